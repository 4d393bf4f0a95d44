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
   layers ``exclude`` selects (:mod:`onnxslim_kit.selection`: ``NAME``, ``re:REGEX``, ``op:TYPE``,
   ``first:TYPE:N``, ``last:TYPE:N``, ``all``, separated by ``;``; a term matching no node is an
   error) stay float (``head=float``) or become per-column symmetric int8 via DequantizeLinear
   (``head=int8``, opset ≥ 13);
6. nodes the global ``--exclude`` selects are left as they are (a counted skip).

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
one's output loss alone is measured on ≤ 16 calibration samples (fewer on large models:
:func:`onnxslim_kit.passes.int4.mixed.sample_count`) — for at most ``measured=12``
layers: with more candidates, a local proxy (the layer's own output error on rows of its
calibration inputs, :mod:`onnxslim_kit.passes.int4.proxy`, one forward pass) is scaled to the
loss per class of layers and only the layers nearest the cut are measured — and the worst per
extra byte become MatMulNBits ``bits=8`` while all MatMul weight bytes, scales and zero points
included, stay ≤ 0.16× float; until the choice is made the pass holds every layer's int4
codes, packed two to a byte). Measured on all-MiniLM-L6-v2 (results/fp16_int4-2026-11-29-s2-minilm.md,
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
Fidelity (issue 18; before it the pass had no target): with mixed precision the 8-bit layers
are those of the greedy choice up to the shortest prefix whose emulated model holds the target
— ``target`` empty (default) = the pipeline's ``--target`` and this pass's share of its budget,
else the pass's own ``cos:V`` / ``top1:V`` / ``rel:V`` — judged per output view on the held-out
samples against the original (:mod:`onnxslim_kit.passes.int4.judged`). So the step *stops*
promoting when the share holds (fewer 8-bit layers than ``max_ratio`` allows, a smaller model)
and promotes up to ``max_ratio`` while it is missed; ``target=none`` promotes all ``max_ratio``
allows (the behaviour before). Reported when judged: ``target``, ``budget_used``,
``budget_allowed``, ``views``, ``mixed_trials`` and a note naming the binding view and the
judged samples. The layers are ranked by the loss of each output view (:func:`.mixed.sensitivities`).
The int4 rounding itself has no target (GPTQ/RTN have no knob to trade). Measured
(``benchmarks/inputs.py`` data, 32 calibration samples, 8 held out, defaults): mtcnn_onet
all-int4 holds cos:0.99 (dense_5 0.99499, 50 % of the budget): no 8-bit layer, 0.1426× (the
3 layers ``target=none`` promotes: 0.1442×, dense_5 0.99310 — worse on the held-out faces);
ppocrv4_rec misses it even with the 3 layers 0.16× allows (softmax cosine 0.9758, CTC
agreement 0.9759): all 3 promoted, as before.
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

from dataclasses import dataclass

from onnxslim_kit.model import Model
from onnxslim_kit.api import Option, Pass, PassResult, check_target, exclusions, register_pass
from onnxslim_kit.selection import GLOBAL_REASON, Selector

from onnxslim_kit.passes.int4.promote import promote
from onnxslim_kit.passes.int4.rewrite import QDQ_OPSET, rewrite_encoded, rewrite_int8, upgrade
from onnxslim_kit.passes.int4.rounds import codes, encode, quantize_all, quantize_awq
from onnxslim_kit.passes.int4.target import MIN_K, Target, collect_targets, fed_by, heads

__all__ = ["Int4Pass", "MIN_K", "QDQ_OPSET", "Target"]


@dataclass
class _Tally:
    """Weight bytes before / after over the rewritten layers, and the quantization rounds."""

    before: int = 0
    after: int = 0
    rounds: int = 0


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
        "target": Option(str, "", "fidelity target (cos:V, top1:V, rel:V, none) the mixed-precision step stops "
                                  "promoting at; default: the pipeline's --target share", parse=check_target),
        "measured": Option(int, 12, "mixed precision: candidates whose output loss is measured (whole-model runs), "
                                   "those nearest the cut the per-layer error proxy marks; the proxy predicts "
                                   "the others (0: the proxy alone)"),
        "awq": Option(bool, False, "activation-aware scaling: per input channel scales s (searched on the "
                                   "calibration Hessian), weights ×s quantized, input ×1/s by a Mul"),
        "samples": Option(int, 32, "gptq/awq: calibration samples for the Hessians"),
        "act_order": Option(bool, True, "gptq: columns by descending Hessian diagonal (static block scales)"),
        "threads": Option(int, 1, "gptq: BLAS threads (0: the library's default; 1 was fastest on a loaded "
                                  "shared machine)"),
        "sequential": Option(bool, False, "gptq: Hessians from the model quantized so far, layer by layer"),
        "skip_last": Option(bool, False, "keep head layers (no other MatMul/Gemm downstream) out of int4"),
        "exclude": Option(str, "", "MatMul/Gemm kept out of int4, see head (a selector: NAME;re:REGEX;"
                                   "op:TYPE;first:TYPE:N;last:TYPE:N;all); --exclude ones stay float", parse=Selector.parse),
        "head": Option(str, "float", "layers kept out (skip_last/exclude) stay float or become per-column int8",
                       ("float", "int8")),
        "accuracy_level": Option(int, 4, "MatMulNBits accuracy_level: 4 = int8 activations in the kernel "
                                 "(fastest here), 0 = float compute (exact A·deq(W))", (0, 1, 2, 3, 4)),
        "upgrade_opset": Option(bool, True, "qdq: convert models older than opset 21"),
    }
    renamed = {"keep": "exclude=re:REGEX"}

    def is_lossless(self, options: dict) -> bool:
        return False

    def run(self, model: Model, ctx) -> PassResult:
        result = PassResult()
        opts = ctx.options
        fmt = "nbits" if opts["format"] == "auto" else opts["format"]
        if fmt == "qdq" and model.opset < QDQ_OPSET and not upgrade(model, opts["upgrade_opset"], result):
            return result
        targets = collect_targets(model, result)
        if not targets:
            return result
        remaining = _keep_out(model, targets, ctx, result)
        tally, first = _Tally(), {}  # first: int4 results computed for the mixed-precision choice, reused below
        if opts["max_ratio"] > 0 and remaining:
            remaining, first, spent = promote(model, remaining, opts, ctx, fmt, result)
            tally.before, tally.after = tally.before + spent[0], tally.after + spent[1]
            if opts["method"] == "gptq" and opts["sequential"] or opts["awq"]:
                first = {}  # their Hessians come from the model as quantized so far / scaled inputs
        _quantize_in_rounds(model, remaining, first, ctx, fmt, result, tally)
        _summarize(result, opts, fmt, tally)
        return result


def _keep_out(model: Model, targets: list, ctx, result: PassResult) -> list:
    """Leave the layers the global ``--exclude`` selects as they are; rewrite (``head=int8``) or
    skip (``head=float``) the layers kept out of int4 — ``skip_last`` heads and ``exclude``
    selections (:func:`onnxslim_kit.selection.exclusions`); returns the targets left for int4."""
    opts = ctx.options
    chosen = exclusions(model.graph, opts["exclude"], getattr(ctx, "exclude", None), "int4(exclude=...)")
    untouched = {key for key, reason in chosen.items() if reason == GLOBAL_REASON}
    kept = heads(targets) if opts["skip_last"] else set()
    kept |= set(chosen) - untouched
    for target in targets:
        if id(target.node) in untouched:
            result.skip(GLOBAL_REASON)
        elif id(target.node) not in kept:
            continue
        elif opts["head"] == "int8" and model.opset >= 13:
            rewrite_int8(model, target)
            result.rewrite("kept layer→int8")
        else:
            result.skip("kept float (skip_last/exclude)" if opts["head"] == "float" else "int8 needs opset ≥ 13")
    return [t for t in targets if id(t.node) not in kept | untouched]


def _quantize_in_rounds(model: Model, remaining: list, first: dict, ctx, fmt: str, result: PassResult,
                        tally: _Tally) -> None:
    """Quantize and rewrite ``remaining``. GPTQ with ``sequential``: in rounds of the layers
    whose input no unquantized layer feeds, Hessians measured on the model as quantized so far;
    otherwise everything in one round. A weight quantized once is reused (``cache``)."""
    opts = ctx.options
    sequential = opts["method"] == "gptq" and opts["sequential"]
    cache: dict = {}
    progress = iter(ctx.progress(range(len(remaining)), desc="int4", total=len(remaining)))
    while remaining:
        ready = [t for t in remaining if not fed_by(t, remaining)] if sequential else remaining
        todo = [t for t in ready if t.key not in first and t.key not in cache]
        if opts["awq"]:
            fresh = quantize_awq(model, todo, opts, ctx, result)
        else:
            fresh = quantize_all(model, todo, opts, ctx, result) if todo else {}
        tally.rounds += 1
        for target in ready:
            if target.key not in cache:
                qw = codes(first.pop(target.key, None) or fresh.pop(target.key))
                cache[target.key] = encode(model, qw, target.dtype, fmt)
                tally.before += target.float_bytes
                tally.after += cache[target.key][2]
            op = target.node.op
            rewrite_encoded(model, target, cache[target.key], fmt, opts)
            result.rewrite(f"{op}→int4 {fmt}")
            next(progress, None)
        done = {id(t) for t in ready}
        remaining = [t for t in remaining if id(t) not in done]
        if remaining:
            model.commit()


def _summarize(result: PassResult, opts: dict, fmt: str, tally: _Tally) -> None:
    if opts["method"] == "gptq":
        result.metrics["gptq_rounds"] = tally.rounds
    before = tally.before
    after = tally.after + result.metrics.get("awq_scale_bytes", 0)  # the Mul constants belong to the weights' cost
    if before:
        result.metrics.update(weight_bytes_before=before, weight_bytes_after=after,
                              weight_ratio=round(after / before, 4))
        result.notes.append(
            f"int4 {fmt} {opts['method']} bs={opts['block_size']} "
            f"{'sym' if opts['symmetric'] else 'asym'}: weights {before} → {after} bytes "
            f"({after / before:.3f}×)"
        )
