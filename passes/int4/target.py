"""Which MatMul / Gemm nodes ``int4`` quantizes: the match, and the graph order of the matches.

A matched layer is ``Y = A · W`` with ``Wt`` [N, K] (the layout the quantizer works in)::

    MatMul(A, W[K, N])                      Wt = Wᵀ
    Gemm(A, B, C; α, β, transB, transA=0)   Wt = α·(transB ? B : Bᵀ),  bias = β·C broadcast to [N]

Conditions (each failure is the reason string :func:`match` returns, counted by the pass):

1. the op is ai.onnx MatMul or Gemm in the main graph (If/Loop bodies are not touched);
2. the weight is a 2-D float32/float16 constant;
3. Gemm: ``transA = 0`` and C absent or a constant broadcastable to [N];
4. K ≥ :data:`MIN_K` (shorter reductions do not pay off).

:func:`heads` finds the layers with no other matched layer downstream (``skip_last``);
:func:`fed_by` whether a pending layer lies upstream of another's input (sequential rounds).

Layout changes (MatMul's ``W`` [K, N] ↔ ``Wt`` [N, K]) are copied in square tiles of
:data:`TILE` (:func:`transposed`): numpy's strided copy of a whole [1536, 6144] float32 took
78 ms, tile by tile 41 ms — on issue 16's 2.75 GB decoder every weight crosses over 3–4 times.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs
from onnx_graphsurgeon.ir.tensor import LazyValues

from onnxslim_kit.api import PassResult

from onnxslim_kit.passes._common.graph import const_value, is_onnx_op

MIN_K = 16
TILE = 256


@dataclass
class Target:
    """A matched layer. The float weight is read on demand (:meth:`load`) and never kept, so
    the pass holds one layer's float copy at a time (streaming over large models)."""

    node: gs.Node
    weight: gs.Constant  # W of MatMul, B of Gemm
    transform: tuple  # ("MatMul",) or ("Gemm", transB, α)
    bias: np.ndarray | None  # [N] or None
    dtype: np.dtype  # float32 / float16: the dtype of A, the scales and the output
    key: tuple  # identifies (weight, transform, input) for reuse of a quantized weight
    col_scale: np.ndarray | None = None  # awq: s [K]; the layer quantizes Wt·diag(s)

    def load(self) -> np.ndarray:
        """``Wt`` [N, K] float32 (α and transB folded in, ×s with awq)."""
        w = read(self.weight)
        if self.transform[0] == "MatMul":
            wt = transposed(w, np.float32)
        else:
            _, trans_b, alpha = self.transform
            wt = (w if trans_b else w.T).astype(np.float32) * np.float32(alpha)
        wt = np.ascontiguousarray(wt, dtype=np.float32)
        return wt if self.col_scale is None else wt * self.col_scale

    @property
    def shape(self) -> tuple:
        """(N, K) of ``Wt``."""
        rows, cols = self.weight.shape
        return (rows, cols) if self.transform[0] == "Gemm" and self.transform[1] else (cols, rows)

    @property
    def float_bytes(self) -> int:
        """Bytes of the float weight it replaces."""
        return int(np.prod(self.shape)) * self.dtype.itemsize


def transposed(a: np.ndarray, dtype=None) -> np.ndarray:
    """A contiguous copy of the 2-D ``a.T`` (as ``dtype``), copied in :data:`TILE` × :data:`TILE` tiles."""
    out = np.empty(a.shape[::-1], dtype=dtype or a.dtype)
    for i in range(0, a.shape[0], TILE):
        for j in range(0, a.shape[1], TILE):
            out[j:j + TILE, i:i + TILE] = a[i:i + TILE, j:j + TILE].T
    return out


def read(tensor: gs.Constant) -> np.ndarray:
    """The constant's values without caching them in the graph (a lazily loaded initializer
    stays unloaded: reading it does not keep a second copy of the weight alive)."""
    lazy = getattr(tensor, "_values", None)
    return lazy.load() if isinstance(lazy, LazyValues) else np.asarray(tensor.values)


def collect_targets(model, result: PassResult) -> list:
    """The :class:`Target` of every matching main-graph node; the others are counted skips."""
    for graph in list(model.all_graphs())[1:]:
        result.skip("MatMul/Gemm inside an If/Loop body", sum(is_onnx_op(n, "MatMul", "Gemm") for n in graph.nodes))
    targets = []
    for node in list(model.graph.nodes):
        if not is_onnx_op(node, "MatMul", "Gemm"):
            continue
        target = match(node)
        if isinstance(target, str):
            result.skip(target)
        else:
            targets.append(target)
    return targets


def match(node: gs.Node):
    """A :class:`Target`, or the reason the node does not apply."""
    w = node.inputs[1] if len(node.inputs) > 1 else None
    if not isinstance(w, gs.Constant) or len(w.shape) != 2:
        return "weight is not a 2-D constant"
    if w.dtype not in (np.float32, np.float16):
        return f"weight dtype {np.dtype(w.dtype)} (float32/float16 only)"
    bias = None
    if node.op == "MatMul":
        transform = ("MatMul",)
    else:
        attrs = node.attrs
        if attrs.get("transA", 0):
            return "Gemm with transA=1"
        alpha, beta = float(attrs.get("alpha", 1.0)), float(attrs.get("beta", 1.0))
        transform = ("Gemm", bool(attrs.get("transB", 0)), alpha)
    key = (id(w), *transform, id(node.inputs[0]))
    target = Target(node, w, transform, None, np.dtype(w.dtype), key)
    n, k = target.shape
    if node.op == "Gemm" and len(node.inputs) > 2 and not is_empty(node.inputs[2]):
        c = const_value(node.inputs[2])
        if c is None:
            return "Gemm bias C is not a constant"
        if c.size not in (1, n) or (c.ndim == 2 and c.shape[0] != 1) or c.ndim > 2:
            return "Gemm bias C does not broadcast to [N]"
        bias = np.broadcast_to(c.reshape(-1).astype(np.float32) * np.float32(beta), (n,)).copy()
    if k < MIN_K:
        return f"reduction axis K < {MIN_K}"
    target.bias = bias
    return target


def is_empty(tensor) -> bool:
    return isinstance(tensor, gs.Variable) and not tensor.name


def heads(targets: list) -> set:
    """``id(node)`` of the targets with no other target downstream (the layers nearest the outputs)."""
    nodes = {id(t.node) for t in targets}
    found = set()
    for target in targets:
        stack, seen, downstream = list(target.node.outputs), set(), False
        while stack and not downstream:
            tensor = stack.pop()
            if id(tensor) in seen:
                continue
            seen.add(id(tensor))
            for user in tensor.outputs:
                if id(user) in nodes and user is not target.node:
                    downstream = True
                    break
                stack.extend(user.outputs)
        if not downstream:
            found.add(id(target.node))
    return found


def fed_by(target: Target, pending: list) -> bool:
    """Whether another pending target lies upstream of ``target``'s input A."""
    others = {id(t.node) for t in pending if t is not target}
    stack, seen = [target.node.inputs[0]], set()
    while stack:
        tensor = stack.pop()
        if id(tensor) in seen:
            continue
        seen.add(id(tensor))
        for node in tensor.inputs:
            if id(node) in others:
                return True
            stack.extend(node.inputs)
    return False
