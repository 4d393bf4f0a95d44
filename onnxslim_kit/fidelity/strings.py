"""CTC sequence outputs judged by the strings they decode to, and how close each string is to changing.

A CTC recognizer (ddddocr, a captcha reader, a speech model's frame logits) ends in a
projection to classes per time step, ``[N, T, C]`` or ``[T, N, C]``, and the string a user reads
is its greedy decoding: the arg-max path π over C at every step, repeats collapsed, blanks
dropped. Judged per step, most arg-max flips are harmless (a boundary step moving between the
blank and the character beside it), and ddddocr holds per-step margins as small as 0.018; judged
by cosine, int8 read 0.994 while 3 of 32 lines read differently. So the decision is the string.

**Which outputs.** :mod:`.views` marks the candidates (``View.ctc``): an output named
``logits`` without a token mask, an unnamed output produced by a ``Gemm`` / ``MatMul``
with a constant weight (+ a constant bias), through layout ops only, and a 3-D ``Softmax``
output over its last axis (margins then read from its log-probabilities). The data decide
(:func:`ctc_layout`, on the original's outputs): every one is 3-D with at least
:data:`MIN_CLASSES` classes, sequences of at least :data:`MIN_STEPS` steps (median), and one
class — the blank — wins at least :data:`BLANK_SHARE` of all steps. A language model's or a
projection's arg-max is spread over many classes and stays judged as before. The batch axis is
the leading axis of size 1 beside a longer one (``[1, T, C]``: 0, ``[T, 1, C]``: 1), else 0.

**Observed agreement**: the share of sequences whose decoded strings are equal.

**Which flips matter.** Changing step t alone from a = π_t to j changes only what steps t and
t+1 emit: step s emits π_s unless π_s is the blank b or equals π_{s−1}. So with p = π_{t−1},
n = π_{t+1},

    E(c) = [c if c ∉ {b, p}] + [n if n ∉ {b, c}]       (what t and t+1 emit with π_t = c)

and the substitution is harmless iff E(j) = E(a) as strings. Only j ∈ {b, p, n} can be
harmless, so among the five best classes of a step the first harmful runner-up j* exists
whenever C ≥ 5. The step's margin and how far the candidate closed it (logits as they are):

    m_t = ℓ_a − ℓ_{j*},     d_t = m_t − (ℓ̂_a − ℓ̂_{j*})

signed: the step flips iff d_t > m_t, and a margin the candidate widened (d_t < 0) never does.
(|d| in place of d, as the Softmax views of :mod:`.margins` had it until session 16, counts a
widening as a threat: on captcha-whisperer's CRNN that read 0.964 of the strings kept where 256
fresh codes kept 0.988, the signed form 0.982; on ddddocr 0.815 where 0.910 held, signed 0.903
— full int8 run as ORT's Q/DQ emulation; ``benchmarks/results/ctc-estimate-2026-12-07-s15*.md``
has the kernels' figures.)

**Estimated agreement**, the strings' form of :func:`.margins.estimated_agreement`. A shift is
paired with margins of its own size: raw logits move in proportion to how large they are (a
blank step at 20 nats moves by 10 under int8 where a close step moves by 0.3; on ddddocr's
full int8 the judged steps' log margins and log shifts correlate at 0.2), so pairing every
shift with every margin (the Softmax views' form until session 16) read 0.38 where 0.91 of the
strings held.
With F(m) the share of the :data:`.margins.NEAREST` judged steps whose margins are nearest m (in log)
that were closed by more than m, a string keeps its reading with probability Π_t (1 − F(m_t)), and
over the judged strings and those of the fit samples (the original's margins only)

    agreement_est = mean_s Π_{t ∈ s} (1 − F(m_t))

Exact outputs give d = 0 everywhere and the estimate is 1 (the lossless limit).
"""

from __future__ import annotations

import numpy as np

from .margins import log_probs, overturn_rates

MIN_CLASSES = 8  # fewer classes: keypoint or box coordinates, not a character set
MIN_STEPS = 4  # median steps per sequence
BLANK_SHARE = 0.5  # the most frequent class wins at least this share of steps: a CTC blank
TOP = 5  # classes looked at per step: a, then at most three harmless ones before a harmful one
NONE = -1


def ctc_layout(arrays: list) -> tuple | None:
    """``(batch axis, blank)`` when the original's outputs ``arrays`` (one per sample) read as
    CTC sequences (module docstring), else None."""
    arrays = [np.asarray(a) for a in arrays if a is not None]
    if not arrays or any(a.ndim != 3 or a.dtype.kind != "f" or a.shape[-1] < MIN_CLASSES for a in arrays):
        return None
    if len({a.shape[-1] for a in arrays}) != 1:
        return None
    axis = batch_axis(arrays)
    lengths = [a.shape[1 - axis] for a in arrays for _ in range(a.shape[axis])]
    if not lengths or np.median(lengths) < MIN_STEPS:
        return None
    counts = np.zeros(arrays[0].shape[-1], np.int64)
    for a in arrays:
        winners = np.argmax(np.where(np.isnan(a), -np.inf, a), axis=-1)
        counts += np.bincount(winners.ravel(), minlength=counts.size)
    blank = int(np.argmax(counts))
    if counts[blank] < BLANK_SHARE * counts.sum():
        return None
    return axis, blank


def batch_axis(arrays: list) -> int:
    """0 for ``[N, T, C]``, 1 for ``[T, N, C]``: the first sample whose leading axes are one of
    size 1 beside a longer one decides; batch-first when none does."""
    for a in arrays:
        if a.shape[0] == 1 and a.shape[1] > 1:
            return 0
        if a.shape[1] == 1 and a.shape[0] > 1:
            return 1
    return 0


def sequences(array: np.ndarray, axis: int, probs: bool = False) -> list:
    """The ``[T, C]`` sequences of a 3-D output with its batch on ``axis``, as float64;
    ``probs``: Softmax values, taken as log-probabilities (:func:`.margins.log_probs`: their
    differences are the logits')."""
    array = log_probs(array) if probs else np.asarray(array, np.float64)
    return [array[i] if axis == 0 else array[:, i] for i in range(array.shape[axis])]


def decode(path: np.ndarray, blank: int) -> tuple:
    """Greedy CTC: repeats collapsed, blanks dropped."""
    path = np.asarray(path)
    if path.size == 0:
        return ()
    keep = np.ones(path.size, bool)
    keep[1:] = path[1:] != path[:-1]
    return tuple(int(c) for c in path[keep] if c != blank)


def _emitted(c: np.ndarray, prev: np.ndarray, nxt: np.ndarray, blank: int) -> tuple:
    """What steps t and t+1 emit with π_t = c (``NONE``: nothing), left-packed so that two
    pairs emitting the same string are equal."""
    first = np.where((c != blank) & (c != prev), c, NONE)
    second = np.where((nxt != NONE) & (nxt != blank) & (nxt != c), nxt, NONE)
    return np.where(first == NONE, second, first), np.where(first == NONE, NONE, second)


def string_margins(ref: np.ndarray, got: np.ndarray, blank: int) -> tuple:
    """``(m, d)`` per step of one sequence (``[T, C]`` logits, reference and candidate): the
    margin to the best runner-up whose substitution changes the decoded string and how far the
    candidate closed it, signed (module docstring); steps with no such runner-up are left out."""
    steps, classes = ref.shape
    if steps == 0 or classes < 2:
        return np.zeros(0), np.zeros(0)
    k = min(TOP, classes)
    top = np.sort(np.argpartition(-ref, k - 1, axis=1)[:, :k], axis=1)  # class order breaks ties as argmax does
    top = np.take_along_axis(top, np.argsort(-np.take_along_axis(ref, top, 1), axis=1, kind="stable"), 1)
    path = top[:, 0]
    prev = np.concatenate([[NONE], path[:-1]])
    nxt = np.concatenate([path[1:], [NONE]])
    before = _emitted(path, prev, nxt, blank)
    harmful = np.zeros((steps, k - 1), bool)
    for col in range(1, k):
        after = _emitted(top[:, col], prev, nxt, blank)
        harmful[:, col - 1] = (after[0] != before[0]) | (after[1] != before[1])
    found = harmful.any(axis=1)
    rows = np.nonzero(found)[0]
    rival = top[rows, 1 + np.argmax(harmful[rows], axis=1)]
    margin = ref[rows, path[rows]] - ref[rows, rival]
    moved = got[rows, path[rows]] - got[rows, rival]
    shift = margin - moved
    finite = np.isfinite(margin) & np.isfinite(shift)
    return margin[finite], shift[finite]


def estimated_string_agreement(strings: list, margins: np.ndarray, shifts: np.ndarray) -> float:
    """``mean_s Π_t (1 − F(m_t))`` over ``strings`` (one margin array per sequence), F read from
    the judged steps' ``margins`` and their ``shifts`` (:func:`.margins.overturn_rates`); 1.0
    when there is nothing to pair."""
    if np.size(shifts) == 0 or not strings:
        return 1.0
    steps = [np.asarray(string, np.float64).ravel() for string in strings]
    survive = 1.0 - overturn_rates(np.concatenate(steps), margins, shifts)
    keeps, start = [], 0
    for string in steps:
        part, start = survive[start:start + string.size], start + string.size
        keeps.append(0.0 if np.any(part <= 0) else float(np.exp(np.sum(np.log(part)))))
    return float(np.mean(keeps))
