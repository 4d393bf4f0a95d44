"""Quantization parameters and Q/DQ insertion for the ``int8`` pass (onnx-graphsurgeon graphs).

Encodings (what ONNX Runtime's CPU provider fuses into QLinearConv / QLinearMatMul / QGemm /
MatMulIntegerToFloat at load time, checked by the tests):

* activations, per tensor, asymmetric over the calibrated ``[lo, hi]`` (``lo ≤ 0 ≤ hi``):
  ``s = (hi − lo) / 255``, ``z = round(−lo / s)`` for uint8, ``z − 128`` for int8; a
  non-negative tensor (after Relu) gets ``z = qmin`` so ORT can drop the Relu before the Q;
* weights, symmetric, per output channel (``DequantizeLinear`` with ``axis``, opset ≥ 13) or
  per tensor, on a grid that ONNX Runtime's integer kernels compute *exactly on every CPU*
  (:func:`weight_grid`): ``s_c = max|W_c| / q``, codes in ``[−q, q]``:

  - MatMul / Gemm: ``q = 127``, stored as uint8 ``W_q + 128`` with zero point 128 (the same
    values; u8·u8 kernels);
  - Conv with more than one input channel per group: ``q = 63`` (7 bits), int8, no zero point;
  - depthwise Conv (one input and one output channel per group): ``q = 127``, int8.

  Why: with uint8 activations and int8 weights, MLAS's u8·s8 GEMMs on x86-64 CPUs with AVX2 /
  AVX-512 but no VNNI add two products into a saturating int16 (``vpmaddubsw``:
  ``2·255·127 = 64770 > 32767``; :mod:`onnxslim_kit.passes._quant.dynamic` has the measurement).
  On such a CPU PP-OCR's direction classifier, int8 at ``[−127, 127]``, ran at cosine 0.97 on
  held-out samples (one evaluation decision flipped at cosine 0.14) while the same file computed
  exactly gave 1.0. ``2·255·63 = 32130`` cannot saturate; u8·u8 takes the widening kernel; the
  depthwise kernel accumulates in int32. The Conv grid costs one bit of weight resolution; uint8
  Conv weights would keep it but run QLinearConv 36 % slower on AVX2
  (``benchmarks/results/int8-saturation-2026-12-02.md``). ``tests/passes/int8/test_int8_exact.py``
  checks that ORT's fused graph equals the QDQ graph computed in float;
* bias, int32 with ``s_b = s_x · s_w`` (per channel), ``z = 0``; when ``b / s_b`` would not
  fit in int32, ``s_w`` of that channel is raised to ``|b_c| / (s_x · (2^31 − 1))``.

Constants are always new arrays (never edited in place); every name comes from
``model.fresh_name("int8/…")``.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from onnxslim_kit.passes._common.constants import merge_equal_constants
from onnxslim_kit.passes._common.graph import consumers, new_constant
from onnxslim_kit.passes._quant.dynamic import dynamic_matmul, unsigned_weight
from onnxslim_kit.passes._quant.hardswish import quantize_hard_activations
from onnxslim_kit.passes._quant.smooth import weight_array

INT32_MAX = 2**31 - 1
QRANGE = {"uint8": (0, 255, np.uint8), "int8": (-128, 127, np.int8)}
QDQ_OPS = {
    "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "QLinearConv", "QLinearMatMul",
    "MatMulInteger", "ConvInteger", "QGemm", "QLinearAdd", "MatMulIntegerToFloat", "DynamicQuantizeMatMul",
    # com.microsoft kernels ONNX Runtime's quantizers write (the QLinear* family is matched by prefix)
    "DynamicQuantizeLSTM", "QAttention", "QEmbedLayerNormalization", "QOrderedMatMul", "QOrderedLayerNormalization",
    "QOrderedGelu", "QOrderedAttention", "QuantizeWithOrder", "DequantizeWithOrder", "MatMulNBits",
    "MatMulBnb4", "GatherBlockQuantized", "QMoE",
}


def is_quantized_op(op: str) -> bool:
    """A Q/DQ or integer op of any domain: :data:`QDQ_OPS`, ``QLinear*``, ``*Integer``,
    ``*IntegerToFloat``."""
    return op in QDQ_OPS or op.startswith("QLinear") or op.endswith(("Integer", "IntegerToFloat"))


def quantized_ops(graphs) -> Counter:
    """How many nodes of each quantized op type (:func:`is_quantized_op`) ``graphs`` hold."""
    return Counter(node.op for graph in graphs for node in graph.nodes if is_quantized_op(node.op))


def is_quantized(graph: gs.Graph) -> bool:
    return any(is_quantized_op(node.op) for node in graph.nodes)


def already_quantized(model, result) -> bool:
    """True when ``model`` already holds quantized ops (a QAT export, an earlier quantizer's
    output): the ``int8`` / ``dynamic`` passes then leave it as it is — it was quantized on
    purpose, with its float layers (if any) kept float on purpose — and say so: the counted
    reason, and a note naming the ops found (``already quantized: 21 DynamicQuantizeLinear,
    21 ConvInteger — …``)."""
    found = quantized_ops(model.all_graphs())
    if not found:
        return False
    result.skip("already quantized (has Q/DQ or integer ops)")
    listed = ", ".join(f"{n} {op}" for op, n in found.most_common())
    result.notes.append(f"already quantized: {listed} — left as it is (start from the float model to "
                        "quantize it again)")
    return True


def activation_params(lo: float, hi: float, dtype: str = "uint8") -> tuple:
    """(scale float32, zero point) for the range [lo, hi] ∋ 0."""
    qmin, qmax, np_type = QRANGE[dtype]
    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
    scale = (hi - lo) / (qmax - qmin)
    if not np.isfinite(scale) or scale <= 1e-30:
        return np.float32(1.0), np_type(0 if dtype == "int8" else 0)
    zero = int(np.clip(round(qmin - lo / scale), qmin, qmax))
    return np.float32(scale), np_type(zero)


def weight_scales(w: np.ndarray, axis: int | None, qmax: int = 127) -> np.ndarray:
    """Symmetric scales for codes in ``[−qmax, qmax]``: per channel along ``axis`` (1-D) or per
    tensor (0-D)."""
    # max |w| as max(max w, −min w): the same values without an |w| copy of the weight
    if axis is None:
        amax = max(float(w.max()), -float(w.min())) if w.size else 0.0
    else:
        other = tuple(i for i in range(w.ndim) if i != axis % w.ndim)
        amax = np.maximum(w.max(axis=other), -w.min(axis=other)) if other else np.abs(w)
    amax = np.asarray(amax, dtype=np.float64)
    return np.where(amax > 0, amax / float(qmax), 1.0).astype(np.float32)


def quantize_weight(w: np.ndarray, scales: np.ndarray, axis: int | None, qmax: int = 127) -> np.ndarray:
    shape = [1] * w.ndim
    if axis is not None:
        shape[axis] = -1
    scales = scales.reshape(shape).astype(np.float64)
    return by_rows(w, np.int8, lambda part, rows: np.clip(
        np.round(part.astype(np.float64) / (scales[rows] if scales.ndim and scales.shape[0] > 1 else scales)),
        -qmax, qmax))


SAFE_CONV_QMAX = 63  # 2·255·63 = 32130 ≤ 32767: no u8·s8 pair sum saturates an int16


def weight_grid(node: gs.Node, w: np.ndarray) -> tuple:
    """``(qmax, unsigned)`` of a static layer's weight (module docstring): the grid ONNX
    Runtime's fused kernel computes exactly on every CPU."""
    if node.op != "Conv":
        return 127, True
    depthwise = w.ndim >= 2 and w.shape[1] == 1 and int(node.attrs.get("group", 1)) == w.shape[0]
    return (127 if depthwise else SAFE_CONV_QMAX), False


ROWS_BYTES = 1 << 20  # float64 temporaries of a weight's encoding, at most, per block of rows (small blocks: malloc
# reuses them; 8 MB blocks grew the heap by ~20 MB during MiniLM's first trial build)


def by_rows(w: np.ndarray, dtype, fn) -> np.ndarray:
    """``fn(w[rows], rows).astype(dtype)`` computed a block of leading-axis rows at a time
    (element-wise ``fn``: the same array as at once). MiniLM's 47 MB embedding table in
    float64 at once made each encoding's temporaries 3 × 94 MB."""
    if w.ndim == 0:
        return np.asarray(fn(w, slice(None))).astype(dtype)
    out = np.empty(w.shape, dtype)
    step = max(1, ROWS_BYTES // max(1, 8 * (w.size // max(1, w.shape[0]))))
    for start in range(0, w.shape[0], step):
        rows = slice(start, start + step)
        out[rows] = fn(w[rows], rows)
    return out


def fit_bias(bias: np.ndarray, x_scale: float, w_scales: np.ndarray) -> np.ndarray:
    """Weight scales raised where needed so that ``bias / (s_x·s_w)`` fits in int32."""
    need = np.abs(bias.astype(np.float64)) / (float(x_scale) * INT32_MAX) * (1 + 1e-6)
    return np.maximum(w_scales.astype(np.float64), need).astype(np.float32)


def quantize_bias(bias: np.ndarray, x_scale: float, w_scales: np.ndarray) -> tuple:
    scale = (np.float64(x_scale) * w_scales.astype(np.float64)).astype(np.float32)
    scale = np.broadcast_to(scale, bias.shape).copy() if scale.ndim else scale
    q = np.clip(np.round(bias.astype(np.float64) / scale.astype(np.float64)), -INT32_MAX, INT32_MAX)
    return q.astype(np.int32), scale


def dequantize_constant(model, graph: gs.Graph, values_q: np.ndarray, scale: np.ndarray,
                        axis: int | None, base: str, zero=None, zero_point: bool = True) -> gs.Variable:
    """``DequantizeLinear(values_q, scale[, zero])`` as a node of ``graph``; returns its output.

    A symmetric encoding (``zero`` None) writes its zero point, a vector of zeros, only where
    ONNX Runtime needs it (``zero_point``): an int32 bias gets none (0, the operator's default,
    is the only one allowed), nor does a Conv weight (QLinearConv is fused without it) — a byte
    or four per channel (PP-OCR's depthwise-heavy direction classifier in int8: 273 → 258 KB
    for the biases, 4 KB more for the Conv weights). MatMul / Gemm weights keep theirs, even
    when it is 0: without it ONNX Runtime 1.32 does not fuse DQ → Gemm → Q into QGemm
    (test_int8)."""
    # an encoding kept as a read-only scratch map (.resident) is shared, not copied: the
    # readers of one weight (captcha_crnn's 40 recurrent Gemms) would each hold a copy (+143 MB)
    q = (gs.Constant(model.fresh_name(f"int8/{base}_q"), values_q) if isinstance(values_q, np.memmap)
         else new_constant(model, f"int8/{base}_q", values_q))
    s = new_constant(model, f"int8/{base}_scale", np.asarray(scale, dtype=np.float32))
    if zero is None and (values_q.dtype == np.int32 or not zero_point):
        inputs = [q, s]
    else:
        zero = np.zeros(np.shape(scale), dtype=values_q.dtype) if zero is None else np.asarray(zero)
        inputs = [q, s, new_constant(model, f"int8/{base}_zp", zero)]
    out = gs.Variable(model.fresh_name(f"int8/{base}_dq"), dtype=np.float32, shape=list(values_q.shape))
    attrs = {"axis": int(axis)} if axis is not None and np.ndim(scale) == 1 else {}
    graph.nodes.append(gs.Node("DequantizeLinear", name=model.fresh_name("int8/DequantizeLinear"),
                               inputs=inputs, outputs=[out], attrs=attrs))
    return out


def gather_then_dequantize(graph: gs.Graph) -> int:
    """``Gather(DQ(T_q), i)`` → ``DQ(Gather(T_q, i))`` where a table's per-tensor
    DequantizeLinear has one reader, a Gather of this graph; returns the count.

    The same numbers (a per-tensor DQ is ``(q − z)·s`` element by element, Gather only picks
    elements), but a run dequantizes the rows it gathers instead of the whole table (MiniLM:
    47 MB of float table made and dropped on every run of a session without ORT's
    optimisations: the search's, the verifier's). With its optimisations ORT makes the same
    graph of both forms (an integer Gather, then DQ; measured on MiniLM: same nodes, outputs
    bitwise equal), so :func:`apply_plan` writes this form. The two nodes are rewired, no
    name is taken.
    """
    count, here = 0, {id(n) for n in graph.nodes}
    for dq in [n for n in graph.nodes if n.op == "DequantizeLinear"]:
        table, scale, middle = dq.inputs[0], dq.inputs[1], dq.outputs[0]
        readers = consumers(middle)
        if (not isinstance(table, gs.Constant) or not isinstance(scale, gs.Constant) or np.ndim(scale.values) != 0
                or len(readers) != 1 or readers[0].op != "Gather" or id(readers[0]) not in here
                or readers[0].inputs[0] is not middle or len(middle.outputs) != 1
                or any(o is middle for o in graph.outputs)):
            continue
        gather = readers[0]
        out = gather.outputs[0]
        dq.outputs[0] = out  # DQ now makes the Gather's output ...
        gather.outputs[0] = middle  # ... from the gathered integer rows
        gather.inputs[0] = table
        dq.inputs[0] = middle
        middle.dtype, middle.shape = table.values.dtype, None
        graph.nodes.remove(dq)
        graph.nodes.append(dq)  # after its producer
        count += 1
    return count


def insert_qdq(model, graph: gs.Graph, tensor: gs.Variable, scale, zero, readers=None) -> list:
    """``tensor → QuantizeLinear → DequantizeLinear`` with one DQ per reader of ``tensor``.

    A DQ shared by several readers keeps ORT from fusing some of them (its node units claim a
    DQ for one target node), so every reader gets its own. ``readers`` (default: all readers
    of ``tensor``) limits the rewiring; with ``readers=[]`` one DQ is made and nobody is
    rewired (a side branch). Returns the DQ outputs.
    """
    s = new_constant(model, "int8/act_scale", np.asarray(scale, dtype=np.float32))
    z = new_constant(model, "int8/act_zp", np.asarray(zero))
    q_out = gs.Variable(model.fresh_name("int8/q"), dtype=np.asarray(zero).dtype, shape=tensor.shape)
    readers = consumers(tensor) if readers is None else readers
    graph.nodes.append(gs.Node("QuantizeLinear", name=model.fresh_name("int8/QuantizeLinear"),
                               inputs=[tensor, s, z], outputs=[q_out]))
    outs = []
    for reader in readers or [None]:
        dq_out = gs.Variable(model.fresh_name("int8/dq"), dtype=np.float32, shape=tensor.shape)
        graph.nodes.append(gs.Node("DequantizeLinear", name=model.fresh_name("int8/DequantizeLinear"),
                                   inputs=[q_out, s, z], outputs=[dq_out]))
        outs.append(dq_out)
        for i, t in enumerate(reader.inputs if reader is not None else []):
            if t is tensor:
                reader.inputs[i] = dq_out
    return outs


def add_gated_twins(model, plan) -> dict:
    """Every layer's twin (:func:`add_quantized_twins`) switched into the main path by a bool
    graph input: ``y = Where(gate, twin, float)``, readers of ``y`` rewired; returns
    ``{layer name: gate input name}``. With one gate on, one run of this model gives the
    outputs with that layer alone quantized (inputs, weights, and its output Q point, applied
    before a following Relu / Clip: the Q's range clamps as they do) — the end-to-end ranking
    of the fallback from one session instead of one build per layer.
    """
    graph = model.graph
    pairs = add_quantized_twins(model, plan)
    tensors = graph.tensors()
    specs = {spec.name: spec for spec in plan.layers}
    gates = {}
    for layer, float_name, twin_name in pairs:
        y, twin = tensors[float_name], tensors[twin_name]
        if any(o is y for o in graph.outputs):
            continue  # a graph output: that layer is ranked by its own build
        out_params = plan.params.get(specs[layer].output)
        if out_params is not None and specs[layer].inputs:  # the output's Q point (after a Relu / Clip it
            twin = insert_qdq(model, graph, twin, *out_params, readers=[])[0]  # clamps like them: the same)
        readers = list(y.outputs)
        gate = gs.Variable(model.fresh_name("int8/gate"), dtype=np.bool_, shape=[])
        picked = gs.Variable(model.fresh_name("int8/gated"), dtype=np.float32, shape=y.shape)
        graph.nodes.append(gs.Node("Where", name=model.fresh_name("int8/Where"), inputs=[gate, twin, y],
                                   outputs=[picked]))
        graph.inputs.append(gate)
        for node in readers:
            for i, t in enumerate(node.inputs):
                if t is y:
                    node.inputs[i] = picked
        gates[layer] = gate.name
    return gates


def add_quantized_twins(model, plan) -> list:
    """For every layer of ``plan``, a side copy reading fake-quantized inputs and weights.

    The float graph is untouched; returns ``[(layer name, float output, twin output)]`` so that
    one run measures every layer's local quantization error at once.
    """
    graph = model.graph
    tensors = graph.tensors()
    nodes = {node.name: node for node in graph.nodes}
    pairs = []
    for spec in plan.layers:
        node = nodes.get(spec.name)
        if node is None:
            continue
        inputs = list(node.inputs)
        for i, t in enumerate(inputs):
            if t.name in spec.inputs and t.name in plan.params:
                inputs[i] = insert_qdq(model, graph, tensors[t.name], *plan.params[t.name], readers=[])[0]
        out = gs.Variable(model.fresh_name("int8/twin"), dtype=np.float32)
        twin = gs.Node(node.op, name=model.fresh_name("int8/twin"), attrs=dict(node.attrs), inputs=inputs,
                       outputs=[out])
        graph.nodes.append(twin)
        if spec.weight_index is not None:
            _quantize_weights(model, graph, twin, spec, plan)
        pairs.append((spec.name, node.outputs[0].name, out.name))
    gather_then_dequantize(graph)
    return pairs


def upgrade_opset(model, target: int = 13):
    """``model``'s graph converted to opset ``target`` and checked, or None when the converter
    fails. No weight is copied: the converter and the checker get the model's export with its
    float constants as empty stubs (:meth:`~onnxslim_kit.model.Model.session_proto`; they read
    names, types and shapes), and the converted graph gets the model's own arrays back by name
    (a whole export, conversion and import: ddddocr's 54 MB model +270 MB at the int8 pass's peak)."""
    from onnxslim_kit.model import Model
    from onnxslim_kit.verify import checker_error

    proto, arrays = model.session_proto()
    try:
        converted = onnx.version_converter.convert_version(proto, target)
    except Exception:  # noqa: BLE001 - the converter raises several types
        return None
    if checker_error(converted, full_check=False) is not None:
        return None
    graph = Model.from_proto(converted).graph
    tensors = graph.tensors()
    for name, values in (arrays or {}).items():
        tensors[name].values = values
        tensors[name].data_location = None  # the stub's EXTERNAL would make the export a stub again
    return graph


# --- applying a plan ----------------------------------------------------------------------------

RUNGS = ("dynamic", "weights")  # the fallback ladder below static int8, before float


def rungs_of(spec) -> tuple:
    """The fallback rungs a layer can take: ``dynamic`` (MatMul / Gemm with a constant weight),
    ``weights`` (any layer with a constant weight and an activation input); float always."""
    if spec.weight_index is None or not spec.inputs:
        return ()
    return RUNGS if spec.op in ("MatMul", "Gemm") else ("weights",)


def apply_plan(model, plan, enabled: set, result=None, fallback=None) -> int:
    """Insert Q/DQ for the ``enabled`` layers of ``plan`` into ``model.graph``; returns the count.

    ``fallback`` (``{layer: rung}``) gives layers that are not enabled a rung of the ladder
    (:data:`RUNGS`): ``dynamic`` — DynamicQuantizeLinear + MatMulInteger
    (:mod:`onnxslim_kit.passes._quant.dynamic`, same per-channel weight encoding); ``weights`` — float
    activations and compute, the weight stored int8 and restored by ``Cast`` + ``Mul``
    (:func:`scaled_cast`: ORT folds it at load; bias float). Any other layer stays float. Layers that are not static int8 read their float
    input: a smoothed layer (``spec.unsmoothed``) gets its original input and weight back
    (exact, and int8 weights of the original are more accurate), except on the ``dynamic``
    rung, where the smoothed input's flatter range is what the run-time quantizer needs; and a
    Q point shared with static layers is read through its DQ only by those (a point that is
    only a static layer's *output* keeps all its readers, so that layer still fuses).

    Step 4: a HardSigmoid / HardSwish between Q points is rewritten into ``Add → Q → DQ →
    Mul``, which ORT runs as QLinearAdd + QLinearMul (:mod:`onnxslim_kit.passes._quant.hardswish`);
    ``plan.pooled`` adds the Q point in front of a squeeze-excite GlobalAveragePool whose output
    is a static layer's point (:func:`onnxslim_kit.passes.int8.plan.pool_inputs`).

    ``plan`` (see :class:`int8.Plan`) holds names only, so it applies to any copy of the model
    it was made from: ``plan.layers`` (``LayerSpec``), ``plan.params`` (tensor → (scale, zero)),
    ``plan.per_channel``, ``plan.bias_shift`` (layer → vector added to its bias, see
    :mod:`onnxslim_kit.passes.int8.correct`).
    """
    graph = model.graph
    tensors = graph.tensors()
    nodes = {node.name: node for node in graph.nodes}
    chosen = [spec for spec in plan.layers if spec.name in enabled and spec.name in nodes]
    float_readers = set()  # ids of nodes that must read float tensors
    for spec in plan.layers:  # step 1: the layers off static int8, on their rung or float
        if spec.name not in enabled and spec.name in nodes:
            float_readers.add(id(_off_static(model, plan, spec, nodes[spec.name], tensors, fallback, result)))
    for name in _q_points(chosen, plan):  # step 2: Q/DQ on the static layers' points
        readers = consumers(tensors[name])
        static = [r for r in readers if id(r) not in float_readers]
        insert_qdq(model, graph, tensors[name], *plan.params[name], readers=static or readers)
    for spec in chosen:  # step 3: their weights
        node = nodes[spec.name]
        if spec.weight_index is not None:
            _quantize_weights(model, graph, node, spec, plan)
        if result is not None:
            result.rewrite(f"{node.op}→int8")
    quantize_hard_activations(model, graph, result)  # step 4: hard-swish between Q points, in int8 kernels
    gather_then_dequantize(graph)
    merge_equal_constants(graph, {}, lambda t: t.name.startswith("int8/"))  # a weight read by several layers
    return len(chosen)


def _off_static(model, plan, spec, node, tensors, fallback, result) -> gs.Node:
    """A layer that is not static int8: its rung from ``fallback`` (when it can take it) or
    float; a smoothed layer off the ``dynamic`` rung gets its original input and weight back.
    Returns the node that reads the layer's float input (the DynamicQuantizeLinear on the
    ``dynamic`` rung, the layer itself otherwise)."""
    rung = (fallback or {}).get(spec.name)
    rung = rung if rung in rungs_of(spec) else None
    if rung != "dynamic" and spec.unsmoothed is not None:
        name, weight = spec.unsmoothed
        node.inputs[0] = tensors[name]
        node.inputs[spec.weight_index] = gs.Constant(model.fresh_name("int8/w_float"), weight)
    if rung == "dynamic":
        reader = _dynamic(model, model.graph, node, spec, plan)
    else:
        reader = node
        if rung == "weights":
            wq, scales = _encoded(plan, spec, "weights", lambda: _weight_only(node, spec, plan))
            node.inputs[spec.weight_index] = scaled_cast(model, model.graph, wq, scales)
    if rung is not None and result is not None:
        result.rewrite(f"{spec.op}→int8 {'dynamic' if rung == 'dynamic' else 'weights only'}")
    return reader


def _q_points(chosen: list, plan) -> list:
    """The calibrated tensors around the static layers, each once, in layer order."""
    points = []
    for spec in chosen:
        for name in spec.inputs + [spec.output]:
            if name in plan.params and name not in points:
                points.append(name)
    pooled = getattr(plan, "pooled", {})  # a pool's input, where the pooled tensor is a static layer's point
    return points + [name for name, out in pooled.items() if out in points and name not in points]


def _encoded(plan, spec, kind: str, make):
    """``plan.encodings[(layer, kind)]``, computed once (trial builds reuse the arrays)."""
    key = (spec.name, kind)
    if key not in plan.encodings:
        plan.encodings[key] = make()
    return plan.encodings[key]


def _weight_only(node, spec, plan) -> tuple:
    """(int8 weight, scales shaped to broadcast against it)."""
    w = weight_array(node.inputs[spec.weight_index])
    axis = spec.weight_axis if plan.per_channel else None
    scales = weight_scales(w, axis)
    shape = [1] * w.ndim
    if axis is not None:
        shape[axis] = -1
    return quantize_weight(w, scales, axis), scales.reshape(shape) if axis is not None else scales


def scaled_cast(model, graph, values_q: np.ndarray, scales: np.ndarray) -> gs.Variable:
    """``Mul(Cast(values_q, float), scales)``: the weight of the ``weights`` rung.

    The same numbers as ``DequantizeLinear`` with a zero point of 0, but ONNX Runtime folds
    these two nodes at load (all inputs constant; it never folds a DequantizeLinear while
    QDQ fusion is on), so the layer runs as a plain float layer with a constant weight —
    NCHWc convolutions and every other fusion included — at no cost per inference, while
    the file holds int8. (A DequantizeLinear weight ran on every inference and kept Conv
    off ORT's NCHWc path: PP-OCRv4 det 0.70× → 0.79× of the float latency.)
    """
    q = new_constant(model, "int8/w_q", values_q)
    cast_out = gs.Variable(model.fresh_name("int8/w_cast"), dtype=np.float32, shape=list(values_q.shape))
    graph.nodes.append(gs.Node("Cast", name=model.fresh_name("int8/Cast"), attrs={"to": onnx.TensorProto.FLOAT},
                               inputs=[q], outputs=[cast_out]))
    out = gs.Variable(model.fresh_name("int8/w_float"), dtype=np.float32, shape=list(values_q.shape))
    graph.nodes.append(gs.Node("Mul", name=model.fresh_name("int8/Mul"),
                               inputs=[cast_out, new_constant(model, "int8/w_scale", np.asarray(scales, np.float32))],
                               outputs=[out]))
    return out


def _dynamic(model, graph, node, spec, plan) -> gs.Node:
    """The ``dynamic`` rung for a MatMul / Gemm layer; returns its DynamicQuantizeLinear."""
    def encode():
        if spec.op == "MatMul" and spec.bias_index is None and plan.per_channel:
            # per output column, no bias: the static encoding's arrays (the same numbers, held once)
            wq, scales, axis, _, _ = _encoded(plan, spec, ("static", spec.name in plan.bias_shift),
                                              lambda: _encode_weights(node, spec, plan))
            if axis == 1:
                return wq, scales, None
        w = weight_array(node.inputs[spec.weight_index])
        w = w.T if spec.op == "Gemm" and spec.weight_axis == 0 else w  # transB: as [K, N]
        axis = 1 if plan.per_channel else None
        scales = weight_scales(w, axis)
        bias = None
        if spec.bias_index is not None and spec.bias_index < len(node.inputs):
            bias = np.asarray(node.inputs[spec.bias_index].values, np.float32).reshape(-1)
        return quantize_weight(w, scales, axis), scales, bias

    wq, scales, bias = _encoded(plan, spec, "dynamic", encode)
    return dynamic_matmul(model, graph, node, node.inputs[0], wq, scales, bias, prefix="int8")


def _quantize_weights(model, graph: gs.Graph, node: gs.Node, spec, plan) -> None:
    """Replace ``node``'s weight (and bias) by DequantizeLinear of their integer encodings;
    the arrays are computed once per layer and plan (``plan.encodings``), trials reuse them."""
    wq, scales, axis, zero, bias = _encoded(plan, spec, ("static", spec.name in plan.bias_shift),
                                            lambda: _encode_weights(node, spec, plan))
    node.inputs[spec.weight_index] = dequantize_constant(model, graph, wq, scales, axis, "w", zero=zero,
                                                         zero_point=spec.op != "Conv")
    if bias is not None:
        bq, bscale = bias
        b_dq = dequantize_constant(model, graph, bq, bscale, 0 if np.ndim(bscale) == 1 else None, "b")
        if spec.bias_index is not None and spec.bias_index < len(node.inputs):
            node.inputs[spec.bias_index] = b_dq
        else:
            node.inputs.append(b_dq)


def _encode_weights(node: gs.Node, spec, plan) -> tuple:
    """(weight q, scales, axis, zero point or None, (bias q, bias scales) or None)."""
    w = weight_array(node.inputs[spec.weight_index])
    if not spec.inputs:  # a Gather table: encoded like the Q after the Gather (see _quant_plan)
        scale, zero = plan.params[spec.output]
        info = np.iinfo(np.asarray(zero).dtype)
        q = by_rows(w, np.asarray(zero).dtype, lambda part, _: np.clip(
            np.round(part.astype(np.float64) / float(scale)) + int(zero), info.min, info.max))
        return q, scale, None, zero, None
    axis = spec.weight_axis if plan.per_channel else None
    qmax, unsigned = weight_grid(node, w)
    scales = weight_scales(w, axis, qmax)  # (not for a table: |T| of MiniLM's would be 47 MB more, unused)
    x_scale = float(plan.params[spec.inputs[0]][0])
    has_bias = spec.bias_index is not None and spec.bias_index < len(node.inputs)
    shift = plan.bias_shift.get(spec.name)
    bias = None
    if has_bias or shift is not None:
        n = w.shape[spec.weight_axis]
        bias = np.asarray(node.inputs[spec.bias_index].values, dtype=np.float32) if has_bias else np.zeros(n, np.float32)
        bias = bias.reshape(n) if bias.size == n else np.broadcast_to(bias, (n,)).copy()
        bias = bias + shift if shift is not None else bias
        scales = fit_bias(bias, x_scale, scales) if axis is not None else np.float32(
            max(float(scales), float(np.abs(bias).max(initial=0.0)) / (x_scale * INT32_MAX)))
    wq, zero = quantize_weight(w, np.asarray(scales), axis, qmax), None
    if unsigned:
        wq, zero = unsigned_weight(wq, np.zeros(np.shape(scales), np.int8))
    return (wq, scales, axis, zero, None if bias is None else quantize_bias(bias, x_scale, np.asarray(scales)))
