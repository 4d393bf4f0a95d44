"""Numpy-only maths of the quantization core (no onnx, no onnx-graphsurgeon, no ONNX Runtime)."""
