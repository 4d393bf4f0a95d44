"""Closed-form layer-wise re-fit after pruning (distillation from the model before pruning).

For each consumer that lost input channels, in topological order, we re-solve its weights so
that its output on the calibration data matches the *teacher* — the model as it was when the
prune pass started (equal to the original up to the lossless passes before it; the names of
its tensors are the ones of the model being pruned, which the original's may not be after
``fuse``). Inputs come from the *student* — the pruned model with the consumers before this
one already re-fitted — so each layer also compensates the error of the ones before it.

With ``X`` the student's input rows (im2col patches of the kept channels for a Conv, at
randomly sampled output positions, at most ``MAX_ROWS``; rows of features for Gemm/MatMul)
with a column of ones for the bias, ``Y`` the teacher's output at the same positions (kept
output channels only) and ``W₀`` the pruned weights, ridge regression toward ``W₀``::

    W = argmin ‖X W − Y‖² + λ‖W − W₀‖²  =  (XᵀX + λI)⁻¹ (XᵀY + λW₀),   λ = α · tr(XᵀX)/d

(α = ``RIDGE`` = 1e-3; shrinking toward W₀ rather than 0 keeps the weights sensible where the
data do not determine them, e.g. a Gemm head seeing 8 samples). Then for Conv
``W ← W.reshape(C_out, C_in', kh, kw)`` and bias; for Gemm ``B = W/α`` (transposed back if
``transB``) and ``C = c/β``; MatMul has no bias column.

Skipped with a reason: fewer than ``2·(d + 1)`` rows (a Gemm head seeing one row per
sample would memorise the calibration set, not generalise), more than ``MAX_INPUTS`` unknowns per output
(the normal equations would be too large), a solve that does not lower the error.
"""

from __future__ import annotations

import numpy as np

from onnxslim_kit.activations import iter_activations

from ._graph import attr, const_value
from ._prune_apply import set_input
from ._svd_stats import conv_geometry

RIDGE = 1e-3
MAX_ROWS = 8192
MAX_INPUTS = 4608
MIN_ROWS_PER_INPUT = 2  # rows ≥ 2·(d + 1), else the solve would just memorise the samples


def im2col_rows(x: np.ndarray, geo, positions: np.ndarray) -> np.ndarray:
    """Patches of ``x`` [N, C, H, W] under a 2-D kernel at output ``positions`` [P, 3] (n, y, x).

    ``geo``: :class:`._svd_stats.ConvGeometry` (``auto_pad`` already resolved to pads).
    """
    (kh, kw), (sh, sw), (dh, dw), (pt, pl, pb, pr) = geo.kernel, geo.strides, geo.dilations, geo.pads
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    iy = positions[:, 1:2] * sh + np.arange(kh) * dh  # [P, kh]
    ix = positions[:, 2:3] * sw + np.arange(kw) * dw  # [P, kw]
    channels = np.arange(x.shape[1])
    patches = xp[positions[:, 0, None, None, None], channels[None, :, None, None], iy[:, None, :, None],
                 ix[:, None, None, :]]
    return patches.reshape(len(positions), -1)


def _positions(shape, count: int, rng) -> np.ndarray:
    """Random output positions (batch, *spatial) of a Conv output ``shape`` [N, C, *spatial]."""
    grid = [shape[0]] + list(shape[2:])
    total = int(np.prod(grid))
    flat = rng.choice(total, size=min(count, total), replace=False)
    return np.stack(np.unravel_index(flat, grid), axis=1)


def _ridge(x: np.ndarray, y: np.ndarray, w0: np.ndarray, bias_col: bool) -> np.ndarray:
    d = x.shape[1] - (1 if bias_col else 0)
    gram = x.T @ x
    lam = RIDGE * float(np.trace(gram[:d, :d])) / max(d, 1) + 1e-12
    return np.linalg.solve(gram + lam * np.eye(len(gram)), x.T @ y + lam * w0)


class Refitter:
    """Collects rows for one consumer and solves; see the module docstring."""

    def __init__(self, model, teacher, samples, seed: int = 0):
        self.model = model
        self.teacher = teacher
        self.samples = samples
        self.rng = np.random.default_rng(seed)

    def refit(self, c, out_mask, result) -> None:
        node = c.node
        w = const_value(node.inputs[1])
        if c.kind == "conv" and w.ndim != 4:
            result.skip("refit: Conv not 2-D")
            return
        d = int(np.prod(w.shape[1:])) if c.kind == "conv" else w.shape[c.in_axis]
        if c.kind == "gemm" and len(node.inputs) > 2 and node.inputs[2].name and (
                const_value(node.inputs[2]) is None or const_value(node.inputs[2]).size not in (1, w.shape[1 - c.in_axis])):
            result.skip("refit: Gemm with a matrix C")
            return
        if d > MAX_INPUTS:
            result.skip("refit: too many inputs per output")
            return
        x, y = self._rows(c, w, d, out_mask)
        if len(x) < MIN_ROWS_PER_INPUT * (d + 1):
            result.skip("refit: fewer calibration rows than unknowns")
            return
        has_bias = c.kind != "matmul"
        w0 = self._current(c, w)
        if has_bias:
            x = np.concatenate([x, np.ones((len(x), 1))], axis=1)
        else:
            w0 = w0[:-1]
        solved = _ridge(x, y, w0, has_bias)
        before = float(np.sum((x @ w0 - y) ** 2))
        after = float(np.sum((x @ solved - y) ** 2))
        if not after < before:
            result.skip("refit: no improvement")
            return
        self._store(c, w, solved)
        result.rewrite("refit layer")
        result.metrics.setdefault("refit_error_ratio", []).append(round(after / max(before, 1e-30), 4))

    # --- data -------------------------------------------------------------------
    def _rows(self, c, w, d, out_mask):
        node = c.node
        in_name, out_name = node.inputs[0].name, node.outputs[0].name
        per_sample = max(MAX_ROWS // max(len(self.samples), 1), 1)
        positions = []
        ys = []
        for acts in iter_activations(self.teacher, [out_name], self.samples, threads=1):
            y = acts[out_name]
            if c.kind == "conv":
                pos = _positions(y.shape, max(per_sample, 1), self.rng)
                positions.append(pos)
                y = y[(pos[:, 0], slice(None)) + tuple(pos[:, 1 + i] for i in range(y.ndim - 2))]  # [P, C_out]
            y = y.reshape(-1, y.shape[-1])
            ys.append(y if out_mask is None else y[:, out_mask])
        xs = []
        for i, acts in enumerate(iter_activations(self.model.to_proto(), [in_name], self.samples, threads=1)):
            x = acts[in_name]
            xs.append(im2col_rows(x, conv_geometry(node, x.shape), positions[i]) if c.kind == "conv"
                      else x.reshape(-1, d))
        return np.concatenate(xs).astype(np.float64), np.concatenate(ys).astype(np.float64)

    # --- weights ----------------------------------------------------------------
    def _current(self, c, w) -> np.ndarray:
        """Current weights as the [d + 1, C_out] solution matrix (last row: bias)."""
        node = c.node
        w64 = w.astype(np.float64)
        if c.kind == "conv":
            mat = w64.reshape(w.shape[0], -1).T
            bias = const_value(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2].name else None
            bias = np.zeros(w.shape[0]) if bias is None else bias.astype(np.float64)
            return np.vstack([mat, bias[None]])
        if c.kind == "matmul":
            return np.vstack([w64, np.zeros((1, w.shape[1]))])
        alpha, beta = float(attr(node, "alpha", 1.0)), float(attr(node, "beta", 1.0))
        mat = alpha * (w64.T if int(attr(node, "transB", 0)) else w64)
        cvec = np.zeros(mat.shape[1])
        if len(node.inputs) > 2 and node.inputs[2].name and const_value(node.inputs[2]) is not None:
            cvec = cvec + beta * const_value(node.inputs[2]).astype(np.float64).reshape(-1)  # size 1 or N
        return np.vstack([mat, cvec[None]])

    def _store(self, c, w, solved) -> None:
        node = c.node
        dtype = w.dtype
        if c.kind == "conv":
            set_input(self.model, node, 1, solved[:-1].T.reshape(w.shape).astype(dtype))
            set_input(self.model, node, 2, solved[-1].astype(dtype))
        elif c.kind == "matmul":
            set_input(self.model, node, 1, solved.astype(dtype))
        else:
            alpha = float(attr(node, "alpha", 1.0))
            mat = solved[:-1] / alpha
            set_input(self.model, node, 1, (mat.T if int(attr(node, "transB", 0)) else mat).astype(dtype))
            set_input(self.model, node, 2, solved[-1].astype(dtype))
            node.attrs["beta"] = 1.0
