"""SmoothQuant-style rebalancing for the ``int8`` pass (MatMul / Gemm with constant weights).

Transformer activations carry a few channels with large values; one per-tensor activation
scale then wastes most of its 256 levels on them. Moving the difficulty into the weights
(which are quantized per output channel anyway)::

    X ──▶ MatMul(W)            X ──▶ Mul(1/s) ──▶ X' ──▶ MatMul(diag(s)·W)

    s_k = max|X_k|^α / max|W_k·|^(1−α)     (k = input channel = last axis of X,
                                            max over every weight reading X; α = ``smooth``)

is exact in real arithmetic (``X'·W' = X·W``). Layers that fall back (to float, or to int8
weights with float compute) get ``X`` and ``W`` back; on the ``dynamic`` rung they keep the
smoothed pair (its run-time per-tensor range gains from the flatter ``X'``). Conditions: ``X`` is read by at least one
candidate MatMul (constant 2-D weight) or Gemm (constant B, ``transA = 0``); only those
readers are rewired to ``X'``; ``s`` is clipped to [1e-4, 1e4] and set to 1 where a channel
is all zero. The Mul is float and cheap next to the MatMuls it feeds.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ._graph import attr, const_value, new_constant
from ._quant_calib import TensorStats


def _weight_rows(layer) -> np.ndarray:
    """The weight as [K, N] (input channels first)."""
    w = const_value(layer.node.inputs[layer.weight_index])
    return w.T if layer.node.op == "Gemm" and attr(layer.node, "transB", 0) else w


def smoothable(layers: list) -> dict:
    """``{activation name: [layers]}``: MatMul / Gemm layers with constant weights by input."""
    groups = {}
    for layer in layers:
        if layer.node.op in ("MatMul", "Gemm") and layer.weight_index is not None:
            groups.setdefault(layer.inputs[0].name, []).append(layer)
    return groups


def update_peaks(peaks: dict, acts: dict, names) -> None:
    """Fold one sample's ``acts`` into ``peaks`` (``{name: max |x| per last-axis channel}``)."""
    for name in names:
        x = np.abs(np.asarray(acts[name], dtype=np.float32))
        peak = x.reshape(-1, x.shape[-1]).max(axis=0)
        peaks[name] = np.maximum(peaks[name], peak) if name in peaks else peak


def smoothed_stats(graph, kept: dict) -> dict:
    """Statistics of each smoothed input ``X' = Mul(X, 1/s)`` from the kept arrays of ``X``
    (the same float32 product ORT computes): ``{X' name: TensorStats}``."""
    out = {}
    for node in graph.nodes:
        if node.op == "Mul" and node.name.startswith("int8/smooth") and node.inputs[0].name in kept:
            inv = node.inputs[1].values
            stats = TensorStats()
            for x in kept[node.inputs[0].name]:
                stats.update(np.asarray(x, np.float32) * inv)
            out[node.outputs[0].name] = stats
    return out


def smooth(model, groups: dict, peaks: dict, alpha: float, result) -> dict:
    """Insert ``Mul(1/s)`` and rescale the weights; returns ``{layer name: (input name, original
    weight)}`` of the rewired layers (the fallback undoes the smoothing with them)."""
    graph = model.graph
    tensors = graph.tensors()
    count, originals = 0, {}
    for name, layers in groups.items():
        x_peak = peaks.get(name)
        rows = [_weight_rows(l) for l in layers]
        if x_peak is None or any(r.shape[0] != x_peak.size for r in rows):
            result.skip("smooth: channel count mismatch")
            continue
        w_peak = np.max([np.abs(r).max(axis=1) for r in rows], axis=0)
        s = np.where((x_peak > 0) & (w_peak > 0),
                     x_peak.astype(np.float64) ** alpha / np.maximum(w_peak, 1e-12) ** (1 - alpha), 1.0)
        s = np.clip(s, 1e-4, 1e4)
        x = tensors[name]
        smoothed = gs.Variable(model.fresh_name("int8/smoothed"), dtype=np.float32, shape=x.shape)
        inv = new_constant(model, "int8/smooth_inv", (1.0 / s).astype(np.float32))
        graph.nodes.append(gs.Node("Mul", name=model.fresh_name("int8/smooth"), inputs=[x, inv], outputs=[smoothed]))
        for layer, rows_k in zip(layers, rows):
            node = layer.node
            originals[node.name] = (name, const_value(node.inputs[layer.weight_index]))
            scaled = (rows_k.astype(np.float64) * s[:, None]).astype(np.float32)
            if node.op == "Gemm" and attr(node, "transB", 0):
                scaled = scaled.T
            node.inputs[layer.weight_index] = new_constant(model, "int8/smooth_w", np.ascontiguousarray(scaled))
            node.inputs[0] = smoothed
        count += 1
    result.rewrite("smoothed activation", count)
    return originals
