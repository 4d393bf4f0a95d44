"""Storing clustered weights compactly, and the subgraph that decodes them.

A clustered weight ``W`` (``N`` elements) is ``codebook[labels]``. It is stored as

* ``codebook`` — float, ``(k,)`` per tensor or ``(C·k,)`` per output channel (row-major);
* ``labels`` — ``uint8`` with one index per byte (``k ≤ 256``), or, when ``k ≤ 16`` and ``N``
  is even, two 4-bit indices per byte: ``packed[i] = labels[i] + 16 · labels[i + N/2]``
  (first half in the low nibbles, second half in the high ones), i.e. N/2 bytes.

Decoding (every op exists from opset 7 on, so any model can take it; ORT's constant folding
turns the whole chain back into a float initializer when the session is created with graph
optimisations on, so inference runs on the plain weight):

```
packed:  q = Cast<INT32>(packed);  hi = Div(q, 16);  lo = Sub(q, Mul(hi, 16))
         idx = Concat<axis=0>(lo, hi)                       # the N labels, in order
uint8:   idx = Cast<INT32>(labels)
per tensor:   W = Gather(codebook, Reshape(idx, shape(W)))
  with row scales:  W = Mul(Gather(codebook, Reshape(idx, shape(W))), scales)   # [C,1,…] or [1,n]
per channel:  W = Reshape(Gather(codebook, Reshape(idx, [C, N/C]) + k·[0..C−1]ᵀ), shape(W))
```

Why nibbles in a uint8 rather than an ONNX ``UINT4`` tensor: ``UINT4`` needs IR 10 /
opset 21 for ``Cast`` (models here are opset 11–15) and has no numpy dtype for
onnx-graphsurgeon to export; the packed bytes are the same size and decode at any opset.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs


def pack_labels(labels: np.ndarray, k: int) -> tuple:
    """``(stored uint8 array, packed?)`` for labels in ``[0, k)``."""
    flat = labels.ravel()
    if k <= 16 and flat.size % 2 == 0:
        half = flat.size // 2
        return (flat[:half] + 16 * flat[half:]).astype(np.uint8), True
    return flat.astype(np.uint8), False


def unpack_labels(stored: np.ndarray, packed: bool) -> np.ndarray:
    """Numpy mirror of the decoding subgraph (labels as a flat int array)."""
    q = stored.astype(np.int32)
    return np.concatenate([q % 16, q // 16]) if packed else q


def decode_subgraph(model, graph, weight: gs.Constant, codebook: np.ndarray, stored: np.ndarray,
                    packed: bool, per_channel: bool, scales: np.ndarray | None = None) -> gs.Variable:
    """Add the decoding nodes to ``graph``; returns the tensor that equals the clustered weight."""
    def const(tag, values):
        return gs.Constant(model.fresh_name(f"cluster/{tag}"), np.ascontiguousarray(values))

    def node(op, inputs, attrs=None, dtype=np.int32, shape=None):
        out = gs.Variable(model.fresh_name(f"cluster/{op.lower()}"), dtype=dtype, shape=shape)
        graph.nodes.append(gs.Node(op, model.fresh_name(f"cluster/{op}"), dict(attrs or {}), list(inputs), [out]))
        return out

    shape = tuple(weight.values.shape)
    total = int(np.prod(shape))
    idx = node("Cast", [const("labels", stored)], {"to": onnx.TensorProto.INT32}, shape=(stored.size,))
    if packed:
        sixteen = const("sixteen", np.array(16, np.int32))
        hi = node("Div", [idx, sixteen], shape=(stored.size,))
        lo = node("Sub", [idx, node("Mul", [hi, sixteen], shape=(stored.size,))], shape=(stored.size,))
        idx = node("Concat", [lo, hi], {"axis": 0}, shape=(total,))
    books = const("codebook", codebook.ravel())
    if not per_channel:
        idx = node("Reshape", [idx, const("shape", np.array(shape, np.int64))], shape=shape)
        values = node("Gather", [books, idx], {"axis": 0}, dtype=codebook.dtype, shape=shape)
        if scales is None:
            return values
        return node("Mul", [values, const("scales", scales)], dtype=codebook.dtype, shape=shape)
    channels, width = codebook.shape
    rows = (channels, total // channels)
    idx = node("Reshape", [idx, const("rows", np.array(rows, np.int64))], shape=rows)
    offsets = const("offsets", (np.arange(channels, dtype=np.int32) * width)[:, None])
    idx = node("Add", [idx, offsets], shape=rows)
    flat = node("Gather", [books, idx], {"axis": 0}, dtype=codebook.dtype, shape=rows)
    return node("Reshape", [flat, const("shape", np.array(shape, np.int64))], dtype=codebook.dtype, shape=shape)
