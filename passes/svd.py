"""``svd`` — low-rank factorisation of MatMul / Gemm / Conv weights.

Before / after (``W``: ``k × n`` as the layer computes ``Y = X W``; ``A``: ``k × r``, ``B``: ``r × n``):

```
MatMul(X, W)                      →  MatMul(MatMul(X, A), B)
Gemm(X, W[ᵀ], C, α, β)            →  Gemm(MatMul(X, A), α·B, C, α=1, β, transB=0)
Conv(X, W[n,C,kh,kw], bias)       →  Conv(Conv(X, A', same attributes), B', bias)     A' = Aᵀ as [r,C,kh,kw]
  (k = C·kh·kw over im2col rows)                                                     B' = Bᵀ as [n,r,1,1]
```

A k×k Conv becomes a k×k Conv with ``r`` filters followed by a 1×1 Conv (the simplest exact
spatial decomposition; a 1×1 Conv is the special case kh = kw = 1). ``A, B`` come from
:mod:`._svd_math` (plain SVD, or whitened by the input Gram matrix from :mod:`._svd_stats`).

Conditions (each failure is a counted reason):

1. the weight is a float constant read by this node alone; MatMul has it on the right and
   2-D (batched 3-D weights are left alone); Gemm has ``transA = 0``; Conv is 2-D, ``group = 1``;
2. the node is in the main graph (subgraph activations cannot be observed);
3. unless ``force``: the chosen rank pays off, ``r (k + n) < k n``, and the factorised layer is
   faster (:mod:`._svd_speed`: measured in ORT for small shapes, FLOPs for large ones).

Rank: ``rank`` (−1 = full), ``ratio``, ``energy`` or, by default, ``cosine``: the smallest rank
whose estimated per-layer output cosine ``√(kept energy)`` reaches it (0.999). Data: ``auto``
uses the whitened (data-aware) factorisation when calibration data was given (``--calib``), and
the plain SVD when the feed is generated random data — statistics of random inputs are not
those of real ones, and the plain SVD is the whitened one for white inputs. A layer whose input
was seen on fewer than ``2·k`` rows (e.g. an SE block after global pooling: one row per
sample) gets the plain SVD too: its Gram matrix is (nearly) rank-deficient and a rank fitted
to it would not generalise. The notes say
which was used. ``force=true, rank=-1`` is lossless (``A B = W``) and is declared so.
"""

from __future__ import annotations

import math

import numpy as np
import onnx_graphsurgeon as gs

from onnxslim_kit.pipeline import Option, Pass, PassResult, register_pass

from ._graph import new_constant
from ._svd_math import Factorization, breakeven_rank
from ._svd_speed import decide, flops
from ._svd_stats import collect, match

MAX_NOTE_LAYERS = 40
MIN_ROWS_PER_INPUT = 2  # whiten only with at least 2·k calibration rows (else Gram is rank-deficient)


@register_pass
class SvdPass(Pass):
    name = "svd"
    summary = "low-rank factorisation of MatMul/Gemm/Conv weights (data-aware with --calib)"
    lossless = False
    options = {
        "rank": Option(int, 0, "fixed rank per layer (-1: full rank, only useful with force)"),
        "ratio": Option(float, 0.0, "keep this fraction of each layer's parameters"),
        "energy": Option(float, 0.0, "keep this fraction of singular-value energy"),
        "cosine": Option(float, 0.999, "per-layer output cosine target (the default rule)"),
        "data": Option(str, "auto", "whiten with calibration statistics", ("auto", "true", "false")),
        "force": Option(bool, False, "factorise even when it does not pay off (tests, experiments)"),
        "measure": Option(bool, True, "time small layers in ORT and skip those that get slower"),
        "ops": Option(str, "matmul+gemm+conv", "which layers to factorise, joined by '+'"),
    }

    def is_lossless(self, options: dict) -> bool:
        return bool(options.get("force")) and options.get("rank") == -1

    def run(self, model, ctx) -> PassResult:
        result = PassResult()
        opts = ctx.options
        kinds = {op.strip().lower() for op in opts["ops"].split("+")}
        layers = []
        for graph in model.all_graphs():
            for node in graph.nodes:
                found = match(node, graph, model.graph)
                if isinstance(found, str):
                    result.skip(found)
                elif found is not None and found.kind in kinds:
                    layers.append(found)
        if not layers:
            return result
        data_aware = opts["data"] == "true" or (opts["data"] == "auto" and not getattr(ctx.feed, "generated", True))
        samples = list(ctx.feed) if data_aware else ctx.feed.take(1)
        stats = collect(model.to_proto(), layers, samples, want_gram=data_aware)
        totals = {"flops_before": 0, "flops_after": 0, "params_before": 0, "params_after": 0}
        lines = []
        for layer in ctx.progress(layers, desc="svd", total=len(layers)):
            entry = stats[layer.key]
            rows = entry.rows_per_sample
            before = flops(rows, layer.k, layer.n)
            r, line = self._factorise(model, layer, entry, opts, data_aware, result)
            totals["flops_before"] += before
            totals["flops_after"] += flops(rows, layer.k, layer.n, r) if r else before
            totals["params_before"] += layer.k * layer.n
            totals["params_after"] += r * (layer.k + layer.n) if r else layer.k * layer.n
            lines.append(line)
        result.metrics.update(totals)
        if totals["flops_before"]:
            result.metrics["flops_removed"] = round(1 - totals["flops_after"] / totals["flops_before"], 4)
        rule = self._rule(opts)
        mode = (f"data-aware (inputs whitened with {len(samples)} calibration samples)" if data_aware
                else "plain SVD (no calibration data given: weights only, exact for white inputs)")
        result.notes.append(f"{mode}; rank by {rule}; FLOPs of the candidate layers "
                            f"{totals['flops_before']:.3g} → {totals['flops_after']:.3g}")
        result.notes.extend(lines[:MAX_NOTE_LAYERS])
        if len(lines) > MAX_NOTE_LAYERS:
            result.notes.append(f"… {len(lines) - MAX_NOTE_LAYERS} more layers")
        return result

    @staticmethod
    def _rule(opts) -> str:
        for key in ("rank", "ratio", "energy"):
            if opts[key]:
                return f"{key}={opts[key]}"
        return f"per-layer output cosine ≥ {opts['cosine']} (kept energy ≥ {opts['cosine'] ** 2:.6f})"

    def _factorise(self, model, layer: Layer, entry, opts, data_aware: bool, result) -> tuple:
        """Rewrite ``layer`` if it qualifies; ``(rank or 0, one-line note)``."""
        name = f"{layer.node.name or layer.node.op} {layer.k}×{layer.n}"
        whiten = data_aware and entry.gram_rows >= MIN_ROWS_PER_INPUT * layer.k
        if data_aware and not whiten:
            name += f" (plain: {entry.gram_rows} rows < {MIN_ROWS_PER_INPUT}·k)"
        fact = Factorization(layer.matrix, entry.normalized_gram if whiten else None,
                             entry.gram_rows, entry.fourth)
        r, _rule = fact.choose_rank(opts["rank"], opts["ratio"], opts["energy"], opts["cosine"])
        cos = math.sqrt(fact.kept_energy(r))
        breakeven = breakeven_rank(layer.k, layer.n)
        if not opts["force"]:
            if r > breakeven:
                result.skip("rank needed does not pay off")
                return 0, f"{name}: r={r} > break-even {breakeven}, kept"
            w_shape = layer.node.inputs[1].values.shape if layer.kind == "conv" else (layer.k, layer.n)
            attrs = tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in layer.node.attrs.items()))
            faster, how = decide("conv" if layer.kind == "conv" else "matmul", entry.shape, w_shape,
                                 entry.rows_per_sample, layer.k, layer.n, r, attrs, opts["measure"])
            if not faster:
                result.skip("factorised layer would be slower")
                return 0, f"{name}: r={r} would be slower ({how}), kept"
        a, b = fact.factors(r)
        getattr(self, f"_rewrite_{layer.kind}")(model, layer, a, b)
        result.rewrite(f"{layer.kind} → 2 × {'conv' if layer.kind == 'conv' else 'matmul'}")
        shrunk = f", shrinkage {fact.shrinkage:.2f}" if fact.shrinkage is not None else ""
        return r, f"{name}: r={r} (break-even {breakeven}), est. output cosine {cos:.5f}{shrunk}"

    # --- rewrites -------------------------------------------------------------------
    @staticmethod
    def _first(model, layer: Layer, op: str, weight: np.ndarray, attrs: dict) -> gs.Variable:
        """Insert ``op(X, weight)`` before the layer and make the layer read its output."""
        dtype = layer.node.inputs[1].values.dtype
        mid = gs.Variable(model.fresh_name("svd/low_rank"), dtype=dtype)
        w = new_constant(model, "svd/A", weight.astype(dtype))
        layer.graph.nodes.append(gs.Node(op, model.fresh_name(f"svd/{op}"), attrs, [layer.node.inputs[0], w], [mid]))
        layer.node.inputs[0] = mid
        return mid

    def _rewrite_matmul(self, model, layer, a, b):
        self._first(model, layer, "MatMul", a, {})
        layer.node.inputs[1] = new_constant(model, "svd/B", b.astype(layer.node.inputs[1].values.dtype))

    def _rewrite_gemm(self, model, layer, a, b):
        node = layer.node
        alpha = float(node.attrs.get("alpha", 1.0))
        self._first(model, layer, "MatMul", a, {})
        node.inputs[1] = new_constant(model, "svd/B", (alpha * b).astype(node.inputs[1].values.dtype))
        node.attrs["alpha"] = 1.0
        node.attrs["transB"] = 0

    def _rewrite_conv(self, model, layer, a, b):
        node = layer.node
        shape = node.inputs[1].values.shape  # n, C, kh, kw
        r = a.shape[1]
        self._first(model, layer, "Conv", a.T.reshape(r, *shape[1:]), dict(node.attrs))
        node.inputs[1] = new_constant(model, "svd/B", b.T.reshape(shape[0], r, 1, 1).astype(node.inputs[1].values.dtype))
        node.attrs = {"kernel_shape": [1, 1]} if "kernel_shape" in node.attrs else {}
