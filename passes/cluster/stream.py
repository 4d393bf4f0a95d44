"""Decoding many clustered weights with few nodes: label streams and stacked groups.

A *group* is a list of clustered weights (:class:`.maths.encode.Clustered`, per tensor)
that share one codebook and can be concatenated along their output-channel axis ``a``
(:func:`.maths.share.stack_key`); a group of one is any other per-tensor weight. All the
groups of a graph are stored as

* two label *streams*: the labels of every group with ``k ≤ 16`` concatenated (group by group,
  each group's labels stacked along ``a`` and flattened) and packed two to a byte
  (``packed[i] = L[i] + 16 · L[i + h]``, ``h = ⌈n/2⌉``, one pad label when ``n`` is odd), and
  those of the groups with ``k > 16`` one per byte;
* per group: the codebook, the stacked row scales (float16 when every scale round-trips and
  the Cast pays for itself, else in the weight's dtype), the stacked shape, the members' sizes
  along ``a``.

```
stream:  L = Cast<INT32>(Concat<axis=0>(Mod(packed, 16), BitShift<RIGHT>(packed, 4)))   # in uint8
         (before opset 11: q = Cast<INT32>(packed), L = Concat(Sub(q, Mul(Div(q, 16), 16)), Div(q, 16)))
         8-bit stream: L = Cast<INT32>(labels)
         chunk_1, …, chunk_G[, pad] = Split<axis=0>(L, [n_1, …, n_G[, 1]])
group g: W_g = Mul(Reshape(GatherElements(codebook_g, chunk_g), stacked shape), scales_g)
         W_1, …, W_m = Split<axis=a>(W_g, [C_1, …, C_m])       # each the weight of one node
per-row codebooks (books C × k, :mod:`onnxslim_kit.passes.cluster.maths.rows`; labels stored row by row, i.e. with
the axis ``a`` moved first):
         W_g = Reshape(GatherElements<axis=1>(Cast(books16), Reshape(chunk_g, [C, M])), moved shape)
         then Transpose back when a ≠ 0 (before opset 11: Gather on the flat books with the
         labels offset by k·c per row)
```

so a graph pays for ~5 unpacking nodes once and ~4 nodes per group, instead of ~8 nodes and
4 initializers per weight. ONNX Runtime folds the whole chain into float initializers when a
session is created with graph optimisations on, so it runs at every session creation:
GatherElements (opset ≥ 11; Gather before) because ORT's Gather copies one element at a time
(390k labels: 7–10 ms, GatherElements 0.23 ms, measured on this machine). Every other op
exists from opset 7 on (Split takes its sizes as an attribute before opset 13, as an input
from 13).

Large streams (more than ``LEAN_ABOVE`` labels; opset ≥ 11): ORT's constant folding keeps
every folded intermediate until the pass ends, so the chain above costs about 21 bytes per label
at session creation — 5.4× the float weights, on top of them (the 367 MB 3-layer decoder's
output loaded at 2.19 GB peak RSS, ``results/large-model-2026-12-03-s12-small-cluster-a1.md``).
There the uint8 labels are split per group before the Cast, and a 2-D weight with row scales
decodes as ``GatherElements(codebook ⊗ scales, Cast<INT32>(Reshape(labels)))`` — no float
Reshape, no full-size Mul: about 11.5 bytes per label. 8-bit labels go further: no stream, each
group's labels an initializer of its own (shaped like the weight for that table), so neither a
Split nor a Reshape copies them: 2 bytes per label fewer (the 3-layer decoder's output, 56.6 M
labels at k = 256: ORT's load peak 672 → 557 MB, 375 MB once loaded), and the pass builds no
concatenated copy of them (its labels stay in their scratch file's pages). The byte estimates
below are the plain layout's (a lean group's own initializer header is not counted).

Byte estimates (:func:`stream_bytes`, :func:`group_bytes`, :func:`member_bytes`,
:func:`float_bytes`) let the pass
decide per weight and per group whether the encoding is smaller than the float weights it
replaces: protobuf field headers and the pass's fresh names make a node ≈ ``NODE_BYTES`` and an
initializer header ≈ ``INIT_BYTES`` (measured on the decoders of PP-OCR cls v2; tested against
the serialized size in tests/passes/cluster/test_cluster.py).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from onnxslim_kit.passes.cluster.maths.share import as_rows, half_exact

NODE_BYTES = 75  # one decoding node: op type, fresh node name, input and output names
OUTPUT_BYTES = 24  # one more output of a Split (a fresh name)
INIT_BYTES = 40  # an initializer's name, dims and type, without its data
LEAN_ABOVE = 1 << 24  # labels in one stream: above, decoded with fewer folded intermediates (Coder.lean)


def half_scales(members: list) -> bool:
    """Store the group's scales as float16 (+ a Cast)?"""
    scales = [m.scales for m in members]
    if any(s is None for s in scales) or scales[0].dtype.itemsize <= 2:
        return False
    rows = sum(s.size for s in scales)
    return all(half_exact(s) for s in scales) and rows * (scales[0].dtype.itemsize - 2) > NODE_BYTES


def label_bytes(clustered) -> float:
    return clustered.labels.size / (2 if clustered.k <= 16 else 1)


def member_bytes(clustered, half: bool) -> float:
    """What one weight adds to its group: labels, scales (or its rows' codebooks), a Split output."""
    scales = 0 if clustered.scales is None else clustered.scales.size * (2 if half else clustered.scales.itemsize)
    books = clustered.codebook.nbytes if clustered.per_channel else 0
    return label_bytes(clustered) + scales + books + OUTPUT_BYTES


def group_bytes(members: list, half: bool) -> float:
    """What a group costs apart from its members: codebook, Reshape, Gather, Mul, Split (per-row
    codebooks: Reshape, GatherElements, Reshape, Cast, Transpose)."""
    first = members[0]
    if first.per_channel:
        cost = 3 * NODE_BYTES + 2 * INIT_BYTES + 8 * (first.labels.ndim + 2) + OUTPUT_BYTES
        cost += NODE_BYTES if first.dtype is not None else 0
        cost += NODE_BYTES if first.axis % first.labels.ndim else 0
        return cost + (NODE_BYTES + 8 * len(members) if len(members) > 1 else 0)
    cost = 2 * (NODE_BYTES + INIT_BYTES) + first.codebook.nbytes + 8 * first.labels.ndim + OUTPUT_BYTES
    cost += NODE_BYTES if first.dtype is not None else 0
    if first.scales is not None:
        cost += NODE_BYTES + INIT_BYTES + (NODE_BYTES if half else 0)
    if len(members) > 1:
        cost += NODE_BYTES + 8 * len(members)
    return cost


def stream_bytes(groups: list) -> float:
    """What a graph's label streams cost apart from the labels: unpacking, Split, headers."""
    cost = 0
    for bits in (4, 8):
        chosen = [g for g in groups if (g[0].k <= 16) == (bits == 4)]
        if chosen:
            cost += NODE_BYTES + INIT_BYTES + (4 * NODE_BYTES + INIT_BYTES if bits == 4 else 0)
            cost += NODE_BYTES + (len(chosen) + 1) * (OUTPUT_BYTES + 8) if len(chosen) > 1 or bits == 4 else 0
    return cost


def float_bytes(values: np.ndarray) -> float:
    return values.nbytes + INIT_BYTES


def encode(model, graph, groups: list) -> list:
    """Add the decoding nodes of ``groups`` (lists of Clustered) to ``graph``; returns, per
    group, the tensors equal to its members' weights."""
    coder = _Coder(model, graph)
    decoded = {}
    for bits in (4, 8):
        chosen = [g for g in groups if (g[0].k <= 16) == (bits == 4)]
        if not chosen:
            continue
        flats = [_flat_labels(g) for g in chosen]
        lean = model.opset >= 11 and sum(f.size for f in flats) > LEAN_ABOVE
        if lean and bits == 8:  # no stream: each group's labels are an initializer of their own
            decoded.update(coder.lean(chosen, [coder.const("labels8", g[0].labels if _table(g) else f)
                                               for g, f in zip(chosen, flats)]))
            continue
        pad = sum(f.size for f in flats) % 2 if bits == 4 else 0
        stream = _packed_stream(flats, pad) if bits == 4 else np.concatenate(flats).astype(np.uint8)
        sizes = [f.size for f in flats] + ([1] * pad)
        if lean:
            decoded.update(coder.lean(chosen, coder.unpacked(stream, sizes)))
            continue
        if bits == 4 and model.opset >= 11:  # unpacked in uint8: a quarter of the bytes to copy at load
            packed = coder.const("labels4", stream)
            lo = coder.node("Mod", [packed, coder.const("sixteen", np.array(16, np.uint8))])
            hi = coder.node("BitShift", [packed, coder.const("four", np.array(4, np.uint8))], direction="RIGHT")
            idx = coder.node("Cast", [coder.node("Concat", [lo, hi], axis=0)], to=onnx.TensorProto.INT32)
        elif bits == 4:
            idx = coder.node("Cast", [coder.const("labels4", stream)], to=onnx.TensorProto.INT32)
            sixteen = coder.const("sixteen", np.array(16, np.int32))
            hi = coder.node("Div", [idx, sixteen])
            lo = coder.node("Sub", [idx, coder.node("Mul", [hi, sixteen])])
            idx = coder.node("Concat", [lo, hi], axis=0)
        else:
            idx = coder.node("Cast", [coder.const("labels8", stream)], to=onnx.TensorProto.INT32)
        chunks = coder.split(idx, sizes, 0) if len(sizes) > 1 else [idx]
        for group, chunk in zip(chosen, chunks):
            decoded[id(group)] = coder.group(group, chunk)
    return [decoded[id(g)] for g in groups]


def _packed_stream(flats: list, pad: int) -> np.ndarray:
    """:func:`.maths.encode.pack_labels` of the concatenated ``flats`` (and ``pad`` zero labels),
    written piece by piece: the concatenation itself is never built (a large model's 4-bit
    labels are hundreds of MB)."""
    total = sum(f.size for f in flats) + pad
    half = total // 2
    packed = np.zeros(half, np.uint8)
    start = 0
    for flat in flats:
        end = start + flat.size
        if start < half:
            packed[start:min(end, half)] += flat[:min(end, half) - start].astype(np.uint8)
        if end > half:
            high = max(start, half)
            packed[high - half:end - half] += (16 * flat[high - start:].astype(np.uint8)).astype(np.uint8)
        start = end
    return packed


def _table(members: list) -> bool:
    """Whether a lean group decodes as :meth:`_Coder.table`: one 2-D weight with row scales."""
    first = members[0]
    return len(members) == 1 and not first.per_channel and first.scales is not None and first.labels.ndim == 2


def _stacked(members: list, field: str) -> np.ndarray:
    arrays = [getattr(m, field) for m in members]
    if members[0].per_channel and field == "codebook":  # C × k books: rows stack along 0
        return np.concatenate(arrays) if len(arrays) > 1 else arrays[0]
    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays, axis=members[0].axis % arrays[0].ndim)


def _flat_labels(members: list) -> np.ndarray:
    """A group's labels in stream order: flat in the weights' layout, or row by row (axis first)
    for per-row codebooks."""
    labels = _stacked(members, "labels")
    return as_rows(labels, members[0].axis % labels.ndim).ravel() if members[0].per_channel else labels.ravel()


class _Coder:
    def __init__(self, model, graph):
        self.model, self.graph = model, graph

    def const(self, tag: str, values: np.ndarray) -> gs.Constant:
        return gs.Constant(self.model.fresh_name(f"cluster/{tag}"), np.ascontiguousarray(values))

    def node(self, op: str, inputs: list, outputs: int = 1, **attrs):
        # no dtype/shape on the decoder's tensors: their value_info would cost ~40 bytes each
        # in the file, and ORT folds the decoder anyway
        outs = [gs.Variable(self.model.fresh_name(f"cluster/{op.lower()}")) for _ in range(outputs)]
        self.graph.nodes.append(gs.Node(op, self.model.fresh_name(f"cluster/{op}"), attrs, list(inputs), outs))
        return outs[0] if outputs == 1 else outs

    def split(self, tensor, sizes: list, axis: int) -> list:
        if self.model.opset < 13:
            return self.node("Split", [tensor], len(sizes), axis=axis, split=[int(s) for s in sizes])
        return self.node("Split", [tensor, self.const("sizes", np.array(sizes, np.int64))], len(sizes), axis=axis)

    def lean(self, groups: list, chunks: list) -> dict:
        """A large stream's decoders, ``{id(group): tensors}``, with fewer full-size
        intermediates for ONNX Runtime's folding (module docstring): ``chunks``, each group's
        uint8 labels (8-bit: an initializer each, shaped like the weight for a table; 4-bit:
        :meth:`unpacked`), then per group ``Cast<INT32>`` of its own labels — for a 2-D weight
        of one member with row scales (:func:`_table`) one ``GatherElements`` from the ``k × C``
        table ``codebook ⊗ scales`` (built by a Mul of two small tensors) along the non-channel
        axis; any other group as before."""
        out = {}
        for group, chunk in zip(groups, chunks):
            if _table(group):
                out[id(group)] = [self.table(group[0], chunk)]
            else:
                out[id(group)] = self.group(group, self.node("Cast", [chunk], to=onnx.TensorProto.INT32))
        return out

    def unpacked(self, stream: np.ndarray, sizes: list) -> list:
        """The 4-bit ``stream``'s uint8 labels (unpacked by Mod / BitShift / Concat), split per group."""
        labels = self.const("labels4", stream)
        lo = self.node("Mod", [labels, self.const("sixteen", np.array(16, np.uint8))])
        hi = self.node("BitShift", [labels, self.const("four", np.array(4, np.uint8))], direction="RIGHT")
        labels = self.node("Concat", [lo, hi], axis=0)
        return self.split(labels, sizes, 0) if len(sizes) > 1 else [labels]

    def table(self, member, chunk):
        """``GatherElements(codebook ⊗ scales, labels, axis = the non-channel axis)``: ``W[i, j] =
        s_j · book[L[i, j]]`` (axis 1 the channels; the transposed table when axis 0), the same
        float32 products as Gather-then-Mul."""
        axis = member.axis % 2
        shaped = chunk if isinstance(chunk, gs.Constant) and tuple(chunk.shape) == member.labels.shape else (
            self.node("Reshape", [chunk, self.const("shape", np.array(member.labels.shape, np.int64))]))
        index = self.node("Cast", [shaped], to=onnx.TensorProto.INT32)
        book = self.const("codebook", member.codebook)
        if member.dtype is not None:
            book = self.node("Cast", [book], to=onnx.helper.np_dtype_to_tensor_dtype(np.dtype(member.dtype)))
        column = np.array([1, -1] if axis == 0 else [-1, 1], np.int64)
        book = self.node("Reshape", [book, self.const("book", column)])
        if half_scales([member]):
            dtype = onnx.helper.np_dtype_to_tensor_dtype(member.scales.dtype)
            scales = self.node("Cast", [self.const("scales16", member.scales.astype(np.float16))], to=dtype)
        else:
            scales = self.const("scales", member.scales)
        return self.node("GatherElements", [self.node("Mul", [scales, book]), index], axis=1 - axis)

    def group(self, members: list, chunk) -> list:
        first = members[0]
        labels = _stacked(members, "labels")
        if first.per_channel:
            values = self.rows(members, labels, chunk)
        else:
            values = self.shared(members, labels, chunk)
        if len(members) == 1:
            return [values]
        axis = first.axis % labels.ndim
        return self.split(values, [m.labels.shape[axis] for m in members], axis)

    def rows(self, members: list, labels: np.ndarray, chunk):
        """Per-row codebooks: ``books[c, labels[c, m]]``, then back to the weights' layout."""
        first = members[0]
        books = _stacked(members, "codebook")
        axis = first.axis % labels.ndim
        moved = np.moveaxis(labels, axis, 0).shape
        grid = self.node("Reshape", [chunk, self.const("rows", np.array([moved[0], -1], np.int64))])
        book = self.const("books", books)
        if first.dtype is not None:
            book = self.node("Cast", [book], to=onnx.helper.np_dtype_to_tensor_dtype(np.dtype(first.dtype)))
        if self.model.opset >= 11:
            values = self.node("GatherElements", [book, grid], axis=1)
        else:  # Gather on the flat books, each row's labels offset by k · row
            offsets = self.const("offsets", (np.arange(len(books), dtype=np.int32) * books.shape[1])[:, None])
            flat = self.node("Reshape", [book, self.const("flat", np.array([-1], np.int64))])
            values = self.node("Gather", [flat, self.node("Add", [grid, offsets])], axis=0)
        values = self.node("Reshape", [values, self.const("shape", np.array(moved, np.int64))])
        if axis:
            perm = list(range(1, axis + 1)) + [0] + list(range(axis + 1, labels.ndim))
            values = self.node("Transpose", [values], perm=perm)
        return values

    def shared(self, members: list, labels: np.ndarray, chunk):
        """One codebook for the group, times the rows' scales."""
        first = members[0]
        book = self.const("codebook", first.codebook)
        if first.dtype is not None:  # a float16 codebook (k_high)
            book = self.node("Cast", [book], to=onnx.helper.np_dtype_to_tensor_dtype(np.dtype(first.dtype)))
        # GatherElements on the flat labels, then Reshape: ORT's Gather copies element by element
        # (measured: 390k labels 7–10 ms vs 0.23 ms), and the decoder runs at every session creation
        gather = "GatherElements" if self.model.opset >= 11 else "Gather"
        flat = self.node(gather, [book, chunk], axis=0)
        values = self.node("Reshape", [flat, self.const("shape", np.array(labels.shape, np.int64))])
        if first.scales is not None:
            scales = _stacked(members, "scales")
            if half_scales(members):
                dtype = onnx.helper.np_dtype_to_tensor_dtype(scales.dtype)
                stored = self.node("Cast", [self.const("scales16", scales.astype(np.float16))], to=dtype)
            else:
                stored = self.const("scales", scales)
            values = self.node("Mul", [values, stored])
        return values
