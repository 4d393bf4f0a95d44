"""Dependency groups for structured pruning: which channels must be removed together.

Every output channel of a *source* (Conv or ConvTranspose with ``group=1``, Gemm, or MatMul
with a constant 2-D weight) is an **atom**. Walking the graph in topological order, each tensor that carries
channels gets a *layout*: the atom of each of its channel positions, the channel axis, and
whether it was flattened. Ops either keep the layout, couple layouts, or end it:

* pass-through (same atoms): elementwise activations (Relu, Clip, Sigmoid, HardSigmoid,
  HardSwish, LeakyRelu, Tanh, …), PRelu and BatchNormalization (their parameters are
  sliced), Add/Sub/Mul/Div/Max/Min with constants (per-channel constants are sliced),
  MaxPool/AveragePool/GlobalAveragePool/GlobalMaxPool, Resize with scale 1 on the channel
  axis, Pad with no channel padding, Transpose (the channel axis moves), ReduceMean/… with
  ``keepdims=1`` over other axes, depthwise Conv (``group = C_in = C_out``; its weight,
  bias and ``group`` follow);
* coupling: an elementwise op whose operands carry layouts (residual Add/Sum, SE gate Mul)
  unites the atoms position by position — channel k of every operand is one **unit**;
* Concat on the channel axis concatenates layouts (channel ranges map to their inputs); an
  operand without a layout contributes fresh atoms that cannot be pruned;
* Flatten, and a Reshape that merges the channel axis with the axes after it (concrete
  shapes from one ONNX Runtime run decide), make a *flat* layout: channel c becomes the
  features ``o·C·inner + c·inner + i`` (``inner`` = product of the dims after the channel
  axis, ``outer`` = product of the flattened dims before it), read only by Gemm/MatMul;
* consumers: Conv (``group=1``), Gemm (``transA=0``) and MatMul with a constant weight read
  the channels as input channels — their weights are sliced along the input axis; so does
  ConvTranspose (``group=1``), whose weight is ``[C_in, C_out, k…]`` (input axis 0, output
  axis 1);
* Shape is allowed only when its result is sliced/gathered to dims before the channel axis.

Everything else blocks the atoms it touches, with the reason kept for the report: graph
outputs, unknown ops, use inside a subgraph, Transpose/Reshape that mix the channel axis,
grouped (non-depthwise) Conv and ConvTranspose, shared weights at consumers, mismatched
broadcasts.

A **group** is a connected set of units (linked by a shared source, consumer or tensor);
:meth:`ChannelGraph.describe` prints one like Torch-Pruning's ``group.details()``.
The op-by-op rules live in :mod:`onnxslim_kit.passes.prune.ops`, the data in :mod:`onnxslim_kit.passes.prune.layout`.
"""

from __future__ import annotations

import onnx_graphsurgeon as gs

from onnxslim_kit.passes._common.graph import attr, const_value, is_graph_output
from onnxslim_kit.passes.prune.layout import ChannelGraph, Consumer, Layout, ParamSlice, Source
from onnxslim_kit.passes.prune.ops import handler_for

__all__ = ["ChannelGraph", "Layout", "analyse"]


def analyse(graph: gs.Graph, shapes: dict) -> ChannelGraph:
    """Build the channel graph of ``graph`` (topologically sorted); ``shapes``: name → concrete shape."""
    cg = ChannelGraph(graph, shapes=shapes)
    main_nodes = {id(n) for n in graph.nodes}
    for node in graph.nodes:
        _visit(cg, node, shapes)
        for out in node.outputs:
            if out.name in cg.layouts:
                if is_graph_output(out, graph):
                    cg.block(cg.layouts[out.name], "reaches a graph output")
                if any(id(user) not in main_nodes for user in out.outputs):
                    cg.block(cg.layouts[out.name], "used inside a subgraph")
    return cg


def _visit(cg: ChannelGraph, node: gs.Node, shapes: dict) -> None:
    ins = [cg.layouts.get(t.name) if isinstance(t, gs.Variable) else None for t in node.inputs]
    if node.domain not in (None, "", "ai.onnx"):
        _block_all(cg, node, ins, f"unknown op {node.domain}.{node.op}")
        return
    weight_role = _weight_role(node)
    if weight_role is not None:
        _visit_weighted(cg, node, ins, weight_role, shapes)
        return
    if not any(lay is not None for lay in ins):
        return
    handler = handler_for(node.op)
    reason = handler(cg, node, ins, shapes) if handler else f"unknown op {node.op}"
    if reason:
        _block_all(cg, node, ins, reason)
    elif node.op not in ("Shape",):
        cg.passthrough.append(node)


def _block_all(cg, node, ins, reason) -> None:
    for lay in ins:
        if lay is not None:
            cg.block(lay, f"{reason} ({node.name or node.op})")


# --- sources and consumers ---------------------------------------------------------------

def _weight_role(node: gs.Node):
    """'conv'|'convT'|'gemm'|'matmul'|'depthwise'|'grouped' for weighted nodes, else None."""
    if node.op == "Conv" and len(node.inputs) >= 2:
        w = const_value(node.inputs[1])
        if w is None or w.ndim < 3:
            return None
        group = int(attr(node, "group", 1))
        if group == 1:
            return "conv"
        if group == w.shape[0] and w.shape[1] == 1:
            return "depthwise"
        return "grouped"
    if node.op == "ConvTranspose" and len(node.inputs) >= 2:
        w = const_value(node.inputs[1])
        if w is None or w.ndim < 3:
            return None
        return "convT" if int(attr(node, "group", 1)) == 1 else "grouped"
    if node.op == "Gemm" and len(node.inputs) >= 2 and const_value(node.inputs[1]) is not None:
        return "gemm"
    if node.op == "MatMul" and const_value(node.inputs[1]) is not None and const_value(node.inputs[1]).ndim == 2:
        return "matmul"
    return None


def _shared(tensor, node) -> bool:
    return any(user is not node for user in tensor.outputs)


def _visit_weighted(cg, node, ins, role, shapes) -> None:
    lay = ins[0]
    w = const_value(node.inputs[1])
    for extra in ins[1:]:
        if extra is not None:
            cg.block(extra, f"{node.op} reads channels as a weight ({node.name})")
    if role == "depthwise":
        _visit_depthwise(cg, node, lay, w)
        return
    if role == "grouped":
        if lay is not None:
            cg.block(lay, f"grouped {node.op} ({node.name})")
        return
    trans_b = int(attr(node, "transB", 0)) if role == "gemm" else 0
    in_axis, out_axis = {"conv": (1, 0), "convT": (0, 1)}.get(role, (1, 0) if trans_b else (0, 1))
    if lay is not None:
        reason = _consumer_problem(node, lay, role, w.shape[in_axis])
        if reason:
            cg.block(lay, f"{reason} ({node.name})")
        else:
            cg.consumers.append(Consumer(node, node.inputs[0], role, in_axis))
    _add_source(cg, node, role, w, out_axis, shapes)


def _visit_depthwise(cg, node, lay, w) -> None:
    """A depthwise Conv passes its input's channels through (weight, bias and ``group`` follow)."""
    if lay is None:
        return
    if lay.flat or lay.axis != 1 or lay.size != w.shape[0]:
        cg.block(lay, f"depthwise Conv input layout mismatch ({node.name})")
        return
    cg.set_layout(node.outputs[0], Layout(lay.atoms, 1, lay.rank))
    cg.depthwise.append((node, node.outputs[0]))
    cg.params.append(ParamSlice(node, 1, 0, node.outputs[0]))
    if len(node.inputs) > 2 and node.inputs[2] is not None and const_value(node.inputs[2]) is not None:
        cg.params.append(ParamSlice(node, 2, 0, node.outputs[0]))
    cg.passthrough.append(node)


def _consumer_problem(node, lay, role, features: int) -> str | None:
    """Why ``node`` cannot read the channels of ``lay`` as input channels (None: it can)."""
    conv_like = role in ("conv", "convT")
    if role == "gemm" and int(attr(node, "transA", 0)):
        return "Gemm with transA"
    if lay.axis != (1 if conv_like else lay.rank - 1):
        return f"{node.op} reads the channels on another axis"
    if lay.flat is not None and (conv_like or lay.flat[0] * lay.size * lay.flat[1] != features):
        return f"{node.op} feature count does not match the flattened channels"
    if lay.flat is None and lay.size != features:
        return f"{node.op} input count mismatch"
    if _shared(node.inputs[1], node):
        return f"{node.op} weight shared with another node"
    return None


def _add_source(cg, node, role, w, out_axis, shapes) -> None:
    """The node's output channels become new atoms (unless its weight is shared or its bias computed)."""
    if _shared(node.inputs[1], node) or (role == "gemm" and len(node.inputs) > 2 and node.inputs[2] is not None
                                         and const_value(node.inputs[2]) is None):
        return
    conv_like = role in ("conv", "convT")
    out = node.outputs[0]
    rank = len(shapes[out.name]) if out.name in shapes else (w.ndim if conv_like else None)
    if rank is None:
        return
    atoms = cg.uf.new(w.shape[out_axis])
    cg.set_layout(out, Layout(atoms, 1 if conv_like else rank - 1, rank))
    cg.sources.append(Source(node, role, out_axis))
