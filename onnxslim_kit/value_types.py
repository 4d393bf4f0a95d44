"""Values that are not plain tensors (optional, sequence, map, sparse) through onnx-graphsurgeon.

gs imports such a value with a partial type — an optional's element type as its ``dtype``, a
sequence without its element shape, a map without its key type — and its exporter raises
UnboundLocalError for an optional or a map (onnx's ``test_if_opt``: an If whose outputs are
``optional(seq(float))``); ``Graph.copy`` forgets a variable's ``type``; import drops every
``TYPE_PROTO`` attribute (``Optional<type=seq(float[5])>()``, whose output type it is).
So, around gs (used by :class:`.model.Model`):

1. on load, the exact ``TypeProto`` of every graph input, output and value_info that is not a
   plain tensor is kept by name (:func:`non_tensor_types`), and the ``TYPE_PROTO`` attributes
   are put back on the gs nodes as ``TypeProto`` values (:func:`restore_type_attributes`), which
   gs's exporter writes as they are (``onnx.helper.make_attribute``);
2. on export, those variables are handed to gs untyped (:func:`untyped_non_tensors`) and their
   types filled in afterwards (:func:`fill_non_tensor_types`): the loaded one for a name, else
   one rebuilt from what gs holds (a tensor renamed by a pass: ``seq(dtype)``, ``optional(T)``);
   the value_info the input model had for such an intermediate is written again.

Graph *inputs* of these types go through the data feed (:mod:`.calibration`): their structure —
the chain of ``optional`` / ``sequence`` / ``map`` around one innermost tensor type
(:func:`input_layout`) — is checked and generated here (:func:`check_value`,
:func:`generate_value`), the innermost tensors by the feed's own tensor rules. Values as ONNX
Runtime's Python API takes them: a sequence a ``list`` of arrays, a map a ``dict`` of Python
scalars, an optional its element or ``None`` (absent). Generated: a sequence of
:data:`SEQUENCE_LENGTH` elements, a map of :data:`MAP_SIZE` entries (keys: the graph's
vocabulary when it has one, else ``0 … n-1`` / :data:`WORDS`), an optional present.
In a ``.npz`` file (:func:`npz_value`): a sequence ``NAME`` is the keys ``NAME/0``, ``NAME/1``, …
(its elements, in order; at least one), a map ``NAME`` the 1-D arrays ``NAME/keys`` and
``NAME/values``, an optional its element's key(s); empty sequences, absent optionals and
sequences of maps only through the Python API (``calib=[{...}]``).
"""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from .errors import UserError
from .protos import proto_graphs

SEQUENCE_LENGTH = 2  # elements of a generated sequence
MAP_SIZE = 3  # entries of a generated map
WORDS = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta")  # generated strings


def non_tensor_types(proto: onnx.ModelProto) -> dict:
    """name -> TypeProto of every graph input, output and value_info (every graph) whose type
    is not a plain tensor."""
    types = {}
    for graph in proto_graphs(proto.graph):
        for value in (*graph.input, *graph.output, *graph.value_info):
            if value.type.WhichOneof("value") not in (None, "tensor_type"):
                types[value.name] = value.type
    return types


@contextmanager
def untyped_non_tensors(graphs, types: dict):
    """Variables that are not plain tensors (by gs's ``type``, or named in ``types``: gs's
    ``Graph.copy`` forgets ``type``) are exported untyped by gs (its exporter cannot write an
    optional or a map); yields ``[(tensor, dtype)]``, the dtypes put back after."""
    held = []
    for graph in graphs:
        for tensor in graph.tensors().values():
            if isinstance(tensor, gs.Variable) and (tensor.type not in (None, "tensor_type") or tensor.name in types):
                held.append((tensor, tensor.dtype))
                tensor.dtype = None
    try:
        yield held
    finally:
        for tensor, dtype in held:
            tensor.dtype = dtype


def fill_non_tensor_types(proto: onnx.ModelProto, held: list, types: dict) -> None:
    """Give the untyped inputs/outputs/value_info of ``proto`` their types: the one loaded under
    that name, else one rebuilt from what gs holds (a sequence of a dtype, an optional of a type)."""
    wanted = {}
    for tensor, dtype in held:
        found = types.get(tensor.name) or _rebuilt_type(tensor.type, dtype)
        if found is not None:
            wanted[tensor.name] = found
    if not wanted:
        return
    for graph in proto_graphs(proto.graph):
        listed = set()
        for value in (*graph.input, *graph.output, *graph.value_info):
            listed.add(value.name)
            if value.name in wanted and value.type.WhichOneof("value") is None:
                value.type.CopyFrom(wanted[value.name])
        # gs writes no value_info for an untyped tensor: the annotations the input model had
        for name in (o for node in graph.node for o in node.output):
            if name in types and name in wanted and name not in listed:
                graph.value_info.add(name=name).type.CopyFrom(wanted[name])


def _rebuilt_type(kind: str, dtype):
    if kind == "optional_type" and isinstance(dtype, onnx.TypeProto):
        return onnx.helper.make_optional_type_proto(dtype)
    if kind == "sequence_type" and isinstance(dtype, np.dtype):
        elem = onnx.helper.make_tensor_type_proto(onnx.helper.np_dtype_to_tensor_dtype(dtype), None)
        return onnx.helper.make_sequence_type_proto(elem)
    return None


def restore_type_attributes(proto_graph: onnx.GraphProto, graph: gs.Graph) -> None:
    """Put the ``TYPE_PROTO`` attributes gs drops on import back on its nodes (gs imports the
    nodes of each graph in order, one for one), subgraphs included."""
    if len(proto_graph.node) != len(graph.nodes):
        return
    for pnode, node in zip(proto_graph.node, graph.nodes):
        for attribute in pnode.attribute:
            if attribute.type == onnx.AttributeProto.TYPE_PROTO:
                node.attrs[attribute.name] = attribute.tp
            elif attribute.type == onnx.AttributeProto.GRAPH and isinstance(node.attrs.get(attribute.name), gs.Graph):
                restore_type_attributes(attribute.g, node.attrs[attribute.name])


# --- graph inputs that are not plain tensors (the data feed) ---------------------------------


def input_layout(type_proto: onnx.TypeProto) -> tuple | None:
    """``(wrappers, elem_type, dims, key_type)`` of a graph input's type: ``wrappers`` the chain of
    ``"optional"`` / ``"sequence"`` / ``"map"`` around the innermost tensor (``()`` for a plain
    tensor), ``elem_type`` its ONNX element type (0: unknown), ``dims`` its ``TensorShapeProto.Dimension``
    list (None: rank unknown), ``key_type`` the ONNX type of the (outermost) map's keys (0: no map).
    None for a type the feed cannot describe (sparse tensors, opaque types)."""
    wrappers, key_type, t = [], 0, type_proto
    while True:
        which = t.WhichOneof("value")
        if which == "tensor_type":
            dims = list(t.tensor_type.shape.dim) if t.tensor_type.HasField("shape") else None
            return tuple(wrappers), t.tensor_type.elem_type, dims, key_type
        if which == "sequence_type":
            wrappers.append("sequence")
            t = t.sequence_type.elem_type
        elif which == "optional_type":
            wrappers.append("optional")
            t = t.optional_type.elem_type
        elif which == "map_type":
            wrappers.append("map")
            key_type = key_type or t.map_type.key_type
            t = t.map_type.value_type
        else:
            return None


def describe(wrappers: tuple, dtype) -> str:
    """``seq(float32)``, ``optional(seq(int64))``, ``map(…, float32)``: for messages."""
    text = str(dtype)
    for kind in reversed(wrappers):
        text = {"sequence": f"seq({text})", "optional": f"optional({text})", "map": f"map(key, {text})"}[kind]
    return text


def check_value(value, wrappers: tuple, tensor, key_kind: str, label: str):
    """``value`` checked against the structure ``wrappers`` (:func:`input_layout`), as ORT takes
    it; each innermost tensor through ``tensor(value, label)``. ``key_kind``: numpy kind of a
    map's keys (``"O"`` strings, ``"i"`` integers). A :class:`UserError` naming ``label``."""
    if not wrappers:
        return tensor(value, label)
    kind, rest = wrappers[0], wrappers[1:]
    if kind == "optional":
        return None if value is None else check_value(value, rest, tensor, key_kind, label)
    if kind == "sequence":
        if isinstance(value, np.ndarray) or not isinstance(value, (list, tuple)):
            raise UserError(f"{label} is a sequence: give a list of arrays, not {type(value).__name__}")
        return [check_value(v, rest, tensor, key_kind, f"{label} element {i}") for i, v in enumerate(value)]
    if not isinstance(value, dict):
        raise UserError(f"{label} is a map: give a dict, not {type(value).__name__}")
    out = {}
    for key, item in value.items():
        if (key_kind == "O") != isinstance(key, str) or not isinstance(key, (str, int, np.integer)):
            want = "strings" if key_kind == "O" else "integers"
            raise UserError(f"{label}: key {key!r} is a {type(key).__name__}; the map's keys are {want}")
        checked = check_value(item, rest, tensor, key_kind, f"{label}[{key!r}]")
        out[key if isinstance(key, str) else int(key)] = checked.item() if isinstance(checked, np.ndarray) \
            and checked.ndim == 0 else checked
    return out


def generate_value(wrappers: tuple, tensor, keys: list):
    """A value of the structure ``wrappers``: innermost tensors from ``tensor()``, a sequence of
    :data:`SEQUENCE_LENGTH` of them, a map with ``keys`` (scalar values), an optional present."""
    if not wrappers:
        return tensor()
    kind, rest = wrappers[0], wrappers[1:]
    if kind == "optional":
        return generate_value(rest, tensor, keys)
    if kind == "sequence":
        return [generate_value(rest, tensor, keys) for _ in range(SEQUENCE_LENGTH)]
    out = {}
    for key in keys:
        item = generate_value(rest, tensor, keys)
        out[key] = item.item() if isinstance(item, np.ndarray) and item.size == 1 else item
    return out


def npz_value(arrays: dict, name: str, wrappers: tuple):
    """The value of input ``name`` in a ``.npz`` file's arrays (module docstring), or raise
    ``KeyError`` when the file has none; a :class:`UserError` for structures a file cannot hold."""
    inner = tuple(w for w in wrappers if w != "optional")
    if not inner:
        return arrays[name]
    if inner == ("sequence",):
        count = 0
        while f"{name}/{count}" in arrays:
            count += 1
        if not count:
            raise KeyError(name)
        return [arrays[f"{name}/{i}"] for i in range(count)]
    if inner == ("map",):
        keys, values = np.asarray(arrays[f"{name}/keys"]), np.asarray(arrays[f"{name}/values"])
        if keys.ndim != 1 or keys.shape != values.shape:
            raise UserError(f"input {name!r}: {name}/keys and {name}/values must be 1-D arrays of one length")
        return {(str(k) if keys.dtype.kind in "US" else int(k)): v for k, v in zip(keys.tolist(), values)}
    raise UserError(f"input {name!r} ({'/'.join(wrappers)}) cannot be read from a .npz file; "
                    "give it through the Python API (calib=[{...}])")
