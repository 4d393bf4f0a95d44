"""Per-layer damages of the ``cluster`` target search on a large model: a local proxy per layer,
scaled per class of layers by whole-model measurements of one layer per class.

The search (:mod:`onnxslim_kit.passes.cluster.select`) needs, for every layer ``i`` and step
``s`` of its ladder, the damage ``d_i(s)``: the mean relative squared output error of the model
with that layer alone at ``s``, one whole-model run per sample. On issue 16's 2.75 GB decoder
that is 145 layers × 3 steps × 4 samples of runs that each read every weight. When those runs
would read more than ``select.MEASURE_BYTES`` of weights:

```
e_i(s) = ‖X (Ŵ_s − W)‖² / ‖X W‖²        X: rows of the layer's input on the fit samples
                                        (int4's proxy.input_rows: one pass over the samples)
d_i(s) ≈ c_κ · e_i(s)                   c_κ = Σ measured d / Σ e over the measured steps of
                                        the layer's class κ (int4's mixed.predicted)
```

Classes: int4's :func:`onnxslim_kit.passes.int4.proxy.role` — the op types downstream of the
layer up to the next candidates (query / key, value, attention output, FFN input, FFN output
layers in a transformer), since the proxy's relation to the model's output differs between
them. One representative per class (its largest ``e`` at the first step) is measured at every
step of its ladder. Layers the proxy does not see (a Conv, a left-hand weight, recurrent
weights, a layer with no rows) are measured at every step, as without the proxy.
"""

from __future__ import annotations

from onnxslim_kit.passes.int4.mixed import predicted
from onnxslim_kit.passes.int4.proxy import input_rows, output_error, role
from onnxslim_kit.streaming import release_pages

PROXY_KINDS = ("matmul", "gemm")


def proxied(items: list, ladders: list, proxy: tuple, measure) -> list:
    """Damages ``[[d per step] per item]`` (module docstring); ``proxy``: ``(model, layers by
    id(node), fit samples)``; ``measure(item, level)``: the measured damage. A step ``None``
    (float) has no damage."""
    model, layers, samples = proxy
    seen = {i: layers[id(it.node)] for i, it in enumerate(items)
            if it.index == 1 and id(it.node) in layers and layers[id(it.node)].kind in PROXY_KINDS
            and len(ladders[i]) > 1}
    rows = input_rows(model, {layer.input_name: layer.k for layer in seen.values()}, samples) if seen else {}
    errors = {}
    for i, layer in seen.items():
        x = rows[layer.input_name]
        for j, level in enumerate(ladders[i]):
            errors[(i, j)] = 0.0 if level is None else output_error(_matrix(items[i].values, layer).T,
                                                                    _matrix(items[i].levels[level].decoded(), layer).T, x)
        release_pages(items[i].values)
    candidates = {id(items[i].node) for i in seen}
    kinds = {i: role(items[i].node, candidates) for i in seen}
    classes = {key: kinds[key[0]] for key in errors}
    measured = {}
    for i in _representatives(seen, kinds, errors):
        for j, level in enumerate(ladders[i]):
            if level is not None:
                measured[(i, j)] = measure(items[i], level)
    estimate = predicted(measured, errors, classes)
    return [[estimate[(i, j)] for j in range(len(steps))] if i in seen else
            [0.0 if level is None else measure(items[i], level) for level in steps]
            for i, steps in enumerate(ladders)]


def _representatives(seen: dict, kinds: dict, errors: dict) -> list:
    """Per class, the layer with the largest proxy at its first step (ties: the first)."""
    best = {}
    for i in seen:
        kind = kinds[i]
        if kind not in best or errors[(i, 0)] > errors[(best[kind], 0)]:
            best[kind] = i
    return sorted(best.values())


def _matrix(values, layer):
    """The stored weight as the layer's ``k × n`` matrix (a Gemm ``transB=1`` weight is ``n × k``)."""
    return values.T if layer.kind == "gemm" and layer.node.attrs.get("transB", 0) else values
