"""Per-layer damages of the ``cluster`` target search on a large model: a local proxy per layer,
scaled per class of layers by whole-model measurements of one layer per class.

The search (:mod:`onnxslim_kit.passes.cluster.select`) needs, for every layer ``i`` and step
``s`` of its ladder, the damage ``d_i(s)``: the mean relative squared output error of the model
with that layer alone at ``s``, one whole-model run per sample. On issue 16's 2.75 GB decoder
that is 145 layers × 3 steps × 4 samples of runs that each read every weight. When those runs
would read more than ``select.MEASURE_BYTES`` of weights:

```
e_i(s) = ‖X (Ŵ_s − W)‖² / ‖X W‖²        X: the layer's input rows on the fit samples, those its
                                        GPTQ statistics held (:mod:`.grams`, ``item.rows``)
d_i(s) ≈ c_κ · e_i(s)                   c_κ = Σ measured d / Σ e over the measured steps of the
                                        layer's class κ (all measured layers' for a class with
                                        none; 1 when nothing was measured)
```

Classes (:func:`kind`): the op, then per step downstream the sorted op types reached, stopping
at other candidates (``*``), ``KIND_DEPTH`` steps — query / key, value, attention output, FFN
input and FFN output layers of a transformer differ, since the proxy's relation to the model's
output differs between them (the same idea as int4's mixed precision). One representative per
class (its largest ``e`` at the first step) is measured at every step of its ladder. Layers
without rows (a Conv, a left-hand weight, recurrent weights, a layer whose statistics are a
Gram matrix) are measured at every step, as without the proxy.
"""

from __future__ import annotations

import numpy as np

from onnxslim_kit.streaming import release_pages

KIND_DEPTH = 6


def proxied(items: list, ladders: list, measure) -> list:
    """Damages ``[[d per step] per item]`` (module docstring); ``measure(item, level)``: the
    measured damage. A step ``None`` (float) has no damage."""
    seen = [i for i, it in enumerate(items) if getattr(it, "rows", None) is not None and len(ladders[i]) > 1]
    errors = {}
    for i in seen:
        item = items[i]
        reference = item.rows @ _matrix(item, item.values)
        norm = float(np.square(reference, dtype=np.float64).sum())
        del reference
        for j, level in enumerate(ladders[i]):
            if level is None or norm == 0:
                errors[(i, j)] = 0.0
                continue
            change = _matrix(item, item.levels[level].decoded()) - _matrix(item, item.values)
            errors[(i, j)] = float(np.square(item.rows @ change, dtype=np.float64).sum()) / norm
            release_pages(item.levels[level].labels)  # a large model's labels: scratch-file pages
        item.drop_pages()
    candidates = {id(items[i].node) for i in seen}
    kinds = {i: kind(items[i].node, candidates) for i in seen}
    measured = {}
    for i in _representatives(seen, kinds, errors):
        for j, level in enumerate(ladders[i]):
            if level is not None:
                measured[(i, j)] = measure(items[i], level)
    scale = _scales(measured, errors, kinds)
    found = set(seen)
    return [[measured.get((i, j), scale(i) * errors[(i, j)]) for j in range(len(steps))] if i in found else
            [0.0 if level is None else measure(items[i], level) for level in steps]
            for i, steps in enumerate(ladders)]


def kind(node, candidates: set, depth: int = KIND_DEPTH) -> tuple:
    """A layer's class key (module docstring); ``candidates``: ``id`` of every candidate node."""
    key, layer = [node.op], [node]
    while layer and len(key) <= depth:
        users = [user for n in layer for tensor in n.outputs for user in tensor.outputs]
        if not users:
            break
        key.append(tuple(sorted({"*" if id(user) in candidates else user.op for user in users})))
        layer = list({id(user): user for user in users if id(user) not in candidates}.values())
    return tuple(key)


def _scales(measured: dict, errors: dict, kinds: dict):
    """``scale(i)``: ``c_κ`` of item ``i``'s class (module docstring)."""
    def ratio(keys):
        proxy = sum(errors[key] for key in keys)
        return sum(measured[key] for key in keys) / proxy if keys and proxy > 0 else None

    overall = ratio(list(measured))
    by_kind = {}
    for key in measured:
        by_kind.setdefault(kinds[key[0]], []).append(key)
    per_kind = {k: ratio(keys) for k, keys in by_kind.items()}

    def scale(i: int) -> float:
        found = per_kind.get(kinds[i])
        return found if found is not None else overall if overall is not None else 1.0
    return scale


def _representatives(seen: list, kinds: dict, errors: dict) -> list:
    """Per class, the layer with the largest proxy at its first step (ties: the first)."""
    best = {}
    for i in seen:
        if kinds[i] not in best or errors[(i, 0)] > errors[(best[kinds[i]], 0)]:
            best[kinds[i]] = i
    return sorted(best.values())


def _matrix(item, values):
    """A weight as its layer's ``k × n`` matrix, float32 (a Gemm ``transB=1`` weight is ``n × k``)."""
    values = np.asarray(values, np.float32)
    return values.T if item.node.op == "Gemm" and item.node.attrs.get("transB", 0) else values
