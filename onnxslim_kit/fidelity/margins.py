"""Decision agreement estimated from margins: flips the judged samples are too few to show.

Counting flipped arg-max decisions on n held-out samples cannot tell a flip rate of 0 from one
below 1/n: on ppocr_cls_v2, ``prune`` kept every one of 32 held-out decisions while moving the
log-probabilities by up to 5.6 nats behind a saturated Softmax, and flipped one of 32
evaluation samples (the original's margin there was 0.055 nats). The probability cosine never
saw it (≥ 0.997). What decides a flip is the *margin* and how far the candidate moves it.

For each softmax row r that counts (the rows :func:`.judge._foreground` keeps), with
ℓ the reference's log-probabilities (``log max(p, 1e-30)``; LogSoftmax outputs as they are), ℓ̂
the candidate's, t the reference's top class and u its runner-up:

    margin  m_r = ℓ_t − ℓ_u                              (≥ 0; the original's, candidate-free)
    shift   d_r = |(ℓ_t − ℓ_u) − (ℓ̂_t − ℓ̂_u)|            (how far the candidate moved it)

A row flips when its shift exceeds its margin. Taking shifts and margins as independent draws
(a perturbation of the size seen on one row could meet the margin of any other), the flip rate
on rows not seen is estimated over all pairs of the judged rows' shifts D and the margins M of
the judged rows and of the fit samples (the original's margins do not depend on the fit; up to
96 of them, :attr:`.context.Fidelity.margin_pool` — on ppocr_cls_v2 the 128 calibration
samples reach 2.38 nats where the 32 held-out ones stop at 9.36):

    flip = (1 / |D||M|) · Σ_{d∈D} #{m ∈ M : m < d},        agreement_est = 1 − flip

Exact outputs give d = 0 everywhere, so ``agreement_est`` is 1 (the lossless limit). Completing
the samples not run yet with the reference (the fallback's early bound) adds shifts of 0: the
estimate can only fall as they are replaced by real ones, so it stays a bound.

An exact 0 is below the resolution of what made it (a uint8 output's step, float underflow), not
a log-probability of −69: where the runner-up is 0 on either side, its move cannot be read, and
the shift is the top class's move alone, ``d_r = |ℓ_t − ℓ̂_t|`` (a top class gone to 0 still
counts in full). Measured: ORT ``quantize_static``'s uint8 output of ppocr_cls_v2 writes every
runner-up as 0; read through the floor, each of 16 shifts was 43–59 nats and the estimate 0,
while all 16 decisions agreed at probability cosine 1.0000.

A ``logits`` view (:mod:`.views`: an output named ``logits``, the classifier's scores before
any Softmax) gives ℓ as it is: a difference of logits is the same log-odds.

Rows of a softmax over a single class have no margin and are left out; so are ``scores``
views (sigmoid maps: counted by their thresholded sets only).
"""

from __future__ import annotations

import numpy as np

LOG_FLOOR = 1e-30  # probabilities below this count as this (a margin beyond ~69 nats is "sure")


def log_probs(values: np.ndarray) -> np.ndarray:
    """Log-probabilities of a Softmax output (as they are when any value is negative: LogSoftmax)."""
    values = np.asarray(values, np.float64)
    finite = values[np.isfinite(values)]
    if finite.size and finite.min() < 0:
        return values
    return np.log(np.maximum(values, LOG_FLOOR))


def margins_and_shifts(ref_rows: np.ndarray, got_rows: np.ndarray, logits: bool = False) -> tuple:
    """``(m, d)`` per row of ``[rows, classes]`` probability arrays (see the module docstring);
    ``logits``: the rows are a classifier's raw logits, whose differences are the log-odds as
    they are (no floor, no unreadable zero)."""
    if ref_rows.ndim != 2 or ref_rows.shape[1] < 2 or ref_rows.shape[0] == 0:
        return np.zeros(0), np.zeros(0)
    if logits:
        ref, got = np.asarray(ref_rows, np.float64), np.asarray(got_rows, np.float64)
    else:
        ref, got = log_probs(ref_rows), log_probs(got_rows)
    order = np.argsort(-ref, axis=1, kind="stable")
    top, runner = order[:, 0], order[:, 1]
    rows = np.arange(ref.shape[0])
    margin = ref[rows, top] - ref[rows, runner]
    moved = got[rows, top] - got[rows, runner]
    shift = np.abs(margin - moved)
    unread = np.zeros(len(rows), bool) if logits else (
        (np.asarray(ref_rows)[rows, runner] == 0) | (np.asarray(got_rows)[rows, runner] == 0))
    shift[unread] = np.abs(ref[rows, top] - got[rows, top])[unread]  # a zero runner-up: the top's move
    finite = np.isfinite(margin) & np.isfinite(shift)
    return margin[finite], shift[finite]


def estimated_agreement(margins: np.ndarray, shifts: np.ndarray) -> float:
    """``1 − flip`` over all (shift, margin) pairs; 1.0 when there is nothing to pair."""
    if margins.size == 0 or shifts.size == 0:
        return 1.0
    below = np.searchsorted(np.sort(margins), shifts, side="left")  # #{m < d} per shift
    return float(1.0 - below.sum() / (margins.size * shifts.size))
