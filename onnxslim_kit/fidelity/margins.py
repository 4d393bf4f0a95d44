"""Decision agreement estimated from margins: flips the judged samples are too few to show.

Counting flipped arg-max decisions on n held-out samples cannot tell a flip rate of 0 from one
below 1/n: on ppocr_cls_v2, ``prune`` kept every one of 32 held-out decisions while moving the
log-probabilities by up to 5.6 nats behind a saturated Softmax, and flipped one of 32
evaluation samples (the original's margin there was 0.055 nats). The probability cosine never
saw it (≥ 0.997). What decides a flip is the *margin* and how far the candidate moves it.

For each softmax row r that counts (the rows :func:`.judge._foreground` keeps), with
ℓ the reference's log-probabilities (``log max(p, 1e-30)``; LogSoftmax outputs as they are), ℓ̂
the candidate's, t the reference's top class and u its runner-up:

    margin   m_r = ℓ_t − ℓ_u                              (≥ 0; the original's, candidate-free)
    closing  d_r = (ℓ_t − ℓ_u) − (ℓ̂_t − ℓ̂_u)              (how far the candidate closed it)

(ℓ_t − ℓ_u is the logits' difference z_t − z_u whatever the Softmax normalizes by.) A row flips
when its closing exceeds its margin; a margin the candidate widened (d < 0) never flips. Shifts
and margins are taken as draws that can meet across rows (a perturbation seen on one row could
meet the margin of another), but not any with any: logits move in proportion to their size (a
sure row at 20 nats moves by nats where a close one moves by hundredths), so a margin m is
paired with the closings of the :data:`NEAREST` judged rows whose margins are nearest m (in
log), and the flip rate on rows not seen is estimated over the margins M of the judged rows
and of the fit samples (the original's margins do not depend on the fit; up to 96 samples,
:attr:`.context.Fidelity.margin_pool` — on ppocr_cls_v2 the 128 calibration samples reach 2.38
nats where the 32 held-out ones stop at 9.36):

    F(m) = share of the min(NEAREST, judged) judged rows nearest m with d_j > m,
    agreement_est = 1 − (1 / |M|) · Σ_{m∈M} F(m)

With 64 judged rows or fewer (a classifier on 32 held-out samples) every closing is paired with
every margin. Both corrections were measured first on CTC strings (:mod:`.strings`): |d| in
place of the signed closing counted every widening as a threat (0.964 estimated where 0.988 of
256 fresh strings held), and pairing all shifts with all margins read 0.38 where 0.91 held.

Exact outputs give d = 0 everywhere, so ``agreement_est`` is 1 (the lossless limit). Completing
the samples not run yet with the reference (the fallback's early bound) adds closings of 0 at
the reference's own margins: the nearest sets stay the same and a 0 never exceeds a margin, so
the estimate can only fall as they are replaced by real ones — it stays a bound.

An exact 0 is below the resolution of what made it (a uint8 output's step, float underflow), not
a log-probability of −69: where the runner-up is 0 on either side, its move cannot be read, and
the closing is the top class's fall alone, ``d_r = ℓ_t − ℓ̂_t`` (a top class gone to 0 still
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
NEAREST = 64  # judged rows whose closings estimate a margin's chance to be overturned
PEAKED = 0.5  # median confidence above uniform from which a projection's rows read as logits
OUTLIER = {3: 6.0}  # classes → median top-vs-rest z from which the top is a winner, not a draw;
OUTLIER_MANY = 4.0  # 4 or more classes (Gaussian rows, 32 per draw: ≤ 3.41 in 300 draws; C = 3: 5.9)


def reads_as_logits(arrays: list) -> bool:
    """Whether the original's ``[N, C]`` outputs (one per sample) read as a classifier's raw logits.

    An unnamed output that a ``Gemm`` / ``MatMul`` with a constant weight projects (:mod:`.views`)
    is a torchvision-style classifier exported without its Softmax — or a regression head, or an
    embedding. Two medians over the rows decide:

    - the confidence above uniform of the row's softmax, ``(p_top − 1/C) / (1 − 1/C)`` ≥
      :data:`PEAKED`: a regression in small units (MTCNN O-Net's boxes and landmarks: 0.04, 0.03)
      is spread evenly; ppocr_cls_v2's and the orientation classifier's logits read 1.00 and 0.90;
    - with three classes or more, the top is an outlier of the rest,
      ``(z_top − mean(rest)) / std(rest)`` ≥ :data:`OUTLIER_MANY` (6 at C = 3): a projection of
      features to Gaussian-like values of large spread is peaked too, but its top is the largest of
      a draw (medians over 32 Gaussian rows: ≤ 3.41 for any C ≥ 4 in 300 draws); the orientation
      classifier's top stands at 301.

    A regression in large units (pixels) can still read as logits: its arg-max is then judged as
    well, which is stricter, never laxer."""
    arrays = [np.asarray(a) for a in arrays if a is not None]
    if not arrays or any(a.ndim != 2 or a.dtype.kind != "f" or a.shape[-1] < 2 for a in arrays):
        return False
    if len({a.shape[-1] for a in arrays}) != 1:
        return False
    rows = np.concatenate(arrays).astype(np.float64)
    rows = rows[np.all(np.isfinite(rows), axis=1)]
    if rows.size == 0:
        return False
    classes = rows.shape[1]
    top = 1.0 / np.sum(np.exp(rows - rows.max(axis=1, keepdims=True)), axis=1)
    if np.median((top - 1.0 / classes) / (1.0 - 1.0 / classes)) < PEAKED:
        return False
    if classes == 2:
        return True
    ordered = -np.sort(-rows, axis=1)
    rest = ordered[:, 1:]
    with np.errstate(divide="ignore", invalid="ignore"):
        outlier = (ordered[:, 0] - rest.mean(axis=1)) / rest.std(axis=1)
    outlier = np.where(np.isnan(outlier), 0.0, outlier)  # a row of equal values: no winner
    return bool(np.median(outlier) >= OUTLIER.get(classes, OUTLIER_MANY))


def log_probs(values: np.ndarray) -> np.ndarray:
    """Log-probabilities of a Softmax output (as they are when any value is negative: LogSoftmax)."""
    values = np.asarray(values, np.float64)
    finite = values[np.isfinite(values)]
    if finite.size and finite.min() < 0:
        return values
    return np.log(np.maximum(values, LOG_FLOOR))


def margins_and_shifts(ref_rows: np.ndarray, got_rows: np.ndarray, logits: bool = False) -> tuple:
    """``(m, d)`` per row of ``[rows, classes]`` probability arrays: margins and signed closings
    (see the module docstring); ``logits``: the rows are a classifier's raw logits, whose
    differences are the log-odds as they are (no floor, no unreadable zero)."""
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
    closing = margin - (got[rows, top] - got[rows, runner])
    unread = np.zeros(len(rows), bool) if logits else (
        (np.asarray(ref_rows)[rows, runner] == 0) | (np.asarray(got_rows)[rows, runner] == 0))
    closing[unread] = (ref[rows, top] - got[rows, top])[unread]  # a zero runner-up: the top's fall
    finite = np.isfinite(margin) & np.isfinite(closing)
    return margin[finite], closing[finite]


def overturn_rates(margins: np.ndarray, judged: np.ndarray, closings: np.ndarray) -> np.ndarray:
    """F(m) per margin in ``margins``: the share of the :data:`NEAREST` ``judged`` margins nearest
    m (in log) whose ``closings`` exceed m (module docstring)."""
    margins = np.asarray(margins, np.float64)
    keys = _log(np.asarray(judged, np.float64))
    order = np.argsort(keys, kind="stable")
    keys, moved = keys[order], np.asarray(closings, np.float64)[order]
    k = min(NEAREST, keys.size)
    start = np.clip(np.searchsorted(keys, _log(margins)) - k // 2, 0, keys.size - k)
    near = moved[start[:, None] + np.arange(k)]  # [margins, k]
    return np.mean(near > margins[:, None], axis=1)


def estimated_agreement(margins: np.ndarray, judged: np.ndarray, closings: np.ndarray) -> float:
    """``1 − mean F(m)`` over ``margins`` (the judged rows' and the pool's), F from the
    ``judged`` rows' margins and their ``closings``; 1.0 when there is nothing to pair."""
    if np.size(margins) == 0 or np.size(closings) == 0:
        return 1.0
    return float(1.0 - np.mean(overturn_rates(margins, judged, closings)))


def _log(values: np.ndarray) -> np.ndarray:
    return np.log(np.maximum(values, 1e-12))
