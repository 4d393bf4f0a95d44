"""``fuse`` shape rules (used by :mod:`onnxslim_kit.passes.fuse.const_fold`): Shape / Size folding, Reshape targets.

1. ``Shape`` / ``Size`` of a tensor whose shape is statically known (from the graph or ONNX
   shape inference, run once per pass run) become constants; for a partly known shape,
   ``Gather`` / ``Slice`` of the ``Shape`` output that pick only known dims do.
2. A ``Reshape`` target built (``Concat`` on axis 0) from constants and from dims of the
   reshaped tensor itself — ``Shape(x)``, ``Slice(Shape(x))``, ``Gather(Shape(x))``,
   ``Unsqueeze(Gather(Shape(x), i))`` — each copied dim landing at its own index, becomes a
   constant with ``0`` there: Reshape's "copy this dim", so only when ``allowzero`` is 0.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from onnxslim_kit.passes._common.graph import as_array, ensure_shapes, is_onnx_op, run_state, shape_of, skip_once



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
        if int(reader.attrs.get("axis", 0)) not in (0, -1):
            return None
        indices = _const_ints(reader.inputs[1])
        if indices is None or np.any(indices < -len(dims)) or np.any(indices >= len(dims)):
            return None
        picked = [dims[int(i)] for i in indices.reshape(-1)]
        if not all(isinstance(d, int) for d in picked):
            return None
        return np.array(picked, dtype=np.int64).reshape(indices.shape)
    if is_onnx_op(reader, "Slice"):
        if opset < 10:
            starts, ends = reader.attrs.get("starts"), reader.attrs.get("ends")
            axes, steps = reader.attrs.get("axes"), None
        else:
            inputs = list(reader.inputs) + [None] * (5 - len(reader.inputs))
            starts, ends, axes, steps = (_const_ints(t) if t is not None else None for t in inputs[1:5])
            if any(inputs[i] is not None and not inputs[i].is_empty() and v is None
                   for i, v in zip((1, 2, 3, 4), (starts, ends, axes, steps))):
                return None
        if starts is None or ends is None or len(starts) != 1 or len(ends) != 1:
            return None
        if axes is not None and [int(a) for a in axes] not in ([0], [-1]):
            return None
        step = 1 if steps is None else int(steps[0])
        if step < 1:
            return None
        picked = dims[int(starts[0]):int(ends[0]):step]
        if not all(isinstance(d, int) for d in picked):
            return None
        return np.array(picked, dtype=np.int64)
    return None


def fold_shapes(graph, model, result) -> int:
    ensure_shapes(model, result)
    count = 0
    for node in list(graph.nodes):
        if not node.outputs or not node.inputs or not is_onnx_op(node, "Shape", "Size"):
            continue
        data = node.inputs[0]
        if isinstance(data, gs.Constant):
            continue  # plain constant folding
        shape = shape_of(data)
        if shape is None:
            skip_once(model, result, node, f"{node.op.lower()} folding: input shape unknown")
            continue
        shape = [int(d) if isinstance(d, (int, np.integer)) else None for d in shape]
        if node.op == "Size":
            if all(d is not None for d in shape):
                _to_constant(node, np.array(int(np.prod(shape, dtype=np.int64)), dtype=np.int64))
                count += 1
            else:
                skip_once(model, result, node, "size folding: input shape not static")
            continue
        dims = _shape_dims(node, shape)
        if all(d is not None for d in dims):
            _to_constant(node, np.array(dims, dtype=np.int64))
            count += 1
            continue
        out = node.outputs[0]
        folded = 0
        for reader in list(out.outputs):
            if not reader.outputs or reader.inputs[0] is not out:
                continue
            picked = _picked_dims(reader, dims, model.opset)
            if picked is not None:
                _to_constant(reader, picked)
                folded += 1
        if not folded and out.outputs:
            skip_once(model, result, node, "shape folding: input shape not static")
        count += folded
    if count:
        run_state(model, result)["dirty"] = True
    return count


def _producer(tensor):
    return tensor.inputs[0] if len(tensor.inputs) == 1 else None


def _own_dims(part, data, rank, opset):
    """Indices of ``data``'s dims that the 1-D tensor ``part`` holds (from Shape(data)), or None."""
    node = _producer(part)
    if node is None or not node.outputs:
        return None
    if is_onnx_op(node, "Unsqueeze"):
        axes = node.attrs.get("axes") if opset < 13 else _const_ints(node.inputs[1] if len(node.inputs) > 1 else None)
        inner = _own_dims(node.inputs[0], data, rank, opset)
        if axes is None or [int(a) for a in np.asarray(axes).reshape(-1)] not in ([0], [-1]) or inner is None:
            return None
        return _Dims(inner) if len(inner) == 1 and inner.scalar else None
    if is_onnx_op(node, "Shape"):
        if node.inputs[0] is not data:
            return None
        if rank is None:
            return None
        start, end = int(node.attrs.get("start", 0)), node.attrs.get("end")
        return _Dims(range(rank)[start:None if end is None else int(end)])
    if is_onnx_op(node, "Gather", "Slice"):
        source = node.inputs[0]
        shape_node = _producer(source)
        if shape_node is None or not is_onnx_op(shape_node, "Shape") or shape_node.inputs[0] is not data:
            return None
        all_dims = _own_dims(source, data, rank, opset)
        if all_dims is None:
            return None
        if node.op == "Gather":
            if int(node.attrs.get("axis", 0)) not in (0, -1):
                return None
            indices = _const_ints(node.inputs[1])
            if indices is None or indices.ndim > 1 or np.any(indices >= len(all_dims)) or np.any(indices < -len(all_dims)):
                return None
            picked = _Dims(all_dims[int(i)] for i in indices.reshape(-1))
            picked.scalar = indices.ndim == 0
            return picked
        picked = _picked_dims(node, list(all_dims), opset)
        return None if picked is None else _Dims(int(i) for i in picked.reshape(-1))
    return None


class _Dims(list):
    """Dim indices; ``scalar`` when they come as a 0-d tensor (Gather with a scalar index)."""

    scalar = False


def constant_reshape_targets(graph, model, result) -> int:
    ensure_shapes(model, result)
    count = 0
    opset = model.opset
    for node in list(graph.nodes):
        if not node.outputs or not is_onnx_op(node, "Reshape") or len(node.inputs) != 2:
            continue
        data, target = node.inputs
        if isinstance(target, gs.Constant) or int(node.attrs.get("allowzero", 0)):
            continue
        shape = shape_of(data)
        rank = len(shape) if shape is not None else None
        concat = _producer(target)
        if concat is not None and is_onnx_op(concat, "Concat") and int(concat.attrs.get("axis", 0)) in (0, -1):
            parts = list(concat.inputs)
        else:
            parts = [target]
        values = []
        for part in parts:
            constant = _const_ints(part)
            if constant is not None:
                values.extend(int(v) for v in constant.reshape(-1))
                continue
            dims = _own_dims(part, data, rank, opset)
            if dims is None or dims.scalar or any(d != len(values) + k for k, d in enumerate(dims)):
                values = None
                break
            values.extend([0] * len(dims))
        if values is None or (concat is None and not values) or not any(v == 0 for v in values):
            continue
        node.inputs[1] = gs.Constant(model.fresh_name("fuse/reshape_shape"), np.array(values, dtype=np.int64))
        count += 1
    return count
