"""Estimated multiply–accumulates (MACs) of one inference, from tensor shapes.

One MAC is one multiply and one add of a dot product (FLOPs ≈ 2 · MACs). Shapes come from
``onnx.shape_inference`` after the graph inputs are fixed to the shapes actually benchmarked.
With ``|T|`` the number of elements of tensor ``T``:

==========================================  ===============================================
op                                          MACs
==========================================  ===============================================
Conv, ConvInteger, QLinearConv              ``|Y| · ∏ W.shape[1:]``  (W = [C_out, C_in/group, k…])
ConvTranspose                               ``|X| · ∏ W.shape[1:]``  (W = [C_in, C_out/group, k…])
Gemm, FusedGemm, QGemm                      ``M · N · K`` = ``|Y| · K`` (Y unknown: M from A, N from B)
MatMul, MatMulInteger, QLinearMatMul,       ``|Y| · K``, K = last dimension of A
MatMulIntegerToFloat, DynamicQuantizeMatMul
LSTM, GRU, RNN                              ``T · B · (|W| + |R|)`` = T·B·D·G·H·(I + H), G = 4/3/1 gates
==========================================  ===============================================

Other ops (element-wise, pooling, normalisation, Softmax…) are cheap next to these and are
not counted. Shapes that inference leaves open in the main graph are measured by one ORT
run when a sample is given; a counted op whose shapes stay unknown adds 1 to ``unresolved``
instead of guessing. ``If`` counts its larger branch; ``Loop``/``Scan`` bodies count one
iteration (the trip count is data). The com.microsoft forms (FusedConv, FusedMatMul, QGemm,
MatMulIntegerToFloat, DynamicQuantizeMatMul…) are those of graphs ORT saved after its
optimisations (:mod:`.executed`), counted with the formula of their ONNX counterpart.
"""

from __future__ import annotations

import math

import onnx

from .activations import iter_activations

# op: index of W (com.microsoft Fused* ops appear in models saved after ORT optimisation)
CONV = {"Conv": 1, "ConvInteger": 1, "QLinearConv": 3, "FusedConv": 1}
MATMUL = {"MatMul": 0, "MatMulInteger": 0, "QLinearMatMul": 0, "FusedMatMul": 0,  # op: index of A
          "MatMulIntegerToFloat": 0, "DynamicQuantizeMatMul": 0}
GEMM = {"Gemm": 1, "FusedGemm": 1, "QGemm": 3}  # op: index of B
RNN = {"LSTM", "GRU", "RNN"}


def estimate_macs(proto: onnx.ModelProto, input_shapes: dict | None = None, feed: dict | None = None) -> tuple:
    """``(macs, unresolved)`` of ``proto`` with its inputs fixed to ``input_shapes``
    (``{name: shape}``); ``(None, None)`` when shape inference fails outright.

    With ``feed`` (one input sample), main-graph tensors whose shapes inference leaves open
    are measured by running the model once with them exposed as outputs."""
    model = inferred(proto, input_shapes)
    if model is None:
        return None, None
    macs, unresolved = graph_macs(model.graph, {})
    if unresolved and feed is not None:
        measured = _measured(proto, model.graph, feed)
        if measured is not None:
            macs, unresolved = graph_macs(model.graph, measured)
    return macs, unresolved


def inferred(proto: onnx.ModelProto, input_shapes: dict | None = None) -> onnx.ModelProto | None:
    """A copy of ``proto`` with its inputs fixed to ``input_shapes`` and shapes inferred
    (None when inference fails outright)."""
    import tempfile

    from .streaming import checker_view

    with tempfile.TemporaryDirectory(prefix="slim-macs-") as folder:
        # a copy without the weights (stubs into a sparse file): shape inference reads the
        # values of integer tensors only, which the view keeps
        return _inferred(checker_view(proto, folder), input_shapes)


def _inferred(model: onnx.ModelProto, input_shapes: dict | None) -> onnx.ModelProto | None:
    for value in model.graph.input:
        shape = (input_shapes or {}).get(value.name)
        if shape is None or not value.type.HasField("tensor_type"):
            continue
        dims = value.type.tensor_type.shape
        del dims.dim[:]
        for d in shape:
            dims.dim.add().dim_value = int(d)
    try:
        return onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    except Exception:  # noqa: BLE001 - inference raises several types (and fails on >2 GB)
        return None


def _measured(proto: onnx.ModelProto, graph: onnx.GraphProto, feed: dict, arrays: dict | None = None) -> dict | None:
    """``{name: shape}`` of the main-graph tensors counted nodes need and inference left open,
    from one ORT run of ``proto`` on ``feed`` (None when ORT cannot run it); ``arrays``: the
    values of its in-memory stubs (:meth:`.model.Model.session_proto`)."""
    try:
        measured = next(iter_activations(proto, _unknown_tensors(graph), [feed], arrays=arrays))
    except Exception:  # noqa: BLE001 - ORT may not run it; keep the inferred count
        return None
    return {k: list(v.shape) for k, v in measured.items()}


def main_shapes(proto: onnx.ModelProto, input_shapes: dict | None = None, feed: dict | None = None,
                arrays: dict | None = None) -> dict:
    """``{name: shape}`` of ``proto``'s main-graph tensors whose shapes are known: inferred at
    ``input_shapes``, and with ``feed`` those counted nodes need measured by one run
    (``arrays``: as :func:`_measured`)."""
    model = inferred(proto, input_shapes)
    if model is None:
        return {}
    shapes = graph_shapes(model.graph, {})
    if feed is not None and _unknown_tensors(model.graph):
        shapes.update(_measured(proto, model.graph, feed, arrays) or {})
    return shapes


def _unknown_tensors(graph: onnx.GraphProto) -> list:
    """Names of the main-graph tensors a counted node needs but shape inference did not give."""
    shapes = graph_shapes(graph, {})
    names = []
    for node in graph.node:
        if node_macs(node, shapes) is None:
            names += [n for n in list(node.input[:4]) + list(node.output[:1]) if n and n not in shapes]
    return list(dict.fromkeys(names))


def graph_shapes(graph: onnx.GraphProto, outer: dict) -> dict:
    """``{name: shape}`` of one graph's fully known tensors (value_info, initializers, Constant
    outputs), over ``outer`` (the shapes of enclosing scopes or measured ones)."""
    shapes = dict(outer)
    for value in list(graph.input) + list(graph.value_info) + list(graph.output):
        if value.type.HasField("tensor_type") and value.type.tensor_type.HasField("shape"):
            dims = value.type.tensor_type.shape.dim
            if all(d.HasField("dim_value") for d in dims):
                shapes[value.name] = [d.dim_value for d in dims]
    for tensor in graph.initializer:
        shapes[tensor.name] = list(tensor.dims)
    for node in graph.node:
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.TENSOR:
                    shapes[node.output[0]] = list(attr.t.dims)
    return shapes


def graph_macs(graph: onnx.GraphProto, outer: dict) -> tuple:
    """``(macs, unresolved)`` of one graph; ``outer`` holds the shapes of enclosing scopes."""
    shapes = graph_shapes(graph, outer)
    total, unresolved = 0, 0
    for node in graph.node:
        subgraphs = [a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH]
        if subgraphs:
            results = [graph_macs(g, shapes) for g in subgraphs]
            total += max(r[0] for r in results)
            unresolved += max(r[1] for r in results)
            continue
        macs = node_macs(node, shapes)
        if macs is None:
            unresolved += 1
        else:
            total += macs
    return total, unresolved


def _shape_of(node: onnx.NodeProto, shapes: dict):
    def shape(index: int, outputs: bool = False):
        names = node.output if outputs else node.input
        return shapes.get(names[index]) if index < len(names) and names[index] else None

    return shape


def _trans_a(node: onnx.NodeProto) -> bool:
    return any(at.name == "transA" and at.i for at in node.attribute)


def _conv_macs(node, shape):
    y, w = shape(0, outputs=True), shape(CONV[node.op_type])
    return None if y is None or w is None else math.prod(y) * math.prod(w[1:])


def _conv_transpose_macs(node, shape):
    x, w = shape(0), shape(1)
    return None if x is None or w is None else math.prod(x) * math.prod(w[1:])


def _gemm_macs(node, shape):
    a, y, b = shape(0), shape(0, outputs=True), shape(GEMM[node.op_type])
    if a is None or len(a) != 2:
        return None
    k = a[0] if _trans_a(node) else a[1]
    if y is None and b is not None and len(b) == 2:  # Y = M × N from A and B (ORT's MatMul+Add → Gemm)
        transposed = any(at.name == "transB" and at.i for at in node.attribute)
        y = [a[1] if _trans_a(node) else a[0], b[0] if transposed else b[1]]
    return None if y is None else math.prod(y) * k


def _matmul_macs(node, shape):
    a, y = shape(MATMUL[node.op_type]), shape(0, outputs=True)
    if not a or y is None:
        return None
    return math.prod(y) * (a[-2] if _trans_a(node) and len(a) > 1 else a[-1])  # transA: FusedMatMul


def _rnn_macs(node, shape):
    x, w, r = shape(0), shape(1), shape(2)
    if x is None or w is None or r is None or len(x) != 3:
        return None
    return x[0] * x[1] * (math.prod(w) + math.prod(r))  # T·B or B·T: the product is the same


def _counter(op: str):
    if op in CONV:
        return _conv_macs
    if op == "ConvTranspose":
        return _conv_transpose_macs
    if op in GEMM:
        return _gemm_macs
    if op in MATMUL:
        return _matmul_macs
    return _rnn_macs if op in RNN else None


def node_macs(node: onnx.NodeProto, shapes: dict) -> int | None:
    """MACs of one node (0 for ops not counted), None when a needed shape is unknown."""
    if node.domain not in ("", "ai.onnx", "com.microsoft"):
        return 0
    counter = _counter(node.op_type)
    return 0 if counter is None else counter(node, _shape_of(node, shapes))
