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
"""

from __future__ import annotations

import numpy as np

from onnxslim_kit.passes.cluster.maths.kmeans import kmeans_1d
from onnxslim_kit.passes.cluster.maths.share import HALF_MAX, as_rows, from_rows

CHUNK = 1 << 20  # elements × k per block of the nearest-centroid search


def row_codebooks(weight: np.ndarray, axis: int, k: int, keep_zero: bool) -> tuple:
    """``(books (C × k), labels in the weight's shape, exact)``: ``exact`` when every row has
    at most ``k`` distinct values (books in the weight's dtype, bit for bit); else the books are
    float16 when they fit (assignment against the rounded values)."""
    rows = as_rows(weight, axis)
    books = np.empty((len(rows), k), weight.dtype)
    exact = True
    for c, row in enumerate(rows):
        book, _ = kmeans_1d(row, k, keep_zero)
        exact &= np.unique(row).size <= k
        books[c] = np.concatenate([book, np.repeat(book[-1:], k - book.size)])
    if not exact and weight.dtype != np.float16 and np.all(np.abs(books) <= HALF_MAX):
        books = books.astype(np.float16)
    labels = nearest_rows(books, rows, keep_zero)
    return books, from_rows(labels, weight.shape, axis), exact


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
