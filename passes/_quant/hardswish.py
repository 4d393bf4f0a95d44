"""Hard-sigmoid, hard-swish and sigmoid gates (SiLU) between Q/DQ points, rewritten into ops ONNX
Runtime runs in int8.

ORT's CPU provider has no QLinear kernel for HardSigmoid or HardSwish (its QDQ selectors cover
Add, Mul, Concat, the pools, Sigmoid, LeakyRelu, Softmax …), so a hard-swish between a Conv's
output Q and the next Conv's input Q stayed float: ``DequantizeLinear → HardSigmoid → Mul →
QuantizeLinear`` four float passes over the tensor, and the NHWC chain of QLinearConvs broken
(PP-OCR's direction classifier: 46 such DequantizeLinear left). With ``α > 0``::

    HardSigmoid(x) = clip(α·x + β, 0, 1) = α · clip(x + β/α, 0, 1/α)

so, ``x̂ = DQ(x_q)`` being already quantized::

    t_q = Q(x̂ + c; s_t = 1 / (255·α), z_t = q_min)        c = β/α, written DQ(c_q)
    h   = DQ(t_q; s_t·α = 1/255, z_t)                       = clip(α·x̂ + β, 0, 1) on a 1/255 grid
    y   = x̂ · h                                             (HardSwish: β = 1/2, α = 1/6)

The saturation of ``Q`` over ``[0, 1/α]`` *is* the clip (``z_t = q_min``, ``q_max·s_t = 1/α``
exactly), so ORT fuses ``DQ, DQ → Add → Q`` into QLinearAdd and ``DQ, DQ → Mul → Q`` into
QLinearMul; the factor ``α`` rides on the DequantizeLinear's scale (``Q`` and ``DQ`` of ``t``
differ by it: each fusion takes its own side's parameters; checked: ORT with and without its
optimisations agree). Error: ``|h − HardSigmoid(x̂)| ≤ 1/510``, i.e. at most ``|x̂|/510`` on
``y`` — of the order of the output's own quantization step.

A sigmoid gate ``y = x̂ · σ(x̂)`` (SiLU / swish: YOLOv5–v8, ddddocr; or ``x̂₁ · σ(x̂₂)``) has
kernels of its own — ``DQ → Sigmoid → Q`` fuses into QLinearSigmoid (a 256-entry table), ``DQ, DQ →
Mul → Q`` into QLinearMul — but int8's Q points are the layers' inputs, so it ran as ``DQ → Sigmoid
→ Mul → Q`` in float between two QLinearConvs (ddddocr's int8 floor: 11 of them, 0.85× of ``fuse``
where ORT's ``quantize_static``, which puts Q/DQ around every op, ran 0.71×). ``σ`` has a known
range, so its Q point needs no calibration::

    s_q = Q(σ(x̂); 1/255, q_min),     y = x̂ · DQ(s_q; 1/255, q_min)

Error: ``|DQ(s_q) − σ(x̂)| ≤ 1/510``, at most ``|x̂|/510`` on ``y`` (as the hard-sigmoid's).

Conditions (a node is left as it is otherwise):

1. ``HardSigmoid`` with ``α > 0``, ``HardSwish`` or ``Sigmoid``, of the main graph;
2. its input is the output of an activation ``DequantizeLinear`` (not a weight's), per tensor,
   uint8 (with int8 activations ORT 1.32's CPU provider fuses no QLinearAdd / QLinearMul — nor
   the Conv reading them: checked — so the float HardSigmoid is left as the cheaper form);
3. HardSigmoid and Sigmoid: every reader is a ``Mul`` whose other input is also an activation
   ``DequantizeLinear`` output and whose output is read only by ``QuantizeLinear`` nodes
   (else the Mul stays float and nothing is gained); HardSwish: its output is read only by
   ``QuantizeLinear`` nodes; neither output is a graph output.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from onnxslim_kit.passes._common.graph import attr, consumers, is_graph_output, is_onnx_op, new_constant, producer

QMIN = {np.dtype(np.uint8): 0}  # the activation types rewritten (condition 2)


def _activation_dq(tensor) -> gs.Node | None:
    """The per-tensor activation DequantizeLinear that makes ``tensor`` (condition 2), or None."""
    node = producer(tensor)
    if node is None or not is_onnx_op(node, "DequantizeLinear") or isinstance(node.inputs[0], gs.Constant):
        return None
    scale = node.inputs[1]
    zero = node.inputs[2] if len(node.inputs) > 2 else None
    if not isinstance(scale, gs.Constant) or np.ndim(scale.values) != 0:
        return None
    if not isinstance(zero, gs.Constant) or np.asarray(zero.values).dtype not in QMIN:
        return None
    return node


def _only_quantized(tensor, graph) -> bool:
    readers = consumers(tensor)
    return bool(readers) and not is_graph_output(tensor, graph) and all(is_onnx_op(r, "QuantizeLinear")
                                                                        for r in readers)


def _copy_dq(model, graph, dq: gs.Node) -> gs.Variable:
    out = gs.Variable(model.fresh_name("int8/dq"), dtype=np.float32, shape=dq.outputs[0].shape)
    graph.nodes.append(gs.Node("DequantizeLinear", name=model.fresh_name("int8/DequantizeLinear"),
                               inputs=list(dq.inputs), outputs=[out], attrs=dict(dq.attrs)))
    return out


def _quantized_gate(model, graph, dq: gs.Node, x_hat: gs.Variable, alpha: float, beta: float, readers: int) -> list:
    """``DQ(Q(x̂ + β/α; 1/(255α), q_min); 1/255, q_min)`` (module docstring), one DQ per reader;
    ``x̂`` is read by the Add alone. Returns the DQ outputs."""
    dtype = np.asarray(dq.inputs[2].values).dtype
    qmin = QMIN[dtype]
    qmax = qmin + 255
    shift = beta / alpha  # c as DQ(c_q; |c|/255, z): (q_max − q_min)·|c|/255 = c, its negative swapped, 0 as 0
    code, zero = (qmax, qmin) if shift > 0 else (qmin, qmax) if shift < 0 else (qmin, qmin)
    c = gs.Variable(model.fresh_name("int8/hsig_shift"), dtype=np.float32, shape=[])
    graph.nodes.append(gs.Node("DequantizeLinear", name=model.fresh_name("int8/DequantizeLinear"), inputs=[
        new_constant(model, "int8/hsig_shift_q", np.asarray(code, dtype)),
        new_constant(model, "int8/hsig_shift_scale", np.asarray(abs(shift) / 255.0 if shift else 1.0, np.float32)),
        new_constant(model, "int8/hsig_shift_zp", np.asarray(zero, dtype))], outputs=[c]))
    added = gs.Variable(model.fresh_name("int8/hsig_add"), dtype=np.float32, shape=x_hat.shape)
    graph.nodes.append(gs.Node("Add", name=model.fresh_name("int8/Add"), inputs=[x_hat, c], outputs=[added]))
    return _on_grid(model, graph, added, 1.0 / (255.0 * alpha), dtype, readers, "hsig")


def _on_grid(model, graph, x: gs.Variable, q_scale: float, dtype, readers: int, label: str) -> list:
    """``DQ(Q(x; q_scale, q_min); 1/255, q_min)``, one DQ per reader: a gate in ``[0, 1]`` on the
    fixed grid 1/255 (``q_scale`` = 1/255 over what maps to 1). Returns the DQ outputs."""
    zero = new_constant(model, f"int8/{label}_zp", np.asarray(QMIN[dtype], dtype))
    x_q = gs.Variable(model.fresh_name(f"int8/{label}_q"), dtype=dtype, shape=x.shape)
    graph.nodes.append(gs.Node("QuantizeLinear", name=model.fresh_name("int8/QuantizeLinear"),
                               inputs=[x, new_constant(model, f"int8/{label}_q_scale",
                                                       np.asarray(q_scale, np.float32)), zero],
                               outputs=[x_q]))
    gate_scale = new_constant(model, f"int8/{label}_dq_scale", np.asarray(1.0 / 255.0, np.float32))
    outs = []
    for _ in range(readers):
        h = gs.Variable(model.fresh_name(f"int8/{label}"), dtype=np.float32, shape=x.shape)
        graph.nodes.append(gs.Node("DequantizeLinear", name=model.fresh_name("int8/DequantizeLinear"),
                                   inputs=[x_q, gate_scale, zero], outputs=[h]))
        outs.append(h)
    return outs


def _gated_muls(out, graph) -> list | None:
    """The Muls reading the gate ``out`` (condition 3), or None when a reader is not such a Mul."""
    muls = consumers(out)
    if is_graph_output(out, graph) or not muls:
        return None
    for mul in muls:
        others = [t for t in mul.inputs if t is not out]
        if (not is_onnx_op(mul, "Mul") or len(mul.inputs) != 2 or len(others) != 1
                or _activation_dq(others[0]) is None or not _only_quantized(mul.outputs[0], graph)):
            return None
    return muls


def _hard_sigmoid(model, graph, node: gs.Node) -> bool:
    alpha, beta = float(attr(node, "alpha", 0.2)), float(attr(node, "beta", 0.5))
    dq = _activation_dq(node.inputs[0])
    out = node.outputs[0]
    muls = _gated_muls(out, graph)
    if alpha <= 0 or dq is None or muls is None:
        return False
    x_hat = node.inputs[0] if len(consumers(node.inputs[0])) == 1 else _copy_dq(model, graph, dq)
    gates = _quantized_gate(model, graph, dq, x_hat, alpha, beta, len(muls))
    for mul, gate in zip(muls, gates):
        mul.inputs[[i for i, t in enumerate(mul.inputs) if t is out][0]] = gate
    node.inputs.clear()
    node.outputs.clear()
    graph.nodes.remove(node)
    return True


def _hard_swish(model, graph, node: gs.Node) -> bool:
    dq = _activation_dq(node.inputs[0])
    out = node.outputs[0]
    if dq is None or not _only_quantized(out, graph):
        return False
    x_hat = node.inputs[0] if len(consumers(node.inputs[0])) == 1 else _copy_dq(model, graph, dq)
    gate = _quantized_gate(model, graph, dq, x_hat, 1.0 / 6.0, 0.5, 1)[0]
    x_mul = _copy_dq(model, graph, dq)
    node.inputs.clear()
    node.outputs.clear()
    graph.nodes.remove(node)
    graph.nodes.append(gs.Node("Mul", name=model.fresh_name("int8/Mul"), inputs=[x_mul, gate], outputs=[out]))
    return True


def _sigmoid_gate(model, graph, node: gs.Node) -> bool:
    """``σ(x̂)`` put on the fixed grid ``1/255`` (module docstring, the sigmoid gate) before its Muls."""
    dq = _activation_dq(node.inputs[0])
    out = node.outputs[0]
    muls = _gated_muls(out, graph)
    if dq is None or muls is None:
        return False
    if len(consumers(node.inputs[0])) > 1:  # x̂ read by the Mul too: the Sigmoid gets a DQ of its own
        node.inputs[0] = _copy_dq(model, graph, dq)
    gates = _on_grid(model, graph, out, 1.0 / 255.0, np.asarray(dq.inputs[2].values).dtype, len(muls), "sigmoid")
    for mul, gate in zip(muls, gates):
        mul.inputs[[i for i, t in enumerate(mul.inputs) if t is out][0]] = gate
    return True


REWRITES = {"HardSigmoid": (_hard_sigmoid, "HardSigmoid→QLinearAdd"),
            "HardSwish": (_hard_swish, "HardSwish→QLinearAdd+QLinearMul"),
            "Sigmoid": (_sigmoid_gate, "Sigmoid gate→QLinearSigmoid+QLinearMul")}


def quantize_hard_activations(model, graph: gs.Graph, result=None) -> int:
    """Rewrite every HardSigmoid (with its Muls), HardSwish and Sigmoid gate (with its Muls) of
    ``graph`` that meets the module docstring's conditions; returns the count (counted in
    ``result`` as rewrites)."""
    count = 0
    for node in [n for n in graph.nodes if is_onnx_op(n, *REWRITES)]:
        rewrite, label = REWRITES[node.op]
        done = rewrite(model, graph, node)
        if done and result is not None:
            result.rewrite(label)
        count += done
    return count
