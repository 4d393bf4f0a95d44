"""Which sensitivity ranking the ``int8`` fallback uses when ``sensitivity=auto``, by the cost of ranking.

The rankings (:mod:`onnxslim_kit.passes.int8.fallback`): ``e2e`` scores each layer alone in int8
at the outputs — one whole-model run per layer (one gated session, :func:`._quant.qdq.add_gated_twins`),
so its cost grows as ``layers × weight bytes``; ``hybrid`` ranks by the local errors of one run of
the float model carrying every layer's twin (:mod:`onnxslim_kit.passes.int8.correct`), then
re-scores the ``refine`` most sensitive end to end.

``auto``::

    hybrid                   when MatMul + Gemm layers < 1/4 of the layers (measured: local errors
                             misrank transformer layers, MiniLM all float — so e2e for them)
    e2e                      when layers × Σ weight bytes ≤ E2E_COST
    hybrid, ``by_size``      else

Measured: the 2.75 GB decoder (194 layers, 533 GB·layers) was still in its e2e ranking after
12 minutes; MiniLM is 4.4 GB·layers, the 219 MB decoder 7.5, so every suite model ranks as before.
``by_size``: the twins' run is made only when the search ranks at all, in :data:`TWIN_ROUNDS`
rounds (the float path reads every weight in each run; a round's twins hold a third of the
encodings: 1.59 → 1.24× the 2.75 GB decoder's size at the peak), its float layers reading
their unsmoothed input and weight (no float copy of the smoothed weights).

:func:`unsmooth_float_path` is that rewiring (the gated e2e session uses it too); :func:`unsmoothed_round`
prepares each round (rewired, the last round's pages dropped, :mod:`.resident`).
"""

from __future__ import annotations

from onnxslim_kit.passes.int8.resident import release

E2E_COST = 16 << 30  # layers × weight bytes above which the e2e ranking gives way to hybrid
TWIN_ROUNDS = 3


def weight_bytes(nodes: dict, spec) -> int:
    """Bytes of the weight of layer ``spec`` (``nodes``: name → node), without reading it
    (lazy and mapped values know their size)."""
    node = nodes.get(spec.name)
    if node is None or spec.weight_index is None:
        return 0
    return int(getattr(getattr(node.inputs[spec.weight_index], "_values", None), "nbytes", 0))


def sensitivity_mode(model, plan, opts) -> tuple:
    """``(ranking, by_size)``: ``opts["sensitivity"]``, ``auto`` resolved as in the module docstring."""
    if opts["sensitivity"] != "auto":
        return opts["sensitivity"], False
    dense = sum(spec.op in ("MatMul", "Gemm") for spec in plan.layers)
    if 4 * dense < len(plan.layers):
        return "hybrid", False
    nodes = {node.name: node for node in model.graph.nodes}
    weights = sum(weight_bytes(nodes, spec) for spec in plan.layers)
    return ("e2e", False) if len(plan.layers) * weights <= E2E_COST else ("hybrid", True)


def unsmooth_float_path(graph, plan) -> None:
    """The float layers of a twin graph (:func:`._quant_qdq.add_gated_twins`) read their
    original input and weight again (``X·W``, equal to the smoothed ``X'·W'`` up to float
    rounding): the float weights are then the ones the model holds anyway, not a float copy
    of every smoothed weight for the session (MiniLM gated ranking: 40 MB). The twins keep
    the smoothed pair; the trial's own weight constant takes the array, no new name."""
    tensors = graph.tensors()
    nodes = {node.name: node for node in graph.nodes}
    for spec in plan.layers:
        node = nodes.get(spec.name)
        if spec.unsmoothed is None or node is None:
            continue
        name, weight = spec.unsmoothed
        node.inputs[0] = tensors[name]
        node.inputs[spec.weight_index].values = weight


def unsmoothed_round(graph, model, plan) -> None:
    """Before each round of the by-size local ranking's twins: the float path unsmoothed
    (:func:`unsmooth_float_path`), the pages the last round's session read dropped
    (:mod:`.resident`: a round's encodings, not every layer's, resident during its run)."""
    unsmooth_float_path(graph, plan)
    release(model.graph, plan)
