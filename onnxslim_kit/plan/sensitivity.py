"""Per-layer sensitivity to dynamic int8: a cheap estimate that orders the plan's mix search.

For each MatMul/Gemm layer the ``dynamic`` pass would rewrite (:func:`dynamic_layers`: main
graph, a float32 2-D constant weight ``W`` with at least ``min_weights`` elements, a
non-constant activation, Gemm without ``transA``; ``W`` transposed when ``transB``), the
layer's input ``x`` is read on the fit calibration samples (one ORT run per sample with the
inputs exposed as outputs) and its output error under dynamic quantization is computed in numpy::

    x̂ = (clip(round(x / s_x) + z_x, 0, 255) − z_x) · s_x      DynamicQuantizeLinear, per run:
        s_x = (max(x_max, 0) − min(x_min, 0)) / 255,  z_x = clip(round(−min(x_min, 0) / s_x), 0, 255)
    Ŵ[:, j] = round(W[:, j] / s_j) · s_j,  s_j = max_i |W[i, j]| / 127     symmetric, per column
    e = Σ_samples ‖x̂ Ŵ − x W‖² / Σ_samples ‖x W‖²                          (relative squared error)

``e`` is local: how much the layer's own output moves, not how much the model's outputs do. It
only orders the layers (the most sensitive first); whether a mix holds the target is measured
end to end by the pipeline's fidelity judgement (:mod:`.mix`).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

MIN_WEIGHTS = 1024  # the dynamic pass's default min_weights
TRANSB = "transB"


def _attr(node, name: str, default):
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def _constants(graph) -> dict:
    values = {t.name: t for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and len(node.output) == 1:
            for a in node.attribute:
                if a.name == "value" and a.type == onnx.AttributeProto.TENSOR:
                    values[node.output[0]] = a.t
    return values


def dynamic_layers(proto: onnx.ModelProto, min_weights: int = MIN_WEIGHTS) -> list:
    """``[(node name, activation name, W as [K, N] float32)]`` of the layers (module docstring), in
    graph order; nodes without a name cannot be selected by ``exclude=`` and are left out."""
    constants = _constants(proto.graph)
    out = []
    for node in proto.graph.node:
        if node.op_type not in ("MatMul", "Gemm") or node.domain not in ("", "ai.onnx") or not node.name:
            continue
        if len(node.input) < 2 or node.input[0] in constants or node.input[1] not in constants:
            continue
        tensor = constants[node.input[1]]
        if tensor.data_type != onnx.TensorProto.FLOAT or len(tensor.dims) != 2:
            continue
        if node.op_type == "Gemm" and _attr(node, "transA", 0):
            continue
        w = numpy_helper.to_array(tensor).astype(np.float32)
        if w.size < min_weights:
            continue
        if node.op_type == "Gemm" and _attr(node, TRANSB, 0):
            w = w.T
        out.append((node.name, node.input[0], w))
    return out


def dynamic_quantize(x: np.ndarray) -> np.ndarray:
    """``x̂``: ``x`` through DynamicQuantizeLinear and back (uint8, per tensor; module docstring)."""
    x = np.asarray(x, np.float32)
    lo, hi = min(float(x.min(initial=0.0)), 0.0), max(float(x.max(initial=0.0)), 0.0)
    scale = (hi - lo) / 255.0
    if scale == 0.0:
        return np.zeros_like(x)
    zero = float(np.clip(np.round(-lo / scale), 0, 255))
    return ((np.clip(np.round(x / scale) + zero, 0, 255) - zero) * scale).astype(np.float32)


def quantize_columns(w: np.ndarray) -> np.ndarray:
    """``Ŵ``: symmetric int8 per column and back (module docstring)."""
    scale = np.abs(w).max(axis=0) / 127.0
    scale = np.where(scale == 0, 1.0, scale).astype(np.float32)
    return (np.clip(np.round(w / scale), -127, 127) * scale).astype(np.float32)


def layer_errors(proto: onnx.ModelProto, samples: list, min_weights: int = MIN_WEIGHTS) -> dict:
    """``{node name: e}`` (module docstring) over ``samples`` (``{input: array}`` dicts)."""
    from ..activations import iter_activations

    layers = dynamic_layers(proto, min_weights)
    if not layers or not samples:
        return {}
    quantized = {name: quantize_columns(w) for name, _, w in layers}
    num = {name: 0.0 for name, _, _ in layers}
    den = dict(num)
    activations = sorted({x for _, x, _ in layers})
    for values in iter_activations(proto, activations, samples):
        for name, x_name, w in layers:
            x = np.asarray(values[x_name], np.float32)
            x2 = x.reshape(-1, x.shape[-1])
            y = x2 @ w
            err = dynamic_quantize(x2) @ quantized[name] - y
            num[name] += float(np.square(err, dtype=np.float64).sum())
            den[name] += float(np.square(y, dtype=np.float64).sum())
    return {name: (num[name] / den[name] if den[name] > 0 else (0.0 if num[name] == 0 else float("inf")))
            for name in num}
