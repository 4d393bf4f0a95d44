"""Constant Mul / Add / Sub / Div after Conv, ConvTranspose or Gemm folded into its weight and
bias; MatMul + Add → Gemm.

Before / after::

    x ─ Conv(W, b) ─ Mul(c) ─ y          x ─ Conv(W·c, b·c) ─ y
    x ─ Conv(W, b) ─ Div(c) ─ y          x ─ Conv(W/c, b/c) ─ y
    x ─ Conv(W, b) ─ Add(c) ─ y          x ─ Conv(W, b + c) ─ y      (also c + Conv(…))
    x ─ Conv(W, b) ─ Sub(c) ─ y          x ─ Conv(W, b − c) ─ y      (Conv(…) − c only)
    x ─ MatMul(W) ─ Add(c) ─ y           x ─ Gemm(W, C=c) ─ y        (x known to be 2-D)

Algebra, per output channel k, with the constant as a vector c[k] (see
:func:`._fold_common.per_channel`; float64, cast back to each tensor's dtype)::

    y·s + t  with  Mul: s = c, t = 0   Div: s = 1/c, t = 0   Add: s = 1, t = c   Sub: s = 1, t = −c
    W'[k] = W[k]·s[k]        b' = b·s + t        (Gemm: B column k, C ← β·C·s + t, β ← 1)

Conditions:

1. The node is an ai.onnx Mul / Add / Sub / Div with one constant and one non-constant input.
   Mul and Add may have the constant on either side; Sub and Div only second (``x − c``,
   ``x / c``); ``c − x`` and ``c / x`` are not affine maps of this form
   ("affine: constant first operand").
2. The non-constant input is produced, in the same graph, by a Conv / ConvTranspose / Gemm
   whose weight is constant (and bias constant or absent) — see :mod:`onnxslim_kit.passes.fuse.fold_common` — and it is
   read by this node only and is not a graph output ("affine: producer output has other readers").
3. The constant is per output channel or a scalar and broadcasting it does not change the
   output's shape: for a rank-r Conv output a scalar, [C,1,…] (r−1 dims) or [1,C,1,…] (r dims);
   for Gemm a scalar, [C] or [1,C] ("affine: not per-channel" otherwise, e.g. a per-element
   [1,C,H,W] constant).
4. Div: the constant has no zeros ("affine: division by zero").
5. Mul / Div rescale the weight, so it must be read by this producer alone ("affine: shared
   weight"); Add / Sub touch only the bias, which is copied when shared.
6. A float16 fold's rounding stays within the lossless bound at the output's scale
   (:mod:`onnxslim_kit.passes.fuse.fp16_guard`; "affine: float16 rounding of the folded weight").

MatMul + Add → Gemm (label ``matmul+add→gemm``): ``Add(MatMul(x, W), c)`` (either order in the
Add) with W a constant 2-D float weight, c a constant of shape (), [1], [N], [1,1] or [1,N],
the MatMul output read only by the Add and not a graph output, and x known to be 2-D. When x's
rank is not 2 or unknown the pair is kept as it is ("matmul+add: input not 2-D, kept" /
"matmul+add: input rank unknown, kept") — ONNX Runtime fuses MatMul + Add itself. W and c are
reused as they are (no copy, sharing is fine).
"""

from __future__ import annotations

from functools import partial

import numpy as np
import onnx_graphsurgeon as gs

from onnxslim_kit.passes._common.graph import const_value
from onnxslim_kit.passes._common.match import NOT_CONCERNED, MatchResult, RuleRun
from onnxslim_kit.passes.fuse.fold_common import (
    FLOAT_KINDS, FoldPlan, apply_each, fold_into, guarded, is_op, local_producer, match_target,
    per_channel, rank_of, sole_reader, split_constant,
)

AFFINE_OPS = ("Mul", "Add", "Sub", "Div")


def _plan(node, graph, node_ids, ops) -> MatchResult:
    """Match + check: a :class:`FoldPlan` or a reason; not concerned when ``node`` does not
    follow a node of ``ops`` with a constant operand."""
    value, index, other = split_constant(node)
    if value is None:
        return NOT_CONCERNED
    producer = local_producer(other, node_ids)
    if producer is None or not is_op(producer, *ops):
        return NOT_CONCERNED
    if index == 0 and node.op in ("Sub", "Div"):
        return MatchResult.fail("affine: constant first operand")
    if not sole_reader(other, graph, node):
        return MatchResult.fail("affine: producer output has other readers")
    found = match_target(producer)
    if not found.ok:
        return found.prefixed("affine: ")
    target = found.value
    vector = per_channel(value, target.channels, target.rank)
    if vector is None:
        return MatchResult.fail("affine: not per-channel")
    if node.op == "Div" and not np.all(vector != 0):
        return MatchResult.fail("affine: division by zero")
    if node.op in ("Mul", "Div") and target.weight_shared():
        return MatchResult.fail("affine: shared weight")
    if node.op in ("Mul", "Div"):
        return MatchResult.of(FoldPlan(target, vector if node.op == "Mul" else 1.0 / vector, None, (node,)))
    return MatchResult.of(FoldPlan(target, None, vector if node.op == "Add" else -vector, (node,)))


def fold_affine(graph: gs.Graph, run: RuleRun, ops: tuple) -> int:
    """Fold constant Mul / Add / Sub / Div nodes that follow a node of ``ops``."""

    def rewrite(node, plan: FoldPlan):
        fold_into(plan.target, run.model, graph, plan.scale, plan.shift, node.outputs[0], plan.consumed)

    return apply_each(graph, run, AFFINE_OPS, guarded(partial(_plan, ops=ops), run, "affine: "), rewrite)


def _plan_gemm(add, graph, node_ids) -> MatchResult:
    bias, index, other = split_constant(add)
    matmul = local_producer(other, node_ids) if bias is not None else None
    if not is_op(matmul, "MatMul") or len(matmul.inputs) != 2:
        return NOT_CONCERNED
    weight = const_value(matmul.inputs[1])
    if weight is None or weight.ndim != 2 or weight.dtype.kind not in FLOAT_KINDS:
        return NOT_CONCERNED
    if const_value(matmul.inputs[0]) is not None:
        return NOT_CONCERNED
    n = weight.shape[1]
    if bias.shape not in ((), (1,), (n,), (1, 1), (1, n)):
        return MatchResult.fail("matmul+add: bias not broadcast along the last dim")
    if not sole_reader(other, graph, add):
        return MatchResult.fail("matmul+add: matmul output has other readers")
    rank = rank_of(matmul.inputs[0])
    if rank != 2:
        reason = "input rank unknown" if rank is None else "input not 2-D"
        return MatchResult.fail(f"matmul+add: {reason}, kept (ORT fuses MatMul+Add)")
    return MatchResult.of((matmul, add.inputs[index]))


def matmul_add_to_gemm(graph: gs.Graph, run: RuleRun) -> int:
    """``Add(MatMul(x, W), c)`` → ``Gemm(x, W, c)`` for a 2-D x (W and c reused as they are)."""
    model = run.model

    def rewrite(add, plan):
        matmul, bias = plan
        x, weight, out = matmul.inputs[0], matmul.inputs[1], add.outputs[0]
        index = next(i for i, n in enumerate(graph.nodes) if n is matmul)
        for dead in (add, matmul):
            dead.inputs.clear()
            dead.outputs.clear()
        graph.nodes[index] = gs.Node(
            "Gemm", name=model.fresh_name(f"fuse_gemm_{matmul.name or 'matmul'}"),
            attrs={"alpha": 1.0, "beta": 1.0, "transA": 0, "transB": 0},
            inputs=[x, weight, bias], outputs=[out],
        )

    return apply_each(graph, run, ("Add",), _plan_gemm, rewrite)


RULES = [
    ("affine→conv", partial(fold_affine, ops=("Conv",))),
    ("affine→convtranspose", partial(fold_affine, ops=("ConvTranspose",))),
    ("affine→gemm", partial(fold_affine, ops=("Gemm",))),
    ("matmul+add→gemm", matmul_add_to_gemm),
]
