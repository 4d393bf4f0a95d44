"""``int4`` — weight-only block-wise 4-bit quantization of MatMul / Gemm with constant weights.

Before / after (``format=nbits``, the default: ONNX Runtime's fast CPU kernel)::

    Y = MatMul(A, W[K,N])                →  Y = com.microsoft::MatMulNBits(A, Bq, S[, Z])
    Y = Gemm(A, B, C; α, β, transB)      →  Y = MatMulNBits(A, Bq, S[, Z], bias = β·C)
                                              with W = α·(transB ? Bᵀ : B)

``format=qdq`` (standard ONNX, opset 21; older models are upgraded with the onnx version
converter, or skipped with a reason when that fails or ``upgrade_opset=false``)::

    Y = MatMul(A, DequantizeLinear(Wq INT4/UINT4 [K,N], S[n_blocks,N][, Z]; axis=0, block_size))
    (Gemm: + Add(β·C))

The numbers (blocks along K, scales, zero points, packing) are in :mod:`onnxslim_kit.passes.int4.quant`;
GPTQ rounding (``method=gptq``, Hessian 2XᵀX of the calibration inputs of each layer;
``act_order=true``: columns by descending diag H with static block scales) is in
:mod:`onnxslim_kit.passes.int4.gptq`; activation-aware scaling (``awq=true``: Y = (A·diag(1/s))·(diag(s)·W), s
per input channel searched on the calibration Hessian, one ``Mul`` by 1/s per input tensor,
its bytes counted with the weights) in :mod:`onnxslim_kit.passes.int4.awq`. With ``sequential=true`` (default) layers are quantized in rounds: a round
takes the layers no pending layer feeds, measures their inputs on the model *as quantized so
far* (one pass over the calibration data per round), so each layer compensates the error of
the layers before it; ``sequential=false`` takes every Hessian from the float model at once.

Conditions (each failure is a counted skip reason):

1. the op is ai.onnx MatMul or Gemm in the main graph (If/Loop bodies are not touched);
2. the weight is a 2-D float32/float16 constant (a shared weight is quantized once and reused);
3. Gemm: ``transA = 0`` and C absent or a constant broadcastable to [N];
4. K ≥ 16 (shorter reductions do not pay off);
5. ``skip_last=true``: a *head* layer — no other matched MatMul/Gemm downstream of it — and
   layers whose node name matches ``keep`` (a regex) stay float (``head=float``) or become
   per-column symmetric int8 via DequantizeLinear (``head=int8``, opset ≥ 13).

Embeddings (Gather on a weight table) are not MatMuls and stay float.

Memory (models whose weights do not fit twice): a target reads its float weight when it is
quantized (:meth:`Target.load`, which does not cache the values in the graph's constant) and
drops it after encoding, so the pass holds one layer's float copy (awq: the layers sharing one
input) besides the int4 results. For a model with external data the core streams the rest
(:mod:`onnxslim_kit.streaming`): the weights stay in their file (a read maps one layer),
ONNX Runtime maps them itself for the teacher and the verification, and the output's data file
is written tensor by tensor — 256 MB of MatMul weights: peak RSS 367 MB with RTN (was
1386 MB), ``benchmarks/measure_memory.py``, results/memory-2026-11-29-s2.md. GPTQ (and the
range search) take the Hessians XᵀX in rounds of ≤ ``HESSIAN_BYTES_PER_ROUND`` and quantize a
round's layers before measuring the next (every round measures the model as it was on entry,
so the result does not depend on the round size); the heap each round frees (its ORT session,
the GPTQ work) is given back to the system before the next round's session (glibc kept it:
+70 MB after the first round, then the rounds crept up), and the int4 results held until
encoding (all of them for the mixed-precision choice) keep their codes two to a byte (32 MB
instead of 64 MB here). The same 256 MB model with the default GPTQ + mixed precision peaks
at 489 MB (744 MB before that, 1225 MB with all 64 Hessians and GPTQ factors held at once),
``max_ratio=0`` at 487 MB (544 MB; 952 MB): the weights once as ORT maps them for a round's
session, a round's Hessians (≤ 64 MB) and the packed results — results/memory-2026-11-29-s2-int4.md.

Defaults (session 2): ``method=gptq, act_order=true, symmetric=false, block_size=64,
damp=0.1, search=false``, ``sequential=false``, and mixed
precision ``max_ratio=0.16`` (:mod:`onnxslim_kit.passes.int4.mixed`: every layer is quantized to int4, each
one's output loss alone is measured on ≤ 16 calibration samples, and the worst per extra byte
become MatMulNBits ``bits=8`` while all MatMul weight bytes, scales and zero points included,
stay ≤ 0.16× float; until the choice is made the pass holds every layer's int4 codes, packed
two to a byte). Measured on all-MiniLM-L6-v2 (results/fp16_int4-2026-11-29-s2-minilm.md,
worst-sample cosine over 32 held-out sentences, level 4): default 0.1586× weights, token
0.987, sentence 0.984; the same without 8-bit layers 0.1426×, 0.982 / 0.975; session 1's
default (RTN block 32 sym) 0.952 / 0.942; ONNX Runtime's MatMulNBitsQuantizer RTN 0.956 /
0.945, GPTQ 0.942 / 0.925 (these rows with ``search=true``; ``search=false``, the default, gave
0.987 / 0.984 too, and PP-OCRv4 rec 0.993 instead of 0.991 — RTN there: bs 32 sym 0.997, bs 64
asym with the H-weighted search 0.969, without 0.974). Why: GPTQ over-fits the calibration set (summed layer error
‖XΔWᵀ‖²/‖XWᵀ‖² 0.031 on it, 0.064 on held-out sentences with damp 0.01, 0.058 with 0.1), and
the loss is spread over all 36 layers (keeping any one float gains ≤ 0.003), so a few cheap
8-bit layers (the attention value projections first) buy more than finer int4 blocks.
Not kept: sequential GPTQ (MiniLM 0.974 vs 0.978 one round, 4× slower), asymmetric
"GPTAQ"-style targets W·XᵀX̃·H̃⁻¹ (0.974–0.978), least-squares refit of the block scales
after GPTQ (in-sample error −6 %, held-out cosine unchanged), full-H_bb block search (no
better than the diagonal, 4× slower). Session 1: PP-OCRv4 rec awq 0.898 (the α chosen on 16
calibration lines does not carry over), so ``awq`` stays off.
``format=auto`` = ``nbits`` with ``accuracy_level=4`` — the fastest here. Measured on
all-MiniLM-L6-v2 (ONNX Runtime 1.32 CPU, 1 thread, graph optimisations on, median of paired
interleaved runs vs float32): MatMulNBits accuracy_level 0 (float compute) 1.04×, level 4
(int8 activations, blockwise) 0.78×; qdq 0.79× because ORT fuses DequantizeLinear + MatMul into
MatMulNBits (level 4) itself — without its optimisations DequantizeLinear expands the whole
weight on every run. Level 4 quantizes activations: use ``accuracy_level=0`` for A·deq(W) exactly.
Float16 activations (after ``fp16``) always get level 0: with level 4 ORT's CPU kernel was far
off (mtcnn_onet softmax max error 0.59 vs 0.0008).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from types import SimpleNamespace

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx_graphsurgeon.ir.tensor import LazyValues

from onnxslim_kit.activations import iter_activations
from onnxslim_kit.errors import UserError
from onnxslim_kit.model import Model
from onnxslim_kit.pipeline import Option, Pass, PassResult, register_pass
from onnxslim_kit.runtime import give_back

from onnxslim_kit.passes.int4 import awq as _int4_awq
from onnxslim_kit.passes.int4 import gptq as _int4_gptq
from onnxslim_kit.passes.int4 import mixed as _int4_mixed
from onnxslim_kit.passes.int4 import quant as _int4_quant
from onnxslim_kit.passes._common.blas import blas_threads
from onnxslim_kit.passes._common.graph import const_value, is_onnx_op, new_constant

MIN_K = 16
QDQ_OPSET = 21
HESSIAN_BYTES_PER_ROUND = 64 << 20
HEAD_STOPS = ("MatMul", "Gemm", "MatMulNBits")


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
        w = _read(self.weight)
        if self.transform[0] == "MatMul":
            wt = w.T
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


def _read(tensor: gs.Constant) -> np.ndarray:
    """The constant's values without caching them in the graph (a lazily loaded initializer
    stays unloaded: reading it does not keep a second copy of the weight alive)."""
    lazy = getattr(tensor, "_values", None)
    return lazy.load() if isinstance(lazy, LazyValues) else np.asarray(tensor.values)


@register_pass
class Int4Pass(Pass):
    name = "int4"
    summary = "weight-only block-wise int4 for MatMul/Gemm (MatMulNBits or DequantizeLinear), RTN or GPTQ"
    lossless = False
    options = {
        "format": Option(str, "auto", "auto (= nbits), nbits (com.microsoft MatMulNBits), qdq (opset 21)",
                         ("auto", "nbits", "qdq")),
        "block_size": Option(int, 64, "elements per block along the reduction axis", (16, 32, 64, 128)),
        "symmetric": Option(bool, False, "symmetric grid (no zero point); false: asymmetric with zero points"),
        "method": Option(str, "gptq", "rounding: rtn (round to nearest) or gptq", ("rtn", "gptq")),
        "search": Option(bool, False, "per-block range search: shrink the range (or use 16 signed levels) when "
                                     "that lowers the block's error, weighted by diag H of the calibration inputs"),
        "damp": Option(float, 0.1, "gptq dampening, as a fraction of mean(diag H)"),
        "max_ratio": Option(float, 0.16, "mixed precision: the layers whose int4 hurts the outputs most (measured) "
                                         "become 8-bit while all MatMul weights stay ≤ max_ratio × float (0: off)"),
        "awq": Option(bool, False, "activation-aware scaling: per input channel scales s (searched on the "
                                   "calibration Hessian), weights ×s quantized, input ×1/s by a Mul"),
        "samples": Option(int, 32, "gptq/awq: calibration samples for the Hessians"),
        "act_order": Option(bool, True, "gptq: columns by descending Hessian diagonal (static block scales)"),
        "threads": Option(int, 1, "gptq: BLAS threads (0: the library's default; 1 was fastest on a loaded "
                                  "shared machine)"),
        "sequential": Option(bool, False, "gptq: Hessians from the model quantized so far, layer by layer"),
        "skip_last": Option(bool, False, "keep head layers (no other MatMul/Gemm downstream) out of int4"),
        "keep": Option(str, "", "regex: MatMul/Gemm whose node name matches stay out of int4"),
        "head": Option(str, "float", "layers kept out (skip_last/keep) stay float or become per-column int8",
                       ("float", "int8")),
        "accuracy_level": Option(int, 4, "MatMulNBits accuracy_level: 4 = int8 activations in the kernel "
                                 "(fastest here), 0 = float compute (exact A·deq(W))", (0, 1, 2, 3, 4)),
        "upgrade_opset": Option(bool, True, "qdq: convert models older than opset 21"),
    }

    def is_lossless(self, options: dict) -> bool:
        return False

    def run(self, model: Model, ctx) -> PassResult:
        result = PassResult()
        opts = ctx.options
        fmt = "nbits" if opts["format"] == "auto" else opts["format"]
        if fmt == "qdq" and model.opset < QDQ_OPSET and not _upgrade(model, opts["upgrade_opset"], result):
            return result
        targets = _collect_targets(model, result)
        if not targets:
            return result
        heads = _heads(model.graph, targets) if opts["skip_last"] else set()
        if opts["keep"]:
            try:
                pattern = re.compile(opts["keep"])
            except re.error as exc:
                raise UserError(f"int4(keep=...): not a regular expression ({exc})") from None
            heads |= {id(t.node) for t in targets if pattern.search(t.node.name or "")}
        for target in targets:
            if id(target.node) in heads:
                if opts["head"] == "int8" and model.opset >= 13:
                    _rewrite_int8(model, target)
                    result.rewrite("kept layer→int8")
                else:
                    result.skip("kept float (skip_last/keep)" if opts["head"] == "float" else "int8 needs opset ≥ 13")
        remaining = [t for t in targets if id(t.node) not in heads]
        gptq = opts["method"] == "gptq"
        before = after = rounds = 0
        cache: dict = {}
        first: dict = {}  # int4 results computed for the mixed-precision choice, reused below
        if opts["max_ratio"] > 0 and remaining:
            remaining, first, spent = _mixed(model, remaining, opts, ctx, fmt, result)
            before, after = before + spent[0], after + spent[1]
            if gptq and opts["sequential"] or opts["awq"]:
                first = {}  # their Hessians come from the model as quantized so far / scaled inputs
        progress = iter(ctx.progress(range(len(remaining)), desc="int4", total=len(remaining)))
        while remaining:
            # GPTQ: layers whose input no unquantized layer feeds, with Hessians measured on the
            # model as quantized so far (sequential GPTQ); RTN: everything in one round.
            ready = [t for t in remaining if not _fed_by(t, remaining)] if gptq and opts["sequential"] else remaining
            todo = [t for t in ready if t.key not in first and t.key not in cache]
            if opts["awq"]:
                hessians = _apply_awq(model, todo, _hessians(model, todo, ctx) if todo else {}, opts, result)
                factors: dict = {}  # per input tensor: layers reading one input share H and its factor
                fresh = {t.key: _quantize(t, opts, hessians.get(t.node.inputs[0].name), factors, result)
                         for t in todo}
                del hessians, factors
            else:
                fresh = _quantize_all(model, todo, opts, ctx, result) if todo else {}
            rounds += 1
            for target in ready:
                if target.key not in cache:
                    qw = _codes(first.pop(target.key, None) or fresh.pop(target.key))
                    cache[target.key] = _encode(model, qw, target.dtype, fmt)
                    before += int(np.prod(target.shape)) * target.dtype.itemsize
                    after += cache[target.key][2]
                op = target.node.op
                if fmt == "nbits":
                    qw = cache[target.key][0]
                    _rewrite_nbits(model, target, cache[target.key][1], (qw.k, qw.n, 4, qw.block_size), opts)
                else:
                    _rewrite_qdq(model, target, cache[target.key], opts["block_size"])
                result.rewrite(f"{op}→int4 {fmt}")
                next(progress, None)
            done = {id(t) for t in ready}
            remaining = [t for t in remaining if id(t) not in done]
            if remaining:
                model.commit()
        if gptq:
            result.metrics["gptq_rounds"] = rounds
        after += result.metrics.get("awq_scale_bytes", 0)  # the Mul constants belong to the weights' cost
        if before:
            result.metrics.update(weight_bytes_before=before, weight_bytes_after=after,
                                  weight_ratio=round(after / before, 4))
            result.notes.append(
                f"int4 {fmt} {opts['method']} bs={opts['block_size']} "
                f"{'sym' if opts['symmetric'] else 'asym'}: weights {before} → {after} bytes "
                f"({after / before:.3f}×)"
            )
        return result


# --- matching ------------------------------------------------------------------------------

def _collect_targets(model: Model, result: PassResult) -> list:
    for graph in list(model.all_graphs())[1:]:
        result.skip("MatMul/Gemm inside an If/Loop body", sum(is_onnx_op(n, "MatMul", "Gemm") for n in graph.nodes))
    targets = []
    for node in list(model.graph.nodes):
        if not is_onnx_op(node, "MatMul", "Gemm"):
            continue
        target = _match(node)
        if isinstance(target, str):
            result.skip(target)
        else:
            targets.append(target)
    return targets


def _match(node: gs.Node):
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
    if node.op == "Gemm" and len(node.inputs) > 2 and not _is_empty(node.inputs[2]):
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


def _is_empty(tensor) -> bool:
    return isinstance(tensor, gs.Variable) and not tensor.name


def _heads(graph: gs.Graph, targets: list) -> set:
    """Targets with no other target downstream (the layers nearest the outputs)."""
    nodes = {id(t.node) for t in targets}
    heads = set()
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
            heads.add(id(target.node))
    return heads


def _fed_by(target: Target, pending: list) -> bool:
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


def _upgrade(model: Model, allowed: bool, result: PassResult) -> bool:
    """Convert the model to opset 21 for INT4 DequantizeLinear; False (with a reason) if not possible."""
    if not allowed:
        result.skip(f"qdq needs opset {QDQ_OPSET}, model has {model.opset} (upgrade_opset=false)")
        return False
    try:
        converted = onnx.version_converter.convert_version(model.to_proto(), QDQ_OPSET)
        upgraded = Model.from_proto(converted)
    except Exception as exc:  # noqa: BLE001 - the converter raises several types
        result.skip(f"qdq needs opset {QDQ_OPSET}; conversion from {model.opset} failed")
        result.notes.append(f"opset conversion failed: {str(exc).strip().splitlines()[0][:200]}")
        return False
    result.notes.append(f"opset {model.opset} → {QDQ_OPSET} for INT4 DequantizeLinear")
    model.graph = upgraded.graph
    model.commit()
    return True


# --- quantizing ----------------------------------------------------------------------------

def _hessian_rounds(model: Model, targets: list, ctx):
    """Yields {input tensor name: summed XᵀX} for the targets, one round (≤
    ``HESSIAN_BYTES_PER_ROUND``) at a time, from the model as it is when each round starts; a
    caller that quantizes a round's layers before taking the next holds one round's Hessians."""
    inputs = {}
    for t in targets:
        inputs.setdefault(t.node.inputs[0].name, t.shape[1])
    graph_inputs = {t.name for t in model.graph.inputs}
    samples = ctx.feed.take(ctx.options["samples"])
    batch, used = [], 0
    names = list(inputs)
    for i, name in enumerate(names):
        batch.append(name)
        used += inputs[name] ** 2 * 8
        if used < HESSIAN_BYTES_PER_ROUND and i + 1 < len(names):
            continue
        exposed = [n for n in batch if n not in graph_inputs]
        acts = iter_activations(model.to_proto(), exposed, samples) if exposed else ({} for _ in samples)
        hessians = {}
        with blas_threads(ctx.options["threads"]):
            for sample, values in zip(samples, acts):
                for n in batch:
                    x = sample[n] if n in graph_inputs else values[n]
                    hessians[n] = _int4_gptq.hessian_update(hessians.get(n), x)
        acts = values = None  # the session (in the generator) and the last sample's tensors
        give_back()  # the round's session and activations went back to malloc, which keeps them
        yield hessians
        batch, used, hessians = [], 0, None
        give_back()  # the caller's work on the round (GPTQ factors, copies), before the next session


def _hessians(model: Model, targets: list, ctx) -> dict:
    """Summed XᵀX per input tensor name of the targets (all rounds at once)."""
    out = {}
    for part in _hessian_rounds(model, targets, ctx):
        out.update(part)
    return out


def _quantize_all(model: Model, targets: list, opts: dict, ctx, result: PassResult) -> dict:
    """{target key: quantized weight} for the targets, Hessians (gptq, search) taken and dropped
    round by round — so a model of many large layers never holds all their Hessians and GPTQ
    factors at once; every Hessian comes from the model as it was on entry."""
    keys = {}
    for t in targets:
        keys.setdefault(t.key, t)
    if not (opts["method"] == "gptq" or opts["search"]):
        return {k: _packed(_quantize(t, opts, None, {}, result)) for k, t in keys.items()}
    done = {}
    for hessians in _hessian_rounds(model, list(keys.values()), ctx):
        factors: dict = {}  # per input tensor: layers reading one input share H and its factor
        for k, t in keys.items():
            if k not in done and t.node.inputs[0].name in hessians:
                done[k] = _packed(_quantize(t, opts, hessians[t.node.inputs[0].name], factors, result))
        del factors, hessians
    return done


def _packed(qw: _int4_quant.QuantizedWeight) -> _int4_quant.QuantizedWeight:
    """``qw`` with its codes two to a byte (held until encoding: 64 layers of 1024×1024, 32 MB less)."""
    return replace(qw, q=_int4_quant.pack_nibbles(qw.q))


def _codes(qw: _int4_quant.QuantizedWeight) -> _int4_quant.QuantizedWeight:
    """``qw`` with a code per byte (unpacks a :func:`_packed` result)."""
    width = qw.n_blocks * qw.block_size
    return qw if qw.q.shape[1] == width else replace(qw, q=_int4_quant.unpack_nibbles(qw.q, width))


def _apply_awq(model: Model, targets: list, hessians: dict, opts: dict, result: PassResult) -> dict:
    """Per input tensor of ``targets``: search s (:mod:`onnxslim_kit.passes.int4.awq`), scale the weights by s, make
    the layers read ``Mul(A, 1/s)``; returns the Hessians keyed by the (new) input names."""
    groups: dict = {}
    for t in targets:
        groups.setdefault(t.node.inputs[0].name, []).append(t)
    out = dict(hessians)
    for name, group in groups.items():
        xtx = hessians.get(name)
        if xtx is None or not np.all(np.isfinite(xtx)):
            result.skip("awq: no usable activation statistics", len(group))
            continue
        s, alpha, _ = _int4_awq.search_scales([t.load() for t in group], xtx, opts["block_size"], opts["symmetric"],
                                              opts["search"])
        result.metrics.setdefault("awq_alpha", []).append(alpha)
        if alpha == 0:
            continue
        a = group[0].node.inputs[0]
        scaled = gs.Variable(model.fresh_name("int4/awq_in"), group[0].dtype, a.shape)
        inv = new_constant(model, "int4/awq_inv_scale", (1.0 / s).astype(group[0].dtype))
        result.metrics["awq_scale_bytes"] = result.metrics.get("awq_scale_bytes", 0) + inv.values.nbytes
        model.graph.nodes.append(gs.Node("Mul", model.fresh_name("int4/awq_Mul"), {}, [a, inv], [scaled]))
        for t in group:
            t.col_scale = s
            t.node.inputs[0] = scaled
        out[scaled.name] = _int4_awq.scaled_hessian(xtx, s)
        result.rewrite("awq input scaling (Mul)")
    return out


def _quantize(target: Target, opts: dict, xtx, factors: dict, result: PassResult) -> _int4_quant.QuantizedWeight:
    if opts["method"] == "gptq" and xtx is not None:
        name = target.node.inputs[0].name
        if name not in factors:
            try:
                factors[name] = _int4_gptq.gptq_factor(xtx, opts["damp"], opts["threads"], opts["act_order"]) if np.all(np.isfinite(xtx)) else None
            except np.linalg.LinAlgError:
                factors[name] = None
        if factors[name] is not None:
            return _int4_gptq.quantize_gptq(target.load(), xtx, opts["block_size"], opts["symmetric"], opts["damp"],
                                            search=opts["search"], factor=factors[name],
                                            threads=opts["threads"])
        result.skip("gptq: Hessian not usable (non-finite / not positive definite), RTN used")
    importance = np.diag(xtx).astype(np.float32) if opts["search"] and xtx is not None else None
    return _int4_quant.quantize_rtn(target.load(), opts["block_size"], opts["symmetric"], opts["search"], importance)


def _encode(model: Model, qw, dtype, fmt: str) -> tuple:
    """(the layer's shape (k, n, block_size), [weight, scales, zero points or None] as constants,
    bytes they take). The codes of ``qw`` (a byte per weight) are not kept: the cache holds the
    packed constants only (streaming a 256 MB model: 64 MB less)."""
    shape = SimpleNamespace(k=qw.k, n=qw.n, block_size=qw.block_size)
    if fmt == "nbits":
        b, scales, zeros = _int4_quant.nbits_arrays(qw, dtype)
        consts = [new_constant(model, "int4/B", b), new_constant(model, "int4/scales", scales),
                  new_constant(model, "int4/zero_points", zeros) if zeros is not None else None]
        return shape, consts, b.nbytes + scales.nbytes + (zeros.nbytes if zeros is not None else 0)
    codes, scales, zeros = _int4_quant.qdq_arrays(qw, dtype)
    consts = [
        _int4_quant.int4_tensor(model.fresh_name("int4/w"), codes, signed=qw.symmetric),
        new_constant(model, "int4/scales", scales),
        _int4_quant.int4_tensor(model.fresh_name("int4/zero_points"), zeros, signed=False)
        if zeros is not None else None,
    ]
    packed = (codes.size + 1) // 2 + (((zeros.size + 1) // 2) if zeros is not None else 0)
    return shape, consts, packed + scales.nbytes


# --- rewriting -----------------------------------------------------------------------------

def _rewrite_nbits(model: Model, target: Target, consts: list, shape: tuple, opts: dict) -> None:
    """``shape`` = (K, N, bits, block_size); ``consts`` = [B, scales, zero points or None]."""
    b, scales, zeros = consts
    node = target.node
    inputs = [node.inputs[0], b, scales]
    if zeros is not None or target.bias is not None:
        inputs.append(zeros if zeros is not None else gs.Variable.empty())
    if target.bias is not None:
        inputs += [gs.Variable.empty(), new_constant(model, "int4/bias", target.bias.astype(target.dtype))]
    attrs = dict(zip(("K", "N", "bits", "block_size"), shape))
    if opts["accuracy_level"] and target.dtype == np.float32:  # with float16 A, level 4 measured far off on CPU
        attrs["accuracy_level"] = opts["accuracy_level"]
    outputs = list(node.outputs)
    node.outputs.clear()
    node.inputs.clear()
    model.graph.nodes.append(gs.Node("MatMulNBits", model.fresh_name("int4/MatMulNBits"), attrs, inputs,
                                     outputs, domain="com.microsoft"))


def _mixed(model: Model, targets: list, opts: dict, ctx, fmt: str, result: PassResult) -> tuple:
    """Quantize every target to int4, measure each one's output loss alone, promote the worst to
    8 bits within ``max_ratio`` (:mod:`onnxslim_kit.passes.int4.mixed`). Returns (targets left for int4, their int4
    results by key, (float bytes, bytes) of the promoted layers)."""
    first, by_weight = _quantize_all(model, targets, opts, ctx, result), {}
    for t in targets:
        by_weight.setdefault(t.weight.name, set()).add(t.key)
    float_total = int4_total = 0
    costs, candidates, seen = {}, {}, set()
    for t in targets:
        if t.key in seen:
            continue
        seen.add(t.key)
        item = t.dtype.itemsize
        float_total += int(np.prod(t.shape)) * item
        int4 = _int4_mixed.int4_bytes(t.shape, opts["block_size"], opts["symmetric"], item)
        int4_total += int4
        if len(by_weight[t.weight.name]) == 1 and (fmt == "nbits" or model.opset >= 13):
            int8 = (_int4_mixed.int8_bytes(t.shape, item) if fmt == "nbits"
                    else int(np.prod(t.shape)) + t.shape[0] * item)
            costs[t.weight.name] = (int4, int8)
            candidates[t.weight.name] = lambda t=t: _stored_layout(t, _int4_quant.dequantize(_codes(first[t.key])))
    budget = int(opts["max_ratio"] * float_total) - int4_total
    if budget <= 0 or not candidates:
        result.notes.append(f"mixed precision: no 8-bit layer fits max_ratio={opts['max_ratio']}")
        return targets, first, (0, 0)
    losses = _int4_mixed.sensitivities(model.to_proto(), candidates, ctx.feed.take(min(opts["samples"], 16)))
    give_back()  # the sensitivity session's run buffers
    chosen = _int4_mixed.select(costs, losses, budget)
    spent = [0, 0]
    for t in targets:
        if t.weight.name not in chosen:
            continue
        if fmt == "nbits":
            wt = t.load()
            bs = _int4_mixed.int8_block(wt.shape[1])
            codes, scale = _int4_quant.quantize_int8_blocks(wt, bs)
            consts = [new_constant(model, "int4/B8", codes), new_constant(model, "int4/scales8", scale.astype(t.dtype)),
                      None]
            _rewrite_nbits(model, t, consts, (wt.shape[1], wt.shape[0], 8, bs), opts)
        else:
            _rewrite_int8(model, t)
        spent[0] += int(np.prod(t.shape)) * t.dtype.itemsize
        spent[1] += costs[t.weight.name][1]
        result.rewrite("MatMul/Gemm→8-bit (mixed precision)")
    result.metrics["int8_layers"] = sorted(t.node.name for t in targets if t.weight.name in chosen)
    return [t for t in targets if t.weight.name not in chosen], first, tuple(spent)


def _stored_layout(target: Target, wt: np.ndarray) -> np.ndarray:
    """``Wt`` [N, K] back in the layout of the weight constant (MatMul W, Gemm B with α divided out)."""
    if target.transform[0] == "MatMul":
        w = wt.T
    else:
        _, trans_b, alpha = target.transform
        w = (wt if trans_b else wt.T) / np.float32(alpha)
    return np.ascontiguousarray(w, dtype=target.dtype)


def _rewrite_qdq(model: Model, target: Target, encoded: tuple, block_size: int) -> None:
    qw, (w, scales, zeros), _ = encoded
    dq_inputs = [w, scales] + ([zeros] if zeros is not None else [])
    deq = gs.Variable(model.fresh_name("int4/w_dq"), target.dtype, [qw.k, qw.n])
    model.graph.nodes.append(gs.Node("DequantizeLinear", model.fresh_name("int4/DequantizeLinear"),
                                     {"axis": 0, "block_size": block_size}, dq_inputs, [deq]))
    _replace_with_matmul(model, target, deq)


def _rewrite_int8(model: Model, target: Target) -> None:
    q, scale = _int4_quant.quantize_int8_columns(target.load().T)
    deq = gs.Variable(model.fresh_name("int4/head_dq"), target.dtype, list(q.shape))
    inputs = [new_constant(model, "int4/head_q", q), new_constant(model, "int4/head_scale", scale.astype(target.dtype))]
    model.graph.nodes.append(gs.Node("DequantizeLinear", model.fresh_name("int4/DequantizeLinear"),
                                     {"axis": 1}, inputs, [deq]))
    _replace_with_matmul(model, target, deq)


def _replace_with_matmul(model: Model, target: Target, weight: gs.Variable) -> None:
    """``node`` becomes MatMul(A, weight) (+ bias for Gemm); the outputs keep their tensors."""
    node = target.node
    if node.op == "MatMul":
        node.inputs[1] = weight
        return
    a, outputs = node.inputs[0], list(node.outputs)
    node.outputs.clear()
    node.inputs.clear()
    if target.bias is None:
        model.graph.nodes.append(gs.Node("MatMul", model.fresh_name("int4/MatMul"), {}, [a, weight], outputs))
        return
    mid = gs.Variable(model.fresh_name("int4/mm"), target.dtype)
    bias = new_constant(model, "int4/bias", target.bias.astype(target.dtype))
    model.graph.nodes.append(gs.Node("MatMul", model.fresh_name("int4/MatMul"), {}, [a, weight], [mid]))
    model.graph.nodes.append(gs.Node("Add", model.fresh_name("int4/Add"), {}, [mid, bias], outputs))
