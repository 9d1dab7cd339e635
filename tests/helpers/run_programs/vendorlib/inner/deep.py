"""Where a third-party package imports the runtime: `from onnxruntime import ...`."""

from onnxruntime import InferenceSession


def make_session(path: str) -> InferenceSession:
    return InferenceSession(path, providers=["CPUExecutionProvider"])
