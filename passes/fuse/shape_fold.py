"""``fuse`` shape rules (used by :mod:`onnxslim_kit.passes.fuse.const_fold`): Shape / Size folding, Reshape targets.

1. ``Shape`` / ``Size`` of a tensor whose shape is statically known (from the graph or ONNX
   shape inference, run once per pass run) become constants; for a partly known shape,
   ``Gather`` / ``Slice`` of the ``Shape`` output that pick only known dims do.
2. A ``Reshape`` target built (``Concat`` on axis 0) from constants and from dims of the
   reshaped tensor itself — ``Shape(x)``, ``Slice(Shape(x))``, ``Gather(Shape(x))``,
   ``Unsqueeze(Gather(Shape(x), i))`` — each copied dim landing at its own index, becomes a
   constant with ``0`` there: Reshape's "copy this dim", so only when ``allowzero`` is 0.
   A dim may also pass through ``Cast(Cast(d, to=T), to=INT64)`` (a torch export of
   ``x.view(int(x.size(0)), …)``): with T = int64 / float64 the round trip is exact for every
   dim a tensor can have (below 2^53); with T = int32 / float32 only below 2^31 / 2^24, so then
   the target must hold no ``-1``: a changed dim would change the target's element count and
   the original Reshape would fail (for tensors with elements; an empty tensor with a dim over
   2^24 is the one case where the original would have produced another, empty, shape).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from onnxslim_kit.passes._common.graph import as_array, is_onnx_op
from onnxslim_kit.passes._common.match import RuleRun

def _shape_dims(node: gs.Node, shape: list) -> list:
    start = int(node.attrs.get("start", 0))
    end = node.attrs.get("end")
    return shape[start:] if end is None else shape[start:int(end)]


def _to_constant(node: gs.Node, value: np.ndarray) -> None:
    out = node.outputs[0]
    node.outputs.clear()
    node.inputs.clear()
    out.to_constant(as_array(value))


def _const_ints(tensor):
    if tensor is None or tensor.is_empty() or not isinstance(tensor, gs.Constant):
        return None
    return np.asarray(tensor.values).astype(np.int64)


def _picked_dims(reader: gs.Node, dims: list, opset: int):
    """The dims a Gather / Slice of a Shape output selects (np.int64 array), or None."""
    if is_onnx_op(reader, "Gather") and len(reader.inputs) == 2 and reader.inputs[0] is not reader.inputs[1]:
        return _gathered_dims(reader, dims)
    if is_onnx_op(reader, "Slice"):
        return _sliced_dims(reader, dims, opset)
    return None


def _known(picked) -> bool:
    return all(isinstance(d, int) for d in picked)


def _gathered_dims(reader: gs.Node, dims: list):
    if int(reader.attrs.get("axis", 0)) not in (0, -1):
        return None
    indices = _const_ints(reader.inputs[1])
    if indices is None or np.any(indices < -len(dims)) or np.any(indices >= len(dims)):
        return None
    picked = [dims[int(i)] for i in indices.reshape(-1)]
    return np.array(picked, dtype=np.int64).reshape(indices.shape) if _known(picked) else None


def _slice_inputs(reader: gs.Node, opset: int):
    """(starts, ends, axes, steps) of a Slice, each None when absent; None when one given is not constant."""
    if opset < 10:
        return reader.attrs.get("starts"), reader.attrs.get("ends"), reader.attrs.get("axes"), None
    inputs = list(reader.inputs) + [None] * (5 - len(reader.inputs))
    values = tuple(_const_ints(t) if t is not None else None for t in inputs[1:5])
    if any(t is not None and not t.is_empty() and v is None for t, v in zip(inputs[1:5], values)):
        return None
    return values


def _sliced_dims(reader: gs.Node, dims: list, opset: int):
    params = _slice_inputs(reader, opset)
    if params is None:
        return None
    starts, ends, axes, steps = params
    if starts is None or ends is None or len(starts) != 1 or len(ends) != 1:
        return None
    if axes is not None and [int(a) for a in axes] not in ([0], [-1]):
        return None
    step = 1 if steps is None else int(steps[0])
    if step < 1:
        return None
    picked = dims[int(starts[0]):int(ends[0]):step]
    return np.array(picked, dtype=np.int64) if _known(picked) else None


def fold_shapes(graph, run: RuleRun) -> int:
    shapes = run.ensure_shapes()
    count = 0
    for node in list(graph.nodes):
        if not node.outputs or not node.inputs or not is_onnx_op(node, "Shape", "Size"):
            continue
        data = node.inputs[0]
        if isinstance(data, gs.Constant):
            continue  # plain constant folding
        shape = shapes.shape(data)
        if shape is None:
            run.skip_once(node, f"{node.op.lower()} folding: input shape unknown")
            continue
        shape = [int(d) if isinstance(d, (int, np.integer)) else None for d in shape]
        folder = _fold_size if node.op == "Size" else _fold_shape
        count += folder(node, shape, run)
    if count:
        run.dirty = True
    return count


def _fold_size(node: gs.Node, shape: list, run: RuleRun) -> int:
    if all(d is not None for d in shape):
        _to_constant(node, np.array(int(np.prod(shape, dtype=np.int64)), dtype=np.int64))
        return 1
    run.skip_once(node, "size folding: input shape not static")
    return 0


def _fold_shape(node: gs.Node, shape: list, run: RuleRun) -> int:
    """``Shape`` made constant, or else the Gather / Slice readers that pick only known dims."""
    dims = _shape_dims(node, shape)
    if all(d is not None for d in dims):
        _to_constant(node, np.array(dims, dtype=np.int64))
        return 1
    out = node.outputs[0]
    folded = 0
    for reader in list(out.outputs):
        if not reader.outputs or reader.inputs[0] is not out:
            continue
        picked = _picked_dims(reader, dims, run.opset)
        if picked is not None:
            _to_constant(reader, picked)
            folded += 1
    if not folded and out.outputs:
        run.skip_once(node, "shape folding: input shape not static")
    return folded


def _producer(tensor):
    return tensor.inputs[0] if len(tensor.inputs) == 1 else None


def _own_dims(part, data, rank, opset):
    """Indices of ``data``'s dims that the 1-D tensor ``part`` holds (from Shape(data)), or None."""
    node = _producer(part)
    if node is None or not node.outputs:
        return None
    for ops, rule in _OWN_DIMS_RULES:
        if is_onnx_op(node, *ops):
            return rule(node, data, rank, opset)
    return None


def _unsqueezed_dims(node, data, rank, opset):
    """``Unsqueeze(Gather(Shape(data), i), [0])``: the scalar dim ``i`` as a 1-D tensor."""
    axes = node.attrs.get("axes") if opset < 13 else _const_ints(node.inputs[1] if len(node.inputs) > 1 else None)
    inner = _own_dims(node.inputs[0], data, rank, opset)
    if axes is None or [int(a) for a in np.asarray(axes).reshape(-1)] not in ([0], [-1]) or inner is None:
        return None
    if len(inner) != 1 or not inner.scalar:
        return None
    found = _Dims(inner)
    found.inexact = inner.inexact
    return found


def _shape_own_dims(node, data, rank, opset):
    if node.inputs[0] is not data or rank is None:
        return None
    start, end = int(node.attrs.get("start", 0)), node.attrs.get("end")
    return _Dims(range(rank)[start:None if end is None else int(end)])


def _picked_own_dims(node, data, rank, opset):
    """``Gather`` / ``Slice`` of ``Shape(data)``."""
    source = node.inputs[0]
    shape_node = _producer(source)
    if shape_node is None or not is_onnx_op(shape_node, "Shape") or shape_node.inputs[0] is not data:
        return None
    all_dims = _own_dims(source, data, rank, opset)
    if all_dims is None:
        return None
    if node.op == "Slice":
        picked = _picked_dims(node, list(all_dims), opset)
        return None if picked is None else _Dims(int(i) for i in picked.reshape(-1))
    if int(node.attrs.get("axis", 0)) not in (0, -1):
        return None
    indices = _const_ints(node.inputs[1])
    if indices is None or indices.ndim > 1 or np.any(indices >= len(all_dims)) or np.any(indices < -len(all_dims)):
        return None
    picked = _Dims(all_dims[int(i)] for i in indices.reshape(-1))
    picked.scalar = indices.ndim == 0
    return picked


_EXACT_CASTS = {onnx.TensorProto.INT64: None, onnx.TensorProto.DOUBLE: None,
                onnx.TensorProto.INT32: 2**31 - 1, onnx.TensorProto.FLOAT: 2**24}
"""Types a dim may pass through and back to int64: None = every dim a tensor can have (below
2^53), else the largest int the type holds exactly."""


def _cast_back_dims(node, data, rank, opset):
    """``Cast(Cast(dims, to=T), to=INT64)`` with ``dims`` own dims of ``data`` (T in
    :data:`_EXACT_CASTS`): the same dims, marked ``inexact`` when T is narrower than int64."""
    inner = _producer(node.inputs[0])
    if int(node.attrs.get("to", 0)) != onnx.TensorProto.INT64 or inner is None or not inner.outputs:
        return None
    if not is_onnx_op(inner, "Cast") or len(inner.outputs[0].outputs) != 1:
        return None
    to = int(inner.attrs.get("to", 0))
    if to not in _EXACT_CASTS:
        return None
    dims = _own_dims(inner.inputs[0], data, rank, opset)
    if dims is None:
        return None
    found = _Dims(dims)
    found.scalar, found.inexact = dims.scalar, dims.inexact or _EXACT_CASTS[to] is not None
    return found


_OWN_DIMS_RULES = (
    (("Cast",), _cast_back_dims),
    (("Unsqueeze",), _unsqueezed_dims),
    (("Shape",), _shape_own_dims),
    (("Gather", "Slice"), _picked_own_dims),
)


class _Dims(list):
    """Dim indices; ``scalar`` when they come as a 0-d tensor (Gather with a scalar index)."""

    scalar = False
    inexact = False  # passed through an int32 / float32 Cast: exact only below 2^31 / 2^24


def _target_values(parts: list, data, rank, opset) -> list | None:
    """The constant target (own dims as 0) the parts of a Reshape target amount to, or None."""
    values, inexact = [], False
    for part in parts:
        constant = _const_ints(part)
        if constant is not None:
            values.extend(int(v) for v in constant.reshape(-1))
            continue
        dims = _own_dims(part, data, rank, opset)
        if dims is None or dims.scalar or any(d != len(values) + k for k, d in enumerate(dims)):
            return None
        values.extend([0] * len(dims))
        inexact = inexact or dims.inexact
    if inexact and -1 in values:
        return None  # a -1 could absorb a dim the narrow Cast changed: keep the original target
    return values


def constant_reshape_targets(graph, run: RuleRun) -> int:
    shapes = run.ensure_shapes()
    model = run.model
    count = 0
    opset = model.opset
    for node in list(graph.nodes):
        if not node.outputs or not is_onnx_op(node, "Reshape") or len(node.inputs) != 2:
            continue
        data, target = node.inputs
        if isinstance(target, gs.Constant) or int(node.attrs.get("allowzero", 0)):
            continue
        shape = shapes.shape(data)
        rank = len(shape) if shape is not None else None
        concat = _producer(target)
        if concat is not None and is_onnx_op(concat, "Concat") and int(concat.attrs.get("axis", 0)) in (0, -1):
            parts = list(concat.inputs)
        else:
            parts = [target]
        values = _target_values(parts, data, rank, opset)
        if values is None or (concat is None and not values) or not any(v == 0 for v in values):
            continue
        node.inputs[1] = gs.Constant(model.fresh_name("fuse/reshape_shape"), np.array(values, dtype=np.int64))
        count += 1
    return count
