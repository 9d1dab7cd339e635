"""A stand-in for a third-party package that runs ONNX models (its import is deep inside)."""
