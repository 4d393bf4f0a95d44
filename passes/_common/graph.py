"""Small graph helpers shared by the passes (onnx-graphsurgeon graphs).

Conventions every pass follows:

* a weight may be edited only if the node being rewritten is its sole user
  (:func:`exclusive_constant`); otherwise make a new constant (:func:`new_constant`);
* a tensor that is a graph output keeps its name: :func:`bypass` reroutes around a node
  and, if the node's output was a graph output, gives its name to the surviving tensor;
* rewrites never raise for "does not apply": helpers return ``None``/``False`` and the caller
  counts a reason (match / check steps return a :class:`~.match.MatchResult`).

Element types and shapes completed by shape inference live in :mod:`.shapes`; the state one
pass run's rules share (skip reasons counted once, inferred shapes) in :mod:`.match`.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

ONNX_DOMAINS = ("", "ai.onnx")


def is_onnx_op(node: gs.Node, *ops: str) -> bool:
    return (node.domain or "") in ONNX_DOMAINS and node.op in ops  # gs gives None for an unset domain


def const_value(tensor) -> np.ndarray | None:
    """The value of a constant tensor, or None for a variable (or an empty optional input)."""
    if isinstance(tensor, gs.Constant):
        return np.asarray(tensor.values)
    return None


def graph_outputs(graph: gs.Graph) -> set:
    return {id(t) for t in graph.outputs}


def is_graph_output(tensor, graph: gs.Graph) -> bool:
    return any(t is tensor for t in graph.outputs)


def consumers(tensor) -> list:
    """Distinct nodes that read ``tensor`` (any graph, subgraphs included)."""
    seen, out = set(), []
    for node in tensor.outputs:
        if id(node) not in seen:
            seen.add(id(node))
            out.append(node)
    return out


def producer(tensor) -> gs.Node | None:
    return tensor.inputs[0] if len(tensor.inputs) == 1 else None


def only_consumer(tensor, graph: gs.Graph) -> gs.Node | None:
    """The single node reading ``tensor`` once, if ``tensor`` is not also a graph output."""
    if is_graph_output(tensor, graph) or len(tensor.outputs) != 1:
        return None
    return tensor.outputs[0]


def exclusive_constant(tensor, node: gs.Node) -> bool:
    """True if ``tensor`` is a constant read by ``node`` alone (so it may be edited in place)."""
    return isinstance(tensor, gs.Constant) and all(user is node for user in tensor.outputs)


def as_array(values) -> np.ndarray:
    """A C-contiguous copy that keeps 0-d arrays 0-d (``np.ascontiguousarray`` makes them 1-d)."""
    return np.array(values, order="C", copy=True)


def new_constant(model, base: str, values: np.ndarray) -> gs.Constant:
    return gs.Constant(model.fresh_name(base), as_array(values))


def replace_uses(old, new) -> None:
    """Make every reader of ``old`` read ``new`` instead (graph outputs are not touched)."""
    for node in list(old.outputs):
        for i, tensor in enumerate(node.inputs):
            if tensor is old:
                node.inputs[i] = new


def bypass(node: gs.Node, graph: gs.Graph, keep=None) -> bool:
    """Remove a node whose output equals its input ``keep`` (default: first input).

    Readers of the output read ``keep`` instead. If the output is a graph output, ``keep``
    takes over its name — allowed only when ``keep`` is produced by a node of this graph and
    is neither a graph input nor read by anything else. Returns False when not possible.
    """
    keep = node.inputs[0] if keep is None else keep
    out = node.outputs[0]
    if is_graph_output(out, graph):
        if (
            isinstance(keep, gs.Constant)
            or producer(keep) is None
            or producer(keep) not in graph.nodes
            or any(t is keep for t in graph.inputs)
            or is_graph_output(keep, graph)
            or any(user is not node for user in keep.outputs)
        ):
            return False
        name, dtype, shape = out.name, out.dtype, out.shape
        replace_uses(out, keep)
        index = [i for i, t in enumerate(graph.outputs) if t is out]
        out.name = out.name + "__bypassed"
        keep.name = name
        keep.dtype = keep.dtype or dtype
        keep.shape = keep.shape or shape
        for i in index:
            graph.outputs[i] = keep
    else:
        replace_uses(out, keep)
    node.inputs.clear()
    node.outputs.clear()
    return True


def attr(node: gs.Node, name: str, default=None):
    return node.attrs.get(name, default)
