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

Allocation (``alloc``; :mod:`onnxslim_kit.passes.svd.alloc`): by default, when the pass is
data-aware with at least ``MIN_ALLOC_SAMPLES`` (12) samples to fit — 16 calibration samples, of
which the pipeline holds out 4 — a target is set and no rank/ratio/energy rule is given, the
per-layer cosine rule is replaced by one budget for the whole model: each layer's end-to-end
loss per rank is estimated (``alloc=spectrum``: the layer's own output error read off the
whitened spectrum, cross-fitted on the two halves of the statistics, times one measured transfer
factor per layer — one ONNX Runtime trial per layer), then the largest-saving allocation the
target accepts on the held-out samples (``alloc=spectrum|sensitivity`` with ``target=none``:
the largest-saving allocation, unjudged). ``alloc=sensitivity`` measures every layer at every
grid rank instead (cross-fitted, 8 ranks × 12 runs per layer: 11 minutes on MiniLM-L6). Layers
whose every grid rank would be slower are left out beforehand
(:mod:`onnxslim_kit.passes.svd.speed`); the notes list each layer's losses per rank and its
rank. ``alloc=layer`` keeps the per-layer rule below.

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
sentences of session 2 the default takes 30 s (was 656 s) and factorises nothing. Memory: the statistics are collected a group of
layers at a time and their Gram matrices dropped once the group is decided
(:mod:`onnxslim_kit.passes.svd.stream`; layers too short of rows to whiten need none), and an
allocation candidate keeps its full-rank factors and error curve, not its statistics — on a
118.6 MB decoder (2 layers, 1024 / 4096 wide, 4 calibration samples) the pass's peak RSS went
from 1415 MB to 451 MB. The pass runs
BLAS on one thread (:func:`onnxslim_kit.passes._common.blas.blas_threads`). ``mask=<input>`` (e.g. ``attention_mask``)
leaves padding rows out of the statistics; calibration samples of their own length need none.

End-to-end target (``target``: the fidelity contract, :mod:`onnxslim_kit.fidelity`; default the
pipeline's ``--target`` share, ``cos:0.99`` for a pass run alone; ``cos:V`` / ``top1:V`` /
``rel:V`` for its own, a bare number reads as ``cos:V``; ``none`` or the older ``0`` turn it off;
ignored with ``force``): per-layer budgets do not bound the output error, so the pass judges the
candidate model on the pipeline's judged samples — each output view (a concatenated head's
branches, Softmax/Sigmoid decisions) on its own, against the original — and keeps only the
longest damage-ordered prefix of the planned factorisations (or, with ``alloc``, the
largest-saving allocation) whose budget fraction stays within this pass's share
(:mod:`onnxslim_kit.passes.svd.select`). The pass fits its statistics on ``ctx.feed`` only: the
pipeline holds one calibration sample in four out of it for judging (or uses ``--eval``), which
replaces the pass's own held-out split of earlier sessions (the last ``n // 16`` samples) — an
in-sample check was optimistic: MiniLM, one factorised layer, 0.994 in-sample vs 0.971 on other
sentences. Measured 2026-12-02 on MTCNN O-Net (``fuse,svd``, 32 calibration / 16 evaluation crops
of ``benchmarks/inputs.py``): with the pass's own split (the last 8 held out) and a worst cosine
over whole outputs, 1.3 % of the FLOPs, 0.566× the file, but evaluation cosine 0.965 on the box
regression output ``dense_5``; judged on the pipeline's 8 held-out crops per view, 0.6 %,
0.811×, judged 0.99627 and evaluation 0.99679 (``dense_5`` binds; face decisions the same in
both). ``force=true, rank=-1`` is lossless (``A B = W``) and is declared so.
"""

from __future__ import annotations

from dataclasses import dataclass

from onnxslim_kit.api import Option, Pass, PassResult, check_target, exclusions, pass_fidelity, register_pass
from onnxslim_kit.selection import SYNTAX, Selector

from onnxslim_kit.passes._common.blas import blas_threads
from onnxslim_kit.passes._common.layer_stats import match_layer
from onnxslim_kit.passes.svd.budget import allocate
from onnxslim_kit.passes.svd.plan import Plan, plan_layer
from onnxslim_kit.passes.svd.rewrite import apply
from onnxslim_kit.passes.svd.select import select
from onnxslim_kit.passes.svd.speed import flops
from onnxslim_kit.passes.svd.stream import groups, release

__all__ = ["Plan", "SvdPass"]

MAX_NOTE_LAYERS = 40
MIN_ALLOC_SAMPLES = 12  # fit samples alloc=auto needs (two halves of 6 for the cross-fitting)
DEFAULT_INCLUDE = "op:MatMul;op:Gemm;op:Conv"


@dataclass
class _Data:
    """The calibration samples the statistics are fitted on (the pipeline's fit part)."""

    aware: bool  # whitened (data-aware) factorisation
    samples: list


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
        "target": Option(str, "", "fidelity target (cos:V, top1:V, rel:V, none; a bare number: cos:V; 0: "
                                  "none) held end to end on the judged samples; default: the pipeline's "
                                  "--target share", parse=check_target),
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
        fid = _fidelity(ctx)
        alloc = self._use_alloc(opts, data, fid)
        proto = model.to_proto()
        stats = {}
        parts = _recording(groups(proto, layers, data.samples, data.aware, opts["mask"], need_all=alloc), stats)
        del proto  # the groups generator holds its own reference while it runs
        if alloc:
            kept, verdict, lines = allocate(model, ctx, parts, stats, data.samples, fid, result)
        else:
            kept, verdict, lines = self._per_layer(model, ctx, parts, data, fid, result)
        self._report(result, layers, stats, kept, opts, data.aware, len(data.samples), (verdict, fid), lines,
                     alloc=alloc)
        return result

    def _per_layer(self, model, ctx, parts, data: _Data, fid, result) -> tuple:
        """Each layer's own rule (:mod:`onnxslim_kit.passes.svd.plan`), then the target's prefix:
        ``(kept plans, verdict or None, notes)``. ``parts``: groups of layers with their
        statistics (:func:`.stream.groups`), whose Gram matrices are dropped once planned."""
        plans, lines = [], []
        for group, stats in parts:
            for layer in ctx.progress(group, desc="svd", total=len(group)):
                plan, line = plan_layer(layer, stats[layer.key], ctx.options, data.aware, result)
                lines.append(line)
                if plan is not None:
                    plans.append(plan)
            release(stats)
        kept, verdict = self._choose(model, fid, plans)
        for plan in kept:
            kind = "conv (k×1, 1×k)" if plan.mode == "separable" else plan.layer.kind
            result.rewrite(f"{kind} → 2 × {'conv' if plan.layer.kind == 'conv' else 'matmul'}")
        result.skip("dropped to hold the output target", len(plans) - len(kept))
        return kept, verdict, lines

    @staticmethod
    def _use_alloc(opts, data: _Data, fid) -> bool:
        """Sensitivity allocation: asked for (without a target: the largest-saving allocation),
        or (auto) data-aware with at least ``MIN_ALLOC_SAMPLES`` fit samples, a target and no
        explicit rank rule."""
        if opts["alloc"] == "auto":
            return (fid is not None and data.aware and len(data.samples) >= MIN_ALLOC_SAMPLES
                    and not (opts["rank"] or opts["ratio"] or opts["energy"]))
        return opts["alloc"] in ("spectrum", "sensitivity")

    @staticmethod
    def _choose(model, fid, plans: list) -> tuple:
        """The plans to apply (applied on return) and the verdict (or None: no target)."""
        if fid is None or not plans:
            for plan in plans:
                apply(model, plan.layer, plan.a, plan.b, plan.mode)
            return plans, None
        return select(model, plans, fid)

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
        verdict, fid = measured
        held = ""
        if verdict is not None:
            result.metrics.update(target=str(fid.target), budget_used=round(verdict.used, 4),
                                  budget_allowed=round(fid.allowed, 4),
                                  target_cosine_measured=round(verdict.worst("cosine"), 6))
            held = (f"; kept {len(kept)} rewrites: {'held' if fid.met(verdict) else 'missed'} {fid.describe()}, "
                    f"binding view {verdict.summary()}")
        mode = (f"data-aware (inputs whitened with {n_samples} calibration samples)" if data_aware
                else "plain SVD (no calibration data given: weights only, exact for white inputs)")
        result.notes.append(f"{mode}; rank by {self._rule(opts, alloc, fid)}{held}; FLOPs of the candidate layers "
                            f"{totals['flops_before']:.3g} → {totals['flops_after']:.3g}")
        result.notes.extend(lines[:MAX_NOTE_LAYERS])
        if len(lines) > MAX_NOTE_LAYERS:
            result.notes.append(f"… {len(lines) - MAX_NOTE_LAYERS} more layers")

    @staticmethod
    def _rule(opts, alloc: bool = False, fid=None) -> str:
        held = f"largest saving holding {fid.target}" if fid is not None else "largest saving, no target"
        if alloc and opts["alloc"] == "sensitivity":
            return f"measured sensitivity (cross-fitted 1 − cos per layer and rank, one budget for the model: {held})"
        if alloc:
            return (f"spectrum sensitivity (cross-fitted layer error × one measured transfer factor per layer, "
                    f"one budget for the model: {held})")
        for key in ("rank", "ratio", "energy"):
            if opts[key]:
                return f"{key}={opts[key]}"
        return f"per-layer output cosine ≥ {opts['cosine']} (kept energy ≥ {opts['cosine'] ** 2:.6f})"


def _recording(parts, stats: dict):
    """``parts`` (:func:`.stream.groups`) passed through, each group's statistics also put in
    ``stats`` (every layer's, for the report)."""
    for group, found in parts:
        stats.update(found)
        yield group, found


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
    """Data-aware with real calibration data (``data=auto``) or ``data=true``: every sample of
    ``ctx.feed`` (the pipeline holds the judged ones out of it); else one sample (shapes)."""
    opts = ctx.options
    aware = opts["data"] == "true" or (opts["data"] == "auto" and not getattr(ctx.feed, "generated", True))
    return _Data(aware, list(ctx.feed) if aware else ctx.feed.take(1))


def _fidelity(ctx):
    """The :class:`onnxslim_kit.fidelity.Fidelity` the rewrites must hold, or None: no search
    (``force``, ``target=none`` / ``0``, a Python ``0``)."""
    value = ctx.options["target"]
    if ctx.options["force"] or (not isinstance(value, str) and not value):
        return None
    fid = pass_fidelity(ctx)
    return None if fid.target.metric == "none" else fid
