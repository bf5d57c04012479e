"""attnserve's HTTP service: FastAPI + onnxruntime. Never imports torch, model/ or export/."""
