"""The real-execution driver base shared by the `onnxruntime` and `openvino` drivers."""
