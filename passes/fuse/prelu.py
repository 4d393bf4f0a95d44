"""``fuse`` rule: ``PRelu`` with a constant slope rewritten as ops ONNX Runtime runs fast.

ONNX Runtime 1.32's CPU ``PRelu`` kernel broadcasts its slope element by element: on MTCNN
P-Net's activation shapes (1×10×118×158, 1×16×57×77, 1×32×55×75) it takes 848, 226 and 585 µs
where ``Mul`` + ``Max`` take 60, 26 and 45 (``Relu`` + ``Min``·``Mul`` + ``Add``: 109, 44,
104), and in P-Net it was 40 % of the run time (``benchmarks/floors.py``, time section). The same
function, element for element (``PRelu(x) = x`` for ``x ≥ 0``, ``s·x`` below)::

    every slope equal, exact in float32   LeakyRelu(x, alpha=s)         (ORT fuses it into Conv)
    0 ≤ s ≤ 1                             Max(x, s·x)                   (s·x ≤ x for x ≥ 0, ≥ x below)
    otherwise                             Relu(x) + s·Min(x, 0)

The outputs are the same numbers (up to the sign of a zero). ``fuse`` runs P-Net at 0.78× of
the original's latency, O-Net at 0.84× (0.995× and 0.939× without the activation rewrites;
``benchmarks/measure_activations.py``, ``benchmarks/results/activations-2026-11-29-s4.md``).
Only constant slopes are rewritten, on opset ≥ 8 (multidirectional ``Max``/``Min``).
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from onnxslim_kit.passes._common.graph import const_value, new_constant

LABEL = "PRelu → LeakyRelu / Mul+Max / Relu+Min·Mul+Add"
MIN_OPSET = 8


def rewrite_prelu(graph: gs.Graph, run) -> int:
    model = run.model
    if model.opset < MIN_OPSET:
        return 0
    count = 0
    for node in [n for n in graph.nodes if n.op == "PRelu"]:
        slope = const_value(node.inputs[1])
        if slope is None:
            run.skip_once(node, "prelu: slope not constant")
            continue
        if slope.dtype.kind != "f":
            continue
        graph.nodes.extend(_replacement(model, node.inputs[0], node.inputs[1], slope, node.outputs[0]))
        node.outputs.clear()
        node.inputs.clear()
        graph.nodes.remove(node)
        count += 1
    return count


def _replacement(model, x, s, slope: np.ndarray, y) -> list:
    """The nodes computing ``y = PRelu(x, s)`` from ``x`` and the constant ``s``."""
    first = slope.reshape(-1)[0]
    if (slope.size and np.all(slope == first) and float(np.float32(first)) == float(first)
            and slope.dtype in (np.float16, np.float32)):  # ORT's CPU LeakyRelu: no double kernel
        return [gs.Node("LeakyRelu", name=model.fresh_name("prelu/LeakyRelu"), inputs=[x], outputs=[y],
                        attrs={"alpha": float(first)})]
    if slope.min(initial=0.0) >= 0 and slope.max(initial=0.0) <= 1:
        scaled = gs.Variable(model.fresh_name("prelu/sx"))
        return [gs.Node("Mul", name=model.fresh_name("prelu/Mul"), inputs=[x, s], outputs=[scaled]),
                gs.Node("Max", name=model.fresh_name("prelu/Max"), inputs=[x, scaled], outputs=[y])]
    zero = new_constant(model, "prelu/zero", np.zeros((), slope.dtype))
    pos, neg, scaled = (gs.Variable(model.fresh_name(f"prelu/{n}")) for n in ("pos", "neg", "sneg"))
    return [gs.Node("Relu", name=model.fresh_name("prelu/Relu"), inputs=[x], outputs=[pos]),
            gs.Node("Min", name=model.fresh_name("prelu/Min"), inputs=[x, zero], outputs=[neg]),
            gs.Node("Mul", name=model.fresh_name("prelu/Mul"), inputs=[neg, s], outputs=[scaled]),
            gs.Node("Add", name=model.fresh_name("prelu/Add"), inputs=[pos, scaled], outputs=[y])]


RULES = [(LABEL, rewrite_prelu)]
