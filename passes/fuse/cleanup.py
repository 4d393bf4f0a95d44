"""``fuse`` cleanup rules: remove nodes that provably compute their input.

Each rule is ``(label, function(graph, run) -> rewrites)`` and visits one graph (main graph
or an If/Loop/Scan body); ``run`` is the pass run's
:class:`~onnxslim_kit.passes._common.match.RuleRun`. A node is removed with
:func:`~onnxslim_kit.passes._common.graph.bypass`: its readers read the kept input instead; a
graph output keeps its name (the kept tensor is renamed) or, when that is impossible, the
node stays and a reason is counted.

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
10. ``Squeeze`` without axes of an input whose dims are all known and ≠ 1 (inverse pairs:
    10b in :mod:`.merges`).
11. ``Flatten`` of a rank-2 input with axis 1, or of a static shape it would not change.
12. ``x * 1``, ``1 * x``, ``x + 0``, ``0 + x``, ``x - 0``, ``x / 1`` where the constant
    broadcasts to ``x``'s own shape (rank ≤ rank(x), each dim 1 or equal to a known dim of
    ``x``; a scalar always) and has ``x``'s element type.

Merges of two nodes (10b, 13–15: squeeze/unsqueeze pairs, Transpose∘Transpose,
Reshape∘Reshape, Unsqueeze∘Unsqueeze) live in :mod:`.merges`; :data:`RULES` lists both, in
this order.

Shapes come from the gs tensors, completed once per run by ONNX shape inference
(:meth:`~onnxslim_kit.passes._common.match.RuleRun.ensure_shapes`). Undecidable cases
(unknown shape, runtime target) are skipped with a reason; cases proved not to be no-ops are
not reasons, just not matches.
"""

from __future__ import annotations

import numpy as np

from onnxslim_kit.passes._common.graph import bypass, const_value, is_graph_output
from onnxslim_kit.passes.fuse.merges import merge_reshapes, merge_transposes, merge_unsqueezes, remove_squeeze_pairs
from onnxslim_kit.passes.fuse.rule_helpers import (
    INT32_MAX, axes_of, broadcasts_to_self, ints_of, live_nodes, optional_input, perm_of, remove, reshape_target,
)


# --- 1, 2: Identity, Dropout --------------------------------------------------------------

def remove_identity(graph, run) -> int:
    return sum(remove(node, graph, run, "identity") for node in live_nodes(graph, "Identity"))


def remove_dropout(graph, run) -> int:
    count = 0
    for node in live_nodes(graph, "Dropout"):
        training = optional_input(node, 2) if run.opset >= 12 else None
        if training is not None:
            value = const_value(training)
            if value is None:
                run.skip_once(node, "dropout: training_mode is not a constant")
                continue
            if bool(np.asarray(value).reshape(-1)[0]):
                run.skip_once(node, "dropout: training mode")
                continue
        if len(node.outputs) > 1:
            mask = node.outputs[1]
            if not mask.is_empty() and (mask.outputs or is_graph_output(mask, graph)):
                run.skip_once(node, "dropout: mask output is used")
                continue
        count += remove(node, graph, run, "dropout")
    return count


# --- 3: Reshape -----------------------------------------------------------------------------

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


def _remove_if(verdict, node, graph, run, what: str, unknown: str = "input shape not static") -> int:
    """Act on a no-op check's ``verdict``: True removes ``node`` (1 when done), None (cannot
    tell) counts ``"<what>: <unknown>"`` once, False leaves the node; returns the removals."""
    if verdict:
        return remove(node, graph, run, what)
    if verdict is None:
        run.skip_once(node, f"{what}: {unknown}")
    return 0


def remove_noop_reshape(graph, run) -> int:
    shapes = run.ensure_shapes()
    count = 0
    for node in live_nodes(graph, "Reshape"):
        data, out = node.inputs[0], node.outputs[0]
        target, allowzero = reshape_target(node, run.opset)
        shape = shapes.shape(data)
        verdict = None
        if target is not None and shape is not None:
            verdict = _reshape_is_noop(shape, target, allowzero)
        if verdict is None:
            s_in, s_out = shapes.static(data), shapes.static(out)
            if s_in is not None and s_out is not None:
                verdict = s_in == s_out
        count += _remove_if(verdict, node, graph, run, "reshape",
                            "target shape not constant" if target is None else "input shape not static")
    return count


# --- 4: Transpose ---------------------------------------------------------------------------

def remove_noop_transpose(graph, run) -> int:
    shapes = run.ensure_shapes()
    count = 0
    for node in live_nodes(graph, "Transpose"):
        perm = perm_of(node, shapes)
        if perm is None:
            run.skip_once(node, "transpose: no perm and rank unknown")
        elif perm == list(range(len(perm))):
            count += remove(node, graph, run, "transpose")
    return count


# --- 5: Cast --------------------------------------------------------------------------------

def remove_noop_cast(graph, run) -> int:
    shapes = run.ensure_shapes()
    count = 0
    for node in live_nodes(graph, "Cast", "CastLike"):
        source = shapes.elem_type(node.inputs[0])
        if node.op == "Cast":
            target = node.attrs.get("to")
        else:
            like = optional_input(node, 1)
            target = shapes.elem_type(like) if like is not None else None
        if source is None or target is None:
            run.skip_once(node, "cast: input type unknown")
        elif int(source) == int(target):
            count += remove(node, graph, run, "cast")
    return count


# --- 6: Pad ---------------------------------------------------------------------------------

def remove_noop_pad(graph, run) -> int:
    count = 0
    for node in live_nodes(graph, "Pad"):
        pads, given = ints_of(node, "pads", 1, run.opset, 11)
        if pads is None:
            if given:
                run.skip_once(node, "pad: pads not constant")
            continue
        if all(p == 0 for p in pads):
            count += remove(node, graph, run, "pad")
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
        tensor = optional_input(node, index)
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


def remove_noop_slice(graph, run) -> int:
    shapes = run.ensure_shapes()
    count = 0
    for node in live_nodes(graph, "Slice"):
        params = _slice_params(node, run.opset)
        if params is None:
            run.skip_once(node, "slice: parameters not constant")
            continue
        starts, ends, axes, steps = params
        axes = list(range(len(starts))) if axes is None else axes
        steps = [1] * len(starts) if steps is None else steps
        shape = shapes.shape(node.inputs[0])
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
        count += _remove_if(verdict, node, graph, run, "slice")
    return count


# --- 8: Expand ------------------------------------------------------------------------------

def remove_noop_expand(graph, run) -> int:
    shapes = run.ensure_shapes()
    count = 0
    for node in live_nodes(graph, "Expand"):
        target = const_value(node.inputs[1]) if len(node.inputs) > 1 else None
        shape = shapes.shape(node.inputs[0])
        if target is None:
            run.skip_once(node, "expand: target shape not constant")
            continue
        target = [int(v) for v in np.asarray(target).reshape(-1)]
        count += _remove_if(broadcasts_to_self(shape, target), node, graph, run, "expand")
    return count


# --- 9: Concat ------------------------------------------------------------------------------

def remove_single_concat(graph, run) -> int:
    count = 0
    for node in live_nodes(graph, "Concat"):
        if len(node.inputs) == 1:
            count += remove(node, graph, run, "concat")
    return count


# --- 10: Squeeze / Unsqueeze --------------------------------------------------------------

def remove_noop_squeeze(graph, run) -> int:
    shapes = run.ensure_shapes()
    count = 0
    for node in live_nodes(graph, "Squeeze"):
        axes, given = axes_of(node, run.opset)
        if given:
            continue  # explicit axes always drop a dim (pairs are handled below)
        shape = shapes.shape(node.inputs[0])
        if shape is not None and all(isinstance(d, int) and d != 1 for d in shape):
            count += remove(node, graph, run, "squeeze")
        elif shape is None or not any(d == 1 for d in shape):
            run.skip_once(node, "squeeze: input shape not static")
    return count


# --- 11: Flatten ----------------------------------------------------------------------------

def remove_noop_flatten(graph, run) -> int:
    shapes = run.ensure_shapes()
    count = 0
    for node in live_nodes(graph, "Flatten"):
        shape = shapes.shape(node.inputs[0])
        axis = int(node.attrs.get("axis", 1))
        if shape is None:
            run.skip_once(node, "flatten: input rank unknown")
            continue
        rank = len(shape)
        if axis < 0:
            axis += rank
        if rank == 2 and axis == 1:
            count += remove(node, graph, run, "flatten")
            continue
        static = shapes.static(node.inputs[0])
        if static is None:
            if rank == 2:  # [d0, d1] with axis 0 or 2: a no-op only if d0 == 1 (d1 == 1)
                run.skip_once(node, "flatten: input shape not static")
            continue
        flat = [int(np.prod(static[:axis], dtype=np.int64)), int(np.prod(static[axis:], dtype=np.int64))]
        if flat == static:
            count += remove(node, graph, run, "flatten")
    return count


# --- 12: x*1, x+0, x-0, x/1 ------------------------------------------------------------------

_NEUTRAL = {"Mul": (1, (0, 1)), "Add": (0, (0, 1)), "Sub": (0, (1,)), "Div": (1, (1,))}


def remove_neutral_arithmetic(graph, run) -> int:
    shapes = run.ensure_shapes()
    count = 0
    for node in live_nodes(graph, *_NEUTRAL):
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
            t_const, t_other = shapes.elem_type(const), shapes.elem_type(other)
            if t_other is not None and t_const != t_other:
                run.skip_once(node, f"{node.op.lower()}: element types differ")
                break
            verdict = True if value.ndim == 0 else broadcasts_to_self(shapes.shape(other), list(value.shape))
            if verdict:
                if bypass(node, graph, keep=other):
                    count += 1
                else:
                    run.skip_once(node, f"{node.op.lower()}: graph output cannot be renamed")
            elif verdict is None:
                run.skip_once(node, f"{node.op.lower()}: input shape not static (broadcast unknown)")
            break
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
