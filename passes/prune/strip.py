"""Strip (lossless): find channel units whose values are provably constant where they are read.

Per tensor with a layout we propagate, in topological order, one number per channel: the
channel's value if it is the same at every position of every sample, else NaN.

* source: output channel k is constant ``b[k]`` (0 without bias) when its weights are all zero
  (Conv ``W[k]``, Gemm/MatMul the column/row of k) — whatever the input;
* depthwise Conv: ``b[k]`` when ``W[k] = 0``; ``v·ΣW[k] + b[k]`` for a constant input ``v``
  when the conv has no padding or ``v = 0`` (a padded border sees zeros, not ``v``);
* elementwise ops are evaluated on the values (Relu, Clip, HardSigmoid, HardSwish, Sigmoid,
  LeakyRelu, PRelu, BatchNormalization, Add/Sub/Mul/Div/Max/Min with per-channel
  constants or other layouts, …) — ``f(b)`` is constant when ``b`` is;
* Max/GlobalAverage/GlobalMax pooling, Resize, Transpose, Flatten, Reshape, ReduceMean/Max/Min
  keep a constant; AveragePool with padding (``count_include_pad=1``) and Pad keep it only
  when it equals the padding value (0 / the Pad constant);
* anything else: NaN.

A unit can be stripped when it is not blocked, it is read by at least one consumer, and at
every consumer position its value is finite — and zero at a Conv consumer with padding and at
a ConvTranspose (whose taps overlap unevenly, so a constant input is not a constant output).
Then :func:`._prune_apply.apply` removes it and folds the constants into consumer biases, so
the outputs are unchanged (up to float rounding).
"""

from __future__ import annotations

from collections import Counter

import numpy as np
from scipy.special import erf

from onnxslim_kit.passes._common.graph import attr, const_value
from onnxslim_kit.passes.prune.ops import POOLS, REDUCE


def _clip_bounds(node):
    lo = attr(node, "min")
    hi = attr(node, "max")
    if len(node.inputs) > 1 and node.inputs[1] is not None and node.inputs[1].name:
        v = const_value(node.inputs[1])
        lo = None if v is None else float(v)
        if v is None:
            return None
    if len(node.inputs) > 2 and node.inputs[2] is not None and node.inputs[2].name:
        v = const_value(node.inputs[2])
        if v is None:
            return None
        hi = float(v)
    return (-np.inf if lo is None else lo), (np.inf if hi is None else hi)


def _unary_value(node, v: np.ndarray) -> np.ndarray:
    op = node.op
    alpha = attr(node, "alpha")
    if op in ("Identity", "Dropout", "Cast"):
        return v
    if op == "Relu":
        return np.maximum(v, 0)
    if op == "Clip":
        bounds = _clip_bounds(node)
        return np.full_like(v, np.nan) if bounds is None else np.clip(v, *bounds)
    if op == "Sigmoid":
        return 1 / (1 + np.exp(-v))
    if op == "HardSigmoid":
        a, b = (0.2 if alpha is None else alpha), attr(node, "beta", 0.5)
        return np.clip(a * v + b, 0, 1)
    if op == "HardSwish":
        return v * np.clip(v / 6 + 0.5, 0, 1)
    if op == "LeakyRelu":
        return np.where(v < 0, (0.01 if alpha is None else alpha) * v, v)
    if op == "Tanh":
        return np.tanh(v)
    if op == "Elu":
        return np.where(v < 0, (1.0 if alpha is None else alpha) * (np.exp(v) - 1), v)
    if op == "Softplus":
        return np.log1p(np.exp(v))
    if op == "Neg":
        return -v
    if op == "Abs":
        return np.abs(v)
    if op == "Exp":
        return np.exp(v)
    if op == "Erf":
        return erf(v)
    return np.full_like(v, np.nan)


def _per_channel(value: np.ndarray, layout) -> np.ndarray | None:
    """A constant operand as one number per channel, or None if it varies along other axes."""
    if value.size == 1:
        return np.full(layout.size, float(value.reshape(())))
    pos = layout.axis - (layout.rank - value.ndim)
    if pos < 0 or value.shape[pos] == 1:
        return None
    other = [d for i, d in enumerate(value.shape) if i != pos]
    if any(d != 1 for d in other):
        return None
    return value.reshape(-1).astype(np.float64)


_BINARY = {
    "Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide,
    "Max": np.maximum, "Min": np.minimum, "Pow": np.power,
}


def _binary_value(cg, node, values):
    out = cg.layouts[node.outputs[0].name]
    operands = []
    for t in node.inputs:
        if t.name in values:
            operands.append(values[t.name])
        else:
            per = _per_channel(const_value(t), out)
            if per is None:
                return np.full(out.size, np.nan)
            operands.append(per)
    if node.op in ("Sum", "Mean"):
        total = np.sum(operands, axis=0)
        return total / len(operands) if node.op == "Mean" else total
    with np.errstate(all="ignore"):
        return _BINARY[node.op](operands[0], operands[1])


def _source_value(s) -> np.ndarray:
    node = s.node
    w = np.moveaxis(const_value(node.inputs[1]), s.out_axis, 0).reshape(
        const_value(node.inputs[1]).shape[s.out_axis], -1)
    zero = ~np.any(w != 0, axis=1)
    bias = np.zeros(len(zero))
    if len(node.inputs) > 2 and const_value(node.inputs[2]) is not None:
        b = const_value(node.inputs[2]).astype(np.float64)
        if b.ndim == 2 and b.shape[0] != 1:
            return np.full(len(zero), np.nan)
        bias = bias + b.reshape(-1) if b.size > 1 else bias + float(b.reshape(-1)[0])
        if s.kind == "gemm":
            bias = bias * float(attr(node, "beta", 1.0))
    return np.where(zero, bias, np.nan)


def _has_padding(node) -> bool:
    return any(int(p) for p in attr(node, "pads", []) or []) or attr(node, "auto_pad", "NOTSET") not in (
        "NOTSET", b"NOTSET", "VALID", b"VALID")


def _depthwise_value(node, v):
    w = const_value(node.inputs[1]).astype(np.float64).reshape(len(v), -1)
    b = const_value(node.inputs[2]).astype(np.float64) if len(node.inputs) > 2 and \
        const_value(node.inputs[2]) is not None else np.zeros(len(v))
    through = v * w.sum(axis=1) + b
    if _has_padding(node):
        through = np.where(v == 0, through, np.nan)
    return np.where(~np.any(w != 0, axis=1), b, through)


def _bn_value(node, v):
    scale, bias, mean, var = (const_value(t).astype(np.float64) for t in node.inputs[1:5])
    eps = float(attr(node, "epsilon", 1e-5))
    return (v - mean) * scale / np.sqrt(var + eps) + bias


def _pass_value(cg, node, values, v):
    op = node.op
    if op in ("Transpose", "Flatten", "Reshape", "Resize", "MaxPool", "GlobalAveragePool", "GlobalMaxPool"):
        return v
    if op in REDUCE:
        return v if op in ("ReduceMean", "ReduceMax", "ReduceMin") else np.where(v == 0, 0.0, np.nan)
    if op == "AveragePool":
        padded = _has_padding(node) and int(attr(node, "count_include_pad", 0))
        return np.where(v == 0, 0.0, np.nan) if padded else v
    if op in POOLS:
        return np.where(v == 0, 0.0, np.nan)
    if op == "Pad":
        mode = attr(node, "mode", "constant")
        mode = mode.decode() if isinstance(mode, bytes) else mode
        if mode != "constant":
            return v
        pv = 0.0
        if len(node.inputs) > 2 and node.inputs[2] is not None and node.inputs[2].name:
            c = const_value(node.inputs[2])
            pv = np.nan if c is None else float(c.reshape(-1)[0])
        elif attr(node, "value") is not None:
            pv = float(attr(node, "value"))
        return np.where(v == pv, v, np.nan)
    if op == "BatchNormalization":
        return _bn_value(node, v)
    if op == "PRelu":
        slope = _per_channel(const_value(node.inputs[1]), cg.layouts[node.outputs[0].name])
        return np.full_like(v, np.nan) if slope is None else np.where(v < 0, slope * v, v)
    return _unary_value(node, v)


_MERGING = frozenset(_BINARY) | {"Concat", "Sum", "Mean"}  # read several inputs, missing ones as unknown


def channel_values(cg) -> dict:
    """Tensor name → per-channel constant value (NaN where not provably constant)."""
    values = {}
    sources = {id(s.node): s for s in cg.sources}
    depthwise = {id(n) for n, _ in cg.depthwise}
    for node in cg.graph.nodes:
        outs = [t for t in node.outputs if t.name in cg.layouts]
        if not outs:
            continue
        out = outs[0]
        if id(node) in sources:
            values[out.name] = _source_value(sources[id(node)])
        elif node.op not in _MERGING and node.inputs[0].name not in values:
            values[out.name] = np.full(cg.layouts[out.name].size, np.nan)  # input not traced: unknown
        elif id(node) in depthwise:
            values[out.name] = _depthwise_value(node, values[node.inputs[0].name])
        elif node.op == "Concat":
            values[out.name] = np.concatenate([
                values.get(t.name, np.full(cg.layouts[t.name].size, np.nan)) for t in node.inputs])
        elif node.op in _BINARY or node.op in ("Sum", "Mean"):
            values[out.name] = _binary_value(cg, node, values)
        else:
            with np.errstate(all="ignore"):
                values[out.name] = _pass_value(cg, node, values, values[node.inputs[0].name])
    return values


PADDED_CONV = "constant channel feeds a padded Conv"
LAST_CHANNEL = "the last channel of a layer is kept"
CONV_TRANSPOSE = "non-zero constant channel feeds a ConvTranspose"
VARIES = "constant channel varies where read, padding on the way"


def strippable(cg) -> tuple:
    """(units to strip, {consumer index: values at its input}, {reason: count of units kept})."""
    values = channel_values(cg)
    blocked = cg.blocked_units()
    read: set = set()
    kept: dict = {}  # unit -> reason it cannot be stripped
    for c in cg.consumers:
        for unit, value in zip(cg.units_of(c.tensor.name).tolist(), values[c.tensor.name]):
            read.add(unit)
            if not np.isfinite(value):
                kept.setdefault(unit, VARIES)
            elif c.kind == "conv" and value != 0 and _has_padding(c.node):
                kept[unit] = PADDED_CONV
            elif c.kind == "convT" and value != 0:
                kept[unit] = CONV_TRANSPOSE
    constant_at_source = set()
    for s in cg.sources:
        name = s.node.outputs[0].name
        constant_at_source.update(u for u, v in zip(cg.units_of(name).tolist(), values[name]) if np.isfinite(v))
    reasons: Counter = Counter()
    units = set()
    for unit in read:
        if unit in kept:
            if unit in constant_at_source:
                reasons[kept[unit]] += 1  # a plain, varying channel needs no reason
        elif unit in blocked:
            reasons[f"constant channel in a blocked group: {blocked[unit]}"] += 1
        else:
            units.add(unit)
    for s in cg.sources:  # a layer keeps one channel: no zero-size weights (found by the fuzzer)
        own = cg.units_of(s.node.outputs[0].name).tolist()
        if own and all(u in units for u in own):
            units.discard(own[0])
            reasons[LAST_CHANNEL] += 1
    constants = {i: values[c.tensor.name] for i, c in enumerate(cg.consumers)
                 if np.isin(cg.units_of(c.tensor.name), list(units)).any()}
    return units, constants, dict(reasons)
