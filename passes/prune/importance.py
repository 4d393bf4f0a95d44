"""Channel-unit importance for ``prune(ratio=…, criterion=…)``.

Every criterion gives each layer's channels a score, divides by the layer's mean score (so
layers of different scale compare in a global ranking) and sums the normalised scores over
the layers a unit touches (all sources of a residual group, all consumers of a tensor) and
averages them — a sum would make coupled groups (residual chains, SE gates) look important
just for having more layers:

* ``l1`` / ``l2`` — norm of the source filter producing the channel (Li et al. 2017);
* ``bn_scale`` — |γ| of a BatchNormalization on the channel (network slimming, Liu et al.
  2017); after ``fuse`` folded BN into the conv, γ/σ lives in the filter, so units without
  a BN fall back to the filter's L2 norm;
* ``random`` — a baseline;
* data-driven, on the consumers' inputs over the calibration feed, with ``x_c`` channel c
  at all positions, ``Σ = E[x xᵀ]`` (channel covariance) and ``W_c`` the consumer weights
  reading channel c (``W̄`` summed over the kernel window, ``‖W_c‖²`` the energy of the slice):

  - ``activation`` — ``E|x_c|`` (mean activation magnitude);
  - ``taylor`` — first-order Taylor estimate of the change of the consumer's output energy
    ``L = ½‖Y‖²`` when ``x_c`` is zeroed: ``|x_c · ∂L/∂x_c| = |(Σ · W̄ᵀW̄)_cc|`` (closed form);
  - ``obs`` — Optimal-Brain-Surgeon saliency from the input covariance, per channel:
    ``‖W_c‖² / [(Σ + λI)⁻¹]_cc`` (λ = 1e-2 · mean diag Σ) — the output error left after
    removing channel c and optimally re-weighting the rest (spatial correlations ignored).

Each weight is read once; the pages of one left on disk are dropped after
(:mod:`onnxslim_kit.passes.prune.held`), so scoring a large model does not leave it resident.
"""

from __future__ import annotations

import numpy as np

from onnxslim_kit.activations import iter_activations

from onnxslim_kit.passes._common.graph import const_value
from onnxslim_kit.passes.prune.held import release_constant
from onnxslim_kit.passes.prune.covariance import Covariance

DATA_CRITERIA = ("activation", "taylor", "obs")
COV_POSITIONS = 4096


def _add(scores: dict, units: np.ndarray, layer_scores: np.ndarray) -> None:
    """Accumulate normalised layer scores as (sum, count); :func:`_mean` finishes."""
    mean = float(np.mean(layer_scores)) if len(layer_scores) else 0.0
    normalised = layer_scores / mean if mean > 0 else np.ones_like(layer_scores)
    for unit, value in zip(units.tolist(), normalised.tolist()):
        total, count = scores.get(unit, (0.0, 0))
        scores[unit] = (total + value, count + 1)


def _mean(scores: dict) -> dict:
    return {unit: total / count for unit, (total, count) in scores.items()}


def filter_norms(source, order: int) -> np.ndarray:
    w = const_value(source.node.inputs[1]).astype(np.float64)
    release_constant(source.node.inputs[1])  # read once: its map's pages go (:mod:`.held`)
    w = np.moveaxis(w, source.out_axis, 0).reshape(w.shape[source.out_axis], -1)
    return np.abs(w).sum(axis=1) if order == 1 else np.sqrt((w * w).sum(axis=1))


def magnitude_scores(cg, criterion: str) -> dict:
    scores: dict = {}
    for s in cg.sources:
        _add(scores, cg.units_of(s.node.outputs[0].name), filter_norms(s, 1 if criterion == "l1" else 2))
    if criterion == "bn_scale":
        bn_scores: dict = {}
        for p in cg.params:
            if p.node.op == "BatchNormalization" and p.index == 1:
                gamma = np.abs(const_value(p.node.inputs[1]).astype(np.float64))
                _add(bn_scores, cg.units_of(p.node.outputs[0].name), gamma)
        scores.update(bn_scores)
    return _mean(scores)


def random_scores(cg, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    units = sorted(cg.all_units())
    return dict(zip(units, rng.random(len(units)).tolist()))


def _channels_first(x: np.ndarray, layout) -> np.ndarray:
    """Activation → [C, positions] for the tensor's layout (flattened ones are unflattened)."""
    if layout.flat is not None:
        outer, inner = layout.flat
        x = x.reshape(x.shape[: layout.axis] + (outer, layout.size, inner))
        axis = layout.axis + 1
    else:
        axis = layout.axis
    return np.moveaxis(x, axis, 0).reshape(layout.size, -1).astype(np.float32)


def _consumer_weight(c, layout) -> np.ndarray:
    """Consumer weights as [C_out, C_in, window]: window = kernel (Conv) or features per channel."""
    w = const_value(c.node.inputs[1]).astype(np.float64)
    release_constant(c.node.inputs[1])
    if c.kind == "conv":
        return w.reshape(w.shape[0], w.shape[1], -1)
    if c.kind == "convT":  # [C_in, C_out, k…] → [C_out, C_in, window]
        return np.moveaxis(w.reshape(w.shape[0], w.shape[1], -1), 1, 0)
    w = np.moveaxis(w, c.in_axis, 1)  # [C_out, F]
    outer, inner = layout.flat or (1, 1)
    w = w.reshape(w.shape[0], outer, layout.size, inner)
    return np.moveaxis(w, 2, 1).reshape(w.shape[0], layout.size, -1)


def activation_stats(cg, proto, samples, names: list) -> dict:
    """name → (E[x_c], E|x_c|, E[x xᵀ]) per channel over the samples (the covariance a
    :class:`.covariance.Covariance`: dense, or its rows when they are fewer than ``C / 2``).

    The means use every position; the covariance at most ``COV_POSITIONS`` evenly strided
    positions per sample (a 160×120 feature map has 19,200: the products would dominate).
    """
    sums: dict = {}
    for acts in iter_activations(proto, names, samples, threads=1):
        for name in names:
            x = _channels_first(acts[name], cg.layouts[name])
            mean, abs_sum, count, cov = sums.get(name, (0.0, 0.0, 0, None))
            cov = cov or Covariance(x.shape[0])
            # float32 products (BLAS speed), float64 running sums; the covariance dense or as its rows
            cov.add(x[:, :: -(-x.shape[1] // COV_POSITIONS)] if x.shape[1] > COV_POSITIONS else x)
            sums[name] = (mean + x.sum(axis=1, dtype=np.float64), abs_sum + np.abs(x).sum(axis=1, dtype=np.float64),
                          count + x.shape[1], cov)
    return {name: (m / max(n, 1), a / max(n, 1), c.done()) for name, (m, a, n, c) in sums.items()}


def consumer_inputs(cg) -> list:
    return sorted({c.tensor.name for c in cg.consumers})


def data_scores(cg, criterion: str, stats: dict) -> dict:
    scores: dict = {}
    if criterion == "activation":
        for name in consumer_inputs(cg):
            _add(scores, cg.units_of(name), stats[name][1])
        return _mean(scores)
    for c in cg.consumers:
        layout = cg.layouts[c.tensor.name]
        cov = stats[c.tensor.name][2]
        w = _consumer_weight(c, layout)
        if criterion == "taylor":
            layer = np.abs(cov.product_diagonal(w.sum(axis=2)))  # W̄: [C_out, C]
        else:
            damp = 1e-2 * float(np.mean(cov.diagonal())) + 1e-12
            layer = (w * w).sum(axis=(0, 2)) / np.maximum(cov.inverse_diagonal(damp), 1e-30)
        _add(scores, cg.units_of(c.tensor.name), layer)
    return _mean(scores)


def unit_scores(cg, criterion: str, stats: dict, seed: int = 0) -> dict:
    """unit → importance (higher = keep); ``stats`` from :func:`activation_stats`."""
    if criterion == "random":
        return random_scores(cg, seed)
    if criterion in DATA_CRITERIA:
        scores = data_scores(cg, criterion, stats)
        for unit, value in magnitude_scores(cg, "l2").items():
            scores.setdefault(unit, value)  # units read by no consumer: by magnitude
        return scores
    return magnitude_scores(cg, criterion)


def unit_costs(cg) -> dict:
    """unit → multiply-accumulates per sample that removing it saves (its producers, consumers,
    depthwise convs), from the concrete shapes of the analysis run."""
    costs: dict = {}

    def add(name: str, per_channel: float) -> None:
        for unit in cg.units_of(name).tolist():
            costs[unit] = costs.get(unit, 0.0) + per_channel

    def positions(name: str, conv: bool) -> float:
        shape = cg.shapes.get(name)
        if shape is None:
            return 1.0
        return float(np.prod(shape[2:] if conv else shape[:-1]))

    for s in cg.sources:
        w = const_value(s.node.inputs[1])
        out = s.node.outputs[0].name
        add(out, positions(out, s.kind in ("conv", "convT")) * w.size / w.shape[s.out_axis])
    for c in cg.consumers:
        w = const_value(c.node.inputs[1])
        add(c.tensor.name, positions(c.node.outputs[0].name, c.kind in ("conv", "convT")) * w.size / cg.layouts[c.tensor.name].size)
    for node, tensor in cg.depthwise:
        w = const_value(node.inputs[1])
        add(tensor.name, positions(tensor.name, True) * w.size / w.shape[0])
    return costs
