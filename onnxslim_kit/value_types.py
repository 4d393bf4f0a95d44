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
"""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from .protos import proto_graphs


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
