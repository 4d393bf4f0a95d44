"""Inference BatchNormalization folded into the layer before it, or turned into Mul + Add.

Before / after::

    x ─ Conv(W, b) ─ BatchNormalization(γ, β, μ, σ², ε) ─ y      x ─ Conv(W', b') ─ y
    x ─ Conv(W, b) ─ Add(c) ─ BatchNormalization ─ y             x ─ Conv(W', b') ─ y
    x ─ BatchNormalization ─ y   (nothing to fold into)          x ─ Mul(s) ─ Add(t) ─ y

Algebra, per output channel ``k`` (computed in float64, cast back to the weight's dtype)::

    BN(z) = (z − μ)·γ/√(σ²+ε) + β = z·s + t,   s = γ/√(σ²+ε),   t = β − μ·s
    W'[k] = W[k]·s[k]                 (the slice of W feeding output channel k)
    b'    = (b + c)·s + t  =  (b − μ)·s + β   when there is no bias Add (c = 0; b = 0 if absent)

The slice of W for output channel k depends on the layer (see :mod:`onnxslim_kit.passes.fuse.fold_common`): Conv
``W[k]``; ConvTranspose with ``group=g`` the column ``j`` of group ``gi`` in
``W.reshape(g, C_in/g, C_out/g, …)``; Gemm column ``k`` of B (row ``k`` when ``transB=1``) and
``C ← β·C·s + t, β ← 1``; MatMul ``W[:, k]`` — a MatMul becomes a Gemm, because BN's channel
axis (1) is MatMul's output-channel axis (the last) only when the output is 2-D, which is
also exactly when Gemm applies, so a "MatMul + bias Add" form is never needed.

Rules (labels in the report): ``bn→conv``, ``bn→convtranspose``, ``bn→gemm`` (Gemm and
MatMul), ``bn→mul+add``. Conditions for folding into the producer ``P``:

1. BN is in inference form: one output, ``training_mode`` absent or 0, ``spatial`` absent or 1
   (opset < 9). Otherwise it is left alone ("bn: training mode" / "bn: spatial=0").
2. γ, β, μ, σ² are constant 1-D tensors of length C ("bn: non-constant parameters").
3. ``P`` is a Conv (any rank, any group, with or without bias), ConvTranspose, Gemm, or a
   MatMul with a constant 2-D second input and a first input known to be 2-D; it is in the
   same graph, either directly before BN or before an ``Add`` whose other operand is a
   constant per-channel bias (scalar, [C], [C,1,…], [1,C,1,…]) — paddle2onnx's Conv → Add → BN.
4. Every tensor between ``P`` and BN is read by the next node only and is not a graph output.
5. ``P``'s weight is constant and read by ``P`` alone ("bn: shared weight" otherwise: copying
   would double the weight); its bias is constant or absent (a shared bias is copied).
6. ``P``'s output channel count equals C; all of them float.
7. A float16 fold's rounding stays within the lossless bound at the output's scale
   (:mod:`onnxslim_kit.passes.fuse.fp16_guard`; "bn: float16 rounding of the folded weight"
   otherwise — the BN stays, the other folds go on). For ``bn→mul+add`` too: ``Mul`` then
   ``Add`` rounds ``x·s`` before ``t`` is added, where BN rounds once.

Fallback (``bn→mul+add``): a BN meeting 1–2 whose input is not produced by a candidate ``P``
(directly or through a bias Add) becomes ``Mul(x, s) → Add(·, t)`` with constants shaped
``[C, 1, …, 1]`` to broadcast on axis 1 — only when the rank r of x is known and ≥ 2 (else
"bn: input rank unknown" / "bn: input rank < 2"). A BN that has a candidate ``P`` failing 4–6
keeps its reason and is left as it is. (Folding forward into a following pad-free Conv would
save the two elementwise ops too; the Mul + Add form is simpler, and exact up to one rounding
of ``x·s`` — the reason for condition 7 in float16.)
"""

from __future__ import annotations

from functools import partial

import numpy as np
import onnx_graphsurgeon as gs

from onnxslim_kit.passes._common.graph import attr, const_value, new_constant
from onnxslim_kit.passes._common.match import NOT_CONCERNED, MatchResult, RuleRun
import onnxslim_kit.passes.fuse.fp16_guard as fp16_guard
from onnxslim_kit.passes.fuse.fold_common import (
    TARGET_OPS, FoldPlan, apply_each, fold_into, guarded, half_check, is_op, local_producer, match_target,
    per_channel, rank_of, sole_reader, split_constant,
)


def _inference_reason(bn) -> str | None:
    if len(bn.outputs) != 1 or int(attr(bn, "training_mode", 0)) != 0:
        return "bn: training mode"
    if int(attr(bn, "spatial", 1)) != 1:
        return "bn: spatial=0"
    if len(bn.inputs) != 5:
        return "bn: malformed"
    return None


def _affine(bn) -> MatchResult:
    """Payload (s, t) in float64, or the reason BN is not an inference-form affine map."""
    reason = _inference_reason(bn)
    if reason:
        return MatchResult.fail(reason)
    params = [const_value(t) for t in bn.inputs[1:5]]
    if any(p is None for p in params):
        return MatchResult.fail("bn: non-constant parameters")
    gamma, beta, mean, var = (p.astype(np.float64) for p in params)
    if gamma.ndim != 1 or not gamma.shape == beta.shape == mean.shape == var.shape:
        return MatchResult.fail("bn: parameters not 1-D of one length")
    scale = gamma / np.sqrt(var + float(attr(bn, "epsilon", 1e-5)))
    return MatchResult.of((scale, beta - mean * scale))


def _chain(bn, node_ids):
    """(P, bias Add or None) when BN reads a candidate target, directly or through an Add with
    a constant operand; None otherwise."""
    node = local_producer(bn.inputs[0], node_ids)
    if is_op(node, *TARGET_OPS):
        return node, None
    if is_op(node, "Add"):
        value, _, other = split_constant(node)
        inner = local_producer(other, node_ids) if value is not None else None
        if is_op(inner, *TARGET_OPS):
            return inner, node
    return None


def _plan(bn, graph, node_ids, ops) -> MatchResult:
    """Match + check: a :class:`FoldPlan` or a reason; not concerned when BN has no candidate
    producer of one of ``ops``."""
    chain = _chain(bn, node_ids)
    if chain is None or chain[0].op not in ops:
        return NOT_CONCERNED
    producer, add = chain
    affine = _affine(bn)
    if not affine.ok:
        return affine
    scale, shift = affine.value
    if add is None:
        if not sole_reader(bn.inputs[0], graph, bn):
            return MatchResult.fail("bn: producer output has other readers")
    elif not (sole_reader(bn.inputs[0], graph, bn) and sole_reader(split_constant(add)[2], graph, add)):
        return MatchResult.fail("bn: producer output has other readers")
    found = match_target(producer)
    if not found.ok:
        return found.prefixed("bn: ")
    target = found.value
    if target.channels != scale.shape[0]:
        return MatchResult.fail("bn: channel count mismatch")
    if add is not None:
        bias = per_channel(split_constant(add)[0], target.channels, target.rank)
        if bias is None:
            return MatchResult.fail("bn: bias add not per-channel")
        shift = bias * scale + shift
    if target.weight_shared():
        return MatchResult.fail("bn: shared weight")
    return MatchResult.of(FoldPlan(target, scale, shift, tuple(n for n in (add, bn) if n is not None)))


def fold_bn(graph: gs.Graph, run: RuleRun, ops: tuple) -> int:
    """Fold every BN whose producer is one of ``ops`` into it."""

    def rewrite(bn, plan: FoldPlan):
        fold_into(plan.target, run.model, graph, plan.scale, plan.shift, bn.outputs[0], plan.consumed)

    return apply_each(graph, run, ("BatchNormalization",), guarded(partial(_plan, ops=ops), run, "bn: "), rewrite)


def _plan_mul_add(bn, graph, node_ids) -> MatchResult:
    if _chain(bn, node_ids) is not None:
        return NOT_CONCERNED  # a fold rule's business (applied, or skipped with its reason)
    affine = _affine(bn)
    if not affine.ok:
        return affine
    if getattr(bn.inputs[0], "dtype", None) is None and int(getattr(graph, "opset", 0) or 0) >= 15:
        return MatchResult.fail("bn: input dtype unknown")  # from opset 15 γ, β, μ, σ² may have another dtype than x
    rank = rank_of(bn.inputs[0])
    if rank is None:
        return MatchResult.fail("bn: input rank unknown")
    if rank < 2:
        return MatchResult.fail("bn: input rank < 2")
    return MatchResult.of(affine.value + (rank,))


def _mul_add_dtype(bn):
    x = bn.inputs[0]
    return x.dtype if getattr(x, "dtype", None) is not None else const_value(bn.inputs[1]).dtype


def mul_add_rounding(scale, shift, out_shape, reach=None) -> MatchResult | None:
    """The float16 check of ``Mul(ŝ) → Add(t̂)`` for a BN (:mod:`.fp16_guard`): per channel
    ``m = t``, ``σ = |s|``, ``ε² = (ŝ − s)² + (u²/3)·s² + (t̂ − t)²``."""
    error = np.sqrt(fp16_guard.rounding_error(scale) ** 2 + fp16_guard.UNIT ** 2 / 3 * scale ** 2
                    + fp16_guard.rounding_error(shift) ** 2)
    per_channel = fp16_guard.elements_per_channel(out_shape, scale.shape[0])
    return fp16_guard.check(shift, np.abs(scale), error, per_channel, reach)


def _plan_mul_add_checked(run: RuleRun):
    """:func:`_plan_mul_add`, then, for a float16 BN, :func:`mul_add_rounding`."""
    def plan(bn, graph, node_ids) -> MatchResult:
        found = _plan_mul_add(bn, graph, node_ids)
        if not found.ok or not fp16_guard.is_half(_mul_add_dtype(bn)):
            return found
        scale, shift, _ = found.value
        return half_check(run, graph, bn.outputs[0], found, partial(mul_add_rounding, scale, shift), "bn: ")
    return plan


def bn_to_mul_add(graph: gs.Graph, run: RuleRun) -> int:
    """BN with no candidate producer → Mul + Add with constants broadcasting on axis 1."""
    model = run.model

    def rewrite(bn, plan):
        scale, shift, rank = plan
        x, out = bn.inputs[0], bn.outputs[0]
        dtype = _mul_add_dtype(bn)
        shape = (scale.shape[0],) + (1,) * (rank - 2)
        base = f"fuse_{bn.name or 'bn'}"
        scale_c = new_constant(model, base + "_scale", scale.reshape(shape).astype(dtype))
        shift_c = new_constant(model, base + "_shift", shift.reshape(shape).astype(dtype))
        mid = gs.Variable(model.fresh_name(base + "_scaled"), dtype=out.dtype, shape=out.shape)
        index = next(i for i, n in enumerate(graph.nodes) if n is bn)
        bn.inputs.clear()
        bn.outputs.clear()
        graph.nodes[index:index + 1] = [
            gs.Node("Mul", name=model.fresh_name(base + "_mul"), inputs=[x, scale_c], outputs=[mid]),
            gs.Node("Add", name=model.fresh_name(base + "_add"), inputs=[mid, shift_c], outputs=[out]),
        ]

    return apply_each(graph, run, ("BatchNormalization",), _plan_mul_add_checked(run), rewrite)


RULES = [
    ("bn→conv", partial(fold_bn, ops=("Conv",))),
    ("bn→convtranspose", partial(fold_bn, ops=("ConvTranspose",))),
    ("bn→gemm", partial(fold_bn, ops=("Gemm", "MatMul"))),
    ("bn→mul+add", bn_to_mul_add),
]
