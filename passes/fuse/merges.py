"""``fuse`` merge rules: two nodes that undo each other go, two of a kind become one.

Each rule is ``(label, function(graph, run) -> rewrites)`` and visits one graph (main graph
or an If/Loop/Scan body); ``run`` is the pass run's
:class:`~onnxslim_kit.passes._common.match.RuleRun`. Numbering follows :mod:`.cleanup`.

10b. ``Unsqueeze(a)`` then ``Squeeze(a)`` and ``Squeeze(a)`` then ``Unsqueeze(a)`` (same axes,
     made non-negative with the rank of the wider tensor) → both go (the first node stays if
     something else reads it).
13. ``Transpose(p2) ∘ Transpose(p1)`` → ``Transpose(p1[p2[i]])`` when the first one has no
    other reader; the composition is the identity → both go (the first only if unread).
14. ``Reshape(t2) ∘ R(x)`` → ``Reshape(x, t2)`` where ``R`` is a Reshape / Flatten / Squeeze
    / Unsqueeze (all keep row-major order) read by nothing else, and ``t2`` is constant with
    no 0 (or ``allowzero=1``): a 0 would copy a dim of the *intermediate* tensor.
15. ``Unsqueeze(b) ∘ Unsqueeze(a)`` → ``Unsqueeze(c)`` when the first one has no other reader:
    with both axis lists made non-negative, ``c = b ∪ {p(j) : j ∈ a}`` where ``p(j)`` is the
    ``j``-th position of the final tensor that is not in ``b`` (the intermediate's axes keep
    their order between the new dims).
5.  **Duplicate constants** (rule 5 of :mod:`.const_fold`, which lists it): constants read by
    nodes of one graph with the same element type, shape and bytes become one
    (:mod:`onnxslim_kit.passes._common.constants`: grouped by type and shape, hashed in pieces,
    confirmed byte for byte).
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from onnxslim_kit.passes._common.constants import merge_equal_constants

from onnxslim_kit.passes._common.graph import is_graph_output, is_onnx_op, new_constant
from onnxslim_kit.passes.fuse.rule_helpers import (
    axes_of, bypass_pair, live_nodes, normalized, pairs, perm_of, reshape_target,
)


def remove_squeeze_pairs(graph, run) -> int:
    shapes = run.ensure_shapes()
    count = 0
    opset = run.opset
    ids = {id(n) for n in graph.nodes}
    for second in live_nodes(graph, "Squeeze", "Unsqueeze"):
        first = second.inputs[0].inputs[0] if len(second.inputs[0].inputs) == 1 else None
        if first is None or not first.outputs or id(first) not in ids:
            continue
        if not is_onnx_op(first, "Squeeze", "Unsqueeze") or first.op == second.op:
            continue
        a1, given1 = axes_of(first, opset)
        a2, given2 = axes_of(second, opset)
        if not (given1 and given2):
            continue  # a Squeeze without axes drops every 1-dim: not an inverse
        if a1 is None or a2 is None:
            run.skip_once(second, "squeeze/unsqueeze pair: axes unknown")
            continue
        # Both axes lists refer to the rank of the tensor with the extra dims.
        wide = first.outputs[0] if first.op == "Unsqueeze" else first.inputs[0]
        wide_shape = shapes.shape(wide)
        rank = len(wide_shape) if wide_shape is not None else None
        n1, n2 = normalized(a1, rank), normalized(a2, rank)
        if n1 is None or n2 is None:
            run.skip_once(second, "squeeze/unsqueeze pair: negative axes, rank unknown")
            continue
        if n1 != n2:
            continue
        if bypass_pair(second, first, graph):
            count += 1
        else:
            run.skip_once(second, "squeeze/unsqueeze pair: graph output cannot be renamed")
    return count


# --- 13: Transpose ∘ Transpose ---------------------------------------------------------------

def merge_transposes(graph, run) -> int:
    shapes = run.ensure_shapes()
    count = 0
    for first, mid, second in pairs(graph, "Transpose"):
        p1, p2 = perm_of(first, shapes), perm_of(second, shapes)
        if p1 is None or p2 is None or len(p1) != len(p2):
            run.skip_once(second, "transpose∘transpose: rank unknown")
            continue
        composed = [p1[i] for i in p2]
        if composed == list(range(len(composed))):
            if bypass_pair(second, first, graph):
                count += 1
            else:
                run.skip_once(second, "transpose∘transpose: graph output cannot be renamed")
            continue
        if len(mid.outputs) != 1 or is_graph_output(mid, graph):
            run.skip_once(second, "transpose∘transpose: first transpose has other readers")
            continue
        second.inputs[0] = first.inputs[0]
        second.attrs["perm"] = composed
        count += 1
    return count


# --- 14: Reshape ∘ reshape-like -----------------------------------------------------------

_ORDER_KEEPING = ("Reshape", "Flatten", "Squeeze", "Unsqueeze")


def merge_reshapes(graph, run) -> int:
    count = 0
    for first, mid, second in pairs(graph, "Reshape", *_ORDER_KEEPING):
        if len(mid.outputs) != 1 or is_graph_output(mid, graph):
            run.skip_once(second, "reshape∘reshape: intermediate tensor has other readers")
            continue
        target, allowzero = reshape_target(second, run.opset)
        if target is None:
            run.skip_once(second, "reshape∘reshape: target shape not constant")
            continue
        if 0 in target and not allowzero:
            run.skip_once(second, "reshape∘reshape: target has 0 (copies an intermediate dim)")
            continue
        second.inputs[0] = first.inputs[0]
        count += 1
    return count


# --- 15: Unsqueeze ∘ Unsqueeze --------------------------------------------------------------

def _merged_unsqueeze_axes(a: list, b: list) -> list:
    """Axes of one Unsqueeze equal to Unsqueeze(a) then Unsqueeze(b) (both non-negative)."""
    new_dims = set(b)
    kept = (p for p in range(len(a) + len(b) + max(a + b) + 1) if p not in new_dims)
    positions = [next(kept) for _ in range(max(a) + 1)]
    return sorted(new_dims | {positions[j] for j in a})


def merge_unsqueezes(graph, run) -> int:
    shapes = run.ensure_shapes()
    count = 0
    opset = run.opset
    for first, mid, second in pairs(graph, "Unsqueeze"):
        if len(mid.outputs) != 1 or is_graph_output(mid, graph):
            run.skip_once(second, "unsqueeze∘unsqueeze: intermediate tensor has other readers")
            continue
        a, _ = axes_of(first, opset)
        b, _ = axes_of(second, opset)
        if not a or not b:
            run.skip_once(second, "unsqueeze∘unsqueeze: axes not constant")
            continue
        shape = shapes.shape(first.inputs[0])
        mid_rank = len(shape) + len(a) if shape is not None else None
        a = normalized(a, mid_rank)
        b = normalized(b, mid_rank + len(b) if mid_rank is not None else None)
        if a is None or b is None:
            run.skip_once(second, "unsqueeze∘unsqueeze: negative axes, rank unknown")
            continue
        axes = _merged_unsqueeze_axes(a, b)
        if opset < 13:
            second.attrs["axes"] = axes
        else:
            second.inputs[1] = new_constant(run.model, "fuse/unsqueeze_axes", np.array(axes, dtype=np.int64))
        second.inputs[0] = first.inputs[0]
        count += 1
    return count


# --- 5: duplicate constants -------------------------------------------------------------------

def merge_duplicate_constants(graph, run) -> int:
    """Rule 5 (module docstring): :func:`~onnxslim_kit.passes._common.constants.merge_equal_constants`
    with the run's digest cache."""
    return merge_equal_constants(graph, run.digests)
