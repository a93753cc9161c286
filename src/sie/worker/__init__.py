"""The worker role: model loading, ONNX adapters and the IPC server that runs inference."""
