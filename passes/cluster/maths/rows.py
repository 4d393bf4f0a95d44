"""Per-row codebooks: every output channel of a weight gets ``k`` centroids of its own.

A row ``c`` is the slice ``W[…, c, …]`` along the output-channel axis (:func:`.share.as_rows`).
Per row, 1-D k-means (:func:`._cluster_kmeans.kmeans_1d`, zero kept) gives at most ``k``
centroids; short codebooks are padded with their last centroid, so all rows have ``k``:

```
books  (C × k)   W'[c, m] = books[c, labels[c, m]]
```

Storage: the labels (4-bit when ``k ≤ 16``) plus ``C·k`` centroids, in float16 (2 bytes each,
decoded by a Cast) unless every row is at the exact limit (at most ``k`` distinct values: the
centroids are those values, kept in the weight's dtype, bit for bit) or a centroid lies outside
float16's range. Labels are assigned against the rounded centroids, so the decoded weight is
exactly what the labels and stored centroids give.

Why: with one codebook per tensor and a scale per row (the default), a row whose value
distribution differs from the shared one is quantised badly; PP-OCRv4 rec, measured after
``fuse``, k = 16, GPTQ assignment (8 calibration lines), output damage ``1 − cosine`` of one
layer clustered alone: 1×1 convs 0.03–0.05 with the shared codebook, ≤ 3e-4 with per-row
codebooks (head MatMul 120×6625: 0.0066 → 2e-5); the model with every layer clustered: output
cosine 0.84 → 0.93. The centroids cost ``2k`` bytes a row (k = 16: 32 bytes, +13 % on a row of
480 labels), so the selector (:mod:`onnxslim_kit.passes.cluster.select`) offers them as a step between the shared
codebook and ``k_high``, layer by layer, where they pay for themselves.

Large weights (above ``BATCH_ABOVE`` values): one Lloyd over every row at once
(:func:`batch_books`: seeded with the pooled codebook of the RMS-normalised rows times each
row's RMS instead of k-means++ per row, at most 20 Lloyd steps): a Python loop of one 1-D
k-means per row costs seconds per weight of thousands of rows, and issue 16's decoder has 145
of them. Rows with an exact zero to keep, and rows at the exact limit, still take the 1-D
k-means of their own (one stray zero in a random 1536 × 6144 weight used to send all of its
rows there: 7 of that decoder's 20 weights at 3 layers, 19 s).
"""

from __future__ import annotations

import numpy as np

from onnxslim_kit.passes.cluster.maths.kmeans import at_most_distinct, kmeans_1d
from onnxslim_kit.passes.cluster.maths.share import HALF_MAX, as_rows, from_rows

CHUNK = 1 << 20  # elements × k per block of the nearest-centroid search
BATCH_ABOVE = 1 << 20  # values: a larger weight's rows are clustered together (:func:`batch_books`)
BATCH_ROWS = 1 << 20  # values per batch of rows
BATCH_ITER = 20  # Lloyd steps from the pooled seeds (their error is within 1 % of 100 steps' from the start)


def row_codebooks(weight: np.ndarray, axis: int, k: int, keep_zero: bool, labels: bool = True) -> tuple:
    """``(books (C × k), labels in the weight's shape, exact)``: ``exact`` when every row has
    at most ``k`` distinct values (books in the weight's dtype, bit for bit); else the books are
    float16 when they fit (assignment against the rounded values); ``labels=False``: None for
    the labels unless ``exact`` (a caller that assigns them itself). Above :data:`BATCH_ABOVE`
    values, the Lloyd of every row without an exact zero to keep runs at once
    (:func:`batch_books`)."""
    rows = as_rows(weight, axis)
    batched = weight.size > BATCH_ABOVE
    own = np.any(rows == 0, axis=1) if keep_zero and batched else np.zeros(len(rows), bool)
    books = batch_books(rows, k) if batched else np.empty((len(rows), k), weight.dtype)
    exact = True
    for c, row in enumerate(rows):
        few = at_most_distinct(row, k)
        exact &= few
        if few or not batched or own[c]:
            book, _ = kmeans_1d(row, k, keep_zero)
            books[c] = np.concatenate([book, np.repeat(book[-1:], k - book.size)])
    if not exact and weight.dtype != np.float16 and np.all(np.abs(books) <= HALF_MAX):
        books = books.astype(np.float16)
    if not (labels or exact):
        return books, None, exact
    return books, from_rows(nearest_rows(books, rows, keep_zero), weight.shape, axis), exact


def batch_books(rows: np.ndarray, k: int, max_iter: int = BATCH_ITER) -> np.ndarray:
    """``C × k`` sorted centroids, one 1-D k-means per row, all rows at once: seeded with the
    codebook of the RMS-normalised rows pooled (:func:`.kmeans.kmeans_1d`, a sketch for a
    large weight) times each row's RMS, then at most ``max_iter`` Lloyd steps on the rows
    :data:`BATCH_ROWS` values at a time (:func:`_batch_lloyd`)."""
    rms = np.sqrt(np.mean(np.square(rows, dtype=np.float64), axis=1))
    rms[rms == 0] = 1.0
    pooled, _ = kmeans_1d((rows / rms[:, None].astype(rows.dtype)).ravel(), k, False, labels=False)
    pooled = np.concatenate([pooled, np.repeat(pooled[-1:], k - pooled.size)]).astype(np.float64)
    books = np.empty((len(rows), k), rows.dtype)
    step = max(1, BATCH_ROWS // max(rows.shape[1], 1))
    for start in range(0, len(rows), step):
        ordered = np.sort(rows[start:start + step].astype(np.float64), axis=1)
        seeds = rms[start:start + step, None] * pooled[None, :]
        books[start:start + step] = _batch_lloyd(ordered, seeds, max_iter)
    return books


def _batch_lloyd(ordered: np.ndarray, centroids: np.ndarray, max_iter: int) -> np.ndarray:
    """Lloyd on every row of ``ordered`` (sorted rows) from ``centroids`` (sorted rows): the
    cells' edges by one ``searchsorted`` over the rows laid end to end (row ``c`` shifted by
    ``c · span``, ``span`` above any row's range), new centroids from prefix sums; a row whose
    edges stop moving leaves."""
    count, width = ordered.shape
    span = 2.0 * float(np.abs(ordered).max()) + 1.0
    shift = np.arange(count)[:, None] * span
    flat = (ordered + shift).ravel()
    prefix = np.concatenate([np.zeros((count, 1)), np.cumsum(ordered, axis=1)], axis=1)
    centroids = np.array(centroids, dtype=np.float64)
    edges = np.zeros((count, centroids.shape[1] + 1), np.int64)
    active = np.arange(count)
    for _ in range(max_iter):
        mids = (centroids[active, :-1] + centroids[active, 1:]) / 2 + shift[active]
        cuts = np.searchsorted(flat, mids.ravel()).reshape(len(active), -1) - active[:, None] * width
        new_edges = np.concatenate([np.zeros((len(active), 1), np.int64), cuts,
                                    np.full((len(active), 1), width)], axis=1)
        moved = np.any(new_edges != edges[active], axis=1)
        active, new_edges = active[moved], new_edges[moved]
        if not len(active):
            break
        edges[active] = new_edges
        sizes = np.diff(new_edges, axis=1)
        part = prefix[active]
        sums = np.take_along_axis(part, new_edges[:, 1:], axis=1) - np.take_along_axis(part, new_edges[:, :-1], axis=1)
        centroids[active] = np.sort(np.where(sizes > 0, sums / np.maximum(sizes, 1), centroids[active]), axis=1)
    return centroids


def nearest_rows(books: np.ndarray, rows: np.ndarray, keep_zero: bool) -> np.ndarray:
    """Label of the nearest centroid of its own row for every value (``rows``: C × M); exact
    zeros go to their row's 0.0 centroid when ``keep_zero`` and the row has one."""
    book = books.astype(np.float64)
    labels = np.empty(rows.shape, np.int64)
    step = max(1, CHUNK // max(1, rows.shape[1] * books.shape[1]))
    for start in range(0, len(rows), step):
        part = rows[start:start + step].astype(np.float64)
        labels[start:start + step] = np.abs(part[:, :, None] - book[start:start + step, None, :]).argmin(axis=2)
    if keep_zero:
        zero_label = zero_labels(books)
        fix = (rows == 0) & (zero_label[:, None] >= 0)
        labels[fix] = np.broadcast_to(zero_label[:, None], rows.shape)[fix]
    return labels


def zero_labels(books: np.ndarray) -> np.ndarray:
    """Per row, the index of its 0.0 centroid, −1 where it has none."""
    is_zero = books == 0
    return np.where(is_zero.any(axis=1), is_zero.argmax(axis=1), -1)
