"""``int8`` — static QDQ quantization that ONNX Runtime's CPU provider runs with integer kernels.

Before / after, for a Conv (MatMul and Gemm alike)::

    x ──▶ Conv(W, b) ──▶ Relu ──▶ y
    x ─▶ Q ─▶ DQ ─▶ Conv(DQ(W_q, s_w, axis=0), DQ(b_q, s_x·s_w)) ─▶ Relu ─▶ Q ─▶ DQ ─▶ y

ORT fuses ``DQ → Conv → (Relu) → Q`` into QLinearConv (MatMul → QLinearMatMul, or
MatMulIntegerToFloat when the output stays float; Gemm → QGemm; ``DQ,DQ → Add → Q`` →
QLinearAdd) with its optimisations on. Encodings: :mod:`onnxslim_kit.passes._quant.qdq`; where Q/DQ go and
what stays float: :mod:`onnxslim_kit.passes.int8.plan`; calibration methods: :mod:`onnxslim_kit.passes._quant.maths.calib`; the
fidelity target and per-layer fallback: :mod:`onnxslim_kit.passes.int8.fallback`.

Steps:

1. models that already hold Q/DQ or integer ops (a QAT export, quantize_static / quantize_dynamic
   output, QLinearConv, com.microsoft ops such as DynamicQuantizeLSTM or MatMulNBits;
   :func:`onnxslim_kit.passes._quant.qdq.is_quantized_op`) pass through untouched, with the
   counted reason and a note naming the ops found: the model was quantized on purpose, and so
   were the layers it keeps float (QAT recipes keep the first / last layers float) — quantizing
   those again with post-training ranges would undo that choice; start from the float model to
   quantize it again;
2. layers found (Conv / MatMul / Gemm / Gather tables of the main graph; layers inside
   If/Loop bodies are counted, not quantized), ``include`` / ``exclude`` (selectors,
   :mod:`onnxslim_kit.selection`, chosen among the layers; each must match a node) and the
   global ``--exclude`` applied — the layers they leave out stay as they were (float, and
   out of ``cle``); nothing left → nothing changes (not even the opset);
3. opset < 13: upgraded to 13 (per-channel ``DequantizeLinear`` needs ``axis``); when the
   converter fails, per-tensor weights on opset ≥ 10, nothing below;
4. with ``cle``: cross-layer equalization of (Conv → Relu →) Conv pairs (:mod:`onnxslim_kit.passes.int8.cle`);
5. streaming calibration over the feed (histograms, bounded memory), ranges by ``method``;
   with ``smooth``, in the same run: per-channel peaks of MatMul/Gemm inputs, then
   SmoothQuant rebalancing (:mod:`onnxslim_kit.passes._quant.smooth`), the rebalanced inputs' statistics from
   the kept inputs (one run over the samples instead of two; a second run past 256 MB);
6. safeguards mark tensors float; layers whose input must stay float stay float;
7. with ``rounding=adaround`` (opt-in): each static Conv / Gemm / MatMul weight's codes
   rounded up or down as learned on its float inputs over the first fit samples, on the
   same grid and scales, never worse than nearest per output channel on those rows
   (:mod:`onnxslim_kit.passes.int8.adaround`); the bias correction, the sensitivities
   and every trial then read the learned codes. Measured (2026-12-02,
   ``benchmarks/results/int8-adaround-2026-12-02.md``): 0.19–0.36 of the nearest weight
   error on the fit rows, held-out worst cosine better on 3 of 4 models with every layer
   static, but at the default target no fewer fallback layers (PP-OCRv4 det 20 → 5 static)
   at 1.9–7.4× the pass's time — so not the default;
   with ``bias_correction``: per-channel mean output shift of every Conv/Gemm measured and
   folded into its bias, and every layer's local error measured in the same run
   (:mod:`onnxslim_kit.passes.int8.correct`);
8. with ``fallback`` and a target (``ctx.fidelity``: the pipeline's ``--target`` share, or
   the pass's own ``target=``; :mod:`onnxslim_kit.fidelity`): layers leave static int8 until
   the candidate, judged view by view on the *held-out* samples against the original, uses
   at most the budget fraction allowed (:mod:`onnxslim_kit.passes.int8.fallback`), down a *ladder* of rungs
   (``ladder``, default ``dynamic;weights``) before float: ``dynamic`` (MatMul / Gemm:
   DynamicQuantizeLinear + MatMulInteger, each input quantized over its own range at run
   time, fused by ORT into DynamicQuantizeMatMul), ``weights`` (float compute from int8
   per-channel weights restored by ``Cast`` + ``Mul``, which ORT folds at load: no cost per
   inference), then float; the ranking that orders them by cost (:mod:`.ranking`), the
   encodings and weight pages kept resident only while read (:mod:`.resident`). The most sensitive layers go deepest
   (:func:`.ladder.choose_fallback`). Layers off static int8 read their float
   input; smoothed layers on ``weights`` or float get their original input and weight back.
   The trials run the Q/DQ graph as float emulation; the chosen configuration is judged again
   on ORT's fused int8 kernels, and searched once more when those miss — for large inputs the
   trials run on those kernels themselves (:mod:`.kernels`).
   Measured (2026-11-29, s2): PP-OCRv4 det 10 float layers (0.54× the fp32 file) → 11 on
   ``weights`` (0.30×), held-out worst cosine 0.9949 → 0.9935, latency not worse. The
   report: ``target``, ``budget_used`` / ``budget_allowed`` (fractions of the target's loss
   budget) and a note naming the binding view and the judged samples;
9. ``speed`` — never slower than float. The default ``auto`` is ``layers``, or what
   ``$ONNXSLIM_KIT_SPEED`` names (``off`` for builds whose output must not depend on the building
   machine: the machine that times should be the kind that runs the model). ``layers`` (decided before step 8, whose
   search then holds these layers float): each layer kind's int8 kernel is timed against its
   float op in one-node ORT models and the layers slower than ``speed_margin`` × float stay
   float, with the measured ratio as the reason; timings go to a timing cache keyed by the
   layer kind, ORT version, CPU model and threads, so that a machine and its cache give
   byte-identical output (:mod:`onnxslim_kit.passes.int8.layer_speed`: the decision is
   machine-dependent, the note says so); then, as with ``model``, the whole int8 candidate is
   timed against float (cached by the two models' sha256), slower → the model stays float
   (:mod:`onnxslim_kit.passes.int8.speed`; skipped, with a note, above
   :data:`~onnxslim_kit.passes.int8.layer_speed.MODEL_CHECK_MAX_BYTES` of layer weights, where
   two whole sessions would double the memory); ``off``: neither.
   ``speed_check=true|false`` is the older spelling of ``model`` / ``off``. The report's pass
   list records what the timings decided (``speed=off``, ``speed_decided=`` the layers, or
   ``*``), so a recipe replays it on any machine without timing
   (:mod:`onnxslim_kit.passes.int8.speed_decision`);
10. Q/DQ written for the chosen layers; hard-swish / HardSigmoid between Q points rewritten
    into ``Add → Q → DQ → Mul`` (ORT has no QLinear kernel for them; it runs this as
    QLinearAdd + QLinearMul), squeeze-excite pools quantized on their input
    (:mod:`onnxslim_kit.passes._quant.hardswish`; measured 2026-12-02, ``fuse,int8`` latency ×
    ``fuse`` alone, 1 thread: orientation 1.07 → 0.89, ppocr_cls_v2 1.73 → 1.52 — its
    depthwise QLinearConvs are slower than float ones here); with ``io=uint8|int8``, integer
    model inputs and outputs (:mod:`onnxslim_kit.passes.int8.integer_io`).

Lossless limit: ``exclude=all`` leaves the graph unchanged; every layer falling back leaves
it float (with ``smooth``, an exactly equivalent rebalanced float graph).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from onnxslim_kit.api import Option, Pass, PassResult, pass_fidelity, register_pass
from onnxslim_kit.selection import SYNTAX, Selector

from onnxslim_kit.passes._quant.maths import calib
from onnxslim_kit.passes.int8 import plan as plan_mod
from onnxslim_kit.passes._quant import smooth as smooth_mod
from onnxslim_kit.passes._common.graph import attr
from onnxslim_kit.passes.int8 import adaround as adaround_mod
from onnxslim_kit.passes.int8.cle import equalize
from onnxslim_kit.passes.int8.correct import measure_twins
from onnxslim_kit.passes.int8.bodies import restore_body_weights, store_body_weights
from onnxslim_kit.passes.int8.fallback import (
    Scorer,
    SharedWeights,
    collect_trials,
    ranking_fidelity,
    search_scope,
    trial_copy,
)
from onnxslim_kit.passes.int8.integer_io import make_integer_io
from onnxslim_kit.passes.int8.ladder import choose_fallback
from onnxslim_kit.passes.int8.ranking import TWIN_ROUNDS, sensitivity_mode, unsmooth_float_path, unsmoothed_round
from onnxslim_kit.passes.int8.resident import ScratchEncodings, release
from onnxslim_kit.passes.int8.options import ROUNDINGS, check_ladder, check_target, parse_ladder
from onnxslim_kit.passes._quant.qdq import (
    RUNGS,
    activation_params,
    add_gated_twins,
    already_quantized,
    apply_plan,
    rungs_of,
    upgrade_opset,
)
from onnxslim_kit.passes.int8.calib_groups import calibration_groups, group_activations
from onnxslim_kit.passes.int8.layer_speed import SPEED_ENV, SPEEDS
from onnxslim_kit.passes.int8.kernels import on_kernels, trials_on_kernels
from onnxslim_kit.passes.int8 import speed_decision

KEEP_BYTES = 256 << 20  # smoothable activations kept for their smoothed statistics, at most


def calib_samples(ctx):
    """The calibration samples: the first ``calib_samples`` of the feed, or all of it."""
    n = ctx.options["calib_samples"]
    return ctx.feed.take(n) if n > 0 else ctx.feed


@dataclass
class LayerSpec:
    name: str
    op: str
    inputs: list          # activation tensor names
    output: str           # Q point after the layer
    weight_index: int | None
    weight_axis: int | None
    bias_index: int | None
    unsmoothed: tuple | None = None  # (input name, weight array) before SmoothQuant


@dataclass
class Plan:
    layers: list
    params: dict          # tensor name -> (scale, zero point)
    per_channel: bool
    bias_shift: dict = field(default_factory=dict)  # layer name -> bias correction vector
    encodings: dict = field(default_factory=dict)   # (layer, kind) -> integer weights (_quant_qdq; .resident)
    pooled: dict = field(default_factory=dict)      # extra Q point -> the pooled layer input (plan.pool_inputs)


@register_pass
class Int8Pass(Pass):
    name = "int8"
    summary = "static int8 QDQ (per-channel weights, calibrated activations, safeguards, fidelity target)"
    lossless = False
    options = {
        "method": Option(str, "percentile", "activation calibration", calib.METHODS),
        "percentile": Option(float, 99.99, "percentile for method=percentile"),
        "activations": Option(str, "uint8", "activation type", ("uint8", "int8")),
        "per_channel": Option(bool, True, "per-output-channel weight scales (needs opset ≥ 13)"),
        "calib_samples": Option(int, 0, "calibration samples to use (0: the whole feed)"),
        "target": Option(str, "", "fidelity target (cos:V, top1:V, rel:V, none); default: the pipeline's "
                         "--target share (off / 0: none, as before)",
                         parse=check_target),
        "fallback": Option(bool, True, "move the most sensitive layers back to float until the target holds"),
        "eval_samples": Option(int, 8, "fit samples that measure the bias correction and the local "
                               "sensitivities (the target is judged on the held-out samples)"),
        "cle": Option(bool, False, "cross-layer equalization of (Conv → Relu →) Conv pairs before calibration"),
        "smooth": Option(float, 0.5, "SmoothQuant α: move activation outliers of MatMul/Gemm inputs into "
                         "the weights (0: off)"),
        "rounding": Option(str, "nearest", "static weight codes: nearest, or adaround (learned up/down per "
                           "weight on the fit samples' layer inputs, never worse than nearest per channel)",
                           ROUNDINGS),
        "adaround_iters": Option(int, adaround_mod.ITERS, "rounding=adaround: Adam steps per layer"),
        "bias_correction": Option(bool, True, "shift Conv/Gemm biases by the mean output error of quantization"),
        "sensitivity": Option(str, "auto", "layer ranking for the fallback: local (one run, per-layer "
                              "error), e2e (each layer alone in int8, scored at the outputs), hybrid (local, "
                              "then the `refine` first re-ranked end to end), auto (e2e when ≥ 1/4 of the "
                              "layers are MatMul/Gemm and layers × weight bytes ≤ 16 GiB, else hybrid)", ("auto", "hybrid", "e2e", "local")),
        "refine": Option(int, 8, "sensitivity=hybrid: layers re-scored end to end"),
        "gated_ranking": Option(bool, True, "sensitivity=e2e: rank from one session holding every layer's "
                                "quantized twin behind a switch (instead of one build per layer; same ranking)"),
        "rank_samples": Option(int, 1, "held-out samples used to rank layers end to end (e2e, hybrid)"),
        "ladder": Option(str, "dynamic;weights", "fallback rungs between static int8 and float, ';'-separated, "
                         "from int8 towards float: dynamic (MatMul/Gemm: DynamicQuantizeLinear + MatMulInteger), "
                         "weights (int8 weights, float compute; ORT folds them at load); 'none': straight to float",
                         parse=check_ladder),
        "io": Option(str, "float", "model inputs/outputs: float, or uint8 / int8 (full-integer, encodings in "
                     "the model's metadata)", ("float", "uint8", "int8")),
        "speed": Option(str, "auto", "int8 only where it pays: layers (each layer kind's int8 kernel timed "
                        "against its float op once per machine, through the timing cache; slower → float; then the "
                        "model check), model (the whole int8 candidate timed against float: slower → all float), "
                        f"off (the output does not depend on the machine's timings); auto (the default): "
                        f"${SPEED_ENV} if set, else layers", SPEEDS),
        "speed_check": Option(bool, None, "older spelling: true = speed=model, false = speed=off"),
        "speed_decided": Option(str, "", "what a timed speed decision found, for a replay without timing "
                                "(a recipe sets it, with speed=off): the layers kept float, ';'-separated, "
                                "or * (the whole model kept float)"),
        "speed_margin": Option(float, 1.0, "speed: keep int8 only where its latency ≤ this × float's"),
        "timing_cache": Option(str, "", "speed: the timing cache file (default $ONNXSLIM_KIT_TIMINGS, "
                               "else $ONNXSLIM_KIT_CACHE/timings.json, else ~/.cache/onnxslim_kit/timings.json)"),
        "include": Option(str, "", f"only these layers (a selector: {SYNTAX}, first/last counting layers)", parse=Selector.parse),
        "exclude": Option(str, "", "keep these layers float (a selector, as include; e.g. last:Conv:1, all); "
                          "the global --exclude too", parse=Selector.parse),
        "max_range": Option(float, 1e4, "keep tensors with calibrated |x| above this float (0: off)"),
        "heads": Option(bool, True, "keep inputs of Sigmoid/Softmax decision heads float"),
        "log": Option(bool, True, "keep tensors feeding a Log (spectra) float"),
        "bodies": Option(bool, True, "store If/Loop/Scan body weights (Conv/MatMul/Gemm/RNN) as int8 + Cast + Mul, "
                         "float compute, kept when the target holds (the bodies are not calibrated)"),
        "grouped": Option(str, "int8", "depthwise and other grouped Conv: int8 (static, searched like any "
                          "layer), weights (int8 storage, float compute: ONNX Runtime's CPU int8 path for "
                          "them can be slower than its float one) or float", ("int8", "weights", "float")),
        "concat_ratio": Option(float, 16.0, "keep Concat outputs float when input ranges differ more (0: off)"),
    }

    def run(self, model, ctx) -> PassResult:
        result = PassResult()
        opts = ctx.options
        if already_quantized(model, result):
            return result
        fid = pass_fidelity(ctx)  # the target share this pass holds, the held-out samples
        ladder = parse_ladder(opts["ladder"])
        for sub in list(model.all_graphs())[1:]:
            result.skip("layer in an If/Loop body (not calibrated)",
                        sum(1 for n in sub.nodes if n.op in plan_mod.LAYER_OPS))
        first_look = PassResult()
        chosen = self._layers(model, ctx, first_look)
        if not chosen:  # decided before any opset upgrade
            result.skipped.update(first_look.skipped)
            result.skip("no layer to quantize")
            self._store_body_weights(model, ctx, fid, result)
            return result
        per_channel = self._prepare_opset(model, opts["per_channel"], result)
        if per_channel is None:
            return result
        if opts["cle"]:  # the convs the selectors leave float are left as they are
            alone = {n.name for n in model.graph.nodes if n.op == "Conv"} - {l.name for l in chosen}
            result.metrics["cle_pairs"] = equalize(model.graph, result, alone)
        layers = self._layers(model, ctx, result)
        start = time.perf_counter()  # the calibration phase: smoothing peaks, activation ranges
        groups = smooth_mod.smoothable(layers) if opts["smooth"] > 0 else {}
        stats, peaks, kept = self._calibrate(model, layers, ctx, sorted(groups))
        # the same layers after smoothing, their inputs rewired (smooth updates them)
        unsmoothed = smooth_mod.smooth(model, groups, peaks, opts["smooth"], result) if groups else {}
        if unsmoothed:
            if kept is None:  # the inputs were too large to keep: a second run over the samples
                stats = self._calibrate(model, layers, ctx)[0]
            else:
                stats.update(smooth_mod.smoothed_stats(model.graph, kept))
        del kept  # the kept activations (up to KEEP_BYTES) are not needed past here: not held through the search
        release(model.graph)  # the calibration read every weight: their pages go (:mod:`.resident`)
        result.metrics["seconds_calibration"] = time.perf_counter() - start  # the plan's time added next
        try:
            return self._quantize(model, ctx, result, layers, stats, unsmoothed, per_channel, fid, ladder)
        finally:
            smooth_mod.realize(model.graph)  # smoothed weights still read (a layer kept float) get arrays

    def _quantize(self, model, ctx, result, layers, stats, unsmoothed, per_channel, fid, ladder) -> PassResult:
        """Steps 6–10 on the calibrated (and smoothed) model."""
        opts = ctx.options
        start = time.perf_counter()
        plan = self._plan(model, layers, stats, opts, per_channel, result)
        result.metrics["seconds_calibration"] = round(result.metrics.pop("seconds_calibration")
                                                      + time.perf_counter() - start, 2)
        for spec in plan.layers:
            spec.unsmoothed = unsmoothed.get(spec.name)
        learned = self._adaround(model, plan, ctx, result) if opts["rounding"] == "adaround" else {}
        start = time.perf_counter()
        sensitivity = None
        searched = opts["fallback"] and fid.target.metric != "none"
        if opts["bias_correction"] and any(s.op in ("Conv", "Gemm") and s.weight_index is not None
                                           for s in plan.layers):  # else nothing to correct (MatMul: no bias)
            mode, by_size = sensitivity_mode(model, plan, opts)
            local = searched and mode != "e2e" and not by_size  # else no ranking reads it now
            plan.bias_shift, sensitivity = measure_twins(trial_copy(model), plan, self._eval_samples(ctx),
                                                         local=local)
            sensitivity = sensitivity if local else None
            release(model.graph, plan)
            result.metrics["bias_corrected"] = len(plan.bias_shift)
            result.metrics["seconds_bias_correction"] = round(time.perf_counter() - start, 2)
            adaround_mod.store(model, plan, learned)  # the learned codes under the bias-corrected encodings
        fixed = self._grouped(model, plan, opts["grouped"], result)
        speed = result.metrics["speed"] = speed_decision.resolved_speed(opts)
        slow = speed_decision.before_search(model, plan, fixed, speed, ctx, result)  # the search holds them float
        fixed.update(slow)
        enabled = {spec.name for spec in plan.layers} - set(fixed)
        rungs = self._rungs(plan, ladder)
        result.metrics["target"] = str(fid.target)
        if searched and enabled:
            start = time.perf_counter()
            enabled, rungs = self._fallback(model, plan, enabled, rungs, fid, ctx, result, sensitivity, fixed)
            result.metrics["seconds_fallback"] = round(time.perf_counter() - start, 2)
        else:
            rungs = {}
        rungs.update({name: rung for name, rung in fixed.items() if rung in RUNGS})
        if speed_decision.kept_float(model, plan, enabled, rungs, slow, speed, ctx, result):
            return result
        release(model.graph, plan)
        apply_plan(model, plan, enabled, result, rungs)
        if opts["io"] != "float" and enabled:
            make_integer_io(model, opts["io"], stats, lambda s: calib.clip_range(s, opts["method"], opts["percentile"]),
                            result)
        result.metrics["layers_int8"] = len(enabled)
        result.metrics["layers_float"] = len(plan.layers) - len(enabled) - len(rungs)
        self._store_body_weights(model, ctx, fid, result)
        return result

    def _adaround(self, model, plan, ctx, result) -> dict:
        """Learned rounding of the static weights (:mod:`onnxslim_kit.passes.int8.adaround`) on
        the first fit samples, stored in ``plan.encodings`` (the twins of the
        bias correction and of the sensitivity ranking, the trials and the output use them)."""
        start = time.perf_counter()
        n = ctx.options["calib_samples"]
        samples = ctx.feed.take(min(n, adaround_mod.SAMPLES) if n > 0 else adaround_mod.SAMPLES)
        learned = adaround_mod.adaround(model, plan, samples, result,
                                        iters=max(1, ctx.options["adaround_iters"]), progress=ctx.progress)
        adaround_mod.store(model, plan, learned)
        result.metrics["seconds_adaround"] = round(time.perf_counter() - start, 2)
        return learned

    def _store_body_weights(self, model, ctx, fid, result) -> None:
        """If/Loop/Scan body weights stored int8, float compute (:mod:`onnxslim_kit.passes.int8.bodies`), kept
        only when the whole model still meets the target."""
        if not ctx.options["bodies"]:
            return
        trial = PassResult()
        undo = store_body_weights(model, trial)
        if undo and fid.target.metric != "none":
            verdict = Scorer(fid)(model.to_proto()).verdict
            if not fid.met(verdict):
                restore_body_weights(undo)
                result.skip(f"body weights kept float: int8 storage uses {verdict.used * 100:.3g}% of the "
                            f"{fid.target} budget ({verdict.binding}; {fid.allowed * 100:.3g}% allowed)", len(undo))
                return
        for label, count in trial.rewrites.items():
            result.rewrite(label, count)

    # --- steps ---------------------------------------------------------------------------
    def _prepare_opset(self, model, per_channel: bool, result):
        """Per-channel flag to use, upgrading the opset when needed; None: cannot quantize."""
        if model.opset >= 13:
            return per_channel
        if not per_channel and model.opset >= 10:
            return False
        upgraded = upgrade_opset(model, 13)
        if upgraded is not None:
            result.notes.append(f"opset {model.opset} upgraded to 13 for per-channel DequantizeLinear")
            result.rewrite("opset→13")
            model.graph = upgraded
            model.commit()
            return per_channel
        if model.opset >= 10:
            result.notes.append(f"opset {model.opset} could not be upgraded: per-tensor weight scales")
            return False
        result.skip("opset < 10 and the upgrade to 13 failed")
        return None

    def _layers(self, model, ctx, result) -> list:
        """The layers of the main graph after include / exclude / the global --exclude
        (unnamed nodes get names first, so that selectors and reports can name them)."""
        for node in model.graph.nodes:
            if not node.name:
                node.name = model.fresh_name(f"int8/{node.op}")
        layers = plan_mod.find_layers(model.graph, result)
        keep = self._selected(model.graph, layers, ctx, result)
        return [l for l in layers if l.name in keep]

    @staticmethod
    def _selected(graph, layers, ctx, result) -> set:
        """Names of the ``layers`` left after the selectors (:mod:`onnxslim_kit.selection`,
        chosen among the layers: ``first:Conv:1`` is the first Conv *layer*). The pass's own
        ``include`` / ``exclude`` must each match a node; the global ``--exclude`` may not
        (earlier passes renamed or removed nodes)."""
        opts = ctx.options
        include = Selector.coerce(opts["include"], "int8(include=...)")
        exclude = Selector.coerce(opts["exclude"], "int8(exclude=...)")
        nodes = [l.node for l in layers]
        keep = {l.name for l in layers}
        if include:
            keep &= include.select(graph, "int8(include=...)", must_match=True, among=nodes)
        keep -= exclude.select(graph, "int8(exclude=...)", must_match=True, among=nodes)
        result.skip("excluded by include/exclude", len(layers) - len(keep))
        glob = getattr(ctx, "exclude", Selector.EMPTY) or Selector.EMPTY
        globally = glob.select(graph, "--exclude", must_match=False, among=nodes) & keep
        result.skip("excluded by --exclude", len(globally))
        return keep - globally

    def _calibrate(self, model, layers, ctx, smoothable=()) -> tuple:
        """(statistics of every Q point, per-channel peaks of the ``smoothable`` tensors, those
        tensors' arrays per sample or None past ``KEEP_BYTES``) from one run over the samples.

        SmoothQuant needs the peaks before it can rewrite, and the rewritten inputs
        ``X' = X · (1/s)`` need statistics: kept, ``X`` gives them exactly without a second
        run (:func:`._quant_smooth.smoothed_stats`)."""
        opts = ctx.options
        tensors = {t.name for l in layers for t in l.inputs + [l.output]}
        tensors |= {t.name for t in plan_mod.concat_inputs(layers)}
        tensors |= set(plan_mod.pool_inputs(model.graph, layers))
        if opts["io"] != "float":
            tensors |= {t.name for t in model.graph.outputs}
        names = sorted(tensors | set(smoothable))
        collector = calib.StatsCollector(sorted(tensors), binned=opts["method"] != "minmax")
        peaks, kept, size = {}, {name: [] for name in smoothable}, 0
        groups = calibration_groups(model, names, ctx.feed.take(1)[0])
        total = opts["calib_samples"] * len(groups) or None
        # every core, as quantize_static's calibration: ORT's CPU kernels split work by output
        # blocks, so the activations are bitwise those of one thread (checked on PP-OCRv4 det)
        runs = group_activations(model, groups, calib_samples(ctx), threads=0)  # every tensor: the samples in order
        for acts in ctx.progress(runs, desc="int8 calibration", total=total):
            smoothed = [name for name in smoothable if name in acts]
            collector.update(acts)
            smooth_mod.update_peaks(peaks, acts, smoothed)
            if kept is not None:
                size += sum(acts[name].nbytes for name in smoothed)
                if size > KEEP_BYTES:
                    kept = None
                else:
                    for name in smoothed:
                        kept[name].append(acts[name])  # ORT's own arrays: never reused, no copy needed
            acts.clear()  # frees this sample's tensors before the next run (half the peak memory)
        return collector.stats, peaks, kept

    def _plan(self, model, layers, stats, opts, per_channel, result) -> Plan:
        guards = plan_mod.Guards(opts["max_range"], opts["heads"], opts["log"], opts["concat_ratio"])
        float_reasons = plan_mod.float_tensors(model.graph, layers, stats, guards)
        specs, params = [], {}
        for layer in layers:
            blocked = [float_reasons[t.name] for t in layer.inputs + [layer.output]
                       if t.name in float_reasons and (t in layer.inputs or layer.node.op == "Gather")]
            if blocked:
                result.skip(f"{layer.node.op} kept float: {'output' if layer.node.op == 'Gather' else 'input'} "
                            f"{blocked[0]}")
                continue
            if layer.output.name in float_reasons:
                result.skip(f"output left float: {float_reasons[layer.output.name]}")
            for t in layer.inputs + [layer.output]:
                if t.name not in float_reasons and t.name not in params:
                    lo, hi = calib.clip_range(stats[t.name], opts["method"], opts["percentile"])
                    params[t.name] = activation_params(lo, hi, opts["activations"])
            if layer.node.op == "Gather":  # the output Q repeats the table's encoding (uint8: ORT turns
                table = layer.node.inputs[0].values  # int8 activation Q/DQ into uint8 on x86)
                params[layer.output.name] = activation_params(float(table.min()), float(table.max()), "uint8")
            bias_index = 2 if layer.bias is not None else None
            specs.append(LayerSpec(layer.name, layer.node.op, [t.name for t in layer.inputs], layer.output.name,
                                   layer.weight_index, layer.weight_axis, bias_index))
        return Plan(specs, params, per_channel, encodings=ScratchEncodings(on_store=lambda: release(model.graph)),
                    pooled=self._pooled(model.graph, layers, stats, opts, params))

    @staticmethod
    def _pooled(graph, layers, stats, opts, params) -> dict:
        """The squeeze-excite pool inputs (:func:`.plan.pool_inputs`) that get a Q point, their
        parameters added to ``params``: calibrated, within ``max_range``, the pooled tensor itself
        quantized."""
        pooled = {}
        for name, out in plan_mod.pool_inputs(graph, layers).items():
            s = stats.get(name)
            if out not in params or s is None or not s.count or opts["max_range"] and s.absmax > opts["max_range"]:
                continue
            lo, hi = calib.clip_range(s, opts["method"], opts["percentile"])
            params[name] = activation_params(lo, hi, opts["activations"])
            pooled[name] = out
        return pooled

    @staticmethod
    def _rungs(plan, ladder: list) -> dict:
        """``{layer: the rungs of the ladder it can take, in ladder order}`` (layers with one)."""
        out = {}
        for spec in plan.layers:
            rungs = [r for r in ladder if r in rungs_of(spec)]
            if rungs:
                out[spec.name] = rungs
        return out

    @staticmethod
    def _eval_samples(ctx) -> list:
        return ctx.feed.take(max(1, ctx.options["eval_samples"]))

    @staticmethod
    def _grouped(model, plan, choice: str, result) -> dict:
        """``{layer: "weights" | "float"}`` for the depthwise / grouped Convs under ``grouped``
        (none for ``int8``). ``grouped=weights`` measured (ORT 1.32, 1 thread, latency vs
        float, ``benchmarks/results/int8-2026-11-29-s3-grouped.md``): ppocr_cls_v2 1.39× → 1.04×,
        orientation 1.00× → 0.91×, PP-OCRv4 det 0.68× → 0.64×, but PP-OCRv4 rec 0.63× → 0.79×:
        with its depthwise convs float-computed the target needed 18 more layers in float (not
        understood yet), so it is not the default."""
        if choice == "int8":
            return {}
        nodes = {node.name: node for node in model.graph.nodes}
        fixed = {spec.name: choice for spec in plan.layers
                 if spec.op == "Conv" and spec.name in nodes and int(attr(nodes[spec.name], "group", 1)) > 1}
        result.skip(f"grouped Conv on the {choice} rung (grouped={choice})" if choice == "weights"
                    else "grouped Conv kept float (grouped=float)", len(fixed))
        return fixed

    def _fallback(self, model, plan, enabled, rungs, fid, ctx, result, sensitivity, fixed=None) -> tuple:
        """(layers left static int8, ``{layer: rung}`` of the layers on a ladder rung): the
        smallest fallback whose verdict on ``fid``'s held-out samples uses at most
        ``fid.allowed`` of the budget (:func:`.ladder.choose_fallback`), the layers of
        ``fixed`` (``{layer: choice}``) held at their choice."""
        fixed = fixed or {}
        shared = SharedWeights(model.graph)
        scorer = Scorer(fid, shared, kernels=trials_on_kernels(model, plan, fid.samples))

        def build(assign: dict):
            collect_trials()
            release(model.graph, plan)  # what the last trial's session read
            trial = trial_copy(model)
            assign = {**assign, **fixed}
            apply_plan(trial, plan, {n for n, c in assign.items() if c == "int8"},
                       fallback={n: c for n, c in assign.items() if c in RUNGS})
            release(model.graph)  # the float weights the new encodings were made from
            shared.strip(trial.graph)
            return trial.to_proto()  # ORT sorts the nodes itself; no commit needed

        names = [spec.name for spec in plan.layers if spec.name not in fixed]
        mode, by_size = sensitivity_mode(model, plan, ctx.options)
        local = None if mode == "e2e" else (  # measured with the bias correction, or now
            lambda: sensitivity or measure_twins(trial_copy(model), plan, self._eval_samples(ctx), correct=False,
                                                 before_run=(lambda g: unsmoothed_round(g, model, plan))
                                                 if by_size else None, rounds=TWIN_ROUNDS if by_size else 1)[1])
        ranker = scorer.head(max(1, ctx.options["rank_samples"]), ranking_fidelity(fid))
        refine = ctx.options["refine"] if mode == "hybrid" else 0

        def gated(todo: list) -> dict:
            """End-to-end sensitivities from one session (:func:`._quant_qdq.add_gated_twins`)."""
            collect_trials()
            release(model.graph, plan)
            trial = trial_copy(model)
            every = add_gated_twins(trial, plan)  # every layer's switch is a session input
            gates = {n: g for n, g in every.items() if n in todo}
            unsmooth_float_path(trial.graph, plan)
            shared.strip(trial.graph)
            ranker.builds += 1
            session = shared.session(trial.to_proto(), prepack=False, threads=ranker.threads)
            off = {g: np.array(False) for g in every.values()}
            return {n: float(ranker.score_session(session, extra={**off, g: np.array(True)}))
                    for n, g in ctx.progress(gates.items(), desc="int8 sensitivity", total=len(gates))}

        ranking = []  # ranked once: a second search (on the kernels' verdict) reuses it

        def search(allowed: float) -> tuple:
            with search_scope():
                return choose_fallback(names, build, scorer, allowed, rungs, ctx.progress, ctx.log, local, ranker,
                                       refine, gated if ctx.options["gated_ranking"] and mode == "e2e" else None,
                                       ranking)

        chosen, score, _ = search(fid.allowed)
        chosen, score = on_kernels(model, plan, chosen, score, fixed, scorer, fid, result, search)
        on_rung = {n: c for n, c in chosen.items() if c in RUNGS}
        float_layers = [n for n, c in chosen.items() if c == "float"]
        result.metrics["sensitivity"] = mode
        result.skip("kept float for the fidelity target", len(float_layers))
        self._report_fidelity(result, fid, getattr(score, "verdict", None) or fid.judge(fid.reference))
        result.metrics["fallback_builds"] = scorer.builds + ranker.builds
        result.metrics["fallback_runs"] = scorer.runs + ranker.runs
        for rung in RUNGS:
            result.metrics[f"layers_{rung}"] = sum(c == rung for c in on_rung.values())
        for what, names_ in (("on a fallback rung", list(on_rung)), ("float", float_layers)):
            if names_:
                result.notes.append(f"{what} for the target: " + ", ".join(names_[:8])
                                    + (" …" if len(names_) > 8 else ""))
        return {n for n, c in chosen.items() if c == "int8"}, on_rung

    @staticmethod
    def _report_fidelity(result, fid, verdict) -> None:
        """The verdict of the chosen fallback in the metrics and a note (what binds, on what)."""
        result.metrics["budget_used"] = round(verdict.used, 4)
        result.metrics["budget_allowed"] = round(fid.allowed, 4)
        result.notes.append(f"fallback judged on {verdict.samples} {fid.judged_on or 'samples'}: {verdict.binding} "
                            f"binds, {verdict.used * 100:.3g}% of the {fid.target} budget "
                            f"({fid.allowed * 100:.3g}% allowed)")
