"""Helpers of the ``fuse`` cleanup rules (:mod:`.cleanup`, :mod:`.merges`): live nodes, node
pairs, int lists given as attributes or constant inputs, removal by bypass.

A node is removed with :func:`~onnxslim_kit.passes._common.graph.bypass`: its readers read the
kept input instead; a graph output keeps its name (the kept tensor is renamed) or, when that
is impossible, the node stays and a reason is counted (:func:`remove`).
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from onnxslim_kit.passes._common.graph import bypass, const_value, is_graph_output, is_onnx_op
from onnxslim_kit.passes._common.shapes import ShapeTable

INT32_MAX = 2**31 - 1


def live_nodes(graph: gs.Graph, *ops: str):
    """Live nodes of ``graph`` with one of ``ops`` (snapshot; removed nodes are skipped)."""
    for node in list(graph.nodes):
        if node.outputs and node.inputs and is_onnx_op(node, *ops):
            yield node


def pairs(graph: gs.Graph, op: str, *first_ops: str):
    """(first, mid, second) for each live ``op`` node ``second`` whose data input ``mid`` is
    written by a live node ``first`` of ``first_ops`` (default: the same op)."""
    ids = {id(n) for n in graph.nodes}
    for second in live_nodes(graph, op):
        mid = second.inputs[0]
        first = mid.inputs[0] if len(mid.inputs) == 1 else None
        if first is not None and first.outputs and id(first) in ids and is_onnx_op(first, *(first_ops or (op,))):
            yield first, mid, second


def optional_input(node: gs.Node, index: int):
    """Input ``index`` or None when absent or empty (an omitted optional input)."""
    if index < len(node.inputs) and not node.inputs[index].is_empty():
        return node.inputs[index]
    return None


def ints_of(node: gs.Node, attr_name: str, input_index: int, opset: int, since: int):
    """An int list given as attribute (before opset ``since``) or constant input (from it).

    Returns ``(values, given)``: ``values`` None when given but not constant.
    """
    if opset < since:
        if attr_name not in node.attrs:
            return None, False
        return [int(v) for v in node.attrs[attr_name]], True
    tensor = optional_input(node, input_index)
    if tensor is None:
        return None, False
    value = const_value(tensor)
    if value is None:
        return None, True
    return [int(v) for v in np.asarray(value).reshape(-1)], True


def remove(node, graph, run, what: str) -> int:
    if bypass(node, graph):
        return 1
    run.skip_once(node, f"{what}: graph output cannot be renamed (input is a graph input, constant or shared)")
    return 0


def bypass_pair(second, first, graph) -> bool:
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


def reshape_target(node, opset: int):
    """(target ints or None, allowzero)."""
    allowzero = int(node.attrs.get("allowzero", 0))
    if opset < 5:
        shape = node.attrs.get("shape")
        return ([int(v) for v in shape] if shape is not None else None), allowzero
    tensor = optional_input(node, 1)
    value = const_value(tensor) if tensor is not None else None
    return ([int(v) for v in np.asarray(value).reshape(-1)] if value is not None else None), allowzero


def perm_of(node, shapes: ShapeTable):
    """The perm of a Transpose, or None when absent and the rank is unknown."""
    perm = node.attrs.get("perm")
    if perm is not None:
        return [int(p) for p in perm]
    shape = shapes.shape(node.inputs[0])
    return None if shape is None else list(range(len(shape)))[::-1]


def broadcasts_to_self(shape, other) -> bool | None:
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


def axes_of(node, opset):
    """(axes, given): axes as ints, None when given but not constant."""
    return ints_of(node, "axes", 1, opset, 13)


def normalized(axes, rank):
    if axes is None:
        return None
    if rank is None:
        return sorted(axes) if all(a >= 0 for a in axes) else None
    return sorted(a + rank if a < 0 else a for a in axes)
