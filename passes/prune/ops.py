"""How each pass-through / coupling op maps channel layouts (used by :mod:`onnxslim_kit.passes.prune.groups`).

Every handler ``(cg, node, ins, shapes) -> reason | None`` sets the layout of the node's
output (and records parameters to slice), or returns why the channels cannot go through —
the caller then blocks the input units with that reason.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from onnxslim_kit.passes._common.graph import attr, const_value
from onnxslim_kit.passes.prune.layout import Layout, ParamSlice

UNARY = {
    "Relu", "Sigmoid", "HardSigmoid", "HardSwish", "LeakyRelu", "Tanh", "Elu", "Selu", "Softplus",
    "Softsign", "Identity", "Neg", "Abs", "Exp", "Sqrt", "Erf", "Gelu", "Mish", "Clip", "Dropout",
    "Celu", "ThresholdedRelu", "Sin", "Cos", "Floor", "Ceil", "Round", "Reciprocal", "Log", "Cast",
}
BINARY = {"Add", "Sub", "Mul", "Div", "Sum", "Max", "Min", "Mean", "Pow"}
POOLS = {"MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "LpPool", "GlobalLpPool"}
REDUCE = {"ReduceMean", "ReduceMax", "ReduceMin", "ReduceSum", "ReduceL2", "ReduceL1"}


# --- pass-through and coupling ops ------------------------------------------------------------

def _first(ins):
    return next(lay for lay in ins if lay is not None)


def _unary(cg, node, ins, shapes):
    lay = ins[0]
    if lay is None or lay.flat:
        return f"{node.op} on flattened channels" if lay is not None else f"{node.op} reads channels as a parameter"
    if node.op == "Dropout" and len(node.outputs) > 1 and node.outputs[1].outputs:
        return "Dropout mask used"
    if any(lay2 is not None for lay2 in ins[1:]):
        return f"{node.op} reads channels as a parameter"
    cg.set_layout(node.outputs[0], lay)
    return None


def _channel_param(value: np.ndarray, lay: Layout):
    """'scalar' (same for every channel), 'slice' (per-channel along the axis) or None."""
    if value.size == 1:
        return "scalar"
    offset = lay.rank - value.ndim  # numpy broadcasting aligns from the right
    pos = lay.axis - offset
    if value.ndim > lay.rank:
        return None
    if pos < 0 or value.shape[pos] == 1:
        return "scalar"  # constant along the channel axis
    return "slice" if value.shape[pos] == lay.size else None


def _binary(cg, node, ins, shapes):
    lays = [lay for lay in ins if lay is not None]
    ref = lays[0]
    if any(lay.flat for lay in lays):
        return f"{node.op} on flattened channels"
    for lay in lays[1:]:
        if lay.size != ref.size or lay.rank - lay.axis != ref.rank - ref.axis:
            return f"{node.op} operands with different channel layouts"
    rank = max(lay.rank for lay in lays)
    for i, (t, lay) in enumerate(zip(node.inputs, ins)):
        if lay is not None:
            continue
        value = const_value(t)
        if value is None:
            return f"{node.op} with a tensor outside the group"
        kind = _channel_param(value, ref)
        if kind is None:
            return f"{node.op} constant does not broadcast per channel"
        if node.op == "Pow" and kind == "slice":
            return "Pow with per-channel exponent"
        if kind == "slice":
            cg.params.append(ParamSlice(node, i, ref.axis - (ref.rank - value.ndim), node.outputs[0]))
    for lay in lays[1:]:
        for a, b in zip(ref.atoms, lay.atoms):
            cg.uf.union(int(a), int(b))
    out_rank = len(shapes.get(node.outputs[0].name, ())) or rank
    cg.set_layout(node.outputs[0], Layout(ref.atoms, ref.axis + (out_rank - ref.rank), out_rank))
    return None


def _prelu(cg, node, ins, shapes):
    lay = ins[0]
    if lay is None or lay.flat or ins[1] is not None:
        return "PRelu slope carries channels"
    slope = const_value(node.inputs[1])
    if slope is None:
        return "PRelu with a non-constant slope"
    kind = _channel_param(slope, lay)
    if kind is None:
        return "PRelu slope does not broadcast per channel"
    if kind == "slice":
        cg.params.append(ParamSlice(node, 1, lay.axis - (lay.rank - slope.ndim), node.outputs[0]))
    cg.set_layout(node.outputs[0], lay)
    return None


def _batchnorm(cg, node, ins, shapes):
    lay = ins[0]
    if lay is None or lay.flat or lay.axis != 1 or any(x is not None for x in ins[1:]):
        return "BatchNormalization on another axis"
    if len(node.outputs) != 1 or int(attr(node, "training_mode", 0)):
        return "BatchNormalization in training mode"
    if any(const_value(t) is None for t in node.inputs[1:5]):
        return "BatchNormalization with non-constant parameters"
    for i in range(1, 5):
        cg.params.append(ParamSlice(node, i, 0, node.outputs[0]))
    cg.set_layout(node.outputs[0], lay)
    return None


def _pool(cg, node, ins, shapes):
    lay = ins[0]
    if lay.flat or lay.axis != 1:
        return f"{node.op} on another axis"
    if len(node.outputs) > 1 and node.outputs[1].outputs:
        return "MaxPool indices used"
    cg.set_layout(node.outputs[0], lay)
    return None


def _given(node, index: int) -> bool:
    """Whether optional input ``index`` is present (not missing, not the empty name)."""
    return len(node.inputs) > index and node.inputs[index] is not None and bool(node.inputs[index].name)


def _data_only(node, ins) -> str | None:
    """Reason when channels reach ``node`` other than through its first (data) input."""
    if ins[0] is None or ins[0].flat or any(x is not None for x in ins[1:]):
        return f"{node.op} reads channels as a parameter"
    return None


def _resize(cg, node, ins, shapes):
    lay = ins[0]
    if _data_only(node, ins):
        return _data_only(node, ins)
    out = shapes.get(node.outputs[0].name)
    if out is None or len(out) != lay.rank or out[lay.axis] != lay.size:
        return "Resize changes the channel axis"
    if _given(node, 3):
        sizes = const_value(node.inputs[3])
        if sizes is None:
            return "Resize with computed sizes"
        if sizes.size:
            cg.params.append(ParamSlice(node, 3, -1, node.outputs[0]))  # sizes: rewrite the channel entry
    cg.set_layout(node.outputs[0], lay)
    return None


def _pad(cg, node, ins, shapes):
    lay = ins[0]
    if _data_only(node, ins):
        return _data_only(node, ins)
    pads = const_value(node.inputs[1]) if len(node.inputs) > 1 else np.asarray(attr(node, "pads", []))
    if _given(node, 3):
        return "Pad with axes"
    if pads is None or pads.size != 2 * lay.rank:
        return "Pad with unknown pads"
    if pads[lay.axis] or pads[lay.axis + lay.rank]:
        return "Pad on the channel axis"
    cg.set_layout(node.outputs[0], lay)
    return None


def _reduce(cg, node, ins, shapes):
    lay = ins[0]
    if lay is None:
        return f"{node.op} reads channels as axes"
    axes = attr(node, "axes")
    if axes is None and len(node.inputs) > 1:
        value = const_value(node.inputs[1])
        axes = None if value is None else value.tolist()
    if lay.flat or axes is None or int(attr(node, "keepdims", 1)) != 1:
        return f"{node.op} over unknown axes or without keepdims"
    if lay.axis in {a % lay.rank for a in axes}:
        return f"{node.op} over the channel axis"
    cg.set_layout(node.outputs[0], lay)
    return None


def _concat(cg, node, ins, shapes):
    ref = _first(ins)
    axis = int(attr(node, "axis")) % ref.rank
    if ref.flat or axis != ref.axis:
        return "Concat on another axis"
    parts = []
    for t, lay in zip(node.inputs, ins):
        if lay is None:
            shape = shapes.get(t.name) if not isinstance(t, gs.Constant) else const_value(t).shape
            if shape is None or len(shape) != ref.rank:
                return "Concat with an input of unknown shape"
            lay = Layout(cg.uf.new(int(shape[axis])), axis, ref.rank)
            cg.block(lay, f"concatenated with channels from outside the group ({node.name})")
            cg.set_layout(t, lay)
        elif lay.flat or lay.axis != axis or lay.rank != ref.rank:
            return "Concat inputs with different layouts"
        parts.append(lay.atoms)
    cg.set_layout(node.outputs[0], Layout(np.concatenate(parts), axis, ref.rank))
    return None


def _transpose(cg, node, ins, shapes):
    lay = ins[0]
    perm = attr(node, "perm") or list(range(lay.rank))[::-1]
    if lay.flat or len(perm) != lay.rank:
        return "Transpose of flattened channels"
    cg.set_layout(node.outputs[0], Layout(lay.atoms, list(perm).index(lay.axis), lay.rank))
    return None


def _flatten_like(cg, node, lay, start, shapes):
    """Merge of dims ``start…`` of the input into one: the channel axis must be among them."""
    in_shape = shapes.get(node.inputs[0].name)
    if in_shape is None or lay.flat:
        return "flatten of unknown shape"
    if lay.axis < start:
        return f"{node.op} mixes the channel axis with the batch axes"
    outer = int(np.prod(in_shape[start:lay.axis], dtype=np.int64))
    inner = int(np.prod(in_shape[lay.axis + 1:], dtype=np.int64))
    flat = None if outer == 1 and inner == 1 else (outer, inner)
    cg.set_layout(node.outputs[0], Layout(lay.atoms, start, start + 1, flat))
    return None


def _flatten(cg, node, ins, shapes):
    lay = ins[0]
    return _flatten_like(cg, node, lay, int(attr(node, "axis", 1)) % max(lay.rank, 1), shapes)


def _reshape(cg, node, ins, shapes):
    lay = ins[0]
    if lay is None or ins[1] is not None:
        return "Reshape reads channels as a shape"
    src, dst = shapes.get(node.inputs[0].name), shapes.get(node.outputs[0].name)
    if src is None or dst is None:
        return "Reshape of unknown shape"
    start = len(dst) - 1
    if lay.flat or list(src[:start]) != list(dst[:start]) or int(np.prod(src[start:])) != dst[-1]:
        return "Reshape that mixes the channel axis"
    target = shapes.get(("value", node.inputs[1].name))
    if target is None or len(target) != len(dst):
        return "Reshape with an unknown target shape"
    if target[start] != -1 and not (target[start] == 0 and lay.axis == start == len(src) - 1):
        if const_value(node.inputs[1]) is None:
            return "Reshape whose computed shape fixes the channel count"
        if int(attr(node, "allowzero", 0)):
            return "Reshape with allowzero and a fixed channel count"
        cg.reshapes.append((node, start))  # target becomes [0, …, 0, -1]
    return _flatten_like(cg, node, lay, start, shapes)


def _shape(cg, node, ins, shapes):
    """Shape is harmless when only dims before the channel axis are used."""
    lay = ins[0]
    end = attr(node, "end")
    if end is not None and int(attr(node, "start", 0)) >= 0 and 0 <= int(end) <= lay.axis:
        return None
    for user in node.outputs[0].outputs:
        if user.op == "Slice" and len(user.inputs) >= 3:
            starts, ends = const_value(user.inputs[1]), const_value(user.inputs[2])
            axes = const_value(user.inputs[3]) if len(user.inputs) > 3 and user.inputs[3] is not None else None
            if starts is not None and ends is not None and (axes is None or list(axes) == [0]) \
                    and len(ends) == 1 and 0 <= int(ends[0]) <= lay.axis and int(starts[0]) >= 0:
                continue
        if user.op == "Gather":
            idx = const_value(user.inputs[1])
            if idx is not None and np.all((idx >= 0) & (idx < lay.axis)):
                continue
        return "Shape of the channels used"
    return None


HANDLERS = {
    "PRelu": _prelu,
    "BatchNormalization": _batchnorm,
    "Resize": _resize,
    "Pad": _pad,
    "Concat": _concat,
    "Transpose": _transpose,
    "Flatten": _flatten,
    "Reshape": _reshape,
    "Shape": _shape,
}


def handler_for(op: str):
    """The handler of ``op`` (None: unknown op, which blocks)."""
    if op in HANDLERS:
        return HANDLERS[op]
    if op in UNARY:
        return _unary
    if op in BINARY:
        return _binary
    if op in POOLS:
        return _pool
    if op in REDUCE:
        return _reduce
    return None
