"""Clustered weights (:class:`Clustered`), 4-bit packing, and the int8 grid of ``encode=dense``.

A clustered weight ``W`` (``N`` elements) is ``codebook[labels]``. It is stored as

* ``codebook`` — ``(k,)`` per tensor (shared by a group, with row scales: :mod:`onnxslim_kit.passes.cluster.maths.share`)
  or ``(C, k)`` per row (:mod:`onnxslim_kit.passes.cluster.maths.rows`; float16 + a Cast unless exact);
* ``labels`` — ``uint8`` with one index per byte (``k > 16``), or two 4-bit indices per byte:
  ``packed[i] = labels[i] + 16 · labels[i + N/2]`` (first half in the low nibbles, second half
  in the high ones, :func:`pack_labels`), i.e. N/2 bytes.

The decoding nodes (one label stream per graph, a few nodes per group) are written by
:mod:`onnxslim_kit.passes.cluster.stream`; ORT's constant folding turns them back into float initializers when
the session is created with graph optimisations on, so inference runs on plain weights.

Dense (``encode=dense``, for a following ``int8``): the decoded weight is stored as a plain
float initializer, so a quantizer sees a constant. With ``grid`` the decoded values are snapped
to the symmetric int8 grid int8 uses (:func:`snap_to_int8_grid`, per tensor or per output
channel): ``s = max|W'| / 127``, ``W'' = round(W' / s) · s`` (float32, as DequantizeLinear
computes it, and ``s`` nudged by ulps until ``max|W''| / 127`` gives ``s`` back). Each centroid
lands on one grid point, so ``W''`` has at most ``k`` distinct values (per row) and int8's
quantization of ``W''`` is exact: ``int8`` after ``cluster`` adds no further error.

Why nibbles in a uint8 rather than an ONNX ``UINT4`` tensor: ``UINT4`` needs IR 10 /
opset 21 for ``Cast`` (models here are opset 11–15) and has no numpy dtype for
onnx-graphsurgeon to export; the packed bytes are the same size and decode at any opset.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def pack_labels(labels: np.ndarray, k: int) -> tuple:
    """``(stored uint8 array, packed?)`` for labels in ``[0, k)``: two to a byte when ``k ≤ 16``
    and their number is even (the label stream pads to even), else one a byte, in their shape."""
    flat = labels.ravel()
    if k <= 16 and flat.size % 2 == 0:
        half = flat.size // 2
        return (flat[:half] + 16 * flat[half:]).astype(np.uint8), True
    return np.ascontiguousarray(labels, dtype=np.uint8), False


def unpack_labels(stored: np.ndarray, packed: bool) -> np.ndarray:
    """Numpy mirror of the decoding subgraph (labels as a flat int array)."""
    q = stored.astype(np.int32).ravel()
    return np.concatenate([q % 16, q // 16]) if packed else q


@dataclass(eq=False)
class Clustered:
    """A clustered weight: ``codebook[labels]`` (per tensor, optionally ``· scales``) or, per
    channel, ``codebook[c, labels[…, c, …]]`` along ``axis``."""

    codebook: np.ndarray
    labels: np.ndarray
    scales: np.ndarray | None
    per_channel: bool
    axis: int = 0
    dense: np.ndarray | None = None  # the values as stored by encode=dense (snapped to a grid)
    share: tuple | None = None  # stack key when the codebook is shared (:mod:`onnxslim_kit.passes.cluster.maths.share`)
    dtype: np.dtype | None = None  # the weight's dtype when the codebook is stored narrower (float16)

    def __post_init__(self):
        # one byte a label (k ≤ 256), not the int64 of the assignment: every level of every
        # weight is held until the selector has chosen (8× the weight's labels otherwise)
        if self.labels.dtype != np.uint8 and self.codebook.shape[-1] <= 256:
            self.labels = self.labels.astype(np.uint8)

    @property
    def k(self) -> int:
        return self.codebook.shape[-1]

    def stored_bytes(self) -> int:
        """Labels (4-bit when ``k ≤ 16``), scales and the codebook (when not shared)."""
        labels = (self.labels.size + 1) // 2 if self.k <= 16 else self.labels.size
        book = 0 if self.share is not None else self.codebook.nbytes
        return labels + book + (0 if self.scales is None else self.scales.nbytes)

    def decoded(self) -> np.ndarray:
        """Numpy mirror of the decoding subgraph (or the dense values)."""
        if self.dense is not None:
            return self.dense
        if not self.per_channel:
            book = self.codebook if self.dtype is None else self.codebook.astype(self.dtype)
            values = book[self.labels]
            if self.scales is None:
                return values
            if isinstance(values, np.ndarray) and np.result_type(values, self.scales) == book.dtype and \
                    np.broadcast_shapes(values.shape, self.scales.shape) == values.shape:
                # the same product, without its two whole-weight temporaries (a 1536 × 6144
                # weight: 44 → 27 ms; the choice decodes ~1300 such weights at 24 layers)
                return np.multiply(values, self.scales, out=values)
            return (values * self.scales).astype(book.dtype)
        labels = np.moveaxis(self.labels, self.axis, 0)
        rows = np.take_along_axis(self.codebook, labels.reshape(len(labels), -1), axis=1)
        rows = rows if self.dtype is None else rows.astype(self.dtype)
        return np.moveaxis(rows.reshape(labels.shape), 0, self.axis)


def snap_to_int8_grid(values: np.ndarray, axis: int | None) -> np.ndarray:
    """``values`` on the symmetric int8 grid ``s · [−127, 127]`` (per tensor, or per slice along
    ``axis``), with ``s`` exactly what ``max|result| / 127`` gives back in float32."""
    if axis is not None and values.ndim >= 2:
        moved = np.moveaxis(values, axis, 0)
        rows = np.stack([snap_to_int8_grid(row, None) for row in moved])
        return np.moveaxis(rows, 0, axis)
    v = np.asarray(values, np.float32)
    amax = np.float32(np.abs(v).max()) if v.size else np.float32(0)
    if amax == 0:
        return v.copy()
    scale = np.float32(amax / np.float32(127.0))
    for _ in range(8):  # the round trip scale → 127·scale → /127 may be off by an ulp
        snapped = np.clip(np.round(v / scale), -127, 127).astype(np.float32) * scale
        back = np.float32(np.abs(snapped).max() / np.float32(127.0))
        if back == scale:
            break
        scale = back
    return snapped.astype(values.dtype)
