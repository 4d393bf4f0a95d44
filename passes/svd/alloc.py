"""Rank allocation across layers by measured sensitivity (data-aware ``svd``, ``alloc=sensitivity``).

A uniform per-layer rule (every layer keeps the same output cosine) spends the error budget
badly: layers differ by orders of magnitude in how much end-to-end damage a FLOP saved costs
(MiniLM-L6, cross-fitted: layer 2's query projection at rank 57 — 30 % of its break-even rank —
costs 1.8e-3 of output cosine, its FFN input layer at rank 291 — 95 % of break-even — 3.6e-3;
``benchmarks/results/svd-2026-11-29-s2.md``).
So:

1. **Sensitivity.** For every candidate layer and every rank of a grid (the ranks removing
   ``GRID`` fractions of the layer's FLOPs) the loss ``1 − cos`` of the model's float outputs
   against the unmodified model is measured with that layer alone factorised, *cross-fitted*:
   factors fitted on the statistics of one half of the calibration samples (even / odd index),
   loss measured on the samples of the other half, the two averaged — an in-sample loss was
   useless (MiniLM, 32 sentences: in-sample allocation 32 % of the FLOPs at cosine 0.992 on the
   calibration sentences, 0.58 on other sentences).
2. **Allocation.** Losses of small perturbations add up, so for a price ``λ`` each layer takes
   the grid rank minimising ``loss − λ · FLOPs saved`` (or stays whole); larger ``λ`` saves
   more. The allocations of ``LAMBDAS`` prices are ordered by saving and the largest one the
   fidelity contract accepts (factors fitted on all statistics; its outputs on the pipeline's
   judged samples, view by view against the original: budget fraction ``u ≤ allowed``,
   :mod:`onnxslim_kit.fidelity`) is found by bisection.

**Spectrum** (``alloc=spectrum``, the default): step 1 costs one ONNX Runtime trial per layer
instead of one per rank and half. A layer's relative output error at rank ``r`` is
``ε(r) = 1 − cos²`` of its own output, read off the whitened spectrum for every rank at once —
cross-fitted as well: factors of one half, error on the Gram matrix of the other
(:meth:`.maths.factor.Factorization.heldout_cosine`), the two averaged. The end-to-end loss of a
small perturbation is quadratic in it, so ``loss(r) ≈ s · ε(r)``; the layer's transfer factor
``s`` is measured once, at the grid rank nearest 30 % of its FLOPs (``SCALE_AT``), with the
full-data factors on ``MAX_SCALE_SAMPLES`` calibration samples. Measured on MiniLM-L6 with
3900 calibration sentences (``benchmarks/results/svd-2026-11-29-s3*.md``) the allocations of
the model and of the measured grid hold the same cosine at the same saving. Its ranks are a
fine grid (``FINE_GRID``), as every rank costs the same.

Trials put ``W_eff = A_r B_r`` in the layer (the product, not the factorised graph: the same
values up to rounding) — one ONNX Runtime session per layer, its weight a graph input
(:class:`Probe`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper

from onnxslim_kit.metrics import cosine
from onnxslim_kit.runtime import make_session, run

GRID = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7)  # fractions of a layer's FLOPs removed
FINE_GRID = tuple(round(0.025 * i, 3) for i in range(1, 33))  # alloc=spectrum: 2.5 % … 80 %
SCALE_AT = 0.3  # alloc=spectrum: the transfer factor is measured at the grid rank nearest this
LAMBDAS = 40
MAX_HALF_SAMPLES = 6  # samples per half for the sensitivity runs
MAX_SCALE_SAMPLES = 16  # samples for the spectrum's one measured trial per layer


class Probe:
    """Trials of factorised weights against the unmodified model on fixed (fit) samples, and
    the outputs of a whole allocation on other samples (:meth:`outputs`, the judged ones).

    A layer's trials share one session in which that layer's weight alone is a graph input
    (the others stay initializers: ORT pre-packs constant MatMul weights; with every weight an
    input MiniLM ran 4× slower); a whole allocation is measured with its weights baked in."""

    def __init__(self, proto: onnx.ModelProto, samples: list):
        self.proto = proto
        self.samples = samples
        session = make_session(proto, opt_level="all", threads=1)
        self.reference = [run(session, sample) for sample in samples]

    def _variant(self, replace: dict, as_input: str | None = None):
        """A session of the model with initializers ``replace`` ({name: array}) swapped in and
        ``as_input`` turned into a graph input."""
        proto = onnx.ModelProto()
        proto.CopyFrom(self.proto)
        kept = []
        for init in proto.graph.initializer:
            if init.name == as_input:  # type and shape from the proto: its data may lie in a file
                proto.graph.input.append(helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
                continue
            if init.name in replace:
                init.CopyFrom(onnx.numpy_helper.from_array(replace[init.name], init.name))
            kept.append(init)
        del proto.graph.initializer[:]
        proto.graph.initializer.extend(kept)
        return make_session(proto, opt_level="all", threads=1)

    def _losses(self, session, which: list, extra: dict) -> np.ndarray:
        out = []
        for i in which:
            got, ref = run(session, {**self.samples[i], **extra}), self.reference[i]
            out.append(max([1.0 - cosine(r, got[name]) for name, r in ref.items() if r.dtype.kind == "f"],
                           default=0.0))
        return np.asarray(out)

    def layer_losses(self, layer, trials: list) -> list:
        """For each ``(weight tensor, sample indices)`` of ``trials``: mean ``1 − cos`` (worst
        float output) over those samples with that weight in ``layer``."""
        name = layer.node.inputs[1].name
        session = self._variant({}, as_input=name)
        return [float(np.mean(self._losses(session, which, {name: v}))) for v, which in trials]

    def outputs(self, replace: dict, samples: list) -> list:
        """The outputs on ``samples`` with ``replace`` ({layer: weight tensor}) baked in."""
        session = self._variant({layer.node.inputs[1].name: v for layer, v in replace.items()})
        return [run(session, sample) for sample in samples]


@dataclass(eq=False)
class Candidate:
    """A layer the allocation may factorise: full-data and per-half factorisations, grid ranks."""

    layer: object
    full: object  # Factorization on all statistics
    halves: tuple  # Factorization on half 0 and half 1
    flops_before: int
    options: list = field(default_factory=list)  # (r, FLOPs saved, cross-fitted loss)
    half_grams: tuple = ()  # the normalised Gram matrix of each half (alloc=spectrum)
    scale: float | None = None  # alloc=spectrum: measured loss per unit of layer error
    ranks: list = field(default_factory=list)  # the ranks it may take (faster than the layer)
    error: np.ndarray | None = None  # alloc=spectrum: crossfit_error, computed while the halves exist


def grid_ranks(k: int, n: int, breakeven: int, grid: tuple = GRID) -> list:
    """Ranks removing the ``grid`` fractions of ``k n`` MACs per row (distinct, ≥ 1, ≤ break-even)."""
    ranks = {max(int(k * n * (1 - f) / (k + n)), 1) for f in grid}
    return sorted(r for r in ranks if r <= breakeven)


def crossfit_error(cand: Candidate) -> np.ndarray:
    """``ε(r) = 1 − cos²`` of the layer's own output for every rank ``r`` (index ``r − 1``):
    factors of each half of the statistics scored on the other half's Gram matrix, averaged."""
    w = cand.layer.matrix
    errors = [1.0 - np.clip(fact.heldout_cosine(w, other), 0.0, 1.0) ** 2
              for fact, other in zip(cand.halves, cand.half_grams[::-1])]
    return np.mean(errors, axis=0)


def spectral(probe: Probe, cand: Candidate, ranks: list, flops_after, which: list) -> None:
    """Fill ``cand.options`` with ``s · ε(r)`` (see the module docstring); ``s`` from one trial of
    the full-data factors on the probe samples ``which``."""
    error = crossfit_error(cand) if cand.error is None else cand.error
    at = min(ranks, key=lambda r: abs((1 - flops_after(r) / cand.flops_before) - SCALE_AT))
    trial = weight_value(cand.layer, np.matmul(*cand.full.factors(at)))
    measured = probe.layer_losses(cand.layer, [(trial, which)])[0]
    scale = measured / max(float(error[at - 1]), 1e-12)
    cand.scale = scale
    cand.options.extend((r, cand.flops_before - flops_after(r), float(scale * error[r - 1])) for r in ranks)


def sensitivity(probe: Probe, cand: Candidate, ranks: list, flops_after, n: int) -> None:
    """Fill ``cand.options`` with the cross-fitted loss of each rank (see the module docstring);
    the first ``n`` probe samples are the ones the statistics were collected on."""
    tests = [list(range(1, n, 2))[:MAX_HALF_SAMPLES], list(range(0, n, 2))[:MAX_HALF_SAMPLES]]
    trials = [(weight_value(cand.layer, np.matmul(*fact.factors(r))), test)
              for fact, test in zip(cand.halves, tests) for r in ranks]
    losses = np.asarray(probe.layer_losses(cand.layer, trials)).reshape(2, len(ranks)).mean(axis=0)
    cand.options.extend((r, cand.flops_before - flops_after(r), float(loss)) for r, loss in zip(ranks, losses))


def allocations(cands: list) -> list:
    """Distinct allocations ``{id(candidate): r}`` of ``LAMBDAS`` prices, by FLOPs saved."""
    ratios = [loss / saved for c in cands for _r, saved, loss in c.options if saved > 0 and loss > 0]
    if not ratios:
        return []
    found = {}
    for lam in np.geomspace(min(ratios) / 2, max(ratios) * 2, LAMBDAS):
        pick = {}
        for c in cands:
            best, best_r = 0.0, None
            for r, saved, loss in c.options:
                if loss - lam * saved < best:
                    best, best_r = loss - lam * saved, r
            if best_r is not None:
                pick[id(c)] = best_r
        saving = sum(saved for c in cands for r, saved, _l in c.options if pick.get(id(c)) == r)
        found.setdefault(tuple(sorted(pick.items())), (saving, pick))
    return [pick for _s, pick in sorted(found.values(), key=lambda t: t[0]) if pick]


def choose(probe: Probe, cands: list, fid) -> tuple:
    """``(allocation, its verdict)``: the largest-saving allocation whose full-data factors
    ``fid`` accepts on ``fid.samples`` (bisection; ``{}`` — the model unchanged — if none does).
    Without a target (``fid`` None): the largest-saving allocation, unjudged (verdict None)."""
    options = allocations(cands)
    if fid is None:
        return (options[-1] if options else {}), None
    by_id = {id(c): c for c in cands}

    def measure(pick: dict):
        replace = {}
        for key, r in pick.items():
            c = by_id[key]
            a, b = c.full.factors(r)
            replace[c.layer] = weight_value(c.layer, a @ b)
        return fid.judge(probe.outputs(replace, fid.samples))

    good, good_verdict, lo, hi = {}, None, -1, len(options)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        verdict = measure(options[mid])
        if fid.met(verdict):
            lo, good, good_verdict = mid, options[mid], verdict
        else:
            hi = mid
    return good, good_verdict if good_verdict is not None else measure({})


def weight_value(layer, matrix: np.ndarray) -> np.ndarray:
    """The layer's weight tensor for an effective ``k × n`` matrix (inverse of ``match``)."""
    values = layer.node.inputs[1].values
    if layer.kind == "conv":
        return matrix.T.reshape(values.shape).astype(values.dtype)
    if layer.kind == "gemm" and layer.node.attrs.get("transB", 0):
        return np.ascontiguousarray(matrix.T).astype(values.dtype)
    return matrix.astype(values.dtype)
