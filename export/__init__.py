"""Turns trained checkpoints into verified model-repository entries (imports torch and onnx)."""
