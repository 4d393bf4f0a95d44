"""What ONNX Runtime actually executes: the int8 kernels and float compute of its optimized graph.

A QDQ model is only a request: ORT's optimizer (level ``extended`` and up) fuses
``DequantizeLinear → Conv → QuantizeLinear`` into QLinearConv (and MatMul into
QLinearMatMul / MatMulIntegerToFloat, Gemm into QGemm …) only where the pattern it knows
appears; everywhere else the DequantizeLinear stays and the op runs in float (NNCF's Q/DQ
after hard-swish: 38 of 38 convs of a recognizer ran float). So the graph to judge is the
one ORT writes with ``SessionOptions.optimized_model_filepath`` — one session, no run.

Level: the one asked (``all`` by default, what ``bench`` deploys with), with the two layout
transformers off (``NchwcTransformer``, ``NhwcTransformer``): they rewrite the memory layout
of kernels already chosen (float Conv → blocked NCHWc Conv with padded channels, QLinearConv →
its NHWC form between Transposes), never their precision, and would hide the shapes the MAC
count needs (checked: the same int8 kernels on ppocr_cls_v2 and orientation after
``fuse,int8``, with and without them).

With ``K`` the set of int8 compute kernels (:data:`INT8_KERNELS`), ``F`` the float compute ops
(:data:`FLOAT_COMPUTE`), ``macs(n)`` a node's multiply–accumulates (:mod:`.bench_macs`, at the
shapes of the original model's tensors, which ORT's fused nodes keep by name, and inference on
the optimized graph for the rest) and ``w(n)`` the elements of its constant operands (an
initializer, a Constant, or a DequantizeLinear of one — int8 weights computed in float)::

    int8_mac_share    = Σ_{n∈K} macs(n) / Σ_{n∈K∪F} macs(n)
    int8_weight_share = Σ_{n∈K} w(n)    / Σ_{n∈K∪F} w(n)

Nodes whose MACs stay unknown are counted in ``macs_unresolved``, never guessed.

Unfused Q/DQ: every DequantizeLinear left in the optimized graph, once per op it feeds (graph
outputs aside): that op, whether the dequantized tensor is a weight (int8 weights, float
compute) or an activation, and the ``detour`` when the op's result is quantized again through
at most :data:`DETOUR_DEPTH` ops, those after the first not compute ops — a float stretch
inside the int8 domain: ``DequantizeLinear → HardSigmoid → Mul → QuantizeLinear`` (a hard-swish
between DQ and Q), or ``DequantizeLinear → Conv → HardSwish → QuantizeLinear`` (a Conv ORT could
not fuse because the Q sits after its activation). ``detours`` counts them by path.
"""

from __future__ import annotations

import os
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

from .bench_macs import graph_shapes, inferred, main_shapes, node_macs
from .calibration import CalibrationFeed, input_specs
from .errors import UserError
from .model import load_proto
from .runtime import EXTERNAL_FOLDER, OPT_LEVELS, SPILL, shared_root, session_options, split_weights
from .streaming import set_location

INT8_KERNELS = {"QLinearConv", "ConvInteger", "MatMulInteger", "QLinearMatMul", "QGemm", "DynamicQuantizeMatMul",
                "MatMulIntegerToFloat", "QAttention", "DynamicQuantizeLSTM"}
FLOAT_COMPUTE = {"Conv", "FusedConv", "ConvTranspose", "Gemm", "FusedGemm", "MatMul", "FusedMatMul", "LSTM", "GRU",
                 "RNN", "Attention", "MultiHeadAttention"}
QDQ = {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"}
# operands that may be weights (constant), per compute op
OPERANDS = {"Conv": (1,), "FusedConv": (1,), "ConvTranspose": (1,), "ConvInteger": (1,), "QLinearConv": (3,),
            "LSTM": (1, 2), "GRU": (1, 2), "RNN": (1, 2), "DynamicQuantizeLSTM": (1, 2),
            "QLinearMatMul": (0, 3), "QGemm": (0, 3)}
LAYOUT = ["NchwcTransformer", "NhwcTransformer"]
OPTIMIZED, OPTIMIZED_WEIGHTS = "optimized.onnx", "optimized.bin"
DETOUR_DEPTH = 3  # float ops between a DequantizeLinear and the QuantizeLinear that closes the detour


def optimized_graph(model, provider: str = "CPUExecutionProvider", opt_level: str = "all",
                    folder: str | Path | None = None) -> onnx.ModelProto:
    """The graph ORT executes for ``model`` (proto or path) on ``provider`` at ``opt_level``
    (layout transformers off, module docstring), loaded without its weights' values (their
    dims are all the counts need). ``folder``: where ORT writes it (a temporary one if None)."""
    if opt_level not in OPT_LEVELS:
        raise UserError(f"opt level {opt_level!r}: one of {', '.join(OPT_LEVELS)}")
    if folder is None:
        with tempfile.TemporaryDirectory(prefix="slim-executed-", ignore_cleanup_errors=True) as tmp:
            return optimized_graph(model, provider, opt_level, tmp)
    target = Path(folder) / OPTIMIZED
    so = session_options(opt_level, threads=1, prepack=False)
    so.optimized_model_filepath = str(target)
    so.add_session_config_entry("session.optimized_model_external_initializers_file_name", OPTIMIZED_WEIGHTS)
    so.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    kwargs = {"providers": _providers(provider), "disabled_optimizers": LAYOUT}
    if isinstance(model, (str, Path)):
        session = ort.InferenceSession(str(model), so, **kwargs)
    else:
        skeleton, moved, anchored = split_weights(model)
        held = _hand_over(skeleton, moved, anchored, so, Path(folder))
        session = ort.InferenceSession(skeleton.SerializeToString(), so, **kwargs)
        del held
    del session
    return onnx.load(str(target), load_external_data=False)


def _hand_over(skeleton: onnx.ModelProto, moved: list, anchored: str | None, so: ort.SessionOptions,
               folder: Path) -> list:
    """Give ORT the weights :func:`.runtime.split_weights` moved out of ``skeleton``, as
    :func:`.runtime.make_session` does: written one by one, page-aligned, to a file in ``folder``
    that ORT maps (no copy of the weights in memory). When other weights stay in their own files
    (``anchored``), ORT's external-data folder is the deepest folder holding both, the anchored
    tensors named relative to it (:func:`.runtime.shared_root`); only where there is none
    (different drives) are the moved weights handed over as arrays, which ORT copies. Returns what
    the session needs kept alive until it is built. Measured on a 933 MB decoder after
    ``fuse,int8``: the arrays cost 0.99 GB of anonymous memory at the report's peak."""
    root = str(folder) if anchored is None else shared_root(skeleton, anchored, str(folder))
    if root is None:
        so.add_session_config_entry(EXTERNAL_FOLDER, anchored)
        held = [np.ascontiguousarray(numpy_helper.to_array(t)) for _, t in moved]
        for stub, _ in moved:
            set_location(stub, "in-memory", 0, 0)
        if moved:
            values = [ort.OrtValue.ortvalue_from_numpy(a) for a in held]
            so.add_external_initializers([t.name for _, t in moved], values)
        return held
    location = os.path.relpath(folder / SPILL, root)
    with open(folder / SPILL, "wb") as fh:
        for stub, tensor in moved:
            start = -(-fh.tell() // 4096) * 4096  # page-aligned: ORT maps instead of reading
            fh.write(b"\0" * (start - fh.tell()))
            data = np.ascontiguousarray(numpy_helper.to_array(tensor))
            fh.write(memoryview(data).cast("B"))
            set_location(stub, location, start, data.nbytes)
            del data
    so.add_session_config_entry(EXTERNAL_FOLDER, root)
    return []


def _providers(provider: str) -> list:
    return [provider] if provider == "CPUExecutionProvider" else [provider, "CPUExecutionProvider"]


def _nodes(graph: onnx.GraphProto):
    """Every node of ``graph`` and of its subgraphs, with the graph it belongs to."""
    for node in graph.node:
        yield node, graph
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _nodes(attr.g)


def _constants(graph: onnx.GraphProto) -> dict:
    """``{tensor: dims}`` of constants: initializers and Constant outputs (main graph)."""
    found = {t.name: list(t.dims) for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant":
            found.update({node.output[0]: list(a.t.dims) for a in node.attribute
                          if a.type == onnx.AttributeProto.TENSOR})
    return found


def _weight_elements(node: onnx.NodeProto, constants: dict, dequantized: dict) -> tuple:
    """(elements of ``node``'s constant operands, whether one of them is a dequantized weight)."""
    indices = OPERANDS.get(node.op_type, (0, 1))
    total, via_dq = 0, False
    for i in indices:
        name = node.input[i] if i < len(node.input) else ""
        if name in constants:
            total += int(np.prod(constants[name]))
        elif name in dequantized:
            total += int(np.prod(dequantized[name]))
            via_dq = True
    return total, via_dq


def _optimized_shapes(optimized: onnx.ModelProto, seed: dict, input_shapes: dict | None) -> dict:
    """Shapes of the optimized graph's tensors: the original's by name, then inference on it."""
    model = inferred(optimized, input_shapes)
    own = graph_shapes(model.graph, {}) if model is not None else graph_shapes(optimized.graph, {})
    return {**seed, **own}


def _consumers(graph: onnx.GraphProto) -> dict:
    readers = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    return readers


def _detour(node: onnx.NodeProto, readers: dict, depth: int = DETOUR_DEPTH) -> list | None:
    """The op types from ``node`` to a QuantizeLinear its result reaches through at most
    ``depth`` float ops that are not compute ops (``[HardSigmoid, Mul, QuantizeLinear]``), or None."""
    for out in node.output:
        for reader in readers.get(out, []):
            if reader.op_type == "QuantizeLinear":
                return [node.op_type, reader.op_type]
            if depth > 1 and reader.op_type not in FLOAT_COMPUTE | INT8_KERNELS | QDQ:
                rest = _detour(reader, readers, depth - 1)
                if rest is not None:
                    return [node.op_type, *rest]
    return None


def unfused(graph: onnx.GraphProto, constants: dict | None = None) -> list:
    """The DequantizeLinear nodes of ``graph`` left in the optimized graph, one entry per op
    they feed (module docstring)."""
    constants = _constants(graph) if constants is None else constants
    readers = _consumers(graph)
    entries = []
    for node in graph.node:
        if node.op_type != "DequantizeLinear":
            continue
        for reader in readers.get(node.output[0], []):
            detour = _detour(reader, readers) if reader.op_type != "QuantizeLinear" else None
            entries.append({"dequantize": node.name or node.output[0], "tensor": node.input[0],
                            "feeds": reader.op_type, "node": reader.name or reader.output[0],
                            "kind": "weight" if node.input[0] in constants else "activation",
                            "requantized": detour is not None,
                            "detour": " → ".join(["DequantizeLinear", *detour]) if detour else None})
    return entries


def analyse(optimized: onnx.ModelProto, seed_shapes: dict | None = None, input_shapes: dict | None = None) -> dict:
    """The counts of the module docstring for an optimized graph (:func:`optimized_graph`);
    ``seed_shapes``: ``{tensor: shape}`` known from the original model."""
    graph = optimized.graph
    shapes = _optimized_shapes(optimized, seed_shapes or {}, input_shapes)
    constants = _constants(graph)
    dequantized = {n.output[0]: constants[n.input[0]] for n in graph.node
                   if n.op_type == "DequantizeLinear" and n.input[0] in constants}
    ops = {"int8": Counter(), "float": Counter(), "int8_other": Counter(), "qdq": Counter()}
    macs = {"int8": 0, "float": 0}
    weights = {"int8": 0, "float": 0}
    unresolved = float_int8_weights = 0
    for node, owner in _nodes(graph):
        kind = "int8" if node.op_type in INT8_KERNELS else "float" if node.op_type in FLOAT_COMPUTE else None
        if kind is None:
            if node.op_type in QDQ:
                ops["qdq"][node.op_type] += 1
            elif node.op_type.startswith("QLinear"):
                ops["int8_other"][node.op_type] += 1
            continue
        ops[kind][node.op_type] += 1
        count = node_macs(node, shapes if owner is graph else graph_shapes(owner, shapes))
        if count is None:
            unresolved += 1
        else:
            macs[kind] += count
        elements, via_dq = _weight_elements(node, constants, dequantized)
        weights[kind] += elements
        float_int8_weights += int(kind == "float" and via_dq)
    leftovers = unfused(graph, constants)
    return {
        "int8_ops": dict(ops["int8"]), "float_ops": dict(ops["float"]), "int8_other_ops": dict(ops["int8_other"]),
        "qdq_ops": dict(ops["qdq"]), "macs_int8": macs["int8"], "macs_float": macs["float"],
        "macs_unresolved": unresolved, "int8_mac_share": _share(macs),
        "weights_int8": weights["int8"], "weights_float": weights["float"], "int8_weight_share": _share(weights),
        "float_ops_with_int8_weights": float_int8_weights,
        "unfused_by_op": dict(Counter(e["feeds"] for e in leftovers)),
        "detours": dict(Counter(e["detour"] for e in leftovers if e["detour"])), "unfused": leftovers,
    }


def _share(parts: dict) -> float | None:
    total = parts["int8"] + parts["float"]
    return parts["int8"] / total if total else None


def executed(model, provider: str = "CPUExecutionProvider", opt_level: str = "all",
             input_shapes: dict | None = None, feed: dict | None = None, proto: onnx.ModelProto | None = None) -> dict:
    """What ORT executes for ``model`` (proto or path) on ``provider``: :func:`analyse` of its
    optimized graph, shapes at ``input_shapes`` (and, where inference leaves a counted node's
    shapes open, measured on ``feed`` with one run of the original model). ``proto``: the
    model of a path, already loaded (else it is loaded, weights left on disk)."""
    if proto is None:
        proto = load_proto(model, lazy=True) if isinstance(model, (str, Path)) else model
    seed = main_shapes(proto, input_shapes, feed)
    summary = analyse(optimized_graph(model, provider, opt_level), seed, input_shapes)
    return {"provider": provider, "opt_level": opt_level, "layout_transformers": "off", **summary}


QUANTIZED_OPS = {"QuantizeLinear", "DequantizeLinear", "MatMulInteger", "ConvInteger", "DynamicQuantizeLinear"}


def has_quantized_ops(proto: onnx.ModelProto) -> bool:
    """Whether ``proto`` holds ops that only ORT's optimizer turns into int8 kernels (or not)."""
    return any(node.op_type in QUANTIZED_OPS for node, _ in _nodes(proto.graph))


def executed_summary(proto: onnx.ModelProto, sample: dict | None = None) -> dict:
    """For the pipeline's report of a lossy pass: :func:`executed` on CPU at level ``all``, shapes
    at one input ``sample`` (the run's own data; if None, one generated from the input specs, as
    :class:`.calibration.CalibrationFeed` does with no data), measured with it where inference
    cannot tell; ``{"error": …}`` when ORT cannot build the session."""
    try:
        if sample is None:
            sample = CalibrationFeed(input_specs(proto), None, num_samples=1).take(1)[0]
        shapes = {k: list(np.shape(v)) for k, v in sample.items()}
        return executed(proto, input_shapes=shapes, feed=sample)
    except Exception as exc:  # noqa: BLE001 - a report line, never a crash of the pipeline
        text = str(exc).strip()
        return {"error": f"ONNX Runtime: {text.splitlines()[0][:300] if text else type(exc).__name__}"}


def percent(share) -> str:
    """A share as a percentage; a share that is not 0 or 1 never reads as 0.0% or 100.0%."""
    if share is None:
        return "—"
    return "<0.1%" if 0 < share < 0.001 else ">99.9%" if 0.999 < share < 1 else f"{share * 100:.1f}%"


def executed_line(summary: dict) -> str:
    """One terminal line: ``ORT runs: int8 MACs 100.0% (QLinearConv ×53, QGemm ×1); float compute
    0 of 54; weights in int8 kernels 100.0%; DequantizeLinear left → HardSigmoid ×27, Mul ×28``."""
    if summary.get("error"):
        return f"ORT runs: unknown ({summary['error']})"
    kernels = ", ".join(f"{op} ×{n}" for op, n in sorted(summary["int8_ops"].items()))
    n_int8, n_float = sum(summary["int8_ops"].values()), sum(summary["float_ops"].values())
    text = (f"ORT runs: int8 MACs {percent(summary['int8_mac_share'])}" + (f" ({kernels})" if kernels else "")
            + f"; float compute {n_float} of {n_int8 + n_float}")
    if summary["float_ops_with_int8_weights"]:
        text += f" ({summary['float_ops_with_int8_weights']} with int8 weights)"
    text += f"; weights in int8 kernels {percent(summary['int8_weight_share'])}"
    if summary["macs_unresolved"]:
        text += f"; MACs of {summary['macs_unresolved']} ops unknown"
    if summary["unfused_by_op"]:
        left = ", ".join(f"{op} ×{n}" for op, n in sorted(summary["unfused_by_op"].items(), key=lambda kv: -kv[1]))
        text += f"; DequantizeLinear left → {left}"
    return text
