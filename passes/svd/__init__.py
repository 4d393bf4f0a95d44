"""``svd`` — low-rank factorisation of MatMul / Gemm / Conv weights.

A layer ``Y = X W`` (``W``: ``k × n``; a Conv's ``k`` is ``C·kh·kw`` over im2col rows) becomes
``Y = (X A) B`` with ``A``: ``k × r``, ``B``: ``r × n`` — two MatMuls, or for a Conv a Conv with
``r`` filters and the original attributes followed by a 1×1 Conv (:mod:`onnxslim_kit.passes.svd.rewrite`) — the
simplest exact spatial decomposition of a k×k Conv; a 1×1 Conv is the special case kh = kw = 1.
A k×k Conv may instead become a kh×1 Conv with ``r`` filters then a 1×kw Conv
(:mod:`onnxslim_kit.passes.svd.maths.spatial`; ``spatial=separable``, or ``auto``: whichever needs fewer FLOPs at the
rank its rule asks for; ``kxk``: never).
``A, B`` come from
:mod:`onnxslim_kit.passes.svd.maths.factor` (plain SVD, or whitened by the input Gram matrix from :mod:`onnxslim_kit.passes._common.layer_stats`).

Which layers (:mod:`onnxslim_kit.selection`): ``include`` (default ``op:MatMul;op:Gemm;op:Conv``)
minus ``exclude`` and the global ``--exclude`` (both counted skips); a term of ``include`` /
``exclude`` that matches no node is an error.

Conditions (each failure is a counted reason):

1. the weight is a float constant read by this node alone; MatMul has it on the right, 2-D,
   or 3-D ``[heads, k, n]`` (batched: every head factorised, plain SVD, one common rank — the
   largest any head needs — so ``A``: ``[heads, k, r]``, ``B``: ``[heads, r, n]`` keep MatMul's
   broadcasting); Gemm has ``transA = 0``; Conv is 2-D, ``group = 1``;
2. the node is in the main graph (subgraph activations cannot be observed);
3. unless ``force``: the chosen rank pays off, ``r (k + n) < k n``, and the factorised layer is
   faster (:mod:`onnxslim_kit.passes.svd.speed`: measured in ORT for small shapes, FLOPs for large ones).

Rank: ``rank`` (−1 = full), ``ratio``, ``energy`` or, by default, ``cosine``: the smallest rank
whose estimated per-layer output cosine ``√(kept energy)`` reaches it (0.999). Data: ``auto``
uses the whitened (data-aware) factorisation when calibration data was given (``--calib``), and
the plain SVD when the feed is generated random data — statistics of random inputs are not
those of real ones, and the plain SVD is the whitened one for white inputs. A layer whose input
was seen on fewer than ``2·k`` rows (e.g. an SE block after global pooling: one row per
sample) gets the plain SVD too: its Gram matrix is (nearly) rank-deficient and a rank fitted
to it would not generalise. The notes say which was used.

Allocation (``alloc``; :mod:`onnxslim_kit.passes.svd.alloc`): by default, when the calibration data allow a
held-out check (data-aware, ≥ 16 samples), a target is set and no rank/ratio/energy rule is
given, the per-layer cosine rule is replaced by one budget for the whole model: each layer's
end-to-end loss per rank is estimated (``alloc=spectrum``: the layer's own output error read
off the whitened spectrum, cross-fitted on the two halves of the statistics, times one
measured transfer factor per layer — one ONNX Runtime trial per layer), then the
largest-saving allocation whose measured output cosine on the held-out samples holds
``target``. ``alloc=sensitivity`` measures every layer at every grid rank instead (cross-fitted,
8 ranks × 12 runs per layer: 11 minutes on MiniLM-L6). Layers whose every grid rank would be
slower are left out beforehand (:mod:`onnxslim_kit.passes.svd.speed`); the notes list each layer's losses per
rank and its rank. ``alloc=layer`` keeps the per-layer rule below.

Statistics need many more rows than input dimensions: with 32 calibration sentences (428
tokens for 384/1536-dim inputs) whitened factors and rank choices over-fit (an allocation
fitted in-sample removed 32 % of MiniLM's weight-MatMul FLOPs at cosine 0.992 on its own
sentences, 0.58 on others; ``benchmarks/results/svd-2026-11-29-s2*.md``). Measured with 2000+
calibration sentences (``benchmarks/measure_svd.py``, WordNet usage examples from
``benchmarks/build_svd_calib.py``; ``benchmarks/results/svd-2026-11-29-s3*.md``) the choices
carry over to other sentences, but the trade-off itself is poor: default ``svd`` with 2000
WordNet sentences (25 360 real tokens) removes 3.5 % of the weight-MatMul FLOPs, held-out check
0.9916, worst sentence-embedding cosine 0.985 on the benchmark's evaluation sentences, in 56 s
(``target=0.95``: 11.3 %, 0.940); the study's curve gives ~1.5 % at 0.99 and 28 % at 0.77, and
the session-2 "32 % at 0.993" was an in-sample fit (0.61 on other sentences). With the 32
sentences of session 2 the default takes 30 s (was 656 s) and factorises nothing. The pass runs
BLAS on one thread (:func:`onnxslim_kit.passes._common.blas.blas_threads`). ``mask=<input>`` (e.g. ``attention_mask``)
leaves padding rows out of the statistics; calibration samples of their own length need none.

End-to-end target (``target``, default 0.99; 0 turns it off; ignored with ``force``): per-layer
budgets do not bound the output error, so the pass measures the model's output cosine on 8
calibration samples and keeps only the longest damage-ordered prefix of the planned
factorisations that holds the target (:mod:`onnxslim_kit.passes.svd.select`). With at least 16 calibration
samples the last ``n // 16`` (8 … 64) are held out of the statistics and used for this check (an in-sample check
was optimistic: MiniLM, one factorised layer, 0.994 in-sample vs 0.971 on other sentences). ``force=true, rank=-1`` is
lossless (``A B = W``) and is declared so.
"""

from __future__ import annotations

from dataclasses import dataclass

from onnxslim_kit.api import Option, Pass, PassResult, exclusions, register_pass
from onnxslim_kit.selection import SYNTAX, Selector

from onnxslim_kit.passes._common.blas import blas_threads
from onnxslim_kit.passes._common.layer_stats import collect, match_layer
from onnxslim_kit.passes.svd.budget import allocate
from onnxslim_kit.passes.svd.plan import Plan, plan_layer
from onnxslim_kit.passes.svd.rewrite import apply
from onnxslim_kit.passes.svd.select import select
from onnxslim_kit.passes.svd.speed import flops

__all__ = ["Plan", "SvdPass"]

MAX_NOTE_LAYERS = 40
TARGET_SAMPLES = 8
MAX_CHECK_SAMPLES = 64  # held out for the end-to-end check: n // CHECK_SHARE of n samples, 8 … 64
CHECK_SHARE = 16
DEFAULT_INCLUDE = "op:MatMul;op:Gemm;op:Conv"


@dataclass
class _Data:
    """The calibration samples the statistics are fitted on, and those the target is checked on."""

    aware: bool  # whitened (data-aware) factorisation
    samples: list
    check: list
    held_out: bool  # ``check`` was held out of ``samples``


@register_pass
class SvdPass(Pass):
    name = "svd"
    summary = "low-rank factorisation of MatMul/Gemm/Conv weights (data-aware with --calib)"
    lossless = False
    options = {
        "rank": Option(int, 0, "fixed rank per layer (-1: full rank, only useful with force)"),
        "ratio": Option(float, 0.0, "keep this fraction of each layer's parameters"),
        "energy": Option(float, 0.0, "keep this fraction of singular-value energy"),
        "cosine": Option(float, 0.999, "per-layer output cosine target (the default rule)"),
        "target": Option(float, 0.99, "end-to-end output cosine to hold on calibration data (0: off)"),
        "data": Option(str, "auto", "whiten with calibration statistics", ("auto", "true", "false")),
        "force": Option(bool, False, "factorise even when it does not pay off (tests, experiments)"),
        "measure": Option(bool, True, "time small layers in ORT and skip those that get slower"),
        "include": Option(str, DEFAULT_INCLUDE, f"only these layers (a selector: {SYNTAX})",
                          parse=Selector.parse),
        "exclude": Option(str, "", "layers left as they are (a selector, as include); the global --exclude too", parse=Selector.parse),
        "alloc": Option(str, "auto", "rank allocation: spectrum (per-layer loss from the whitened spectrum × "
                                     "one measured transfer factor, one global budget), sensitivity (loss "
                                     "measured per layer and rank: slow), layer (each layer's own rule); auto: "
                                     "spectrum with calibration data and a target unless rank/ratio/energy is set",
                        ("auto", "spectrum", "sensitivity", "layer")),
        "mask": Option(str, "", "input marking padding (e.g. attention_mask): statistics use only rows where "
                                "it is non-zero"),
        "spatial": Option(str, "auto", "k×k Conv: kxk (r k×k filters + 1×1), separable (k×1 + 1×k) or the "
                                       "cheaper of the two", ("auto", "kxk", "separable")),
    }
    renamed = {"ops": f"include={DEFAULT_INCLUDE} (a selector; e.g. include=op:MatMul)"}

    def is_lossless(self, options: dict) -> bool:
        return bool(options.get("force")) and options.get("rank") == -1

    def run(self, model, ctx) -> PassResult:
        with blas_threads(1):
            return self._run(model, ctx)

    def _run(self, model, ctx) -> PassResult:
        result = PassResult()
        opts = ctx.options
        layers = _layers(model, ctx, result)
        if not layers:
            return result
        data = _data(ctx)
        stats = collect(model.to_proto(), layers, data.samples, want_gram=data.aware, mask=opts["mask"])
        where = "held-out calibration samples" if data.held_out else "calibration samples"
        alloc = self._use_alloc(opts, data.held_out)
        if alloc:
            kept, measured, lines = allocate(model, ctx, layers, stats, data.samples, data.check, result)
        else:
            kept, measured, lines = self._per_layer(model, ctx, layers, stats, data, result)
        self._report(result, layers, stats, kept, opts, data.aware, len(data.samples), (measured, where), lines,
                     alloc=alloc)
        return result

    def _per_layer(self, model, ctx, layers, stats, data: _Data, result) -> tuple:
        """Each layer's own rule (:mod:`onnxslim_kit.passes.svd.plan`), then the target's prefix:
        ``(kept plans, measured cosine or None, notes)``."""
        plans, lines = [], []
        for layer in ctx.progress(layers, desc="svd", total=len(layers)):
            plan, line = plan_layer(layer, stats[layer.key], ctx.options, data.aware, result)
            lines.append(line)
            if plan is not None:
                plans.append(plan)
        kept, measured = self._choose(model, data.check, plans, ctx.options)
        for plan in kept:
            kind = "conv (k×1, 1×k)" if plan.mode == "separable" else plan.layer.kind
            result.rewrite(f"{kind} → 2 × {'conv' if plan.layer.kind == 'conv' else 'matmul'}")
        result.skip("dropped to hold the output target", len(plans) - len(kept))
        return kept, measured, lines

    @staticmethod
    def _use_alloc(opts, held_out: bool) -> bool:
        """Sensitivity allocation: asked for, or (auto) with a held-out target check (data-aware,
        at least 2·TARGET_SAMPLES calibration samples) and no explicit rank rule."""
        if opts["alloc"] == "auto":
            return (held_out and bool(opts["target"]) and not opts["force"]
                    and not (opts["rank"] or opts["ratio"] or opts["energy"]))
        return opts["alloc"] in ("spectrum", "sensitivity")

    def _choose(self, model, check: list, plans: list, opts) -> tuple:
        """The plans to apply (applied on return) and the measured output cosine (or None)."""
        if opts["force"] or not opts["target"] or not plans:
            for plan in plans:
                apply(model, plan.layer, plan.a, plan.b, plan.mode)
            return plans, None
        return select(model, plans, check, opts["target"])

    def _report(self, result, layers, stats, kept, opts, data_aware, n_samples, measured, lines,
                alloc: bool = False) -> None:
        applied = {id(p.layer): p for p in kept}
        totals = {"flops_before": 0, "flops_after": 0, "params_before": 0, "params_after": 0}
        for layer in layers:
            plan, before = applied.get(id(layer)), flops(stats[layer.key].rows_per_sample, layer.k, layer.n)
            totals["flops_before"] += before
            totals["flops_after"] += plan.flops_after if plan else before
            totals["params_before"] += layer.k * layer.n * layer.heads
            totals["params_after"] += plan.params_after if plan else layer.k * layer.n * layer.heads
        result.metrics.update(totals)
        if totals["flops_before"]:
            result.metrics["flops_removed"] = round(1 - totals["flops_after"] / totals["flops_before"], 4)
        measured, where = measured
        if measured is not None:
            result.metrics["target_cosine_measured"] = round(measured, 6)
        mode = (f"data-aware (inputs whitened with {n_samples} calibration samples)" if data_aware
                else "plain SVD (no calibration data given: weights only, exact for white inputs)")
        held = (f"; kept {len(kept)} of the planned rewrites to hold output cosine ≥ {opts['target']} "
                f"(measured {measured:.5f} on {where})" if measured is not None else "")
        result.notes.append(f"{mode}; rank by {self._rule(opts, alloc)}{held}; FLOPs of the candidate layers "
                            f"{totals['flops_before']:.3g} → {totals['flops_after']:.3g}")
        result.notes.extend(lines[:MAX_NOTE_LAYERS])
        if len(lines) > MAX_NOTE_LAYERS:
            result.notes.append(f"… {len(lines) - MAX_NOTE_LAYERS} more layers")

    @staticmethod
    def _rule(opts, alloc: bool = False) -> str:
        if alloc and opts["alloc"] == "sensitivity":
            return (f"measured sensitivity (cross-fitted 1 − cos per layer and rank, one budget for the model: "
                    f"largest saving holding output cosine ≥ {opts['target']})")
        if alloc:
            return (f"spectrum sensitivity (cross-fitted layer error × one measured transfer factor per layer, "
                    f"one budget for the model: largest saving holding output cosine ≥ {opts['target']})")
        for key in ("rank", "ratio", "energy"):
            if opts[key]:
                return f"{key}={opts[key]}"
        return f"per-layer output cosine ≥ {opts['cosine']} (kept energy ≥ {opts['cosine'] ** 2:.6f})"


def _layers(model, ctx, result: PassResult) -> list:
    """The matched layers ``include`` selects, less those ``exclude`` and the global
    ``--exclude`` select (counted); every candidate's reason not to apply is counted."""
    included, excluded = _selection(model, ctx)
    layers = []
    for graph in model.all_graphs():
        for node in graph.nodes:
            found = match_layer(node, graph, model.graph)
            if found.counted:
                result.skip(found.reason)
            elif found.ok and id(node) in included:
                if id(node) in excluded:
                    result.skip(excluded[id(node)])
                else:
                    layers.append(found.value)
    return layers


def _selection(model, ctx) -> tuple:
    """``id`` of the main-graph nodes ``include`` selects (as given: must match; the default:
    terms matching nothing ignored), and ``id`` → skip reason of those ``exclude`` (must match)
    and the global ``--exclude`` select (:func:`onnxslim_kit.selection.exclusions`)."""
    opts = ctx.options
    include = Selector.coerce(opts["include"], "svd(include=...)")
    given = str(include) != DEFAULT_INCLUDE  # the default need not match
    included = {id(node) for node in include.nodes(model.graph, "svd(include=...)", must_match=given)}
    return included, exclusions(model.graph, opts["exclude"], getattr(ctx, "exclude", None), "svd(exclude=...)")


def _data(ctx) -> _Data:
    """Data-aware with real calibration data (``data=auto``) or ``data=true``; with at least
    ``2·TARGET_SAMPLES`` samples the last ``n // CHECK_SHARE`` (8 … 64) are held out for the check."""
    opts = ctx.options
    aware = opts["data"] == "true" or (opts["data"] == "auto" and not getattr(ctx.feed, "generated", True))
    samples = list(ctx.feed) if aware else ctx.feed.take(1)
    check = ctx.feed.take(TARGET_SAMPLES)
    held_out = aware and bool(opts["target"]) and len(samples) >= 2 * TARGET_SAMPLES
    if held_out:  # the end-to-end check runs on samples the factors were not fitted on
        n_check = min(max(TARGET_SAMPLES, len(samples) // CHECK_SHARE), MAX_CHECK_SAMPLES)
        samples, check = samples[:-n_check], samples[-n_check:]
    return _Data(aware, samples, check, held_out)
