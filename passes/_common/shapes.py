"""Element types and shapes of gs tensors, completed by ONNX shape inference.

gs tensors carry ``dtype`` and ``shape`` from the model's value_info. :func:`infer_shapes` runs
ONNX shape inference on the exported model (intermediate value_info removed, so stale
annotations cannot contradict it) and returns a :class:`ShapeTable`: a side table owned by
the caller (a pass run, :class:`~onnxslim_kit.passes._common.match.RuleRun`), keyed by tensor
identity — *not* written into ``dtype``/``shape``: exported models get no new value_info, so a
later pass that changes shapes cannot be tripped by stale annotations.

Per dim, an inferred int wins, else the declared one (an int, else the inferred symbol, else
the declared symbol). :meth:`ShapeTable.shape` / :meth:`ShapeTable.elem_type` read the
inferred value first, then the declared one; an empty table gives the declared values. A dim
is an ``int`` when known, else a ``str`` (symbolic) or ``None``.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from onnxslim_kit.model import proto_graphs


def _is_int(dim) -> bool:
    return isinstance(dim, (int, np.integer)) and not isinstance(dim, bool)


class ShapeTable:
    """Inferred ``(elem_type, dims)`` per tensor, keyed by the tensor object (renames follow it)."""

    def __init__(self):
        self._info: dict = {}  # id(tensor) -> (tensor, elem, dims); the tensor is kept so ids stay unique

    def __len__(self) -> int:
        return len(self._info)

    def record(self, tensor, elem, dims) -> None:
        self._info[id(tensor)] = (tensor, elem, dims)

    def inferred(self, tensor) -> tuple | None:
        entry = self._info.get(id(tensor))
        return entry[1:] if entry is not None and entry[0] is tensor else None

    def elem_type(self, tensor) -> int | None:
        """The ONNX element type (``onnx.TensorProto.FLOAT`` …) of a tensor, or None if unknown."""
        if isinstance(tensor, gs.Constant):
            export = getattr(tensor, "export_dtype", None)
            dtype = export if export is not None else tensor.dtype
        else:
            info = self.inferred(tensor)
            if info is not None and info[0]:
                return info[0]
            dtype = tensor.dtype
        return _onnx_type(dtype)

    def shape(self, tensor) -> list | None:
        """The shape as a list (dims int / str / None), or None when even the rank is unknown."""
        if isinstance(tensor, gs.Constant):
            return list(tensor.shape)
        info = self.inferred(tensor)
        if info is not None and info[1] is not None:
            return list(info[1])
        if tensor.shape is None:
            return None
        return list(tensor.shape)

    def static(self, tensor) -> list | None:
        """The shape if every dim is a known int, else None."""
        shape = self.shape(tensor)
        if shape is None or not all(_is_int(d) for d in shape):
            return None
        return [int(d) for d in shape]


def _onnx_type(dtype) -> int | None:
    if dtype is None:
        return None
    if isinstance(dtype, (int, np.integer)) and not isinstance(dtype, bool):
        return int(dtype)
    try:
        return int(onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))
    except (TypeError, KeyError, ValueError):
        return None


DECLARED = ShapeTable()
"""An empty table: declared types and shapes only (never written to)."""


def elem_type(tensor) -> int | None:
    """The declared element type (no inference)."""
    return DECLARED.elem_type(tensor)


def infer_shapes(model) -> tuple:
    """``(ShapeTable, problem)``: ONNX shape inference on ``model``; ``problem`` None or one line.

    On a problem the table is empty (declared shapes only).
    """
    table = ShapeTable()
    try:
        proto = model.to_proto(weights=False)  # shape inference reads no float weights
    except Exception as exc:  # noqa: BLE001 - gs export raises several types
        return table, f"export failed ({_first_line(exc)})"
    if proto.ByteSize() > 2**31 - 1:
        return table, "model over 2 GB, skipped"
    for sub in proto_graphs(proto.graph):
        del sub.value_info[:]
    try:
        inferred = onnx.shape_inference.infer_shapes(proto, check_type=False, strict_mode=False, data_prop=True)
    except Exception as exc:  # noqa: BLE001 - InferenceError, ValidationError, RuntimeError
        return table, _first_line(exc)
    _apply_inferred(table, model.graph, inferred.graph)
    return table, None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:200]


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


def _merged(dims, declared):
    """Per dim: an inferred int, else a declared int, else the inferred symbol, else the declared one."""
    if dims is None or declared is None or len(declared) != len(dims):
        return dims
    return [d if _is_int(d) else (o if _is_int(o) else (d or o)) for d, o in zip(dims, declared)]


def _apply_inferred(table: ShapeTable, graph: gs.Graph, proto: onnx.GraphProto) -> None:
    infos = {}
    for vi in list(proto.input) + list(proto.output) + list(proto.value_info):
        info = _type_info(vi)
        if info is not None:
            infos[vi.name] = info
    for tensor in graph.tensors().values():
        if isinstance(tensor, gs.Constant) or tensor.name not in infos:
            continue
        elem, dims = infos[tensor.name]
        table.record(tensor, elem, _merged(dims, tensor.shape))
    if len(graph.nodes) != len(proto.node):
        return
    for node, pnode in zip(graph.nodes, proto.node):
        if node.op != pnode.op_type:
            return
        by_name = {a.name: a for a in pnode.attribute}
        for name, value in node.attrs.items():
            if isinstance(value, gs.Graph) and name in by_name and by_name[name].type == onnx.AttributeProto.GRAPH:
                _apply_inferred(table, value, by_name[name].g)
