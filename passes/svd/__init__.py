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
BLAS on one thread (:func:`._blas.blas_threads`). ``mask=<input>`` (e.g. ``attention_mask``)
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

import math
from dataclasses import dataclass

import numpy as np

from onnxslim_kit.pipeline import Option, Pass, PassResult, register_pass

from onnxslim_kit.passes.svd.alloc import (
    FINE_GRID,
    MAX_HALF_SAMPLES,
    MAX_SCALE_SAMPLES,
    Candidate,
    Probe,
    choose,
    grid_ranks,
    sensitivity,
    spectral,
)
from onnxslim_kit.passes._common.blas import blas_threads
from onnxslim_kit.passes.svd.maths.factor import Factorization, HeadsFactorization, breakeven_rank
from onnxslim_kit.passes.svd.rewrite import apply
from onnxslim_kit.passes.svd.select import select
from onnxslim_kit.passes.svd.maths.spatial import (
    separable_attrs,
    separable_breakeven,
    separable_factorization,
    separable_flops,
)
from onnxslim_kit.passes.svd.speed import decide, flops
from onnxslim_kit.passes._common.layer_stats import Layer, collect, match

MAX_NOTE_LAYERS = 40
MIN_ROWS_PER_INPUT = 2  # whiten only with at least 2·k calibration rows (else Gram is rank-deficient)
TARGET_SAMPLES = 8
MAX_CHECK_SAMPLES = 64  # held out for the end-to-end check: n // CHECK_SHARE of n samples, 8 … 64
CHECK_SHARE = 16


@dataclass(eq=False)
class Plan:
    layer: Layer
    r: int
    a: np.ndarray
    b: np.ndarray
    rows: int
    damage: float  # (1 − kept energy) per FLOP saved
    note: str
    flops_after: int = 0
    params_after: int = 0
    mode: str = "kxk"  # or "separable" (k×1 then 1×k)


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
        "ops": Option(str, "matmul+gemm+conv", "which layers to factorise, joined by '+'"),
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

    def is_lossless(self, options: dict) -> bool:
        return bool(options.get("force")) and options.get("rank") == -1

    def run(self, model, ctx) -> PassResult:
        with blas_threads(1):
            return self._run(model, ctx)

    def _run(self, model, ctx) -> PassResult:
        result = PassResult()
        opts = ctx.options
        kinds = {op.strip().lower() for op in opts["ops"].split("+")}
        layers = []
        for graph in model.all_graphs():
            for node in graph.nodes:
                found = match(node, graph, model.graph)
                if isinstance(found, str):
                    result.skip(found)
                elif found is not None and ("matmul" if found.kind == "batched" else found.kind) in kinds:
                    layers.append(found)
        if not layers:
            return result
        data_aware = opts["data"] == "true" or (opts["data"] == "auto" and not getattr(ctx.feed, "generated", True))
        samples = list(ctx.feed) if data_aware else ctx.feed.take(1)
        check = ctx.feed.take(TARGET_SAMPLES)
        held_out = data_aware and opts["target"] and len(samples) >= 2 * TARGET_SAMPLES
        if held_out:  # the end-to-end check runs on samples the factors were not fitted on
            n_check = min(max(TARGET_SAMPLES, len(samples) // CHECK_SHARE), MAX_CHECK_SAMPLES)
            samples, check = samples[:-n_check], samples[-n_check:]
        stats = collect(model.to_proto(), layers, samples, want_gram=data_aware, mask=opts["mask"])
        if self._use_alloc(opts, held_out):
            kept, measured, lines = self._allocate(model, ctx, layers, stats, samples, check, result)
            where = "held-out calibration samples" if held_out else "calibration samples"
            self._report(result, layers, stats, kept, opts, data_aware, len(samples), (measured, where), lines,
                         alloc=True)
            return result
        plans, lines = [], []
        for layer in ctx.progress(layers, desc="svd", total=len(layers)):
            plan, line = self._plan(layer, stats[layer.key], opts, data_aware, result)
            lines.append(line)
            if plan is not None:
                plans.append(plan)
        kept, measured = self._choose(model, check, plans, opts)
        for plan in kept:
            kind = "conv (k×1, 1×k)" if plan.mode == "separable" else plan.layer.kind
            result.rewrite(f"{kind} → 2 × {'conv' if plan.layer.kind == 'conv' else 'matmul'}")
        result.skip("dropped to hold the output target", len(plans) - len(kept))
        where = "held-out calibration samples" if held_out else "calibration samples"
        self._report(result, layers, stats, kept, opts, data_aware, len(samples), (measured, where), lines)
        return result

    @staticmethod
    def _use_alloc(opts, held_out: bool) -> bool:
        """Sensitivity allocation: asked for, or (auto) with a held-out target check (data-aware,
        at least 2·TARGET_SAMPLES calibration samples) and no explicit rank rule."""
        if opts["alloc"] == "auto":
            return (held_out and bool(opts["target"]) and not opts["force"]
                    and not (opts["rank"] or opts["ratio"] or opts["energy"]))
        return opts["alloc"] in ("spectrum", "sensitivity")

    def _allocate(self, model, ctx, layers, stats, samples, check, result) -> tuple:
        """``alloc=spectrum|sensitivity`` (:mod:`onnxslim_kit.passes.svd.alloc`): ``(kept plans, measured cosine, notes)``."""
        opts, cands, lines = ctx.options, [], []
        measured_grid = opts["alloc"] == "sensitivity"
        grid = {} if measured_grid else {"grid": FINE_GRID}
        for layer in layers:
            entry = stats[layer.key]
            name = f"{layer.node.name or layer.node.op} {layer.k}×{layer.n}"
            halves = [entry.half(i) for i in (0, 1)]
            if layer.kind == "batched" or entry.gram is None or halves[1][0] is None:
                result.skip("batched weight (alloc=layer factorises it per head)")
                lines.append(f"{name}: kept (batched weight: not allocated; alloc=layer factorises it per head)")
                continue
            rows = entry.rows_per_sample
            full = Factorization(layer.matrix, entry.normalized_gram, entry.gram_rows, entry.fourth)
            cand = Candidate(layer, full, tuple(Factorization(layer.matrix, *h) for h in halves),
                             flops(rows, layer.k, layer.n), half_grams=tuple(h[0] for h in halves))
            w_shape = layer.node.inputs[1].values.shape if layer.kind == "conv" else (layer.k, layer.n)
            attrs = tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in layer.node.attrs.items()))
            kind = "conv" if layer.kind == "conv" else "matmul"
            ranks = [r for r in grid_ranks(layer.k, layer.n, breakeven_rank(layer.k, layer.n), **grid)
                     if decide(kind, entry.shape, w_shape, rows, layer.k, layer.n, r, attrs, opts["measure"])[0]]
            if not ranks:
                result.skip("factorised layer would be slower")
                lines.append(f"{name}: kept (no grid rank is faster: "
                             f"{decide(kind, entry.shape, w_shape, rows, layer.k, layer.n, 1, attrs, opts['measure'])[1]} "
                             "at rank 1 or the FLOPs saved are < 5 %)")
                continue
            cand.ranks = ranks
            cands.append(cand)
        if not cands:
            return [], None, lines
        trials = samples[:2 * MAX_HALF_SAMPLES] if measured_grid else samples[:MAX_SCALE_SAMPLES]
        probe = Probe(model.to_proto(), trials + check)
        for cand in ctx.progress(cands, desc="svd sensitivity", total=len(cands)):
            layer, rows = cand.layer, stats[cand.layer.key].rows_per_sample
            cost = lambda r, layer=layer, rows=rows: flops(rows, layer.k, layer.n, r)  # noqa: E731
            if measured_grid:
                sensitivity(probe, cand, cand.ranks, cost, len(trials))
            else:
                spectral(probe, cand, cand.ranks, cost, list(range(len(trials))))
        how = "cross-fitted" if measured_grid else "estimated (cross-fitted spectrum × transfer factor)"
        pick, measured = choose(probe, cands, list(range(len(trials), len(trials) + len(check))), opts["target"])
        kept = []
        for cand in cands:
            layer, rows = cand.layer, stats[cand.layer.key].rows_per_sample
            name = f"{layer.node.name or layer.node.op} {layer.k}×{layer.n}"
            step = max(len(cand.options) // 8, 1)  # at most ~8 ranks in the note
            losses = ", ".join(f"{r}:{loss:.1e}" for r, _s, loss in cand.options[::step])
            if cand.scale is not None:
                losses += f"; transfer factor {cand.scale:.3g}"
            r = pick.get(id(cand))
            if r is None:
                result.skip("not worth its measured loss")
                lines.append(f"{name}: kept ({how} loss per rank {losses})")
                continue
            a, b = cand.full.factors(r)
            apply(model, layer, a, b)
            plan = Plan(layer, r, a, b, rows, 0.0, "", flops(rows, layer.k, layer.n, r), r * (layer.k + layer.n))
            kept.append(plan)
            result.rewrite(f"{layer.kind} → 2 × {'conv' if layer.kind == 'conv' else 'matmul'}")
            lines.append(f"{name}: r={r} (break-even {breakeven_rank(layer.k, layer.n)}, "
                         f"{1 - plan.flops_after / cand.flops_before:.0%} of its FLOPs removed; {how} "
                         f"loss per rank {losses})")
        return kept, measured, lines

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

    @staticmethod
    def _plan(layer: Layer, entry, opts, data_aware: bool, result) -> tuple:
        """``(Plan or None, one-line note)`` for ``layer``."""
        name = f"{layer.node.name or layer.node.op} {layer.k}×{layer.n}"
        whiten = data_aware and entry.gram_rows >= MIN_ROWS_PER_INPUT * layer.k and layer.kind != "batched"
        if data_aware and not whiten:
            name += f" (plain: {entry.gram_rows} rows < {MIN_ROWS_PER_INPUT}·k)"
        if layer.kind == "batched":
            name = f"{layer.node.name or layer.node.op} {layer.heads}×{layer.k}×{layer.n} (per head, plain)"
            fact = HeadsFactorization(layer.node.inputs[1].values)
        else:
            fact = Factorization(layer.matrix, entry.normalized_gram if whiten else None,
                                 entry.gram_rows, entry.fourth)
        heldout = None
        if whiten and entry.half(1)[0] is not None:
            fit_gram, fit_rows, fit_fourth = entry.half(0)
            heldout = Factorization(layer.matrix, fit_gram, fit_rows, fit_fourth).heldout_cosine(
                layer.matrix, entry.half(1)[0])
        r, _rule = fact.choose_rank(opts["rank"], opts["ratio"], opts["energy"], opts["cosine"], heldout)
        cos = float(heldout[r - 1]) if heldout is not None else math.sqrt(fact.kept_energy(r))
        breakeven = breakeven_rank(layer.k, layer.n)
        rows = entry.rows_per_sample
        w_shape = layer.node.inputs[1].values.shape if layer.kind == "conv" else (layer.k, layer.n)
        cand = {"mode": "kxk", "r": r, "cos": cos, "breakeven": breakeven, "fact": fact,
                "flops": flops(rows, layer.k, layer.n, r), "params": r * (layer.k + layer.n) * layer.heads}
        separable = SvdPass._separable(layer, entry, opts, w_shape)
        if separable is not None and (opts["spatial"] == "separable" or (
                separable["r"] <= separable["breakeven"] and
                (r > breakeven or separable["flops"] < cand["flops"]))):
            cand = separable
        r, cos, breakeven = cand["r"], cand["cos"], cand["breakeven"]
        if cand["mode"] == "separable":
            name += " separable"
        if not opts["force"]:
            if r > breakeven:
                result.skip("rank needed does not pay off")
                return None, f"{name}: r={r} > break-even {breakeven}, kept"
            attrs = tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in layer.node.attrs.items()))
            kind = "matmul" if layer.kind != "conv" else ("separable" if cand["mode"] == "separable" else "conv")
            if kind == "separable":
                attrs = tuple(tuple((k, tuple(v)) for k, v in part.items()) for part in separable_attrs(layer.geometry))
            faster, how = decide(kind, entry.shape, w_shape, rows, layer.k, layer.n, r, attrs, opts["measure"],
                                 after=cand["flops"])
            if not faster:
                result.skip("factorised layer would be slower")
                return None, f"{name}: r={r} would be slower ({how}), kept"
        a, b = cand["fact"].factors(r)
        saved = max(flops(rows, layer.k, layer.n) - cand["flops"], 1)
        fact = cand["fact"]
        shrunk = f", shrinkage {fact.shrinkage:.2f}" if fact.shrinkage is not None else ""
        where = "held-out" if heldout is not None and cand["mode"] == "kxk" else "est."
        note = f"{name}: r={r} (break-even {breakeven}), {where} output cosine {cos:.5f}{shrunk}"
        return Plan(layer, r, a, b, rows, (1 - cos**2) / saved, note, cand["flops"], cand["params"],
                    cand["mode"]), note

    @staticmethod
    def _separable(layer: Layer, entry, opts, w_shape) -> dict | None:
        """The k×1-then-1×k candidate of a 2-D k×k Conv (None when it does not apply)."""
        if (layer.kind != "conv" or opts["spatial"] == "kxk" or layer.geometry is None
                or min(layer.geometry.kernel) < 2 or len(entry.shape) != 4):
            return None
        n, c, kh, kw = w_shape
        fact = separable_factorization(layer.node.inputs[1].values)
        r, _rule = fact.choose_rank(opts["rank"], opts["ratio"], opts["energy"], opts["cosine"])
        return {"mode": "separable", "r": r, "cos": math.sqrt(fact.kept_energy(r)), "fact": fact,
                "breakeven": separable_breakeven(n, c, kh, kw), "params": r * (c * kh + n * kw),
                "flops": separable_flops(entry.shape, entry.rows_per_sample, layer.geometry, n, c, r)}
