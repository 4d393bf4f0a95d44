"""Bias correction and local sensitivity for the ``int8`` pass, from one run.

The float model carries a fake-quantized twin of every layer
(:func:`._quant_qdq.add_quantized_twins`: the same op reading Q/DQ'd inputs and weights);
one run per sample gives, for every layer ``l``, its float output ``y`` and its twin's
``ŷ``, and with them the error ``e = y − ŷ`` of quantizing that layer alone.

**Bias correction.** Quantizing a layer's input and weights shifts the mean of its output:
``E[e] ≠ 0`` per output channel (rounding of small weights does not cancel, most visibly in
depthwise convolutions). The mean is added to the bias before it is quantized::

    m_c = mean over samples, batch and spatial positions of e_c,     b'_c = b_c + m_c

Channel axis: 1 for Conv, the last axis for Gemm. Conv and Gemm without a bias get one;
MatMul has no bias input and is left as is. This is the local (per-layer) form: it corrects
each layer for its own error, not for the error arriving from the layers before it.

**Local sensitivity** (the ranking of the fallback search, :mod:`onnxslim_kit.passes.int8.fallback`): the
relative squared error left after the correction, ``1 / SQNR``, from running sums::

    s_l = Σ_c (Σ e_c² − n_c · m_c²) / Σ y²

(``Σ (e − m)² = Σ e² − n·m²``; without correction, or for MatMul, ``m = 0``).

**Only what is used.** Each twin reads its own fake-quantized copy of the float input and
weight, so one layer's ``e`` does not depend on the other twins. When the ranking is not
local (``local=False``: the fallback ranks end to end, or does not run), only the Conv / Gemm
layers get twins: the same shifts, without a fake-quantized float copy of every MatMul weight
(at 933 MB: 10.1 s and 1.6 GB of the pass's 15.6 s and 1.6 GB peak). Large samples run on every
core (:func:`.fallback.run_threads`: the same values).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from onnxslim_kit.passes.int8.calib_groups import CALIB_RUN_BYTES, tensor_bytes
from onnxslim_kit.passes.int8.fallback import activations, run_threads, trial_copy
from onnxslim_kit.passes.int8.ranking import weight_bytes
from onnxslim_kit.passes._quant.qdq import add_quantized_twins


def _channel_sums(x: np.ndarray, axis: int) -> tuple:
    """(Σ x, Σ x², count) per channel along ``axis``."""
    flat = np.moveaxis(x.astype(np.float64, copy=False), axis, 0).reshape(x.shape[axis], -1)
    return flat.sum(axis=1), np.einsum("ij,ij->i", flat, flat), flat.shape[1]


def measure_twins(model, plan, samples: list, correct: bool = True, local: bool = True,
                  before_run=None, rounds: int = 1) -> tuple:
    """``(shifts, sensitivity)``: ``{layer: float32 vector}`` to add to each Conv / Gemm bias
    (empty when not ``correct``) and ``{layer: s_l}`` for every layer of ``plan`` (with
    ``local``; else for the Conv / Gemm layers only, the only ones measured).

    ``model`` is a throw-away copy of the float model (twins are added to it); ``before_run``:
    called with its graph once the twins are in, before the run (a rewiring of the float path).
    ``rounds`` > 1: the layers in that many runs over the samples (:func:`twin_rounds`), each
    on its own copy — the same numbers, a third of the twins' memory at a time for three. The
    outputs ``y, ŷ`` of one run are kept under :data:`.calib_groups.CALIB_RUN_BYTES` at the
    first sample's shapes: more rounds, cut by those bytes, where they would exceed it (ORT holds
    every output of a run at once: PP-OCR-sized detectors at 800 × 608 peaked here)."""
    ops = {s.name: s.op for s in plan.layers}
    biased = {s.name for s in plan.layers if s.op in ("Conv", "Gemm") and s.weight_index is not None}
    specs = plan.layers if local else [s for s in plan.layers if s.name in biased]
    err_sum, err_sq, count, ref_sq = {}, {}, {}, {}
    chunks = _rounds(model, specs, samples, rounds)
    for chunk in chunks:
        trial = model if len(chunks) == 1 else trial_copy(model)
        pairs = add_quantized_twins(trial, plan if chunk is plan.layers else replace(plan, layers=chunk))
        if before_run is not None:
            before_run(trial.graph)
        names = [n for _, a, b in pairs for n in (a, b)]
        for acts in activations(trial, names, samples, lazy=True, threads=run_threads(samples)):
            for layer, a, b in pairs:
                y = acts.pop(a).numpy()  # made arrays pair by pair, popped: each pair's tensors go once measured
                e = y.astype(np.float64) - acts.pop(b).numpy()
                axis = 1 if ops[layer] == "Conv" else e.ndim - 1
                s1, s2, n = _channel_sums(e, axis) if e.ndim else (e.reshape(1), e.reshape(1) ** 2, 1)
                err_sum[layer] = err_sum.get(layer, 0.0) + s1
                err_sq[layer] = err_sq.get(layer, 0.0) + s2
                count[layer] = count.get(layer, 0) + n
                ref_sq[layer] = ref_sq.get(layer, 0.0) + float(np.square(y, dtype=np.float64).sum())
            acts.clear()  # frees this sample's tensors before the next run
        del trial, pairs
    shifts, sensitivity = {}, {}
    for layer, total in err_sum.items():
        mean = total / count[layer] if correct and layer in biased else 0.0
        if correct and layer in biased:
            shifts[layer] = np.asarray(mean, dtype=np.float32)
        left = float(np.sum(err_sq[layer] - count[layer] * np.square(mean)))
        sensitivity[layer] = max(left, 0.0) / ref_sq[layer] if ref_sq[layer] > 0 else (1.0 if left > 0 else 0.0)
    return shifts, sensitivity


def _rounds(model, specs: list, samples: list, rounds: int) -> list:
    """:func:`twin_rounds`, with as many more rounds, cut by output bytes, as keep the outputs
    ``y, ŷ`` of one run under :data:`.calib_groups.CALIB_RUN_BYTES` (:func:`measure_twins`)."""
    outputs = twin_bytes(model, specs, samples[0]) if samples else {}
    needed = -(-sum(outputs.values()) // CALIB_RUN_BYTES)
    return twin_rounds(model.graph, specs, max(rounds, needed),
                       (lambda spec: outputs[spec.name]) if needed > rounds else None)


def twin_bytes(model, specs: list, sample: dict) -> dict:
    """``{layer: float32 bytes of its output and its twin's}`` at ``sample``'s input shapes
    (:func:`.calib_groups.tensor_bytes`)."""
    nodes = {node.name: node for node in model.graph.nodes}
    names = {s.name: nodes[s.name].outputs[0].name for s in specs if s.name in nodes}
    sizes = tensor_bytes(model, list(names.values()), sample)
    return {layer: 2 * sizes[name] for layer, name in names.items()}


def twin_rounds(graph, specs: list, rounds: int, size=None) -> list:
    """``specs`` in at most ``rounds`` runs of consecutive layers with about equal weight bytes,
    or equal ``size(spec)`` (``[specs]`` itself for one round: the plain single run)."""
    if rounds <= 1 or len(specs) <= 1:
        return [specs]
    nodes = {node.name: node for node in graph.nodes}
    size = size or (lambda spec: weight_bytes(nodes, spec))
    total = sum(size(s) for s in specs) or 1
    chunks, current, seen = [], [], 0
    for spec in specs:
        current.append(spec)
        seen += size(spec)
        if seen * rounds >= total * (len(chunks) + 1) and len(chunks) < rounds - 1:
            chunks.append(current)
            current = []
    return chunks + [current] if current else chunks
