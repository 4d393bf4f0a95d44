"""Where the ``int8`` pass puts Q/DQ: layers, the tensors around them, selectors, safeguards.

A *layer* is one Conv / MatMul / Gemm of the main graph (the unit that the exclusion
options and the sensitivity fallback switch between int8 and float). Conditions:

1. Conv: float activation input, constant float weight (rank 3–5), bias absent or constant;
2. MatMul: two activations (attention), or activation × constant 2-D weight (per column);
3. Gemm: ``transA = 0``, ``alpha = beta = 1``, constant 2-D ``B``, ``C`` absent or a constant
   vector of ``N`` values;
4. Gather from a constant float table (embeddings) of at least ``MIN_TABLE`` elements: the
   table is stored uint8 per tensor over its ``[min, max]`` and the Gather's output gets a Q
   with the *same* scale and zero point, so that ORT drops the DQ/Q pair and gathers 8-bit
   rows (uint8 because ORT turns int8 activation Q/DQ into uint8 on x86, which would break
   the pair); written as ``Gather(T_q) → DQ → Q → DQ`` (:func:`._quant_qdq.gather_then_dequantize`:
   no float table in a session without optimisations; ORT makes the same graph).

The Q/DQ *points* of a layer, as ORT's QDQ fusion expects them (``DQ → op → Q``): every
activation input, and its output — or, when the output's only reader is a Relu / Clip, that
activation's output (ORT then removes the Relu / Clip: the Q's range does the clipping).
A tensor is quantized once; all its readers see the DQ. One more point: the input of a
GlobalAveragePool whose output is a layer's input (squeeze-excite, :func:`pool_inputs`), so
that ORT runs the pool, the excite Mul and the hard-swish in front in int8 kernels.

Safeguards (each an option) keep tensors float; a layer whose *input* must stay float stays
float entirely, one whose *output* must stay float is quantized on its inputs only:

* ``max_range``: calibrated ``|x|`` above it (e.g. −inf attention masks, ±3.4e38);
* graph outputs are never quantized;
* ``heads``: tensors that reach a Sigmoid / Softmax whose output reaches a graph output
  through shape-only ops (a decision head; SE-block sigmoids are not heads);
* ``log``: tensors at most ``LOG_DEPTH`` elementwise ops upstream of a Log (spectra);
* ``concat_ratio``: outputs of a Concat whose inputs' ``max|x|`` differ by more than this factor.

Selectors (``exclude=`` / ``include=``) are :class:`onnxslim_kit.selection.Selector` s
chosen among these layers: ``first:OP:N`` / ``last:OP:N`` count layers, not every node of
that op type (e.g. ``exclude=last:Conv:1;re:^head``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx_graphsurgeon as gs

from onnxslim_kit.passes._common.graph import attr, const_value, consumers, is_graph_output, is_onnx_op, producer

LAYER_OPS = ("Conv", "MatMul", "Gemm", "Gather")
MIN_TABLE = 4096  # elements: smaller Gather tables stay float
SHAPE_OPS = {"Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Concat", "Slice",
             "Split", "Cast", "Gather", "ArgMax", "TopK", "Expand"}
AFFINE_OPS = {"Add", "Sub", "Mul", "Div"}
LOG_PATH_OPS = {"Add", "Mul", "Sqrt", "Pow", "Abs", "Clip", "Max", "Min", "Relu", "MatMul", "Reshape",
                "Transpose", "Squeeze", "Unsqueeze", "Slice", "Concat", "ReduceSum", "ReduceMean", "Div",
                "Sub", "Identity", "Cast", "Conv", "Gemm"}
LOG_DEPTH = 6


@dataclass
class Layer:
    node: gs.Node
    weight_index: int | None  # constant weight input; None for activation × activation MatMul
    weight_axis: int | None   # output-channel axis of the weight
    inputs: list              # activation tensors (gs.Variable) to quantize
    output: gs.Variable       # the Q point after the layer (its output or its Relu/Clip's)
    bias: np.ndarray | None = None
    order: int = 0

    @property
    def name(self) -> str:
        return self.node.name


def find_layers(graph: gs.Graph, result) -> list:
    layers = []
    for order, node in enumerate(graph.nodes):
        if not is_onnx_op(node, *LAYER_OPS):
            continue
        layer = _match(node, result)
        if layer is not None:
            layer.order = order
            layer.output = _q_point(node.outputs[0], graph)
            layers.append(layer)
    return layers


def pool_inputs(graph: gs.Graph, layers: list) -> dict:
    """``{X: Y}`` for every ``Y = GlobalAveragePool(X)`` whose ``Y`` is a layer's input (the
    squeeze-excite pattern ``X → GlobalAveragePool → Conv … → HardSigmoid → Mul(X, ·)``): ``X``
    is an extra Q point, so ORT runs the pool as QLinearGlobalAveragePool, the excite Mul as
    QLinearMul and the hard-swish that makes ``X`` in int8 (:mod:`onnxslim_kit.passes._quant.hardswish`)."""
    inputs = {t.name for l in layers for t in l.inputs}
    found = {}
    for node in graph.nodes:
        if is_onnx_op(node, "GlobalAveragePool") and node.outputs[0].name in inputs and _is_float_var(node.inputs[0]) \
                and not is_graph_output(node.inputs[0], graph) and producer(node.inputs[0]) is not None:
            found[node.inputs[0].name] = node.outputs[0].name
    return found


def _is_float_var(t) -> bool:
    return isinstance(t, gs.Variable) and (t.dtype is None or np.dtype(t.dtype) == np.float32)


def _match(node: gs.Node, result) -> Layer | None:
    """The layer ``node`` is, or None with a counted reason (conditions 1–4 of the docstring)."""
    return _MATCHERS[node.op](node, result)


def _match_conv(node: gs.Node, result) -> Layer | None:
    ins = node.inputs
    w = const_value(ins[1]) if len(ins) > 1 else None
    if not _is_float_var(ins[0]) or w is None or w.dtype != np.float32 or not 3 <= w.ndim <= 5:
        return result.skip("Conv: weight not a float constant")
    bias = const_value(ins[2]) if len(ins) > 2 else None
    if len(ins) > 2 and bias is None:
        return result.skip("Conv: bias not constant")
    return Layer(node, 1, 0, [ins[0]], node.outputs[0], bias)


def _match_gather(node: gs.Node, result) -> Layer | None:
    ins = node.inputs
    table = const_value(ins[0])
    if table is None or table.dtype != np.float32 or table.size < MIN_TABLE or const_value(ins[1]) is not None:
        return result.skip("Gather: not a float table of at least 4096 values")
    return Layer(node, 0, None, [], node.outputs[0])


def _match_matmul(node: gs.Node, result) -> Layer | None:
    ins = node.inputs
    a, b = const_value(ins[0]), const_value(ins[1])
    if a is None and b is None and _is_float_var(ins[0]) and _is_float_var(ins[1]):
        return Layer(node, None, None, [ins[0], ins[1]], node.outputs[0])
    if a is None and b is not None and b.ndim == 2 and b.dtype == np.float32 and _is_float_var(ins[0]):
        return Layer(node, 1, 1, [ins[0]], node.outputs[0])
    return result.skip("MatMul: constant A or weight of rank ≠ 2")


def _match_gemm(node: gs.Node, result) -> Layer | None:
    ins = node.inputs
    b = const_value(ins[1])
    c = const_value(ins[2]) if len(ins) > 2 else None
    if attr(node, "transA", 0) or attr(node, "alpha", 1.0) != 1.0 or attr(node, "beta", 1.0) != 1.0:
        return result.skip("Gemm: transA or alpha/beta ≠ 1")
    if b is None or b.ndim != 2 or b.dtype != np.float32 or not _is_float_var(ins[0]):
        return result.skip("Gemm: B not a float constant")
    n = b.shape[0] if attr(node, "transB", 0) else b.shape[1]
    if len(ins) > 2 and (c is None or c.size != n or c.ndim > 1 and c.shape[-1] != n):
        return result.skip("Gemm: C not a constant vector")
    bias = c.reshape(n) if c is not None else None
    return Layer(node, 1, 0 if attr(node, "transB", 0) else 1, [ins[0]], node.outputs[0], bias)


_MATCHERS = {"Conv": _match_conv, "Gather": _match_gather, "MatMul": _match_matmul, "Gemm": _match_gemm}


def _q_point(out: gs.Variable, graph: gs.Graph) -> gs.Variable:
    if is_onnx_op(producer(out), "Gather"):
        return out  # its Q must follow it directly (same scale as the table)
    users = consumers(out)
    if len(users) == 1 and not is_graph_output(out, graph) and is_onnx_op(users[0], "Relu", "Clip"):
        clip = users[0]
        if clip.op == "Relu" or all(const_value(t) is not None for t in clip.inputs[1:] if t is not None):
            return clip.outputs[0]
    return out


# --- safeguards -----------------------------------------------------------------------------

@dataclass
class Guards:
    max_range: float = 1e4
    heads: bool = True
    log: bool = True
    concat_ratio: float = 16.0
    reasons: dict = field(default_factory=dict)  # tensor name -> reason


def concat_inputs(layers: list) -> list:
    """Extra tensors to calibrate for the Concat safeguard: inputs of Concats feeding Q points."""
    extra = []
    for t in {id(t): t for l in layers for t in l.inputs + [l.output]}.values():
        node = producer(t)
        if node is not None and is_onnx_op(node, "Concat"):
            extra.extend(x for x in node.inputs if isinstance(x, gs.Variable))
    return extra


def float_tensors(graph: gs.Graph, layers: list, stats: dict, guards: Guards) -> dict:
    """``{tensor name: reason}`` for Q points that must stay float."""
    reasons = {}
    points = {id(t): t for l in layers for t in l.inputs + [l.output]}.values()
    heads = _head_tensors(graph) if guards.heads else set()
    logs = _log_tensors(graph) if guards.log else set()
    for t in points:
        s = stats.get(t.name)
        if is_graph_output(t, graph):
            reasons[t.name] = "graph output"
        elif s is None or s.count == 0:
            reasons[t.name] = "no calibration data"
        elif guards.max_range and s.absmax > guards.max_range:
            reasons[t.name] = f"range above {guards.max_range:g}"
        elif t.name in heads:
            reasons[t.name] = "feeds a Sigmoid/Softmax head"
        elif t.name in logs:
            reasons[t.name] = "feeds a Log"
        elif guards.concat_ratio and _uneven_concat(t, stats, guards.concat_ratio):
            reasons[t.name] = "Concat of uneven ranges"
    return reasons


def _head_tensors(graph: gs.Graph) -> set:
    """Tensors upstream of a decision head (Sigmoid/Softmax reaching an output via shape ops)."""
    out = set()
    for node in graph.nodes:
        if is_onnx_op(node, "Sigmoid", "Softmax", "LogSoftmax") and _reaches_output(node.outputs[0], graph):
            tensor = node.inputs[0]
            for _ in range(8):  # walk up through shape-only ops and constant bias / scale
                out.add(tensor.name)
                up = producer(tensor)
                if up is None or not up.inputs or not (
                    is_onnx_op(up, *SHAPE_OPS) or is_onnx_op(up, *AFFINE_OPS)
                    and sum(const_value(t) is None for t in up.inputs) == 1
                ):
                    break
                tensor = next(t for t in up.inputs if const_value(t) is None)
    return out


def _reaches_output(tensor, graph: gs.Graph, depth: int = 8) -> bool:
    if is_graph_output(tensor, graph):
        return True
    if depth == 0:
        return False
    return any(
        is_onnx_op(user, *SHAPE_OPS) and any(_reaches_output(o, graph, depth - 1) for o in user.outputs)
        for user in consumers(tensor)
    )


def _log_tensors(graph: gs.Graph) -> set:
    out = set()
    frontier = [n.inputs[0] for n in graph.nodes if is_onnx_op(n, "Log")]
    for _ in range(LOG_DEPTH):
        nxt = []
        for tensor in frontier:
            if tensor.name in out:
                continue
            out.add(tensor.name)
            up = producer(tensor)
            if up is not None and is_onnx_op(up, *LOG_PATH_OPS):
                nxt.extend(t for t in up.inputs if isinstance(t, gs.Variable))
        frontier = nxt
    return out


def _uneven_concat(tensor, stats: dict, ratio: float) -> bool:
    node = producer(tensor)
    if node is None or not is_onnx_op(node, "Concat"):
        return False
    peaks = [stats[t.name].absmax for t in node.inputs if t.name in stats and stats[t.name].count]
    peaks = [p for p in peaks if p > 0]
    return len(peaks) > 1 and max(peaks) > ratio * min(peaks)
