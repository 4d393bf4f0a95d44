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
output channels only) and ``W₀`` the pruned weights (with the removed channels' means already
in the bias), ridge regression with a prior toward ``W₀``::

    W(α) = argmin ‖X W − Y‖² + λ‖W − W₀‖²  =  (XᵀX + λI)⁻¹ (XᵀY + λW₀),   λ = α · tr(XᵀX)/d

α is chosen on held-out rows: the rows of even-numbered samples fit ``W(α)`` for every α of
``ALPHAS`` (one eigendecomposition gives them all), the rows of odd-numbered samples score them,
and the best α is solved again on all rows — in the dual form (m × m matrices) when there are
fewer rows m than unknowns, the primal (n × n) otherwise (:mod:`onnxslim_kit.passes.prune.ridge`). Shrinking toward W₀ rather than 0 is what makes
this work with few rows (an FC / SE layer sees one row per sample): a large α keeps W₀ where
the data do not determine the weights. When no α beats W₀ on the held-out rows the layer
keeps W₀ (reason counted). Then for Conv ``W ← W.reshape(C_out, C_in', kh, kw)`` and bias; for
Gemm ``B = W/α_gemm`` (transposed back if ``transB``) and ``C = c/β``; MatMul has no bias column.

Cost: the teacher runs once for all consumers (:meth:`Refitter.prepare` keeps only the sampled
rows); the student runs once per consumer, on the first ``n`` samples only, where a Conv whose
output has ``P`` positions per sample uses ``n = min(S, max(MIN_SAMPLES, ⌈4·MAX_ROWS / P⌉))``
(large feature maps give plenty of rows from few images — this is what makes the text
detector's re-fit fast). Skipped with a reason: more than ``MAX_INPUTS`` unknowns per output
(the normal equations would be too large). A 1-D Conv (audio: silero VAD's encoder) is
re-fitted as a 2-D one over a height of 1 (:func:`conv_rows_geometry`).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from onnxslim_kit.activations import iter_activations

from onnxslim_kit.passes._common.graph import attr, const_value
from onnxslim_kit.passes.prune.apply import set_input
from onnxslim_kit.passes.prune.held import release
from onnxslim_kit.passes.prune.ridge import ALPHAS, fit_held_out, ridge, ridge_held_out  # noqa: F401 (re-exported)
from onnxslim_kit.passes.prune.student import truncate, waves
from onnxslim_kit.passes._common.layer_stats import conv_geometry

MAX_ROWS = 8192
MAX_INPUTS = 4608
MIN_SAMPLES = 4


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


def conv_rows_geometry(node, x: np.ndarray) -> tuple:
    """``(x, geometry)`` for :func:`im2col_rows`: a 1-D Conv's input [N, C, L] and attributes
    lifted to 2-D over a height of 1 (kernel 1×k, stride 1×s, …); a 2-D Conv's as they are."""
    if x.ndim == 4:
        return x, conv_geometry(node, x.shape)
    attrs = dict(node.attrs)
    for key, one in (("strides", [1]), ("dilations", [1])):
        attrs[key] = [1] + list(attrs.get(key, one))
    pads = list(attrs.get("pads", [0, 0]))
    attrs["pads"] = [0, pads[0], 0, pads[1]]
    weight = node.inputs[1].values
    kernel = SimpleNamespace(values=np.empty(weight.shape[:2] + (1,) + weight.shape[2:], np.int8))  # shape only
    lifted = SimpleNamespace(attrs=attrs, inputs=[None, kernel])
    return x[:, :, None, :], conv_geometry(lifted, (x.shape[0], x.shape[1], 1, x.shape[2]))


def _positions(shape, count: int, rng) -> np.ndarray:
    """Random output positions (batch, *spatial) of a Conv output ``shape`` [N, C, *spatial]."""
    grid = [shape[0]] + list(shape[2:])
    total = int(np.prod(grid))
    flat = rng.choice(total, size=min(count, total), replace=False)
    return np.stack(np.unravel_index(flat, grid), axis=1)


def _held_out(sample_ids: np.ndarray) -> np.ndarray:
    """Rows of odd-numbered samples (of odd rows when all come from one sample)."""
    if len(np.unique(sample_ids)) > 1:
        return sample_ids % 2 == 1
    return np.arange(len(sample_ids)) % 2 == 1


def not_refittable(c) -> str | None:
    """Why consumer ``c`` cannot be re-fitted (None: it can)."""
    node, w = c.node, const_value(c.node.inputs[1])
    if c.kind == "convT":
        return "ConvTranspose (mean compensation only)"
    if c.kind == "conv" and w.ndim not in (3, 4):
        return "Conv not 1-D or 2-D"
    if c.kind == "gemm" and len(node.inputs) > 2 and node.inputs[2].name and (
            const_value(node.inputs[2]) is None or const_value(node.inputs[2]).size not in (1, w.shape[1 - c.in_axis])):
        return "Gemm with a matrix C"
    if (int(np.prod(w.shape[1:])) if c.kind == "conv" else w.shape[c.in_axis]) > MAX_INPUTS:
        return "too many inputs per output"
    return None


class Refitter:
    """Collects rows for the consumers and solves; see the module docstring."""

    def __init__(self, model, teacher, samples, seed: int = 0):
        self.model = model
        self.teacher = teacher
        self.samples = samples
        self.rng = np.random.default_rng(seed)
        self.targets: dict = {}  # consumer node id -> (samples used, positions per sample, Y rows per sample)
        self.inputs: dict = {}  # consumer node id -> (X rows per sample, sample index per row)

    def refit_all(self, todo: list, result, progress=lambda it, **_: it) -> None:
        """Re-fit ``todo`` [(consumer, out mask)] in topological order: one teacher run for all,
        one truncated student run per wave of independent consumers."""
        self.prepare([c for c, _ in todo])
        structure = self.model.to_proto(weights=False)
        for wave in progress(waves(structure, todo, lambda item: item[0].node), desc="prune refit"):
            self.collect(wave)
            for c, out_mask in wave:
                self.refit(c, out_mask, result)

    def prepare(self, consumers: list) -> None:
        """One teacher run over the samples: the target rows of every consumer in ``consumers``."""
        consumers = [c for c in consumers if not not_refittable(c)]
        if not consumers:
            return
        names = sorted({c.node.outputs[0].name for c in consumers})
        for c in consumers:
            self.targets[id(c.node)] = [None, [], []]
        for i, acts in enumerate(iter_activations(self.teacher, names, self.samples, threads=1)):
            for c in consumers:
                target = self.targets[id(c.node)]
                y = acts[c.node.outputs[0].name]
                if target[0] is None:
                    target[0] = self._samples_for(c, y.shape)
                if i >= target[0]:
                    continue
                if c.kind == "conv":
                    pos = _positions(y.shape, max(MAX_ROWS // target[0], 1), self.rng)
                    target[1].append(pos)
                    y = y[(pos[:, 0], slice(None)) + tuple(pos[:, 1 + k] for k in range(y.ndim - 2))]
                target[2].append(y.reshape(-1, y.shape[-1]).astype(np.float64))

    def _samples_for(self, c, shape) -> int:
        if c.kind != "conv":
            return len(self.samples)
        per_sample = int(np.prod(shape[2:]))
        return min(len(self.samples), max(MIN_SAMPLES, -(-4 * MAX_ROWS // max(per_sample, 1))))

    def refit(self, c, out_mask, result) -> None:
        node = c.node
        w = const_value(node.inputs[1])
        reason = not_refittable(c)
        if reason:
            result.skip(f"refit: {reason}")
            return
        d = int(np.prod(w.shape[1:])) if c.kind == "conv" else w.shape[c.in_axis]
        x, y, ids = self._rows(c, out_mask)
        has_bias = c.kind != "matmul"
        w0 = self._current(c, w)
        if has_bias:
            x = np.concatenate([x, np.ones((len(x), 1))], axis=1)
        else:
            w0 = w0[:-1]
        alpha, after, before, solved = fit_held_out(x, y, w0, _held_out(ids), d)
        if solved is None:
            result.skip("refit: no held-out improvement")
            return
        self._store(c, w, solved)
        result.rewrite("refit layer")
        result.metrics.setdefault("refit_error_ratio", []).append(round(after / max(before, 1e-30), 4))
        result.metrics.setdefault("refit_alpha", []).append(alpha)

    # --- data -------------------------------------------------------------------
    def collect(self, wave: list) -> None:
        """Student input rows of every consumer of ``wave`` [(consumer, out mask)] in one run of
        the model truncated to their inputs (:mod:`onnxslim_kit.passes.prune.student`)."""
        todo = [c for c, _ in wave if id(c.node) in self.targets and id(c.node) not in self.inputs]
        if not todo:
            return
        names = sorted({c.node.inputs[0].name for c in todo})
        n = max(self.targets[id(c.node)][0] for c in todo)
        proto, arrays = self.model.session_proto()  # the session runs on the student's own arrays
        proto = truncate(proto, names)
        for c in todo:
            self.inputs[id(c.node)] = ([], [])
        for i, acts in enumerate(iter_activations(proto, names, self.samples[:n], threads=1, arrays=arrays)):
            for c in todo:
                if i >= self.targets[id(c.node)][0]:
                    continue
                x = acts[c.node.inputs[0].name]
                xs, ids = self.inputs[id(c.node)]
                if c.kind == "conv":
                    pos = self.targets[id(c.node)][1][i]
                    if pos.shape[1] == 2:  # 1-D: (n, l) → (n, 0, l) on the lifted input
                        pos = np.insert(pos, 1, 0, axis=1)
                    xs.append(im2col_rows(*conv_rows_geometry(c.node, x), pos))
                else:
                    xs.append(x.reshape(-1, x.shape[-1]))
                ids.append(np.full(len(xs[-1]), i))
        release(self.model)  # the weight pages the run read (:mod:`onnxslim_kit.passes.prune.held`)

    def _rows(self, c, out_mask):
        """Student input rows X, teacher target rows Y and the sample index of every row."""
        if id(c.node) not in self.targets:
            self.prepare([c])
        self.collect([(c, out_mask)])
        _, _, ys = self.targets.pop(id(c.node))
        xs, ids = self.inputs.pop(id(c.node))
        y = np.concatenate(ys)
        return np.concatenate(xs).astype(np.float64), y if out_mask is None else y[:, out_mask], np.concatenate(ids)

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
