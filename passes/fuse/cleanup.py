"""``fuse`` cleanup rules: remove nodes that provably compute their input, merge chains.

Each rule is ``(label, function(graph, model, result) -> rewrites)`` and visits one graph
(main graph or an If/Loop/Scan body). A node is removed with :func:`_graph.bypass`: its
readers read the kept input instead; a graph output keeps its name (the kept tensor is
renamed) or, when that is impossible, the node stays and a reason is counted.

Removals (``y = op(x, …)`` → ``y := x``), each only when the condition is *proved*:

1. ``Identity``.
2. ``Dropout`` in inference: ``training_mode`` absent, empty or a constant false (opset ≥ 12;
   before, Dropout is always inference in ONNX Runtime), any ``ratio``; a ``mask`` output
   only if nothing reads it.
3. ``Reshape``: constant target ``t`` and input shape ``s`` of the same rank with, per dim,
   ``t[i] == s[i]`` (an int), ``t[i] == 0`` (copy, allowzero=0), or one ``t[j] == -1`` with
   every other dim proved equal (element count forces ``s[j]``); or input and output shapes
   both fully static and equal.
4. ``Transpose`` whose ``perm`` is the identity (no ``perm``: rank ≤ 1).
5. ``Cast`` / ``CastLike`` to the input's own element type.
6. ``Pad`` whose pads are all zero (attribute before opset 11, input from 11).
7. ``Slice`` that takes everything: per sliced axis ``start == 0`` (or ≤ −dim), ``step == 1``
   and ``end ≥ dim`` or ``end ≥ INT32_MAX`` (attributes before opset 10).
8. ``Expand`` whose target broadcasts to the input's own shape (each target dim 1, or equal
   to a known input dim; target rank ≤ input rank).
9. ``Concat`` of one input.
10. ``Squeeze`` without axes of an input whose dims are all known and ≠ 1;
    ``Unsqueeze(a)`` then ``Squeeze(a)`` and ``Squeeze(a)`` then ``Unsqueeze(a)`` (same
    axes; the first node stays if something else reads it).
11. ``Flatten`` of a rank-2 input with axis 1, or of a static shape it would not change.
12. ``x * 1``, ``1 * x``, ``x + 0``, ``0 + x``, ``x - 0``, ``x / 1`` where the constant
    broadcasts to ``x``'s own shape (rank ≤ rank(x), each dim 1 or equal to a known dim of
    ``x``; a scalar always) and has ``x``'s element type.

Merges:

13. ``Transpose(p2) ∘ Transpose(p1)`` → ``Transpose(p1[p2[i]])`` when the first one has no
    other reader; the composition is the identity → both go (the first only if unread).
14. ``Reshape(t2) ∘ R(x)`` → ``Reshape(x, t2)`` where ``R`` is a Reshape / Flatten / Squeeze
    / Unsqueeze (all keep row-major order) read by nothing else, and ``t2`` is constant with
    no 0 (or ``allowzero=1``): a 0 would copy a dim of the *intermediate* tensor.
15. ``Unsqueeze(b) ∘ Unsqueeze(a)`` → ``Unsqueeze(c)`` when the first one has no other reader:
    with both axis lists made non-negative, ``c = b ∪ {p(j) : j ∈ a}`` where ``p(j)`` is the
    ``j``-th position of the final tensor that is not in ``b`` (the intermediate's axes keep
    their order between the new dims).

Shapes come from the gs tensors, completed once per run by ONNX shape inference
(:func:`_graph.ensure_shapes`). Undecidable cases (unknown shape, runtime target) are skipped
with a reason; cases proved not to be no-ops are not reasons, just not matches.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from onnxslim_kit.passes._common.graph import (
    bypass,
    const_value,
    elem_type,
    ensure_shapes,
    is_graph_output,
    is_onnx_op,
    new_constant,
    shape_of,
    skip_once,
    static_shape,
)

INT32_MAX = 2**31 - 1


# --- helpers ---------------------------------------------------------------------------

def _nodes(graph: gs.Graph, *ops: str):
    """Live nodes of ``graph`` with one of ``ops`` (snapshot; removed nodes are skipped)."""
    for node in list(graph.nodes):
        if node.outputs and node.inputs and is_onnx_op(node, *ops):
            yield node


def _pairs(graph: gs.Graph, op: str, *first_ops: str):
    """(first, mid, second) for each live ``op`` node ``second`` whose data input ``mid`` is
    written by a live node ``first`` of ``first_ops`` (default: the same op)."""
    ids = {id(n) for n in graph.nodes}
    for second in _nodes(graph, op):
        mid = second.inputs[0]
        first = mid.inputs[0] if len(mid.inputs) == 1 else None
        if first is not None and first.outputs and id(first) in ids and is_onnx_op(first, *(first_ops or (op,))):
            yield first, mid, second


def _input(node: gs.Node, index: int):
    """Input ``index`` or None when absent or empty (an omitted optional input)."""
    if index < len(node.inputs) and not node.inputs[index].is_empty():
        return node.inputs[index]
    return None


def _ints(node: gs.Node, attr_name: str, input_index: int, opset: int, since: int):
    """An int list given as attribute (before opset ``since``) or constant input (from it).

    Returns ``(values, given)``: ``values`` None when given but not constant.
    """
    if opset < since:
        if attr_name not in node.attrs:
            return None, False
        return [int(v) for v in node.attrs[attr_name]], True
    tensor = _input(node, input_index)
    if tensor is None:
        return None, False
    value = const_value(tensor)
    if value is None:
        return None, True
    return [int(v) for v in np.asarray(value).reshape(-1)], True


def _remove(node, graph, model, result, what: str) -> int:
    if bypass(node, graph):
        return 1
    skip_once(model, result, node, f"{what}: graph output cannot be renamed (input is a graph input, constant or shared)")
    return 0


def _bypass_pair(second, first, graph) -> bool:
    """Remove ``second`` whose output equals ``first``'s input (e.g. two inverse Transposes).

    When ``first``'s output is read by ``second`` alone, ``first`` is detached before the
    bypass (it is dead afterwards), so a graph output can take the name of ``first``'s input.
    """
    keep, mid = first.inputs[0], first.outputs[0]
    alone = len(first.outputs) == 1 and len(mid.outputs) == 1 and not is_graph_output(mid, graph)
    if alone:
        inputs = list(first.inputs)
        first.inputs.clear()
        first.outputs.clear()
    if bypass(second, graph, keep=keep):
        return True
    if alone:
        first.inputs.extend(inputs)
        first.outputs.append(mid)
    return False


def _opset(model) -> int:
    return model.opset


# --- 1, 2: Identity, Dropout --------------------------------------------------------------

def remove_identity(graph, model, result) -> int:
    return sum(_remove(node, graph, model, result, "identity") for node in _nodes(graph, "Identity"))


def remove_dropout(graph, model, result) -> int:
    count = 0
    for node in _nodes(graph, "Dropout"):
        training = _input(node, 2) if _opset(model) >= 12 else None
        if training is not None:
            value = const_value(training)
            if value is None:
                skip_once(model, result, node, "dropout: training_mode is not a constant")
                continue
            if bool(np.asarray(value).reshape(-1)[0]):
                skip_once(model, result, node, "dropout: training mode")
                continue
        if len(node.outputs) > 1:
            mask = node.outputs[1]
            if not mask.is_empty() and (mask.outputs or is_graph_output(mask, graph)):
                skip_once(model, result, node, "dropout: mask output is used")
                continue
        count += _remove(node, graph, model, result, "dropout")
    return count


# --- 3: Reshape -----------------------------------------------------------------------------

def _reshape_target(node, model):
    """(target ints or None, allowzero)."""
    allowzero = int(node.attrs.get("allowzero", 0))
    if _opset(model) < 5:
        shape = node.attrs.get("shape")
        return ([int(v) for v in shape] if shape is not None else None), allowzero
    tensor = _input(node, 1)
    value = const_value(tensor) if tensor is not None else None
    return ([int(v) for v in np.asarray(value).reshape(-1)] if value is not None else None), allowzero


def _reshape_is_noop(shape, target, allowzero):
    """True (proved no-op), False (proved not), None (cannot tell)."""
    if len(shape) != len(target):
        return False
    unknown = False
    for s, t in zip(shape, target):
        if t == -1:
            continue
        elif t == 0 and not allowzero:
            continue
        elif isinstance(s, int):
            if s != t:
                return False
        else:
            unknown = True
    if unknown:
        return None
    return True  # a single -1 is forced to s[j] by the element count


def remove_noop_reshape(graph, model, result) -> int:
    ensure_shapes(model, result)
    count = 0
    for node in _nodes(graph, "Reshape"):
        data, out = node.inputs[0], node.outputs[0]
        target, allowzero = _reshape_target(node, model)
        shape = shape_of(data)
        verdict = None
        if target is not None and shape is not None:
            verdict = _reshape_is_noop(shape, target, allowzero)
        if verdict is None:
            s_in, s_out = static_shape(data), static_shape(out)
            if s_in is not None and s_out is not None:
                verdict = s_in == s_out
        if verdict:
            count += _remove(node, graph, model, result, "reshape")
        elif verdict is None:
            reason = "target shape not constant" if target is None else "input shape not static"
            skip_once(model, result, node, f"reshape: {reason}")
    return count


# --- 4: Transpose ---------------------------------------------------------------------------

def _perm(node):
    """The perm of a Transpose, or None when absent and the rank is unknown."""
    perm = node.attrs.get("perm")
    if perm is not None:
        return [int(p) for p in perm]
    shape = shape_of(node.inputs[0])
    return None if shape is None else list(range(len(shape)))[::-1]


def remove_noop_transpose(graph, model, result) -> int:
    ensure_shapes(model, result)
    count = 0
    for node in _nodes(graph, "Transpose"):
        perm = _perm(node)
        if perm is None:
            skip_once(model, result, node, "transpose: no perm and rank unknown")
        elif perm == list(range(len(perm))):
            count += _remove(node, graph, model, result, "transpose")
    return count


# --- 5: Cast --------------------------------------------------------------------------------

def remove_noop_cast(graph, model, result) -> int:
    ensure_shapes(model, result)
    count = 0
    for node in _nodes(graph, "Cast", "CastLike"):
        source = elem_type(node.inputs[0])
        if node.op == "Cast":
            target = node.attrs.get("to")
        else:
            like = _input(node, 1)
            target = elem_type(like) if like is not None else None
        if source is None or target is None:
            skip_once(model, result, node, "cast: input type unknown")
        elif int(source) == int(target):
            count += _remove(node, graph, model, result, "cast")
    return count


# --- 6: Pad ---------------------------------------------------------------------------------

def remove_noop_pad(graph, model, result) -> int:
    count = 0
    for node in _nodes(graph, "Pad"):
        pads, given = _ints(node, "pads", 1, _opset(model), 11)
        if pads is None:
            if given:
                skip_once(model, result, node, "pad: pads not constant")
            continue
        if all(p == 0 for p in pads):
            count += _remove(node, graph, model, result, "pad")
    return count


# --- 7: Slice -------------------------------------------------------------------------------

def _slice_params(node, opset):
    """(starts, ends, axes or None, steps or None), or None when any given one is not constant."""
    if opset < 10:
        starts, ends = node.attrs.get("starts"), node.attrs.get("ends")
        if starts is None or ends is None:
            return None
        axes = node.attrs.get("axes")
        return [int(v) for v in starts], [int(v) for v in ends], (None if axes is None else [int(a) for a in axes]), None
    values = []
    for index in (1, 2, 3, 4):
        tensor = _input(node, index)
        if tensor is None:
            values.append(None)
            continue
        value = const_value(tensor)
        if value is None:
            return None
        values.append([int(v) for v in np.asarray(value).reshape(-1)])
    if values[0] is None or values[1] is None:
        return None
    return tuple(values)


def remove_noop_slice(graph, model, result) -> int:
    ensure_shapes(model, result)
    count = 0
    for node in _nodes(graph, "Slice"):
        params = _slice_params(node, _opset(model))
        if params is None:
            skip_once(model, result, node, "slice: parameters not constant")
            continue
        starts, ends, axes, steps = params
        axes = list(range(len(starts))) if axes is None else axes
        steps = [1] * len(starts) if steps is None else steps
        shape = shape_of(node.inputs[0])
        verdict = True
        for start, end, axis, step in zip(starts, ends, axes, steps):
            dim = None
            if shape is not None and -len(shape) <= axis < len(shape):
                dim = shape[axis]
            dim = dim if isinstance(dim, int) else None
            if step != 1 or (start != 0 and not (dim is not None and start <= -dim)):
                verdict = False
                break
            if end >= INT32_MAX or (dim is not None and end >= dim):
                continue
            if dim is None and end > 0:
                verdict = None  # end < INT32_MAX, dim unknown: cannot tell
            else:
                verdict = False
                break
        if verdict:
            count += _remove(node, graph, model, result, "slice")
        elif verdict is None:
            skip_once(model, result, node, "slice: input shape not static")
    return count


# --- 8: Expand ------------------------------------------------------------------------------

def remove_noop_expand(graph, model, result) -> int:
    ensure_shapes(model, result)
    count = 0
    for node in _nodes(graph, "Expand"):
        target = const_value(node.inputs[1]) if len(node.inputs) > 1 else None
        shape = shape_of(node.inputs[0])
        if target is None:
            skip_once(model, result, node, "expand: target shape not constant")
            continue
        target = [int(v) for v in np.asarray(target).reshape(-1)]
        verdict = _broadcasts_to_self(shape, target)
        if verdict:
            count += _remove(node, graph, model, result, "expand")
        elif verdict is None:
            skip_once(model, result, node, "expand: input shape not static")
    return count


def _broadcasts_to_self(shape, other) -> bool | None:
    """Does broadcasting ``shape`` with ``other`` give ``shape``? None: cannot tell."""
    if len(other) == 0:
        return True
    if shape is None:
        return None
    if len(other) > len(shape):
        return False
    unknown = False
    for s, o in zip(shape[len(shape) - len(other):], other):
        if o == 1:
            continue
        if isinstance(s, int):
            if s != o:
                return False
        else:
            unknown = True
    return None if unknown else True


# --- 9: Concat ------------------------------------------------------------------------------

def remove_single_concat(graph, model, result) -> int:
    count = 0
    for node in _nodes(graph, "Concat"):
        if len(node.inputs) == 1:
            count += _remove(node, graph, model, result, "concat")
    return count


# --- 10: Squeeze / Unsqueeze --------------------------------------------------------------

def _axes(node, opset):
    """(axes, given): axes as ints, None when given but not constant."""
    return _ints(node, "axes", 1, opset, 13)


def remove_noop_squeeze(graph, model, result) -> int:
    ensure_shapes(model, result)
    count = 0
    for node in _nodes(graph, "Squeeze"):
        axes, given = _axes(node, _opset(model))
        if given:
            continue  # explicit axes always drop a dim (pairs are handled below)
        shape = shape_of(node.inputs[0])
        if shape is not None and all(isinstance(d, int) and d != 1 for d in shape):
            count += _remove(node, graph, model, result, "squeeze")
        elif shape is None or not any(d == 1 for d in shape):
            skip_once(model, result, node, "squeeze: input shape not static")
    return count


def _normalized(axes, rank):
    if axes is None:
        return None
    if rank is None:
        return sorted(axes) if all(a >= 0 for a in axes) else None
    return sorted(a + rank if a < 0 else a for a in axes)


def remove_squeeze_pairs(graph, model, result) -> int:
    ensure_shapes(model, result)
    count = 0
    opset = _opset(model)
    ids = {id(n) for n in graph.nodes}
    for second in _nodes(graph, "Squeeze", "Unsqueeze"):
        first = second.inputs[0].inputs[0] if len(second.inputs[0].inputs) == 1 else None
        if first is None or not first.outputs or id(first) not in ids:
            continue
        if not is_onnx_op(first, "Squeeze", "Unsqueeze") or first.op == second.op:
            continue
        a1, given1 = _axes(first, opset)
        a2, given2 = _axes(second, opset)
        if not (given1 and given2):
            continue  # a Squeeze without axes drops every 1-dim: not an inverse
        if a1 is None or a2 is None:
            skip_once(model, result, second, "squeeze/unsqueeze pair: axes unknown")
            continue
        # Both axes lists refer to the rank of the tensor with the extra dims.
        wide = first.outputs[0] if first.op == "Unsqueeze" else first.inputs[0]
        wide_shape = shape_of(wide)
        rank = len(wide_shape) if wide_shape is not None else None
        n1, n2 = _normalized(a1, rank), _normalized(a2, rank)
        if n1 is None or n2 is None:
            skip_once(model, result, second, "squeeze/unsqueeze pair: negative axes, rank unknown")
            continue
        if n1 != n2:
            continue
        if _bypass_pair(second, first, graph):
            count += 1
        else:
            skip_once(model, result, second, "squeeze/unsqueeze pair: graph output cannot be renamed")
    return count


# --- 11: Flatten ----------------------------------------------------------------------------

def remove_noop_flatten(graph, model, result) -> int:
    ensure_shapes(model, result)
    count = 0
    for node in _nodes(graph, "Flatten"):
        shape = shape_of(node.inputs[0])
        axis = int(node.attrs.get("axis", 1))
        if shape is None:
            skip_once(model, result, node, "flatten: input rank unknown")
            continue
        rank = len(shape)
        if axis < 0:
            axis += rank
        if rank == 2 and axis == 1:
            count += _remove(node, graph, model, result, "flatten")
            continue
        static = static_shape(node.inputs[0])
        if static is None:
            if rank == 2:  # [d0, d1] with axis 0 or 2: a no-op only if d0 == 1 (d1 == 1)
                skip_once(model, result, node, "flatten: input shape not static")
            continue
        flat = [int(np.prod(static[:axis], dtype=np.int64)), int(np.prod(static[axis:], dtype=np.int64))]
        if flat == static:
            count += _remove(node, graph, model, result, "flatten")
    return count


# --- 12: x*1, x+0, x-0, x/1 ------------------------------------------------------------------

_NEUTRAL = {"Mul": (1, (0, 1)), "Add": (0, (0, 1)), "Sub": (0, (1,)), "Div": (1, (1,))}


def remove_neutral_arithmetic(graph, model, result) -> int:
    ensure_shapes(model, result)
    count = 0
    for node in _nodes(graph, *_NEUTRAL):
        if len(node.inputs) != 2:
            continue
        neutral, positions = _NEUTRAL[node.op]
        for pos in positions:
            const, other = node.inputs[pos], node.inputs[1 - pos]
            value = const_value(const)
            if value is None or const_value(other) is not None or value.dtype.kind not in "biuf":
                continue
            if not np.all(value == neutral):
                continue
            t_const, t_other = elem_type(const), elem_type(other)
            if t_other is not None and t_const != t_other:
                skip_once(model, result, node, f"{node.op.lower()}: element types differ")
                break
            verdict = True if value.ndim == 0 else _broadcasts_to_self(shape_of(other), list(value.shape))
            if verdict:
                if bypass(node, graph, keep=other):
                    count += 1
                else:
                    skip_once(model, result, node, f"{node.op.lower()}: graph output cannot be renamed")
            elif verdict is None:
                skip_once(model, result, node, f"{node.op.lower()}: input shape not static (broadcast unknown)")
            break
    return count


# --- 13: Transpose ∘ Transpose ---------------------------------------------------------------

def merge_transposes(graph, model, result) -> int:
    ensure_shapes(model, result)
    count = 0
    for first, mid, second in _pairs(graph, "Transpose"):
        p1, p2 = _perm(first), _perm(second)
        if p1 is None or p2 is None or len(p1) != len(p2):
            skip_once(model, result, second, "transpose∘transpose: rank unknown")
            continue
        composed = [p1[i] for i in p2]
        if composed == list(range(len(composed))):
            if _bypass_pair(second, first, graph):
                count += 1
            else:
                skip_once(model, result, second, "transpose∘transpose: graph output cannot be renamed")
            continue
        if len(mid.outputs) != 1 or is_graph_output(mid, graph):
            skip_once(model, result, second, "transpose∘transpose: first transpose has other readers")
            continue
        second.inputs[0] = first.inputs[0]
        second.attrs["perm"] = composed
        count += 1
    return count


# --- 14: Reshape ∘ reshape-like -----------------------------------------------------------

_ORDER_KEEPING = ("Reshape", "Flatten", "Squeeze", "Unsqueeze")


def merge_reshapes(graph, model, result) -> int:
    count = 0
    for first, mid, second in _pairs(graph, "Reshape", *_ORDER_KEEPING):
        if len(mid.outputs) != 1 or is_graph_output(mid, graph):
            skip_once(model, result, second, "reshape∘reshape: intermediate tensor has other readers")
            continue
        target, allowzero = _reshape_target(second, model)
        if target is None:
            skip_once(model, result, second, "reshape∘reshape: target shape not constant")
            continue
        if 0 in target and not allowzero:
            skip_once(model, result, second, "reshape∘reshape: target has 0 (copies an intermediate dim)")
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


def merge_unsqueezes(graph, model, result) -> int:
    ensure_shapes(model, result)
    count = 0
    opset = _opset(model)
    for first, mid, second in _pairs(graph, "Unsqueeze"):
        if len(mid.outputs) != 1 or is_graph_output(mid, graph):
            skip_once(model, result, second, "unsqueeze∘unsqueeze: intermediate tensor has other readers")
            continue
        a, _ = _axes(first, opset)
        b, _ = _axes(second, opset)
        if not a or not b:
            skip_once(model, result, second, "unsqueeze∘unsqueeze: axes not constant")
            continue
        shape = shape_of(first.inputs[0])
        mid_rank = len(shape) + len(a) if shape is not None else None
        a = _normalized(a, mid_rank)
        b = _normalized(b, mid_rank + len(b) if mid_rank is not None else None)
        if a is None or b is None:
            skip_once(model, result, second, "unsqueeze∘unsqueeze: negative axes, rank unknown")
            continue
        axes = _merged_unsqueeze_axes(a, b)
        if opset < 13:
            second.attrs["axes"] = axes
        else:
            second.inputs[1] = new_constant(model, "fuse/unsqueeze_axes", np.array(axes, dtype=np.int64))
        second.inputs[0] = first.inputs[0]
        count += 1
    return count


RULES = [
    ("identity removed", remove_identity),
    ("dropout removed", remove_dropout),
    ("no-op reshape removed", remove_noop_reshape),
    ("no-op transpose removed", remove_noop_transpose),
    ("no-op cast removed", remove_noop_cast),
    ("no-op pad removed", remove_noop_pad),
    ("no-op slice removed", remove_noop_slice),
    ("no-op expand removed", remove_noop_expand),
    ("single-input concat removed", remove_single_concat),
    ("no-op squeeze removed", remove_noop_squeeze),
    ("squeeze/unsqueeze pair removed", remove_squeeze_pairs),
    ("no-op flatten removed", remove_noop_flatten),
    ("x*1 / x+0 removed", remove_neutral_arithmetic),
    ("transpose∘transpose merged", merge_transposes),
    ("reshape∘reshape merged", merge_reshapes),
    ("unsqueeze∘unsqueeze merged", merge_unsqueezes),
]
