"""attnserve: transformer models on onnxruntime, with their attention maps."""

__version__ = "0.1.0"
