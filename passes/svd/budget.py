"""One budget for the whole model (``alloc=spectrum|sensitivity``): candidates, their measured
or estimated loss per rank, the chosen allocation applied.

A candidate is a non-batched layer with statistics split in two halves (cross-fitting) and at
least one grid rank that is faster (:func:`.speed.decide`). For each, ``loss(r)`` is estimated
(``spectrum``: cross-fitted whitened spectrum × one measured transfer factor) or measured
(``sensitivity``) on the calibration samples the pass fits (``ctx.feed``); :func:`.alloc.choose`
then takes the largest-saving allocation the fidelity contract accepts on the pipeline's judged
samples (the maths: :mod:`onnxslim_kit.passes.svd.alloc`).
"""

from __future__ import annotations

import numpy as np

from onnxslim_kit.api import PassResult

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
from onnxslim_kit.passes.svd.maths.factor import Factorization, breakeven_rank
from onnxslim_kit.passes.svd.plan import Plan, layer_name, node_attrs, weight_shape
from onnxslim_kit.passes.svd.rewrite import apply
from onnxslim_kit.passes.svd.speed import decide, flops
from onnxslim_kit.passes.svd.stream import release


def allocate(model, ctx, layers, stats, samples, fid, result: PassResult) -> tuple:
    """``(kept plans, verdict or None, notes)`` (:mod:`onnxslim_kit.passes.svd.alloc`);
    ``layers``: ``(group, statistics)`` pairs (:func:`.stream.groups`; a group's Gram matrices
    are dropped once its candidates are built: a candidate keeps its full-data factors and, for
    ``spectrum``, its cross-fitted error curve, not the statistics); ``stats``: every layer's
    statistics once ``layers`` is consumed (row counts); ``samples``: the fit samples, ``fid``:
    the :class:`onnxslim_kit.fidelity.Fidelity` held."""
    opts = ctx.options
    measured_grid = opts["alloc"] == "sensitivity"
    cands, lines = [], []
    for group, found in layers:  # groups of layers with their statistics (:func:`.stream.groups`)
        more, notes = _candidates(group, found, opts, {} if measured_grid else {"grid": FINE_GRID}, result,
                                  keep_halves=measured_grid)
        cands += more
        lines += notes
        release(found)
    if not cands:
        return [], None, lines
    trials = samples[:2 * MAX_HALF_SAMPLES] if measured_grid else samples[:MAX_SCALE_SAMPLES]
    probe = Probe(model.to_proto(), trials)
    for cand in ctx.progress(cands, desc="svd sensitivity", total=len(cands)):
        layer, rows = cand.layer, stats[cand.layer.key].rows_per_sample
        cost = lambda r, layer=layer, rows=rows: flops(rows, layer.k, layer.n, r)  # noqa: E731
        if measured_grid:
            sensitivity(probe, cand, cand.ranks, cost, len(trials))
        else:
            spectral(probe, cand, cand.ranks, cost, list(range(len(trials))))
    how = "cross-fitted" if measured_grid else "estimated (cross-fitted spectrum × transfer factor)"
    pick, verdict = choose(probe, cands, fid)
    kept = _apply(model, cands, pick, stats, how, result, lines)
    return kept, verdict, lines


def _candidates(layers: list, stats: dict, opts, grid: dict, result: PassResult, keep_halves: bool = True) -> tuple:
    """``(candidates with their faster grid ranks, notes on the layers left out)``."""
    cands, lines = [], []
    for layer in layers:
        entry = stats[layer.key]
        name = layer_name(layer)
        halves = [entry.half(i) for i in (0, 1)]
        if layer.kind == "batched" or entry.gram is None or halves[1][0] is None:
            result.skip("batched weight (alloc=layer factorises it per head)")
            lines.append(f"{name}: kept (batched weight: not allocated; alloc=layer factorises it per head)")
            continue
        rows = entry.rows_per_sample
        # the full-data factors alone are kept (no Cholesky factor, no U): one k × k matrix
        # less per candidate; the halves' factorisations only while their error curve is made
        full = Factorization(layer.matrix, entry.normalized_gram, entry.gram_rows, entry.fourth).frozen()
        if keep_halves:
            cand = Candidate(layer, full, tuple(Factorization(layer.matrix, *h) for h in halves),
                             flops(rows, layer.k, layer.n), half_grams=tuple(h[0] for h in halves))
        else:
            cand = Candidate(layer, full, (), flops(rows, layer.k, layer.n))
        del halves
        w_shape, attrs = weight_shape(layer), node_attrs(layer)
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
        if not keep_halves:  # spectrum: the error curve is all it needs of the halves
            cand.error = _crossfit_error(layer, entry)
        cands.append(cand)
    return cands, lines


def _crossfit_error(layer, entry) -> np.ndarray:
    """:func:`.alloc.crossfit_error` one half at a time: the factorisation of half ``i`` scored
    on the Gram matrix of the other, then dropped (a 4096-input layer's factorisation holds a
    134 MB Cholesky factor)."""
    errors = []
    for i in (0, 1):
        fit = Factorization(layer.matrix, *entry.half(i))
        errors.append(1.0 - np.clip(fit.heldout_cosine(layer.matrix, entry.half(1 - i)[0]), 0.0, 1.0) ** 2)
        del fit
    return np.mean(errors, axis=0)


def _apply(model, cands: list, pick: dict, stats: dict, how: str, result: PassResult, lines: list) -> list:
    """Factorise each candidate at its chosen rank (none: kept); returns the plans applied."""
    kept = []
    for cand in cands:
        layer, rows = cand.layer, stats[cand.layer.key].rows_per_sample
        name = layer_name(layer)
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
    return kept
