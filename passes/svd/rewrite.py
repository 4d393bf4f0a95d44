"""The ``svd`` graph rewrites, each returning an ``undo`` (the pass tries sets of them).

```
MatMul(X, W)                      →  MatMul(MatMul(X, A), B)
Gemm(X, W[ᵀ], C, α, β)            →  Gemm(MatMul(X, A), α·B, C, α=1, β, transB=0)
Conv(X, W[n,C,kh,kw], bias)       →  Conv(Conv(X, A', same attributes), B', bias)
                                     A' = Aᵀ as [r, C, kh, kw],  B' = Bᵀ as [n, r, 1, 1]
  (mode "separable")              →  Conv(Conv(X, V[r,C,kh,1], vertical attrs), H[n,r,1,kw], bias, horizontal attrs)
                                     (:mod:`onnxslim_kit.passes.svd.maths.spatial`)
```

The original node keeps its name and output (so graph outputs and readers are untouched); a
new node is inserted before it. New constants, tensors and nodes get ``svd/…`` fresh names.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from onnxslim_kit.passes._common.graph import new_constant
from onnxslim_kit.passes.svd.maths.spatial import separable_attrs, separable_weights


def apply(model, layer, a: np.ndarray, b: np.ndarray, mode: str = "kxk"):
    """Rewrite ``layer`` with factors ``A`` (k × r), ``B`` (r × n); returns ``undo()``."""
    node = layer.node
    saved_inputs, saved_attrs = list(node.inputs), dict(node.attrs)
    dtype = node.inputs[1].values.dtype
    r = a.shape[1]
    if mode == "separable":
        vertical, horizontal = separable_weights(a, b, node.inputs[1].values.shape)
        first_attrs, second_attrs = separable_attrs(layer.geometry)
        first = _insert(model, layer, "Conv", vertical.astype(dtype), first_attrs)
        node.inputs[1] = new_constant(model, "svd/H", horizontal.astype(dtype))
        node.attrs = second_attrs
    elif layer.kind == "conv":
        shape = node.inputs[1].values.shape  # n, C, kh, kw
        first = _insert(model, layer, "Conv", a.T.reshape(r, *shape[1:]).astype(dtype), dict(node.attrs))
        node.inputs[1] = new_constant(model, "svd/B", b.T.reshape(shape[0], r, 1, 1).astype(dtype))
        node.attrs = {"kernel_shape": [1, 1]} if "kernel_shape" in node.attrs else {}
    else:
        first = _insert(model, layer, "MatMul", a.astype(dtype), {})
        if layer.kind == "gemm":
            b = float(node.attrs.get("alpha", 1.0)) * b
            node.attrs["alpha"] = 1.0
            node.attrs["transB"] = 0
        node.inputs[1] = new_constant(model, "svd/B", b.astype(dtype))

    def undo():
        for i, tensor in enumerate(saved_inputs):
            node.inputs[i] = tensor
        node.attrs = saved_attrs
        first.inputs.clear()
        first.outputs.clear()
        layer.graph.nodes.remove(first)

    return undo


def _insert(model, layer, op: str, weight: np.ndarray, attrs: dict) -> gs.Node:
    """Insert ``op(X, weight)`` before the layer and make the layer read its output."""
    mid = gs.Variable(model.fresh_name("svd/low_rank"), dtype=weight.dtype)
    w = new_constant(model, "svd/A", weight)
    first = gs.Node(op, model.fresh_name(f"svd/{op}"), attrs, [layer.node.inputs[0], w], [mid])
    layer.graph.nodes.append(first)
    layer.node.inputs[0] = mid
    return first
