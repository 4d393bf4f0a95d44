"""Unstructured and N:M magnitude sparsity on Conv / Gemm / MatMul weights.

* ``sparsity=s``: per weight tensor, the ``⌊s·n⌋`` entries of smallest |w| become 0
  (ties at the threshold broken by position, so exactly that many).
* ``nm=N:M``: along the reduction axis (Conv input channels, for each output channel and
  kernel tap; MatMul/Gemm rows of K), every run of M consecutive weights keeps its N
  largest |w| — the 2:4 pattern sparse tensor cores run at twice the dense rate. A weight
  whose reduction length is not a multiple of M (e.g. depthwise, 1 input channel) is
  skipped with the reason.

Honesty: ONNX Runtime's CPU execution provider stores and multiplies these weights densely,
so inference is **not** faster and the .onnx file is not smaller; only the compressed file
is (zeros compress well), which the pass reports as zlib sizes before/after.
"""

from __future__ import annotations

import numpy as np

from onnxslim_kit.passes._common.graph import attr, const_value
from onnxslim_kit.passes.prune.apply import set_input

NOTE = ("sparsity: ONNX Runtime's CPU execution provider runs sparse and N:M weights as dense "
        "tensors — no speed-up and no smaller .onnx; only the compressed size shrinks")


def weight_nodes(model):
    """(node, reduction axis of its weight) for Conv/Gemm/MatMul with a constant weight."""
    for node in model.graph.nodes:
        if len(node.inputs) < 2 or const_value(node.inputs[1]) is None:
            continue
        if node.op == "Conv":
            yield node, 1
        elif node.op == "Gemm":
            yield node, 1 if int(attr(node, "transB", 0)) else 0
        elif node.op == "MatMul" and const_value(node.inputs[1]).ndim == 2:
            yield node, 0


def magnitude_mask(w: np.ndarray, sparsity: float) -> np.ndarray:
    """True where kept: all but the ⌊s·n⌋ smallest |w|."""
    n_zero = int(sparsity * w.size)
    order = np.argsort(np.abs(w).reshape(-1), kind="stable")
    keep = np.ones(w.size, dtype=bool)
    keep[order[:n_zero]] = False
    return keep.reshape(w.shape)


def nm_mask(w: np.ndarray, axis: int, n: int, m: int) -> np.ndarray | None:
    """True where kept: the N largest |w| of each M consecutive along ``axis`` (None: not divisible)."""
    if w.shape[axis] % m:
        return None
    moved = np.moveaxis(np.abs(w), axis, -1)
    groups = moved.reshape(-1, m)
    order = np.argsort(-groups, axis=1, kind="stable")
    keep = np.zeros_like(groups, dtype=bool)
    np.put_along_axis(keep, order[:, :n], True, axis=1)
    return np.moveaxis(keep.reshape(moved.shape), -1, axis)


def sparsify(model, sparsity: float, nm, result, keep=frozenset()) -> None:
    """Sparsify every weight of :func:`weight_nodes` but those of the nodes named in ``keep``."""
    zeros = total = 0
    for node, axis in list(weight_nodes(model)):
        if node.name in keep:
            result.skip("sparsity: excluded")
            continue
        w_tensor = node.inputs[1]
        if any(user is not node for user in w_tensor.outputs):
            result.skip("sparsity: weight shared with another node")
            continue
        w = const_value(w_tensor)
        mask = np.ones(w.shape, dtype=bool)
        if sparsity > 0:
            mask &= magnitude_mask(w, sparsity)
        if nm is not None:
            pattern = nm_mask(w, axis, *nm)
            if pattern is None:
                result.skip(f"sparsity: reduction length not a multiple of {nm[1]}")
                continue
            mask &= pattern
        sparse = np.where(mask, w, np.zeros((), dtype=w.dtype))
        set_input(model, node, 1, sparse)
        result.rewrite("sparsify weight")
        zeros += int(np.sum(sparse == 0))
        total += sparse.size
    if total:
        result.metrics["weight_sparsity"] = round(zeros / total, 4)
    result.notes.append(NOTE)
