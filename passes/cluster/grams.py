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

Rows instead of ``H`` (``keep_rows``, the pass's large-model mode): a layer seen on ``R`` rows
with ``4 R k < 8 k²`` (fewer rows than twice its width: issue 16's decoder, 4 samples of 32
tokens, 128 rows against widths 1536 and 6144) holds its rows in float32 and forms ``H`` when
GPTQ asks for it (:attr:`Gram.normalized_gram`, one GEMM) — or, with ``R`` at most a quarter of
``k``, never: GPTQ's factor then comes from the rows in low-rank form (:meth:`Gram.factor`,
:func:`.maths.gptq.lowrank_factor`: ``O(k R²)`` instead of ``O(k³)``, no ``k × k`` array). ``R``
per layer comes from one probe run of the first sample (:func:`probe_rows`); the groups are then
sized by what each layer holds, ``min(8k², 4Rk)`` — all of that decoder's 145 layers in one
group, one streamed pass over the samples instead of one per group (36 at 128 MB a group: a
6144-wide ``H`` is 302 MB alone).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from onnxslim_kit.api import iter_activations

from onnxslim_kit.passes._common.layer_stats import MAX_ROWS, conv_geometry, conv_rows, matmul_rows
from onnxslim_kit.passes.cluster.maths.gptq import LOWRANK_RATIO, gptq_factor, lowrank_factor

GRAM_BUDGET = 128 << 20  # bytes of Gram matrices held at once


@dataclass(eq=False)
class Gram:
    """``XᵀX`` summed over the rows seen, and their number."""

    total: np.ndarray | None = None
    gram_rows: int = 0
    held: list | None = None  # float32 row blocks, while they are smaller than XᵀX

    def add(self, rows: np.ndarray, keep: bool) -> None:
        """Add rows; ``keep``: hold them while ``4 R k < 8 k²`` (module docstring)."""
        if keep and self.total is None and 4 * (self.gram_rows + len(rows)) < 8 * rows.shape[1]:
            self.held = (self.held or []) + [np.array(rows, np.float32)]
        else:
            r64 = self._stack(rows)
            self.total = r64.T @ r64 if self.total is None else self.total + r64.T @ r64
        self.gram_rows += len(rows)

    def _stack(self, rows: np.ndarray) -> np.ndarray:
        """``rows`` (and any held ones, which then go) in float64."""
        parts, self.held = (self.held or []) + [rows], None
        return np.concatenate([np.asarray(p, np.float64) for p in parts])

    def held_rows(self) -> np.ndarray | None:
        """The held rows as one float32 array (kept as such), None when ``H`` is held instead."""
        if self.held and len(self.held) > 1:
            self.held = [np.concatenate(self.held)]
        return self.held[0] if self.held else None

    def factor(self) -> tuple:
        """GPTQ's ``(dead inputs, U)`` of ``H``: :func:`.maths.gptq.lowrank_factor` from the held
        rows when they are at most ``1 / LOWRANK_RATIO`` of the width, else :func:`.maths.gptq.gptq_factor`."""
        rows = self.held_rows()
        if rows is not None and LOWRANK_RATIO * len(rows) <= rows.shape[1]:
            return lowrank_factor(rows, self.gram_rows)
        return gptq_factor(self.normalized_gram, overwrite=True)  # a fresh array

    @property
    def normalized_gram(self) -> np.ndarray | None:
        if self.held:
            r64 = self.held_rows().astype(np.float64)
            return (r64.T @ r64) / max(self.gram_rows, 1)
        return None if self.total is None else self.total / max(self.gram_rows, 1)


def _key(layer) -> tuple:
    return layer.input_name, layer.kind, layer.k


def chunks(proto, layers: list, samples: list, budget: int = GRAM_BUDGET, seed: int = 0, keep_rows: bool = False):
    """Yield ``(layers of the group, {layer.key: Gram})`` group by group (module docstring)."""
    by_input = {}
    for layer in layers:
        by_input.setdefault(_key(layer), []).append(layer)
    rows = probe_rows(proto, layers, samples) if keep_rows and samples else {}

    def held_bytes(layer) -> int:
        gram = 8 * layer.k * layer.k
        seen_rows = rows.get(_key(layer))
        return gram if seen_rows is None or 4 * seen_rows >= 8 * layer.k else 4 * seen_rows * layer.k

    groups, current, held, seen = [], [], 0, set()
    for layer in (layer for same in by_input.values() for layer in same):
        size = 0 if _key(layer) in seen else held_bytes(layer)
        if current and size and held + size > budget:
            groups.append(current)
            current, held, seen = [], 0, set()
            size = held_bytes(layer)
        seen.add(_key(layer))
        current.append(layer)
        held += size
    if current:
        groups.append(current)
    rng = np.random.default_rng(seed)
    for group in groups:
        yield group, _collect(proto, group, samples, rng, keep_rows)


def probe_rows(proto, layers: list, samples: list) -> dict:
    """``{_key(layer): rows all samples give}`` of the MatMul / Gemm layers, from one run of the
    first sample (every sample taken to give as many rows, at most ``MAX_ROWS`` each)."""
    names = sorted({layer.input_name for layer in layers if layer.kind != "conv"})
    if not names:
        return {}
    values = next(iter(iter_activations(proto, names, samples[:1], threads=1)))
    return {_key(layer): len(samples) * min(MAX_ROWS, values[layer.input_name].size // layer.k)
            for layer in layers if layer.kind != "conv"}


def _collect(proto, layers: list, samples: list, rng, keep_rows: bool = False) -> dict:
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
            entry.add(rows, keep_rows)
        del values
    return by_layer
