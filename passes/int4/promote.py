"""The mixed-precision step of ``int4`` (``max_ratio > 0``): which layers become 8-bit.

Every target is quantized to int4 first (:func:`.rounds.quantize_all`); a layer is a
candidate when its weight is read by it alone and 8 bits can be written in the chosen format
(``nbits``, or ``qdq`` at opset ≥ 13). With the budget

    budget = max_ratio · Σ float bytes − Σ int4 bytes

the layers whose measured output loss per extra byte is largest become 8-bit while the extra
bytes stay within ``budget`` (:func:`.mixed.sensitivities`, :func:`.mixed.select`); the
others go on to int4 with their int4 results reused.
"""

from __future__ import annotations

import numpy as np

from onnxslim_kit.model import Model
from onnxslim_kit.api import PassResult
from onnxslim_kit.runtime import give_back

import onnxslim_kit.passes.int4.mixed as _int4_mixed
import onnxslim_kit.passes.int4.quant as _int4_quant
from onnxslim_kit.passes.int4.rewrite import rewrite_int8, rewrite_nbits8, stored_layout
from onnxslim_kit.passes.int4.rounds import codes, quantize_all


def promote(model: Model, targets: list, opts: dict, ctx, fmt: str, result: PassResult) -> tuple:
    """Quantize every target to int4, measure each one's output loss alone, promote the worst to
    8 bits within ``max_ratio`` (:mod:`onnxslim_kit.passes.int4.mixed`). Returns (targets left for int4, their int4
    results by key, (float bytes, bytes) of the promoted layers)."""
    first = quantize_all(model, targets, opts, ctx, result)
    costs, candidates, budget = _candidates(model, targets, first, opts, fmt)
    if budget <= 0 or not candidates:
        result.notes.append(f"mixed precision: no 8-bit layer fits max_ratio={opts['max_ratio']}")
        return targets, first, (0, 0)
    losses = _int4_mixed.sensitivities(model.to_proto(), candidates, ctx.feed.take(min(opts["samples"], 16)))
    give_back()  # the sensitivity session's run buffers
    chosen = _int4_mixed.select(costs, losses, budget)
    spent = [0, 0]
    for t in targets:
        if t.weight.name not in chosen:
            continue
        if fmt == "nbits":
            rewrite_nbits8(model, t, opts)
        else:
            rewrite_int8(model, t)
        spent[0] += t.float_bytes
        spent[1] += costs[t.weight.name][1]
        result.rewrite("MatMul/Gemm→8-bit (mixed precision)")
    result.metrics["int8_layers"] = sorted(t.node.name for t in targets if t.weight.name in chosen)
    return [t for t in targets if t.weight.name not in chosen], first, tuple(spent)


def _candidates(model: Model, targets: list, first: dict, opts: dict, fmt: str) -> tuple:
    """({weight name: (int4 bytes, 8-bit bytes)}, {weight name: dequantized int4 weight in the
    stored layout, on demand}, the byte budget for 8-bit layers)."""
    by_weight = {}
    for t in targets:
        by_weight.setdefault(t.weight.name, set()).add(t.key)
    float_total = int4_total = 0
    costs, candidates, seen = {}, {}, set()
    for t in targets:
        if t.key in seen:
            continue
        seen.add(t.key)
        item = t.dtype.itemsize
        float_total += t.float_bytes
        int4 = _int4_mixed.int4_bytes(t.shape, opts["block_size"], opts["symmetric"], item)
        int4_total += int4
        if len(by_weight[t.weight.name]) == 1 and (fmt == "nbits" or model.opset >= 13):
            int8 = (_int4_mixed.int8_bytes(t.shape, item) if fmt == "nbits"
                    else int(np.prod(t.shape)) + t.shape[0] * item)
            costs[t.weight.name] = (int4, int8)
            candidates[t.weight.name] = lambda t=t: stored_layout(t, _int4_quant.dequantize(codes(first[t.key])))
    return costs, candidates, int(opts["max_ratio"] * float_total) - int4_total
