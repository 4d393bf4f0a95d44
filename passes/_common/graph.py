"""Small graph helpers shared by the passes (onnx-graphsurgeon graphs).

Conventions every pass follows:

* a weight may be edited only if the node being rewritten is its sole user
  (:func:`exclusive_constant`); otherwise make a new constant (:func:`new_constant`);
* a tensor that is a graph output keeps its name: :func:`bypass` reroutes around a node
  and, if the node's output was a graph output, gives its name to the surviving tensor;
* rewrites never raise for "does not apply": helpers return ``None``/``False`` and the caller
  counts a reason.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from onnxslim_kit.model import proto_graphs

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


# --- shapes and types ------------------------------------------------------------------
#
# gs tensors carry ``dtype`` and ``shape`` from the model's value_info. ``ensure_shapes`` runs
# ONNX shape inference once per pass run and keeps what it finds in a private attribute of
# each tensor (reset at every run), *not* in ``dtype``/``shape``: exported models get no new
# value_info, so a later pass that changes shapes cannot be tripped by stale annotations.
# ``shape_of`` / ``elem_type`` read the inferred value first. A dim is an ``int`` when known,
# else a ``str`` (symbolic) or ``None``.

_INFERRED = "_slim_inferred"


def _inferred(tensor):
    return tensor.__dict__.get(_INFERRED)


def elem_type(tensor) -> int | None:
    """The ONNX element type (``onnx.TensorProto.FLOAT`` …) of a tensor, or None if unknown."""
    if isinstance(tensor, gs.Constant):
        export = getattr(tensor, "export_dtype", None)
        dtype = export if export is not None else tensor.dtype
    else:
        info = _inferred(tensor)
        if info is not None and info[0]:
            return info[0]
        dtype = tensor.dtype
    if dtype is None:
        return None
    if isinstance(dtype, (int, np.integer)) and not isinstance(dtype, bool):
        return int(dtype)
    try:
        return int(onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))
    except (TypeError, KeyError, ValueError):
        return None


def shape_of(tensor) -> list | None:
    """The tensor's shape as a list (dims int / str / None), or None when even the rank is unknown."""
    if isinstance(tensor, gs.Constant):
        return list(tensor.shape)
    info = _inferred(tensor)
    if info is not None and info[1] is not None:
        return list(info[1])
    if tensor.shape is None:
        return None
    return list(tensor.shape)


def static_shape(tensor) -> list | None:
    """The shape if every dim is a known int, else None."""
    shape = shape_of(tensor)
    if shape is None or not all(_is_int(d) for d in shape):
        return None
    return [int(d) for d in shape]


def _is_int(dim) -> bool:
    return isinstance(dim, (int, np.integer)) and not isinstance(dim, bool)


def run_state(model, result) -> dict:
    """Scratch state shared by the rules of one pass run (a run is identified by its ``result``)."""
    state = model.__dict__.get("_pass_run_state")
    if state is None or state.get("result") is not result:
        state = {"result": result}
        model.__dict__["_pass_run_state"] = state
    return state


def skip_once(model, result, node, reason: str) -> None:
    """``result.skip(reason)`` counted once per node per run (rules are re-applied every round)."""
    seen = run_state(model, result).setdefault("skipped", set())
    key = (id(node), reason)
    if key not in seen:
        seen.add(key)
        result.skip(reason)


def ensure_shapes(model, result, refresh: bool = False) -> None:
    """Run :func:`infer_shapes` once per pass run (again when ``refresh``)."""
    state = run_state(model, result)
    if "shapes" in state and not refresh:
        return
    problem = infer_shapes(model)
    if problem and "shapes" not in state:
        result.notes.append(f"shape inference: {problem}")
    state["shapes"] = True


def infer_shapes(model) -> str | None:
    """Attach ONNX shape inference results to the gs tensors; returns a problem or None.

    Inference runs on the exported model with intermediate value_info removed (stale
    annotations cannot contradict it). Per dim, an inferred int wins, else the declared one.
    """
    for graph in model.all_graphs():
        for tensor in graph.tensors().values():
            tensor.__dict__.pop(_INFERRED, None)
    try:
        proto = model.to_proto(weights=False)  # shape inference reads no float weights
    except Exception as exc:  # noqa: BLE001 - gs export raises several types
        return f"export failed ({_first_line(exc)})"
    if proto.ByteSize() > 2**31 - 1:
        return "model over 2 GB, skipped"
    _strip_value_info(proto.graph)
    try:
        inferred = onnx.shape_inference.infer_shapes(proto, check_type=False, strict_mode=False, data_prop=True)
    except Exception as exc:  # noqa: BLE001 - InferenceError, ValidationError, RuntimeError
        return _first_line(exc)
    _apply_inferred(model.graph, inferred.graph)
    return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:200]


def _strip_value_info(graph: onnx.GraphProto) -> None:
    for sub in proto_graphs(graph):
        del sub.value_info[:]


def _type_info(value_info) -> tuple | None:
    if not value_info.type.HasField("tensor_type"):
        return None
    tt = value_info.type.tensor_type
    elem = tt.elem_type or None
    if not tt.HasField("shape"):
        return elem, None
    dims = []
    for d in tt.shape.dim:
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value))
        elif d.HasField("dim_param") and d.dim_param:
            dims.append(d.dim_param)
        else:
            dims.append(None)
    return elem, dims


def _apply_inferred(graph: gs.Graph, proto: onnx.GraphProto) -> None:
    infos = {}
    for vi in list(proto.input) + list(proto.output) + list(proto.value_info):
        info = _type_info(vi)
        if info is not None:
            infos[vi.name] = info
    for tensor in graph.tensors().values():
        if isinstance(tensor, gs.Constant) or tensor.name not in infos:
            continue
        elem, dims = infos[tensor.name]
        declared = tensor.shape
        if dims is not None and declared is not None and len(declared) == len(dims):
            dims = [d if _is_int(d) else (o if _is_int(o) else (d or o)) for d, o in zip(dims, declared)]
        tensor.__dict__[_INFERRED] = (elem, dims)
    if len(graph.nodes) != len(proto.node):
        return
    for node, pnode in zip(graph.nodes, proto.node):
        if node.op != pnode.op_type:
            return
        by_name = {a.name: a for a in pnode.attribute}
        for name, value in node.attrs.items():
            if isinstance(value, gs.Graph) and name in by_name and by_name[name].type == onnx.AttributeProto.GRAPH:
                _apply_inferred(value, by_name[name].g)
