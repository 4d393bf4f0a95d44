"""End-to-end sensitivity of each MatMul/Gemm layer to dynamic int8, from one gated session.

The local error of :mod:`.sensitivity` misses how a layer's error grows on its way to the
outputs (on MiniLM the layer that breaks cos:0.99 ranks 20th of 36 by local error). This
measures each layer alone at the model's outputs, with every layer's quantized twin in one
session behind a switch, instead of one model build per layer::

    x ─▶ MatMul(W) ─────────────────────────────▶ y_f ─┐
    x ─▶ DynamicQuantizeLinear ─▶ DequantizeLinear ─▶ x̂ ─▶ MatMul(Ŵ) ─▶ y_q ─┤ Where(g[ℓ]) ─▶ y
                                                                       g = the gates input

``Ŵ`` is ``W`` rounded to symmetric int8 per output channel (``quantize_columns`` on the [K, N]
view; a Gemm with ``transB`` keeps its layout, the rounding is per row there), ``x̂`` what ORT's
DynamicQuantizeLinear gives back. Gates all off: the float model (checked: the outputs equal the
original's). Layer ℓ alone on: its loss ::

    L_ℓ = max over the float outputs o and samples s of (1 − cos(o_float(s), o_ℓ(s)))

(cosine of the flattened output; an all-zero pair counts as 1). N + 1 configurations × the
samples runs, each one session run.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .sensitivity import dynamic_layers, quantize_columns

GATES = "slim_plan_gates"


def _fresh(taken: set, base: str) -> str:
    name, i = base, 0
    while name in taken:
        i += 1
        name = f"{base}_{i}"
    taken.add(name)
    return name


def gated_model(proto: onnx.ModelProto, layers: list) -> onnx.ModelProto:
    """A copy of ``proto`` with every layer of ``layers`` (``[(node name, x, W as [K, N])]``)
    behind the gate of its index in the bool input ``GATES`` [len(layers)] (module docstring)."""
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    graph = out.graph
    taken = {t for node in graph.node for t in list(node.input) + list(node.output)}
    taken.update(v.name for v in list(graph.input) + list(graph.output) + list(graph.initializer))
    taken.update(node.name for node in graph.node)
    gates = _fresh(taken, GATES)
    graph.input.append(helper.make_tensor_value_info(gates, onnx.TensorProto.BOOL, [len(layers)]))
    index = {name: i for i, (name, _, _) in enumerate(layers)}
    weights = {name: w for name, _, w in layers}
    nodes = []
    for node in graph.node:
        if node.name not in index:
            nodes.append(node)
            continue
        i, y = index[node.name], node.output[0]
        w = weights[node.name]
        transposed = node.op_type == "Gemm" and any(a.name == "transB" and a.i for a in node.attribute)
        w_hat = quantize_columns(w).T if transposed else quantize_columns(w)
        names = {k: _fresh(taken, f"{y}::plan_{k}") for k in ("q", "s", "z", "xhat", "w", "yq", "yf", "idx", "g")}
        graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(w_hat, np.float32), names["w"]))
        graph.initializer.append(numpy_helper.from_array(np.array(i, np.int64), names["idx"]))
        float_node = onnx.NodeProto()
        float_node.CopyFrom(node)
        float_node.output[0] = names["yf"]
        quant_node = onnx.NodeProto()
        quant_node.CopyFrom(node)
        quant_node.name = _fresh(taken, f"{node.name}::plan_quant")
        quant_node.input[0], quant_node.input[1] = names["xhat"], names["w"]
        quant_node.output[0] = names["yq"]
        nodes += [float_node,
                  helper.make_node("DynamicQuantizeLinear", [node.input[0]], [names["q"], names["s"], names["z"]],
                                   name=_fresh(taken, f"{node.name}::plan_dql")),
                  helper.make_node("DequantizeLinear", [names["q"], names["s"], names["z"]], [names["xhat"]],
                                   name=_fresh(taken, f"{node.name}::plan_dq")),
                  quant_node,
                  helper.make_node("Gather", [gates, names["idx"]], [names["g"]], name=_fresh(taken, f"{node.name}::plan_gate")),
                  helper.make_node("Where", [names["g"], names["yq"], names["yf"]], [y],
                                   name=_fresh(taken, f"{node.name}::plan_where"))]
    del graph.node[:]
    graph.node.extend(nodes)
    return out


def _cos_loss(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    if na == 0 and nb == 0:
        return 0.0
    if na == 0 or nb == 0 or not (np.isfinite(na) and np.isfinite(nb)):
        return 1.0
    return float(max(0.0, 1.0 - np.dot(a, b) / (na * nb)))


def layer_losses(proto: onnx.ModelProto, samples: list, layers: list | None = None) -> dict:
    """``{node name: L_ℓ}`` (module docstring) over ``samples``; ``layers`` default
    :func:`.sensitivity.dynamic_layers` of ``proto``."""
    from ..runtime import make_session

    layers = dynamic_layers(proto) if layers is None else layers
    if not layers or not samples:
        return {}
    gated = gated_model(proto, layers)
    gates_input = gated.graph.input[-1].name
    session = make_session(gated, opt_level="disable", threads=1)
    float_outputs = [o.name for o in proto.graph.output
                     if o.type.tensor_type.elem_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE,
                                                         onnx.TensorProto.FLOAT16)]
    feeds = [dict(sample) for sample in samples]
    off = np.zeros(len(layers), bool)
    reference = [session.run(float_outputs, {**feed, gates_input: off}) for feed in feeds]
    losses = {}
    for i, (name, _, _) in enumerate(layers):
        gates = off.copy()
        gates[i] = True
        worst = 0.0
        for feed, ref in zip(feeds, reference):
            got = session.run(float_outputs, {**feed, gates_input: gates})
            worst = max([worst] + [_cos_loss(r, g) for r, g in zip(ref, got)])
        losses[name] = worst
    return losses
