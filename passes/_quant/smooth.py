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

``diag(s)·W`` is not held: the rewired constant has :class:`SmoothedWeight` values, computed
from ``W`` (which the fallback keeps anyway) each time a copy of the graph reads them — the
weight encodings are made once, the float product is only read by sessions running the
smoothed float layers (calibration, twins). :func:`realize` gives the constants still in use
real arrays before the graph is exported. Measured on MiniLM: 40 MB less held through the
fallback search, the same output bytes.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs
from onnx import numpy_helper
from onnx_graphsurgeon.ir.tensor import LazyValues

from onnxslim_kit.passes._common.graph import attr, const_value, new_constant
from onnxslim_kit.passes._quant.maths.calib import TensorStats


def _weight_rows(layer) -> np.ndarray:
    """The weight as [K, N] (input channels first)."""
    w = const_value(layer.node.inputs[layer.weight_index])
    return w.T if layer.node.op == "Gemm" and attr(layer.node, "transB", 0) else w


class SmoothedWeight(LazyValues):
    """Lazy values ``diag(s)·W`` of a smoothed weight (``rows``: ``W`` as [K, N]; ``transpose``:
    a Gemm ``transB`` weight, stored [N, K]). Each read computes the same float32 array."""

    def __init__(self, rows: np.ndarray, s: np.ndarray, transpose: bool, source=None):
        self.rows, self.s, self.transpose = rows, s, transpose
        self.source = source  # the original constant's values (a file map: its pages can be released)
        self.shape = tuple(rows.shape[::-1] if transpose else rows.shape)
        self.dtype = np.dtype(np.float32)
        self.nbytes = rows.size * 4

    def load(self) -> np.ndarray:
        scaled = (self.rows.astype(np.float64) * self.s[:, None]).astype(np.float32)
        return np.ascontiguousarray(scaled.T if self.transpose else scaled)

    @property
    def tensor(self):  # what onnx-graphsurgeon exports for lazy values (it sets the name)
        return numpy_helper.from_array(self.load())

    def __str__(self):
        return f"SmoothedWeight(shape={self.shape})"


def is_lazy(tensor) -> bool:
    """True for a constant whose smoothed values are not computed (reading ``values`` would)."""
    return isinstance(getattr(tensor, "_values", None), SmoothedWeight)


def weight_array(tensor) -> np.ndarray:
    """A constant's values; a smoothed weight's computed for this read only (the constant, often
    of a trial copy, does not keep them)."""
    return tensor._values.load() if is_lazy(tensor) else np.asarray(tensor.values)


def realize(graph) -> int:
    """Smoothed weights still read by ``graph``'s nodes get their array (before an export);
    returns the count."""
    count = 0
    for tensor in graph.tensors().values():
        if is_lazy(tensor):
            tensor.values = tensor._values.load()
            count += 1
    return count


def smoothable(layers: list) -> dict:
    """``{activation name: [layers]}``: MatMul / Gemm layers with constant weights by input.

    A weight that layers of other inputs read too is left out with its whole group: smoothing
    rescales it per input, and its readers would each get their own copy. An unrolled LSTM reads
    one weight in every step (captcha-whisperer's CRNN: 4 weights, 80 Gemms): smoothed, its int8
    file was 3.6× the float one, with 80 weight copies whose QGemm ran 2–3× slower than ORT's
    quantizer's one shared copy (no longer in cache from step to step)."""
    groups, readers = {}, {}
    for layer in layers:
        if layer.node.op in ("MatMul", "Gemm") and layer.weight_index is not None:
            groups.setdefault(layer.inputs[0].name, []).append(layer)
            weight = layer.node.inputs[layer.weight_index].name
            readers.setdefault(weight, set()).add(layer.inputs[0].name)
    return {name: group for name, group in groups.items()
            if all(readers[layer.node.inputs[layer.weight_index].name] == {name} for layer in group)}


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
            lazy = SmoothedWeight(rows_k, s, node.op == "Gemm" and bool(attr(node, "transB", 0)),
                                  getattr(node.inputs[layer.weight_index], "_values", None))
            node.inputs[layer.weight_index] = gs.Constant(model.fresh_name("int8/smooth_w"), lazy)
            node.inputs[0] = smoothed
            layer.inputs[0] = smoothed
        count += 1
    result.rewrite("smoothed activation", count)
    return originals
