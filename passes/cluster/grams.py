"""Input Gram matrices for GPTQ (``cluster`` with calibration data), a few layers at a time.

GPTQ needs, per layer ``Y = X W``, ``H = XᵀX / rows`` (``k × k``, float64) of its input rows
(MatMul / Gemm: the activation as ``(−1, k)``; Conv: im2col patches; at most ``MAX_ROWS`` rows a
sample, seeded — :mod:`onnxslim_kit.passes._common.layer_stats`). Holding every layer's ``H`` at
once costs ``Σ 8 k²`` bytes — on a 4-layer decoder with 4096-wide MLPs, 134 MB per down
projection alone, more than the model's weights — so :func:`chunks` yields the layers in
groups whose distinct Gram matrices take at most ``budget`` bytes (a larger one alone), each
with its statistics from one streamed pass over the samples
(:func:`onnxslim_kit.api.iter_activations`: only that group's inputs are exposed), and the
caller drops them before the next group. Layers reading one tensor the same way (Q/K/V
projections) share one matrix. Unlike the ``svd`` pass's statistics, no half-sample matrices
or fourth moments: GPTQ uses ``H`` alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from onnxslim_kit.api import iter_activations

from onnxslim_kit.passes._common.layer_stats import conv_geometry, conv_rows, matmul_rows

GRAM_BUDGET = 128 << 20  # bytes of Gram matrices held at once


@dataclass(eq=False)
class Gram:
    """``XᵀX`` summed over the rows seen, and their number."""

    total: np.ndarray | None = None
    gram_rows: int = 0

    @property
    def normalized_gram(self) -> np.ndarray | None:
        return None if self.total is None else self.total / max(self.gram_rows, 1)


def _key(layer) -> tuple:
    return layer.input_name, layer.kind, layer.k


def chunks(proto, layers: list, samples: list, budget: int = GRAM_BUDGET, seed: int = 0):
    """Yield ``(layers of the group, {layer.key: Gram})`` group by group (module docstring)."""
    by_input = {}
    for layer in layers:
        by_input.setdefault(_key(layer), []).append(layer)
    groups, current, held, seen = [], [], 0, set()
    for layer in (layer for same in by_input.values() for layer in same):
        size = 0 if _key(layer) in seen else 8 * layer.k * layer.k
        if current and size and held + size > budget:
            groups.append(current)
            current, held, seen = [], 0, set()
            size = 8 * layer.k * layer.k
        seen.add(_key(layer))
        current.append(layer)
        held += size
    if current:
        groups.append(current)
    rng = np.random.default_rng(seed)
    for group in groups:
        yield group, _collect(proto, group, samples, rng)


def _collect(proto, layers: list, samples: list, rng) -> dict:
    shared, by_layer = {}, {}
    names = sorted({layer.input_name for layer in layers})
    for values in iter_activations(proto, names, samples, threads=1):
        done = set()
        for layer in layers:
            x = values[layer.input_name]
            if layer.kind == "conv" and layer.geometry is None:
                layer.geometry = conv_geometry(layer.node, x.shape)
            key = _key(layer) + (layer.geometry,)
            entry = by_layer[layer.key] = shared.setdefault(key, Gram())
            if key in done:
                continue
            done.add(key)
            rows = conv_rows(x, layer.geometry, rng)[0] if layer.kind == "conv" else matmul_rows(x, layer.k, rng)[0]
            r64 = rows.astype(np.float64)
            entry.total = r64.T @ r64 if entry.total is None else entry.total + r64.T @ r64
            entry.gram_rows += len(r64)
        del values
    return by_layer
