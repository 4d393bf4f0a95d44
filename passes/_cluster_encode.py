"""Storing clustered weights compactly, and the subgraph that decodes one of them (per-channel
codebooks; per-tensor weights go through the shared streams of :mod:`._cluster_stream`).

A clustered weight ``W`` (``N`` elements) is ``codebook[labels]``. It is stored as

* ``codebook`` — float, ``(k,)`` per tensor or ``(C·k,)`` per output channel (row-major);
* ``labels`` — ``uint8`` with one index per byte (``k ≤ 256``, stored in the weight's shape),
  or, when ``k ≤ 16``, ``N`` is even and ``N ≥ PACK_MIN`` (1024), two 4-bit indices per byte:
  ``packed[i] = labels[i] + 16 · labels[i + N/2]`` (first half in the low nibbles, second half
  in the high ones), i.e. N/2 bytes. Unpacking takes five more nodes (≈ 100 bytes of protobuf
  each, names included), so small weights save more bytes unpacked: measured on PP-OCR cls v2
  (85 of its 112 weights under 1024 elements), the decoders were most of the remaining file.

Decoding (every op exists from opset 7 on, so any model can take it; ORT's constant folding
turns the whole chain back into a float initializer when the session is created with graph
optimisations on, so inference runs on the plain weight):

```
packed:  q = Cast<INT32>(packed);  hi = Div(q, 16);  lo = Sub(q, Mul(hi, 16))
         idx = Concat<axis=0>(lo, hi)                       # the N labels, in order
uint8:   idx = Cast<INT32>(labels)                           # already shaped like W (per tensor)
per tensor:   W = Gather(codebook, Reshape(idx, shape(W)))   (no Reshape when not packed)
  with row scales:  W = Mul(Gather(codebook, Reshape(idx, shape(W))), scales)   # [C,1,…] or [1,n]
per channel:  W = Reshape(Gather(codebook, Reshape(idx, [P, C, Q]) + k·[0..C−1] as [1, C, 1]), shape(W))
              (C along the output-channel axis a; P, Q the products of the dims before / after it)
```

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
import onnx
import onnx_graphsurgeon as gs

PACK_MIN = 1024


def pack_labels(labels: np.ndarray, k: int, min_size: int = PACK_MIN) -> tuple:
    """``(stored uint8 array, packed?)`` for labels in ``[0, k)`` (unpacked: in their shape)."""
    flat = labels.ravel()
    if k <= 16 and flat.size % 2 == 0 and flat.size >= min_size:
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
    share: tuple | None = None  # stack key when the codebook is shared (:mod:`._cluster_share`)

    @property
    def k(self) -> int:
        return self.codebook.shape[-1]

    def stored_bytes(self) -> int:
        """Labels (4-bit when ``k ≤ 16``), scales and the codebook (when not shared)."""
        if self.per_channel:
            stored, _ = pack_labels(self.labels, self.k)
            labels = stored.nbytes
        else:
            labels = (self.labels.size + 1) // 2 if self.k <= 16 else self.labels.size
        book = 0 if self.share is not None else self.codebook.nbytes
        return labels + book + (0 if self.scales is None else self.scales.nbytes)

    def decoded(self) -> np.ndarray:
        """Numpy mirror of the decoding subgraph (or the dense values)."""
        if self.dense is not None:
            return self.dense
        if not self.per_channel:
            values = self.codebook[self.labels]
            return values if self.scales is None else (values * self.scales).astype(self.codebook.dtype)
        labels = np.moveaxis(self.labels, self.axis, 0)
        rows = np.take_along_axis(self.codebook, labels.reshape(len(labels), -1), axis=1)
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


def decode_subgraph(model, graph, weight: gs.Constant, clustered: Clustered, stored: np.ndarray,
                    packed: bool) -> gs.Variable:
    """Add the decoding nodes to ``graph``; returns the tensor that equals the clustered weight."""
    def const(tag, values):
        return gs.Constant(model.fresh_name(f"cluster/{tag}"), np.ascontiguousarray(values))

    def node(op, inputs, attrs=None):
        # no dtype/shape on the decoder's tensors: their value_info would cost ~40 bytes each
        # in the file (measured: PP-OCR cls v2 0.275× → 0.254×), and ORT folds the decoder anyway
        out = gs.Variable(model.fresh_name(f"cluster/{op.lower()}"))
        graph.nodes.append(gs.Node(op, model.fresh_name(f"cluster/{op}"), dict(attrs or {}), list(inputs), [out]))
        return out

    codebook, scales = clustered.codebook, clustered.scales
    shape = tuple(weight.values.shape)
    idx = node("Cast", [const("labels", stored)], {"to": onnx.TensorProto.INT32})
    if packed:
        sixteen = const("sixteen", np.array(16, np.int32))
        hi = node("Div", [idx, sixteen])
        lo = node("Sub", [idx, node("Mul", [hi, sixteen])])
        idx = node("Concat", [lo, hi], {"axis": 0})
    books = const("codebook", codebook.ravel())
    if not clustered.per_channel:
        if packed:
            idx = node("Reshape", [idx, const("shape", np.array(shape, np.int64))])
        values = node("Gather", [books, idx], {"axis": 0})
        if scales is None:
            return values
        return node("Mul", [values, const("scales", scales)])
    channels, width = codebook.shape
    axis = clustered.axis % len(shape)
    rows = (int(np.prod(shape[:axis])), channels, int(np.prod(shape[axis + 1:])))
    idx = node("Reshape", [idx, const("rows", np.array(rows, np.int64))])
    offsets = const("offsets", (np.arange(channels, dtype=np.int32) * width)[None, :, None])
    idx = node("Add", [idx, offsets])
    flat = node("Gather", [books, idx], {"axis": 0})
    return node("Reshape", [flat, const("shape", np.array(shape, np.int64))])
