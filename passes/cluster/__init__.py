"""``cluster`` — weight sharing: k-means on weight values, stored as a codebook + small indices.

Before / after, for a weight ``W`` of a Conv / ConvTranspose / Gemm / MatMul (or the W and R
of an LSTM / GRU / RNN):

```
W (float, N values) ──▶ Conv          codebook (k floats), labels (uint8 or 4-bit packed)
                                        ──▶ Cast ─[unpack]─ Reshape ─ Gather(codebook, ·) ──▶ Conv
```

``W' = codebook[labels]`` where ``codebook, labels = kmeans(W, k)`` (:mod:`onnxslim_kit.passes.cluster.maths.kmeans`),
per tensor or per row of ``W`` (``per_channel``: :mod:`onnxslim_kit.passes.cluster.maths.rows`, float16 centroids
unless exact, GPTQ-assigned with calibration data; the channel axis is the output one:
0 for Conv, Gemm ``transB=1`` and a left-hand MatMul weight, the last axis for a right-hand
MatMul / Gemm ``transB=0`` weight, 1 for ConvTranspose — :func:`channel_axis`; or the input
one where it has fewer slices — :func:`book_axis`). Default per tensor
with ``channel_scale``: ``W'[c] = s_c · codebook[labels[c]]``, ``s_c`` the RMS of row ``c`` — one
extra float per row, and necessary after BatchNorm folding, where output channels differ in
scale by orders of magnitude; rows are output channels as above (measured on the orientation model after ``fuse``: output cosine
0.35 without scales, 0.99995 with them). Scales are rounded to float16 (stored in 2 bytes) when
every scale of the weight is a normal float16 number. Weights under 32768 elements that can be
stacked along the output-channel axis (same graph, dtype, axis and other dims) share one
codebook (:mod:`onnxslim_kit.passes.cluster.maths.share`), so that the encoder decodes them together: one packed label
stream per graph, one GatherElements / Reshape / Mul / Split per group
(:mod:`onnxslim_kit.passes.cluster.stream`; per-channel codebooks: :mod:`onnxslim_kit.passes.cluster.maths.encode`). ORT folds the
decoder at session creation with optimisations on, so the model runs on plain float weights
(same latency as unclustered; the folding adds to the session creation time).

Large models: a layer's GPTQ factor is computed once for all its levels (and for the layers
reading one input, Q/K/V), in low-rank form when the layer was seen on few rows
(:meth:`.grams.Gram.factor`); BLAS runs on ``BLAS_THREADS`` threads; the Gram matrices are
held a group of layers at a time (:mod:`onnxslim_kit.passes.cluster.grams`), GPTQ applies its
updates a block of columns at a time (:mod:`.maths.gptq`), and labels are held in one byte
(:class:`.maths.encode.Clustered`). Measured on issue 16's decoder (``fuse,cluster``, 4 calibration
samples; ``benchmarks/results/large-model-2026-12-07-s15-cluster-summary.md``): 3 layers, 367 MB,
213 s and 3.84× the model's bytes in peak RSS before, 78 s and 2.02× after, same decisions; 24
layers, 2.75 GB, killed at 1500 s before, 670 s and 1.39× after — the peak then the pipeline's
verification, whose ORT folding of the decoders held int32 indices (:mod:`.stream`); with the
decoders verified unfolded (``onnxslim_kit/verify.py``), 477–511 s and 1.15–1.18×, the pass's own peak
(``results/large-model-2026-12-07-s16-cluster-summary.md``).

Assignment: nearest centroid; or, with calibration data (``data=auto`` and ``--calib`` given,
or ``data=true``), GPTQ (:mod:`onnxslim_kit.passes.cluster.maths.gptq`) for MatMul / Gemm / Conv (group 1) weights:
the codebook and scales stay the k-means ones, the labels are chosen column by column so that
the layer's *output* error on the calibration inputs is small. Also for layers seen on fewer
rows than inputs (after global pooling, batch-1 dense heads): the damping term keeps the
unobserved directions in check, and on held-out inputs it still beat nearest assignment
(measured after ``fuse``, 16 calibration / 16 evaluation inputs of the benchmark suite, worst
output cosine: ppocrv4_det 0.953 → 0.969, mtcnn_onet 0.950 → 0.992). Generated random data
does not switch it on — its statistics are not real ones.

Codebook size per layer (``target``: the fidelity contract, :mod:`onnxslim_kit.fidelity`; default
the pipeline's ``--target`` share, ``cos:0.99`` for a pass run alone; ``cos:V`` / ``top1:V`` /
``rel:V`` for a target of its own — a bare number, the older ``0.995``, reads as ``cos:V``;
``none`` or the older ``0``: off): the pass judges configurations on the pipeline's judged
samples — one calibration sample in four, held out of ``ctx.feed``, or ``--eval`` — each output
view on its own (the branches of a concatenated head, the decisions of Softmax/Sigmoid heads)
against the original, and moves the layers that hurt the output most, per byte, up a ladder
until the verdict's budget fraction is within this pass's share: ``k`` with a codebook per row
(``rows``, :mod:`onnxslim_kit.passes.cluster.maths.rows`: ``k`` float16 centroids for every
output channel, or every input channel of a weight that has fewer of those), ``k_high``
centroids (256, uint8 indices, float16 codebook), float (:mod:`onnxslim_kit.passes.cluster.select`).
The GPTQ statistics and each layer's damage are fitted on ``ctx.feed`` alone; the pipeline's
split replaced the pass's own (the last 8 of ≥ 16 calibration samples), and a YOLO-style head
(box regression ×100 beside sigmoid scores) now keeps its scores, which a whole-output cosine
never saw (``tests/passes/cluster/test_cluster_fidelity.py``). Weights inside If/Loop bodies are
measured too. The chosen level per layer, the binding view and the judged samples are in the
notes.

The default was ``0.995`` on the pass's own 8 held-out samples, a margin over the 0.99 one asks
of unseen data (PP-OCRv4 det, 16 calibration / 16 evaluation pages: target 0.99 held 0.99205
on the held-out calibration pages but 0.98952 on the evaluation pages at 0.151× the file; 0.995:
0.99532 at 0.157×, ``cluster-2026-11-29-s2*.md``). The margin did not carry over on PP-OCRv4
rec (CTC over 6625 classes; k = 16 everywhere: output cosine 0.84 on held-out lines): that
default gave 0.186× the file and a worst cosine of 0.925 on 16 evaluation lines (agreement
per position 98.3 %; every string the same, ``cluster-2026-11-29-s3*.md``). With the pipeline's
split the pipeline's ``cos:0.99`` applies. Measured 2026-12-02 on PP-OCRv4 rec,
``fuse,cluster(k=16)``, 32 calibration lines (8 judged, 24 fitted) and 16 evaluation lines of
``benchmarks/inputs.py`` (per-view figures of the ``probs`` view: worst-sample cosine /
per-position arg-max agreement):

=====================================  =======  ===============  ===============  ===========
                                       file     judged (8)       evaluation (16)  strings
=====================================  =======  ===============  ===============  ===========
before issue 18, 0.995, own split      0.594×   0.99985 / 1      0.99950 / 0.998  all same
``target=0.995`` (cos:0.995)           0.372×   0.99588 / 1      0.99116 / 0.998  all same
default (pipeline ``cos:0.99``)        0.164×   0.99439 / 0.997  0.97495 / 0.992  all same
=====================================  =======  ===============  ===============  ===========

With 16 calibration lines (4 judged, 12 fitted; the same 16 evaluation lines): before issue 18
0.186×, evaluation 0.925 / 0.983; ``target=0.995`` 0.234×, judged 0.99803 / 1, evaluation
0.950 / 0.994; the default 0.149×, judged 0.99641 / 0.994, evaluation 0.935 / 0.984 — every
string the same in all. (PP-OCR cls v2, 32 / 16 samples: 0.194× the file at either target,
evaluation cosine 0.99998, every decision the same: the target does not bind.) The judged
samples decide, and a worst-sample cosine on other data falls below theirs: give more
``--calib`` (or ``--eval``) where the worst sample matters.

Encoding (``encode``): ``packed`` (default) stores codebook + indices as above; ``dense``
stores the decoded weight as a plain float initializer — for ``cluster,int8``: int8 then sees
constant weights and the file shrinks through int8 (1 byte per weight), and with
``grid=tensor|channel`` the values are snapped to int8's own symmetric grid so that int8
reproduces them exactly (:func:`.maths.encode.snap_to_int8_grid`). With ``encode=packed``
a following ``int8`` sees a Gather, not a constant, and leaves those weights float.

Conditions (each failure is a counted reason, never an error):

1. the weight is a float constant (float16/32/64) read by this node alone (a constant shared
   with other nodes is left alone);
2. it has at least ``min_size`` elements (default 0: no size limit, condition 3 decides);
3. the encoding is smaller than the float weights it replaces, decoder nodes and initializer
   headers included (estimated per weight, per group and per label stream:
   :func:`.stream.member_bytes`, ``group_bytes``, ``stream_bytes``; :mod:`.write`). Measured on
   PP-OCR cls v2 after ``fuse`` (54 weights, 85 of 112 initializers under 1024 elements):
   with a fixed ``min_size=1024`` and a decoder per weight 530859 → 167343 bytes; every weight
   that pays, shared codebooks and one decoder per layout: → 114359 bytes;
4. the node is not one ``exclude`` selects (:mod:`onnxslim_kit.selection`: ``NAME``, ``re:REGEX``,
   ``op:TYPE``, ``first:TYPE:N``, ``last:TYPE:N``, ``all``, separated by ``;``; a term matching no
   node is an error) nor one the global ``--exclude`` selects (main graph; a counted skip).

Exact limit: a weight with at most ``k`` distinct values is stored losslessly (the codebook is
its distinct values, bit for bit, and no scales). With ``keep_zero`` (default) exact zeros keep an exact 0.0
centroid, so a pruned model stays pruned. Metrics: serialized model bytes before/after, raw
and zlib-compressed (what a download or a compressed container costs).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import numpy as np
import onnx_graphsurgeon as gs

from onnxslim_kit.api import Option, Pass, PassResult, check_target, exclusions, model_size_bytes, pass_fidelity, register_pass
from onnxslim_kit.selection import SYNTAX, Selector
from onnxslim_kit.streaming import ScratchArrays, release_pages

from onnxslim_kit.passes.cluster import stream
from onnxslim_kit.passes.cluster.maths.encode import Clustered, snap_to_int8_grid
from onnxslim_kit.passes.cluster.grams import chunks
from onnxslim_kit.passes.cluster.maths.gptq import cluster_layer
from onnxslim_kit.passes.cluster.maths.kmeans import at_most_distinct, cluster_weight
from onnxslim_kit.passes.cluster.maths.rows import row_codebooks
from onnxslim_kit.passes.cluster.select import FLOAT, ROWS, choose
from onnxslim_kit.passes.cluster.write import encode_all
from onnxslim_kit.passes.cluster.maths.share import (
    broadcast_scales,
    half_codebook,
    nearest_labels,
    row_scales,
    shared_codebooks,
    stack_key,
)
from onnxslim_kit.passes._common.blas import blas_threads
from onnxslim_kit.passes._common.graph import const_value, exclusive_constant, is_onnx_op
from onnxslim_kit.passes._common.layer_stats import match_layer
from onnxslim_kit.passes._common.match import NOT_CONCERNED

# op -> input positions that may hold a weight
WEIGHT_INPUTS = {"Conv": (1,), "ConvTranspose": (1,), "Gemm": (0, 1), "MatMul": (0, 1),
                 "LSTM": (1, 2), "GRU": (1, 2), "RNN": (1, 2)}  # recurrent W, R: [directions, gates·H, ·]
FLOAT_KINDS = (np.float16, np.float32, np.float64)
LARGE_BYTES = 256 << 20  # weights to cluster above which labels go to a scratch file and Gram rows are kept
RANK_SAMPLES = 4  # fit samples on which each layer's own damage is measured (select.py)
MAX_NOTE_LAYERS = 40
BLAS_THREADS = 1  # the 2-core machine under load: a 1536-wide GPTQ factor took 3.6 s on 2 threads, 0.14 s on 1


def model_bytes(model) -> tuple:
    """(raw, zlib-compressed) size of the serialized model; the raw size counts weights left in
    external data files too (``model_size_bytes``), the compressed one the serialized part only."""
    proto = model.to_proto()
    blob = proto.SerializeToString()
    raw = max(len(blob), model_size_bytes(proto))
    del proto  # a large model's encodings: one copy fewer while the blob is compressed
    return raw, len(zlib.compress(blob, 6))


def channel_axis(node, index: int, ndim: int) -> int:
    """The output-channel axis of the weight at input ``index`` of ``node``."""
    if node.op in ("ConvTranspose", "LSTM", "GRU", "RNN"):
        return 1  # ConvTranspose [C_in, C_out/g, …]; recurrent W, R [directions, gates·H, ·]
    if node.op == "Gemm":
        transposed = node.attrs.get("transA" if index == 0 else "transB", 0)
        return (1 if transposed else 0) if index == 0 else (0 if transposed else 1)
    if node.op == "MatMul":
        return ndim - 1 if index == 1 else max(ndim - 2, 0)
    return 0


def _level_key(level) -> str:
    return "weights_rows" if level is ROWS else f"weights_k{level}"


def _level_name(level, k: int) -> str:
    return "float" if level is FLOAT else f"k={k} per row" if level is ROWS else f"k={level}"


def book_axis(node, index: int, values: np.ndarray, axis: int) -> int:
    """The axis whose slices get a codebook each (per-row codebooks): the output-channel axis,
    or the input-channel one of a right-hand MatMul / Gemm / group-1 Conv weight when that has
    fewer slices (fewer codebooks to store: PP-OCRv4 rec's 120 × 6625 head, 6625 output
    channels, takes 120 codebooks of 6625 values instead of 6625 of 120)."""
    if index != 1 or values.ndim < 2 or (node.op == "MatMul" and values.ndim != 2):
        return axis
    if node.op == "Conv" and node.attrs.get("group", 1) == 1:
        other = 1
    elif node.op == "Gemm":
        other = 1 if node.attrs.get("transB", 0) else 0
    elif node.op == "MatMul":
        other = 0
    else:
        return axis
    return other if values.shape[other] < values.shape[axis] else axis


@dataclass(eq=False)
class Item:
    """One weight to cluster and its clusterings, one per codebook size."""

    graph: object
    node: object
    index: int
    values: np.ndarray
    axis: int
    levels: dict = field(default_factory=dict)
    scales: np.ndarray | None = None  # (C,) row scales when the codebook is shared
    share: tuple | None = None  # stack key of the weights that share its codebook
    rows: np.ndarray | None = None  # its input rows (float32, R × k), held for a large model's proxy
    mapped: np.ndarray | None = None  # the constant's values when the item was made: the map ``values`` views

    @property
    def weight(self):
        return self.node.inputs[self.index]

    @property
    def name(self) -> str:
        return self.weight.name

    def label(self) -> str:
        return self.node.name or self.node.op

    def drop_pages(self) -> None:
        """Drop the resident pages of the map of the model's file that ``values`` and the layer's
        matrix view (a no-op for weights in memory). That map, not the constant's values now: an
        export of the model (``to_proto``) sends constants back to lazy values, which map the
        file anew when next read — releasing those left every weight resident through the pass
        (the 3-layer decoder: 348 MB of its 367)."""
        release_pages(self.mapped)


@register_pass
class ClusterPass(Pass):
    name = "cluster"
    summary = "k-means weight sharing: float codebook + uint8/4-bit indices, decoded by Gather"
    lossless = False
    options = {
        "k": Option(int, 16, "centroids per tensor (or per channel), 2..256"),
        "per_channel": Option(bool, False, "one codebook per output channel instead of per tensor"),
        "min_size": Option(int, 0, "leave weights with fewer elements unclustered (0: decide by bytes alone)"),
        "keep_zero": Option(bool, True, "keep 0.0 as an exact centroid when the weight has zeros"),
        "channel_scale": Option(bool, True, "per tensor: one RMS scale per output channel, shared codebook"),
        "data": Option(str, "auto", "GPTQ assignment with calibration statistics", ("auto", "true", "false")),
        "target": Option(str, "", "fidelity target (cos:V, top1:V, rel:V, none; a bare number: cos:V; 0: "
                                  "none) held by giving sensitive layers per-row codebooks, k_high centroids "
                                  "or float; default: the pipeline's --target share", parse=check_target),
        "k_high": Option(int, 256, "centroids of the layers that need more (uint8 indices)"),
        "rows": Option(bool, True, "per-row codebooks (k each, float16) as the target's step before k_high"),
        "encode": Option(str, "packed", "packed: codebook + indices; dense: decoded float weights "
                                        "(for a following int8)", ("packed", "dense")),
        "grid": Option(str, "none", "encode=dense: snap to int8's symmetric grid", ("none", "tensor", "channel")),
        "exclude": Option(str, "", f"nodes whose weights stay float (a selector: {SYNTAX}); the global --exclude too", parse=Selector.parse),
    }

    def run(self, model, ctx) -> PassResult:
        with blas_threads(BLAS_THREADS):
            return self._run(model, ctx)

    def _run(self, model, ctx) -> PassResult:
        result = PassResult()
        opts = ctx.options
        k, k_high = opts["k"], max(opts["k_high"], opts["k"])
        if not 2 <= k <= 256 or k_high > 256:
            result.skip(f"k={k}, k_high={k_high} outside 2..256")
            return result
        excluded = _excluded(model, ctx)
        before = model_bytes(model)
        items = self._items(model, opts, excluded, result)
        if not items:
            return result
        data = _data(ctx)
        layers = self._layers(model, items) if data.aware and data.samples else {}
        fid = _fidelity(ctx)
        sizes = [k, k_high] if fid and k_high > k else [k]
        if fid and opts["rows"] and not opts["per_channel"]:
            sizes.insert(1, ROWS)
        large = sum(int(item.values.nbytes) for item in items) > LARGE_BYTES
        labels = ScratchArrays() if large else None  # every level's labels: file pages, not heap
        gptq = self._cluster_all(items, sizes, opts, (layers, model.to_proto() if layers else None, data.samples),
                                 ctx, labels)
        chosen, verdict, trials = [k] * len(items), None, None
        if fid:
            chosen, verdict, trials = self._choose(model, items, ctx.feed.take(RANK_SAMPLES), fid, sizes, large)
        kept = []
        for item, level in zip(items, chosen):
            if level is FLOAT:
                result.skip("kept float to hold the output target")
            else:
                kept.append((item, item.levels[level]))
        encoded = encode_all(model, kept, result)
        if labels is not None:
            labels.close()  # the maps the encodings still read stay valid
        if not result.modified:
            return result
        for graph in model.all_graphs():
            graph.cleanup(remove_unused_graph_inputs=False)
        _summarize(result, opts, before, model_bytes(model), encoded, gptq, data)
        _levels(result, opts, items, sizes, chosen, (verdict, trials, fid))
        return result

    def _items(self, model, opts, excluded: dict, result) -> list:
        """The weights to cluster (``excluded``: id(node) → the reason a selector keeps it)."""
        items = []
        for graph in model.all_graphs():
            for node in graph.nodes:
                if not is_onnx_op(node, *WEIGHT_INPUTS):
                    continue
                if id(node) in excluded:
                    result.skip(excluded[id(node)])
                    continue
                for index in WEIGHT_INPUTS[node.op]:
                    if index >= len(node.inputs):
                        continue
                    reason = self._check(node, index, opts)
                    if reason:
                        if reason != "not a constant":  # activations are not weights: nothing to report
                            result.skip(reason)
                        continue
                    values = const_value(node.inputs[index])
                    items.append(Item(graph, node, index, values, channel_axis(node, index, values.ndim),
                                      mapped=node.inputs[index].values))
        return items

    @staticmethod
    def _cluster_all(items: list, sizes: list, opts, data: tuple, ctx, scratch=None) -> int:
        """Fill ``item.levels[level]`` for every level; returns how many clusterings GPTQ assigned.

        ``data``: ``(layers by id(node), proto, fit samples)``. Item by item, every level at once:
        a layer's Gram matrix and GPTQ factor serve all its levels, and the Gram matrices are
        held a group of layers at a time (:mod:`onnxslim_kit.passes.cluster.grams`; their rows
        instead where fewer, with a ``scratch``). ``scratch`` (a large model's
        :class:`onnxslim_kit.streaming.ScratchArrays`): the labels go there, and each weight's
        pages of the model's file are dropped once its levels are done."""
        layers, proto, samples = data
        books = ClusterPass._books(items, sizes, opts)
        bar = iter(ctx.progress(range(len(items)), desc="cluster", total=len(items)))
        gptq = 0
        held = [None, [None]]  # the last Gram entry and its factor: Q/K/V projections read one

        def fill(item, layer=None, entry=None) -> int:
            next(bar, None)
            usable = layer is not None and entry is not None and entry.gram_rows > 0
            if held[0] is not entry:
                held[:] = [entry, [None]]  # computed on first use: exact weights never need it
            factor = held[1]
            used = 0
            for level in sizes:
                item.levels[level], one = ClusterPass._cluster(item, level, books.get(level, {}), opts,
                                                               layer if usable else None, entry, factor)
                used += one
                if scratch is not None:
                    item.levels[level].labels = scratch.put(item.levels[level].labels)
                    release_pages(item.levels[level].labels)
            item.drop_pages()
            if scratch is not None and usable:
                item.rows = entry.held_rows()  # the proxy's rows (module docstring of .damage)
            return used

        by_node = {key: layer for key, layer in layers.items()}
        for item in items:
            if id(item.node) not in by_node or item.index != 1:
                gptq += fill(item)
        order = [layer for layer in by_node.values()]
        for group, grams in (chunks(proto, order, samples, keep_rows=scratch is not None) if order else ()):
            members = {layer.key: layer for layer in group}
            for item in items:
                if item.index == 1 and id(item.node) in members:
                    gptq += fill(item, members[id(item.node)], grams[id(item.node)])
            del grams
        return gptq

    @staticmethod
    def _books(items: list, sizes: list, opts) -> dict:
        """``{level: {stack key: shared codebook}}`` (row scales set on the items)."""
        scaled = opts["channel_scale"] and not opts["per_channel"]
        groups = {}
        for item in items:
            if scaled and item.values.ndim >= 2:
                item.scales = row_scales(item.values, item.axis)
                item.share = stack_key(item.graph, item.values, item.axis, item)
                groups.setdefault(item.share, []).append(item)
                item.drop_pages()
        books = {level: {} for level in sizes}
        for key, members in groups.items():
            fitted = {}  # the members not at a level's exact limit → those levels: fitted together
            for level in sizes:
                parts = tuple(m for m in members if level is not ROWS and not at_most_distinct(m.values, level))
                if parts:
                    fitted.setdefault(parts, []).append(level)
            for parts, levels in fitted.items():
                found = shared_codebooks([(m.values, m.scales, m.axis) for m in parts], levels, opts["keep_zero"])
                for level, codebook in zip(levels, found):  # assigned against the stored (rounded) centroids
                    books[level][key] = half_codebook(codebook, stream.NODE_BYTES)
            for member in members:
                member.drop_pages()
        return books

    @staticmethod
    def _cluster(item: Item, level, books: dict, opts, layer, entry, factor: list) -> tuple:
        """``(Clustered, 1 if GPTQ assigned it else 0)``: a shared codebook (``books`` by stack
        key) and the item's row scales, a codebook per row (``per_channel`` or the ``ROWS``
        level), or a codebook of its own (exact limit, 1-D weights). GPTQ when ``layer`` (with
        its Gram matrix ``entry``) is given; ``factor``: a one-element list caching the
        entry's GPTQ factor (:meth:`.grams.Gram.factor`) across levels and layers."""
        values = item.values
        k = opts["k"] if level is ROWS else level
        per_row = (opts["per_channel"] or level is ROWS) and values.ndim >= 2
        gptq = layer is not None

        def assign(codebook, scales, per_input=False):
            if factor[0] is None:
                factor[0] = entry.factor()
            return cluster_layer(layer, None, codebook, scales, opts["keep_zero"], per_input, factor[0])
        exact = at_most_distinct(values, k)
        if per_row:
            axis = book_axis(item.node, item.index, values, item.axis)
            codebook, labels, exact_rows = row_codebooks(values, axis, k, opts["keep_zero"], labels=not gptq)
            gptq = gptq and not exact_rows
            if gptq:
                labels = assign(codebook, None, per_input=axis != item.axis)
            clustered = Clustered(codebook, labels, None, True, axis,
                                  dtype=values.dtype if codebook.dtype != values.dtype else None)
        elif item.share is not None and not exact:
            codebook = books[item.share]
            if gptq:
                labels = assign(codebook, item.scales)
            else:
                labels = nearest_labels(values, item.scales, item.axis, codebook, opts["keep_zero"])
            scales = broadcast_scales(item.scales, values.ndim, item.axis)
            clustered = Clustered(codebook, labels, scales, False, item.axis, share=item.share,
                                  dtype=values.dtype if codebook.dtype != values.dtype else None)
        else:
            codebook, labels, scales = cluster_weight(values, k, opts["keep_zero"],
                                                      channel_scale=opts["channel_scale"], axis=item.axis)
            gptq = gptq and not exact and scales is None
            if gptq:
                labels = assign(codebook, None)
            clustered = Clustered(codebook, labels, scales, False, item.axis)
        if opts["encode"] == "dense":
            dense = clustered.decoded()
            if opts["grid"] != "none":
                dense = snap_to_int8_grid(dense, item.axis if opts["grid"] == "channel" else None)
            clustered.dense = dense
        return clustered, int(bool(gptq))

    @staticmethod
    def _choose(model, items, rank_samples: list, fid, levels, proxy: bool = False) -> tuple:
        """``(levels per item, verdict or None, trials)`` holding ``fid`` (items whose
        initializer name is not unique in the model keep the first level: they could not be fed
        apart); ``proxy``: :func:`.select.choose`'s."""
        objects = {}
        for graph in model.all_graphs():
            for tensor in graph.tensors().values():
                objects.setdefault(tensor.name, set()).add(id(tensor))
        main = [i for i, it in enumerate(items) if len(objects.get(it.name, ())) == 1]
        chosen = [levels[0]] * len(items)
        if not main or not fid.samples:
            return chosen, None, None
        picked, verdict, trials = choose(model.to_proto(), [items[i] for i in main], rank_samples, fid, levels, proxy)
        for i, level in zip(main, picked):
            chosen[i] = level
        return chosen, verdict, trials

    @staticmethod
    def _layers(model, items) -> dict:
        """Layers (``Y = X W`` with W at input 1) by ``id(node)``: the weights GPTQ can assign."""
        layers = {}
        for item in items:
            found = match_layer(item.node, item.graph, model.graph) if item.index == 1 else NOT_CONCERNED
            if found.ok and found.value.kind != "batched":
                layers[id(item.node)] = found.value
        return layers

    @staticmethod
    def _check(node, index, opts) -> str | None:
        weight = node.inputs[index]
        if not isinstance(weight, gs.Constant):
            return "not a constant"
        if const_value(weight).dtype not in FLOAT_KINDS:
            return "weight is not float"
        if not exclusive_constant(weight, node):
            return "shared weight"
        if const_value(weight).size < opts["min_size"]:
            return "smaller than min_size"
        return None


@dataclass
class _Data:
    """Calibration samples for the GPTQ statistics: the pipeline's fit part (``ctx.feed``; the
    samples that judge the target are held out of it by the pipeline)."""

    aware: bool
    samples: list


def _data(ctx) -> _Data:
    """GPTQ statistics from real calibration data (``data=auto``) or ``data=true``."""
    opts = ctx.options
    aware = opts["data"] == "true" or (opts["data"] == "auto" and not getattr(ctx.feed, "generated", True))
    return _Data(aware, list(ctx.feed) if aware else [])


def _fidelity(ctx):
    """The :class:`onnxslim_kit.fidelity.Fidelity` the choice of levels holds, or None: no
    search (``target=none`` / ``0``, a Python ``0``)."""
    value = ctx.options["target"]
    if not isinstance(value, str) and not value:
        return None
    fid = pass_fidelity(ctx)
    return None if fid.target.metric == "none" else fid


def _excluded(model, ctx) -> dict:
    """``id(node)`` → skip reason for the main-graph nodes ``exclude=`` (must match) and the
    global ``--exclude`` select (:func:`onnxslim_kit.selection.exclusions`)."""
    return exclusions(model.graph, ctx.options["exclude"], getattr(ctx, "exclude", None), "cluster(exclude=...)")


def _summarize(result: PassResult, opts, before: tuple, after: tuple, encoded: list, gptq: int, data: _Data) -> None:
    """Size metrics (raw and zlib) and the summary note."""
    (raw_before, zip_before), (raw_after, zip_after) = before, after
    result.metrics.update({
        "weights_clustered": len(encoded), "params_clustered": sum(item.values.size for item in encoded),
        "bytes_before": raw_before, "bytes_after": raw_after,
        "zlib_bytes_before": zip_before, "zlib_bytes_after": zip_after,
        "size_ratio": round(raw_after / raw_before, 4),
        "zlib_size_ratio": round(zip_after / zip_before, 4),
        "weights_assigned_by_gptq": gptq,
    })
    mode = ('per channel' if opts['per_channel'] else 'per tensor') + (
        ' + row scales' if opts['channel_scale'] and not opts['per_channel'] else '')
    result.notes.append(
        f"k={opts['k']} {mode}; "
        f"{'data-aware: ' + str(gptq) + ' clusterings assigned by GPTQ' if data.aware else 'nearest-centroid assignment'}"
        f"; encode={opts['encode']}: file {raw_before} → {raw_after} "
        f"bytes ({raw_after / raw_before:.3f}×), zlib {zip_before} → {zip_after} ({zip_after / zip_before:.3f}×)")


def _levels(result: PassResult, opts, items: list, sizes: list, chosen: list, measured: tuple) -> None:
    """Weights per ladder level, and (with a measured target) the target note and each layer's level."""
    k = opts["k"]
    for size in sizes:
        result.metrics[_level_key(size)] = sum(level == size for level in chosen)
    result.metrics["weights_float_for_target"] = sum(level is FLOAT for level in chosen)
    verdict, trials, fid = measured
    if verdict is None:
        return
    result.metrics.update(target=str(fid.target), budget_used=round(verdict.used, 4),
                          budget_allowed=round(fid.allowed, 4),
                          target_cosine_measured=round(verdict.worst("cosine"), 6))
    counts = ", ".join(f"{result.metrics.get(_level_key(s), 0)} at {_level_name(s, k)}" for s in sizes)
    result.notes.append(
        f"{'held' if fid.met(verdict) else 'missed'} {fid.describe()}; binding view {verdict.summary()}; "
        f"{trials.evaluations} trials; {counts}, {result.metrics['weights_float_for_target']} float")
    lines = [f"{it.label()} {it.values.shape}: {_level_name(lv, k)}" for it, lv in zip(items, chosen)]
    result.notes.extend(lines[:MAX_NOTE_LAYERS])
    if len(lines) > MAX_NOTE_LAYERS:
        result.notes.append(f"… {len(lines) - MAX_NOTE_LAYERS} more layers")
