"""Numpy-only maths of ``svd``: factorisations and their costs (no onnx, no onnx-graphsurgeon,
no ONNX Runtime)."""
