"""Numpy-only maths of ``cluster``: k-means, shared codebooks, label packing, GPTQ-style
assignment (no onnx, no onnx-graphsurgeon, no ONNX Runtime)."""
