"""Codebooks shared by weights of one stacked layout (``cluster``, per tensor with row scales).

With row scales, ``W'[c] = s_c · codebook[labels[c]]`` and ``s_c`` the RMS of row ``c`` (a
slice along the output-channel axis ``a``): what the codebook quantises are *normalised* rows,
whose distributions differ little from layer to layer. Weights that can be stacked along ``a``
— same graph, same dtype, same axis, same shape apart from the size along ``a`` — therefore
share one codebook, fitted by weighted k-means over all their normalised rows (weights
``s_c²``, so the objective is the squared error of the weights themselves). Sharing is what
lets the encoder (:mod:`onnxslim_kit.passes.cluster.stream`) decode a whole group with one GatherElements,
Reshape, Mul and Split: on PP-OCR cls v2 (54 weights, 19 layouts) the per-weight decoders were
a third of the clustered file.

Sharing trades accuracy for bytes — a layer's own k-means codebook fits it best, and layers of
one layout can differ in shape of distribution (measured on PP-OCRv4 rec at k = 16, relative
weight error of a 480×120 1×1 conv: 0.146 own, 0.305 shared with a lighter-tailed one). So only
weights under ``SHARE_BELOW`` elements share, where a decoder of their own would cost more
than 3 % of their labels; larger ones keep their own codebook (same encoding, a group of one).

Scales are rounded to float16 before the rows are normalised whenever every scale of the
weight is a normal float16 number: the stored half-precision scales then decode to exactly
the scales the codebook and labels were fitted with (no added error), at 2 bytes a row.

A weight with at most ``k`` distinct values keeps the exact limit: its own codebook of those
values, bit for bit, no scales, no sharing.
"""

from __future__ import annotations

import numpy as np

from onnxslim_kit.passes.cluster.maths.kmeans import codebooks_1d, nearest

HALF_MIN, HALF_MAX = float(np.finfo(np.float16).tiny), float(np.finfo(np.float16).max)
SHARE_BELOW = 32768  # elements: 16 KB of 4-bit labels, to which an own decoder (~0.5 KB) adds ≤ 3 %


def as_rows(weight: np.ndarray, axis: int) -> np.ndarray:
    """``weight`` as ``C × M``: row ``c`` is the slice ``W[…, c, …]`` along ``axis``."""
    return np.moveaxis(weight, axis, 0).reshape(weight.shape[axis], -1)


def from_rows(rows: np.ndarray, shape: tuple, axis: int) -> np.ndarray:
    """Inverse of :func:`as_rows`."""
    moved = (shape[axis],) + tuple(d for i, d in enumerate(shape) if i != axis)
    return np.moveaxis(rows.reshape(moved), 0, axis)


def row_scales(weight: np.ndarray, axis: int) -> np.ndarray:
    """RMS of each row (1 for an all-zero row), in the weight's dtype, rounded to float16 when
    every one of them is a normal float16 number."""
    scales = np.sqrt(np.mean(as_rows(weight, axis).astype(np.float64) ** 2, axis=1))
    scales[scales == 0] = 1.0
    if np.all((scales >= HALF_MIN) & (scales <= HALF_MAX)):
        scales = scales.astype(np.float16).astype(np.float64)
    return scales.astype(weight.dtype)


def half_exact(values: np.ndarray) -> bool:
    """Whether ``values`` survive a float16 round trip unchanged."""
    return bool(np.all(values.astype(np.float16).astype(values.dtype) == values))


def stack_key(graph, weight: np.ndarray, axis: int, owner=None) -> tuple:
    """Weights with equal keys can be concatenated along ``axis`` and share a codebook; a weight
    of at least :data:`SHARE_BELOW` elements gets a key of its own (``owner``)."""
    if weight.size >= SHARE_BELOW:
        return ("own", id(owner))
    rest = tuple(d for i, d in enumerate(weight.shape) if i != axis)
    return id(graph), weight.dtype.str, axis, rest


def shared_codebooks(parts: list, ks: list, keep_zero: bool) -> list:
    """Sorted codebooks of at most ``k`` values, one per ``k`` of ``ks``, for the normalised rows
    of every ``(weight, scales, axis)`` in ``parts`` (weighted k-means, weights ``s_c²``; the
    rows normalised, and sketched, once: :func:`.kmeans.codebooks_1d`)."""
    values, weights = [], []
    for weight, scales, axis in parts:
        rows = as_rows(weight, axis)
        values.append((rows / scales[:, None]).ravel())
        weights.append(np.repeat(scales.astype(np.float64) ** 2, rows.shape[1]))
    return codebooks_1d(np.concatenate(values), ks, keep_zero, weights=np.concatenate(weights))


def half_codebook(codebook: np.ndarray, node_bytes: int) -> np.ndarray:
    """``codebook`` rounded to float16 when that saves more than the Cast that decodes it costs
    (``node_bytes``: k ≥ 64 for float32; a 256-entry codebook 1024 → 512 bytes, a fair share
    of a small model such as MTCNN P-Net) and every centroid fits; else unchanged."""
    saved = codebook.size * (codebook.itemsize - 2)
    if saved <= node_bytes or not np.all(np.abs(codebook) <= HALF_MAX):
        return codebook
    return codebook.astype(np.float16)


def nearest_labels(weight: np.ndarray, scales: np.ndarray, axis: int, codebook: np.ndarray,
                   keep_zero: bool) -> np.ndarray:
    """Labels (in the weight's shape) of the nearest centroid to each normalised value; exact
    zeros go to the 0.0 centroid when ``keep_zero`` and there is one."""
    rows = as_rows(weight, axis)
    labels = nearest(codebook.astype(np.float64), (rows / scales[:, None]).astype(np.float64))
    zero = np.flatnonzero(codebook == 0)
    if keep_zero and zero.size:
        labels[rows == 0] = zero[0]
    return from_rows(labels, weight.shape, axis)


def broadcast_scales(scales: np.ndarray, ndim: int, axis: int) -> np.ndarray:
    """``(C,)`` scales shaped to broadcast against a weight: ``C`` along ``axis``, 1 elsewhere."""
    shape = [1] * ndim
    shape[axis] = scales.size
    return scales.reshape(shape)
