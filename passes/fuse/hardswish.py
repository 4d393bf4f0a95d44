"""``fuse`` rule: the hard-swish written out in elementary ops becomes one (or two) ops.

PaddlePaddle (and other exporters before opset 14) write ``hardswish(x) = x·relu6(x + 3)/6``
and ``hardsigmoid(x) = relu6(x + 3)/6`` as chains of elementwise ops, four passes over the
tensor where ONNX Runtime has one kernel::

    a = Add(x, 3); c = Clip(a, 0, 6); m = Mul(x, c); y = Div(m, 6)   →  y = HardSwish(x)      (opset ≥ 14)
                                                                     →  y = x · HardSigmoid(x; 1/6, ½)
    a = Add(x, 3); c = Clip(a, 0, 6); y = Div(c, 6)                   →  y = HardSigmoid(x; 1/6, ½)

(``Div(·, 6)`` may also be ``Mul(·, 1/6)``; float16 and float32 only: ONNX Runtime's CPU
provider has no double HardSigmoid / HardSwish.) ``HardSigmoid(x; α, β) = max(0, min(1, αx + β))``
is ``relu6(x + 3)/6`` for α = 1/6, β = ½, up to float rounding (about 5e-7 of the value: not
bitwise, within the lossless tolerance). Each intermediate must be read by the next op only.
``fuse`` runs PP-OCRv4 det at 0.857× of the original's latency, rec at 0.829×, the PP-OCR
direction classifier at 0.726× (0.942×, 0.945×, 0.983× without the activation rewrites;
``benchmarks/measure_activations.py``, ``benchmarks/results/activations-2026-11-29-s4.md``).
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from onnxslim_kit.passes.fuse.fold_common import FEEDS_QUANTIZER, feeds_quantizer, split_constant
from onnxslim_kit.passes._common.graph import attr, const_value, is_onnx_op, only_consumer, producer

LABEL = "hard-swish / hard-sigmoid chain → HardSwish / HardSigmoid"
SIXTH = 1.0 / 6.0
KERNEL_TYPES = (np.float16, np.float32)  # ONNX Runtime's CPU HardSigmoid / HardSwish: no double kernel


def _scalar_of(value) -> float | None:
    """The number a one-element float array holds (None for anything else)."""
    return float(value.reshape(-1)[0]) if value is not None and value.size == 1 and value.dtype.kind == "f" else None


def _scalar(tensor) -> float | None:
    return _scalar_of(const_value(tensor))


def _other_input(node, known):
    """The input of a two-input ``node`` that is not ``known``, or None."""
    a, b = node.inputs[0], node.inputs[1]
    return b if a is known else a if b is known else None


def _clip_is_relu6(clip, opset: int) -> bool:
    if opset < 11:
        return attr(clip, "min") == 0.0 and attr(clip, "max") == 6.0
    bounds = [_scalar(t) if t is not None and t.name else None for t in clip.inputs[1:3]]
    return len(bounds) == 2 and bounds == [0.0, 6.0]


def _divides_by_six(node, tensor) -> bool:
    """``node`` computes ``tensor / 6`` (a Div by 6 or a Mul by 1/6 as float32)."""
    if node is None:
        return False
    if is_onnx_op(node, "Div") and node.inputs[0] is tensor:
        return _scalar(node.inputs[1]) == 6.0
    if is_onnx_op(node, "Mul"):
        value, _, other = split_constant(node)
        return other is tensor and _scalar_of(value) == float(np.float32(SIXTH))
    return False


def _match(clip, graph, opset: int):
    """(x, y, nodes to remove, with the Mul by x) for a chain ending at ``clip``'s readers, or None."""
    add = producer(clip.inputs[0])
    if add is None or not is_onnx_op(clip, "Clip") or not is_onnx_op(add, "Add") or not _clip_is_relu6(clip, opset):
        return None
    three, _, x = split_constant(add)
    if _scalar_of(three) != 3.0 or three.dtype not in KERNEL_TYPES or only_consumer(add.outputs[0], graph) is not clip:
        return None
    reader = only_consumer(clip.outputs[0], graph)
    if _divides_by_six(reader, clip.outputs[0]):
        return x, reader.outputs[0], [add, clip, reader], False
    if reader is not None and is_onnx_op(reader, "Mul") and _other_input(reader, clip.outputs[0]) is x:
        last = only_consumer(reader.outputs[0], graph)
        if _divides_by_six(last, reader.outputs[0]):
            return x, last.outputs[0], [add, clip, reader, last], True
    return None


def rewrite_hardswish(graph: gs.Graph, run) -> int:
    model = run.model
    guarded = feeds_quantizer(graph)  # not bit-exact: kept away from quantizer inputs (fold_common)
    count = 0
    for clip in [n for n in graph.nodes if n.op == "Clip"]:
        found = _match(clip, graph, model.opset)
        if found is None:
            continue
        x, y, old, times_x = found
        if any(id(node) in guarded for node in old):
            run.skip_once(clip, FEEDS_QUANTIZER)
            continue
        for node in old:
            node.inputs.clear()
            node.outputs.clear()
            graph.nodes.remove(node)
        if times_x and model.opset >= 14:
            graph.nodes.append(gs.Node("HardSwish", name=model.fresh_name("HardSwish"), inputs=[x], outputs=[y]))
        elif times_x:
            h = gs.Variable(model.fresh_name("hardsigmoid"))
            graph.nodes.append(gs.Node("HardSigmoid", name=model.fresh_name("HardSigmoid"), inputs=[x], outputs=[h],
                                       attrs={"alpha": SIXTH, "beta": 0.5}))
            graph.nodes.append(gs.Node("Mul", name=model.fresh_name("Mul"), inputs=[x, h], outputs=[y]))
        else:
            graph.nodes.append(gs.Node("HardSigmoid", name=model.fresh_name("HardSigmoid"), inputs=[x], outputs=[y],
                                       attrs={"alpha": SIXTH, "beta": 0.5}))
        count += 1
    return count


RULES = [(LABEL, rewrite_hardswish)]
