"""``cluster`` — weight sharing: k-means on weight values, stored as a codebook + small indices.

Before / after, for a weight ``W`` of a Conv / ConvTranspose / Gemm / MatMul:

```
W (float, N values) ──▶ Conv          codebook (k floats), labels (uint8 or 4-bit packed)
                                        ──▶ Cast ─[unpack]─ Reshape ─ Gather(codebook, ·) ──▶ Conv
```

``W' = codebook[labels]`` where ``codebook, labels = kmeans(W, k)`` (:mod:`._cluster_kmeans`),
per tensor or per row of ``W`` (``per_channel``: axis 0, the output channel of Conv and of
Gemm with ``transB=1``; for MatMul/Gemm ``transB=0`` it is an input row). Default per tensor
with ``channel_scale``: ``W'[c] = s_c · codebook[labels[c]]``, ``s_c`` the RMS of row ``c`` — one
extra float per row, and necessary after BatchNorm folding, where output channels differ in
scale by orders of magnitude (measured on the orientation model after ``fuse``: output cosine
0.35 without scales, 0.99995 with them). Encoding and the
decoding subgraph: :mod:`._cluster_encode` — ORT folds the decoder at session creation with
optimisations on, so the model runs on plain float weights (same latency as unclustered).

Assignment: nearest centroid; or, with calibration data (``data=auto`` and ``--calib`` given,
or ``data=true``), GPTQ (:mod:`._cluster_gptq`) for MatMul / Gemm / Conv (group 1) weights:
the codebook and scales stay the k-means ones, the labels are chosen column by column so that
the layer's *output* error on the calibration inputs is small. Also for layers seen on fewer
rows than inputs (after global pooling, batch-1 dense heads): the damping term keeps the
unobserved directions in check, and on held-out inputs it still beat nearest assignment
(measured after ``fuse``, 16 calibration / 16 evaluation inputs of the benchmark suite, worst
output cosine: ppocrv4_det 0.953 → 0.969, mtcnn_onet 0.950 → 0.992). Generated random data
does not switch it on — its statistics are not real ones.

Conditions (each failure is a counted reason, never an error):

1. the weight is a float constant (float16/32/64) read by this node alone (a constant shared
   with other nodes is left alone);
2. it has at least ``min_size`` elements;
3. the codebook + labels take fewer bytes than the float weight.

Exact limit: a weight with at most ``k`` distinct values is stored losslessly (the codebook is
its distinct values, bit for bit, and no scales). With ``keep_zero`` (default) exact zeros keep an exact 0.0
centroid, so a pruned model stays pruned. Metrics: serialized model bytes before/after, raw
and zlib-compressed (what a download or a compressed container costs).
"""

from __future__ import annotations

import zlib

import numpy as np
import onnx_graphsurgeon as gs

from onnxslim_kit.pipeline import Option, Pass, PassResult, register_pass

from ._cluster_encode import decode_subgraph, pack_labels
from ._cluster_gptq import cluster_layer
from ._cluster_kmeans import cluster_weight
from ._graph import const_value, exclusive_constant, is_onnx_op
from ._svd_stats import collect, match

# op -> input positions that may hold a weight
WEIGHT_INPUTS = {"Conv": (1,), "ConvTranspose": (1,), "Gemm": (0, 1), "MatMul": (0, 1)}
FLOAT_KINDS = (np.float16, np.float32, np.float64)


def model_bytes(model) -> tuple:
    """(raw, zlib-compressed) size of the serialized model."""
    blob = model.to_proto().SerializeToString()
    return len(blob), len(zlib.compress(blob, 6))


@register_pass
class ClusterPass(Pass):
    name = "cluster"
    summary = "k-means weight sharing: float codebook + uint8/4-bit indices, decoded by Gather"
    lossless = False
    options = {
        "k": Option(int, 16, "centroids per tensor (or per channel), 2..256"),
        "per_channel": Option(bool, False, "one codebook per row of the weight (axis 0) instead of per tensor"),
        "min_size": Option(int, 1024, "leave weights with fewer elements unclustered"),
        "keep_zero": Option(bool, True, "keep 0.0 as an exact centroid when the weight has zeros"),
        "channel_scale": Option(bool, True, "per tensor: one RMS scale per row (axis 0), shared codebook"),
        "data": Option(str, "auto", "GPTQ assignment with calibration statistics", ("auto", "true", "false")),
    }

    def run(self, model, ctx) -> PassResult:
        result = PassResult()
        opts = ctx.options
        k = opts["k"]
        if not 2 <= k <= 256:
            result.skip(f"k={k} outside 2..256")
            return result
        raw_before, zip_before = model_bytes(model)
        candidates = [(g, n, i) for g in model.all_graphs() for n in g.nodes
                      if is_onnx_op(n, *WEIGHT_INPUTS)
                      for i in WEIGHT_INPUTS[n.op] if i < len(n.inputs)]
        eligible = [(g, n, i) for g, n, i in candidates if not self._check(n, i, opts)]
        data_aware = not opts["per_channel"] and (
            opts["data"] == "true" or (opts["data"] == "auto" and not getattr(ctx.feed, "generated", True)))
        layers, stats = self._statistics(model, ctx, eligible) if data_aware else ({}, {})
        clustered = params = gptq = 0
        for graph, node, index in ctx.progress(candidates, desc="cluster", total=len(candidates)):
            reason = self._check(node, index, opts)
            if reason:
                if reason != "not a constant":  # activations are not weights: nothing to report
                    result.skip(reason)
                continue
            weight = node.inputs[index]
            values = const_value(weight)
            per_channel = opts["per_channel"] and values.ndim >= 2
            layer = layers.get(id(node)) if index == 1 else None
            entry = stats.get(id(node))
            if layer is not None and entry.gram_rows > 0 and np.unique(values).size > k:
                codebook, labels, scales = cluster_layer(layer, entry.normalized_gram, k, opts["keep_zero"],
                                                         opts["channel_scale"])
                gptq += 1
            else:
                codebook, labels, scales = cluster_weight(values, k, per_channel, opts["keep_zero"],
                                                          channel_scale=opts["channel_scale"])
            stored, packed = pack_labels(labels, codebook.shape[-1])
            if codebook.nbytes + stored.nbytes + (0 if scales is None else scales.nbytes) >= values.nbytes:
                result.skip("encoding not smaller than the float weight")
                continue
            node.inputs[index] = decode_subgraph(model, graph, weight, codebook, stored, packed, per_channel, scales)
            result.rewrite(f"{node.op} weight → codebook + {'4-bit' if packed else 'uint8'} indices")
            clustered += 1
            params += values.size
        if not result.modified:
            return result
        for graph in model.all_graphs():
            graph.cleanup(remove_unused_graph_inputs=False)
        raw_after, zip_after = model_bytes(model)
        result.metrics.update({
            "weights_clustered": clustered, "params_clustered": params,
            "bytes_before": raw_before, "bytes_after": raw_after,
            "zlib_bytes_before": zip_before, "zlib_bytes_after": zip_after,
            "size_ratio": round(raw_after / raw_before, 4),
            "zlib_size_ratio": round(zip_after / zip_before, 4),
        })
        result.metrics["weights_assigned_by_gptq"] = gptq
        result.notes.append(
            f"k={k} {'per channel' if opts['per_channel'] else 'per tensor'}"
            f"{' + row scales' if opts['channel_scale'] and not opts['per_channel'] else ''}; "
            f"{'data-aware: ' + str(gptq) + ' weights assigned by GPTQ' if data_aware else 'nearest-centroid assignment'}"
            f": file {raw_before} → {raw_after} "
            f"bytes ({raw_after / raw_before:.3f}×), zlib {zip_before} → {zip_after} ({zip_after / zip_before:.3f}×)"
        )
        return result

    @staticmethod
    def _statistics(model, ctx, eligible) -> tuple:
        """Layers (``Y = X W`` with W at input 1) and their input Gram matrices."""
        layers = {}
        for graph, node, index in eligible:
            found = match(node, graph, model.graph) if index == 1 else None
            if found is not None and not isinstance(found, str):
                layers[id(node)] = found
        if not layers:
            return {}, {}
        stats = collect(model.to_proto(), list(layers.values()), list(ctx.feed), want_gram=True)
        return layers, stats

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
