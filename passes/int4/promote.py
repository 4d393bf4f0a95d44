"""The mixed-precision step of ``int4`` (``max_ratio > 0``): which layers become 8-bit.

Every target is quantized to int4 first (:func:`.rounds.quantize_all`); a layer is a
candidate when its weight is read by it alone and 8 bits can be written in the chosen format
(``nbits``, or ``qdq`` at opset ≥ 13). With the budget

    budget = max_ratio · Σ float bytes − Σ int4 bytes

the layers whose output loss per extra byte is largest are chosen for 8 bits while the extra
bytes stay within ``budget`` (:func:`.mixed.select`): the loss measured for the ``measured``
candidates nearest the cut the local proxy marks, predicted from the proxy for the others
(:mod:`.proxy`, :func:`.mixed.shortlist`, :func:`.mixed.predicted`; all measured when there
are no more candidates). Of that choice, in its greedy order, the shortest prefix whose
emulated model holds the fidelity target (``pass_fidelity(ctx)``: the pipeline's share, or the
pass's own ``target=``) becomes 8-bit — the step stops when the share holds and promotes up
to ``max_ratio`` while it is missed (:mod:`.judged`; ``target=none``: the whole choice); the
others go on to int4 with their int4 results reused.
"""

from __future__ import annotations

import numpy as np

from onnxslim_kit.model import Model
from onnxslim_kit.api import PassResult, pass_fidelity
from onnxslim_kit.runtime import give_back

import onnxslim_kit.passes.int4.judged as _int4_judged
import onnxslim_kit.passes.int4.mixed as _int4_mixed
import onnxslim_kit.passes.int4.proxy as _int4_proxy
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
    losses = _losses(model, targets, first, (costs, candidates, budget), ctx, result)
    chosen = _fidelity_stop(model, targets, first, (costs, losses, _int4_mixed.select(costs, losses, budget)), ctx,
                            fmt, result)
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


def _fidelity_stop(model: Model, targets: list, first: dict, choice: tuple, ctx, fmt: str, result: PassResult) -> set:
    """The greedy choice's shortest prefix that holds ``pass_fidelity(ctx)`` (all of it when
    none does, or with ``target=none``), :mod:`.judged`."""
    costs, losses, chosen = choice
    fid = pass_fidelity(ctx)
    if fid.target.metric == "none" or not chosen:
        return chosen
    order = sorted(chosen, key=lambda n: (-losses.get(n, 0.0) / max(costs[n][1] - costs[n][0], 1), n))
    kept, verdict, trials = _int4_judged.stop(model, targets, first, order, fid, fmt)
    _int4_judged.report(result, fid, verdict, len(kept), len(order), trials)
    return set(kept)


def _losses(model: Model, targets: list, first: dict, choice: tuple, ctx, result: PassResult) -> dict:
    """{weight name: loss} for the candidates: measured for all when there are at most
    ``measured``; else the proxy for all, measured for one per class and for the shortlist near
    the cut, predicted for the rest (:mod:`.mixed`)."""
    costs, candidates, budget = choice
    opts = ctx.options
    samples = ctx.feed.take(min(opts["samples"], 16))
    views = pass_fidelity(ctx).views  # the loss per output view (a head's branches on their own scales)
    if len(candidates) <= opts["measured"]:
        measured = _measure(model, candidates, list(candidates), samples, views)
        result.metrics.update(mixed_candidates=len(candidates), mixed_measured=len(measured))
        return measured
    by_weight = {t.weight.name: t for t in targets if t.weight.name in candidates}
    proxies = _proxies(model, by_weight, first, samples, opts["threads"])
    nodes = {id(t.node) for t in by_weight.values()}
    classes = {name: _int4_proxy.role(t.node, nodes) for name, t in by_weight.items()}
    measured = _measure(model, candidates, _int4_mixed.representatives(costs, proxies, classes, opts["measured"]),
                        samples, views)
    losses = _int4_mixed.predicted(measured, proxies, classes)
    more = _int4_mixed.shortlist(costs, losses, budget, opts["measured"] - len(measured), measured)
    measured.update(_measure(model, candidates, more, samples, views))
    result.metrics.update(mixed_candidates=len(candidates), mixed_measured=len(measured),
                          mixed_classes=len(set(classes.values())))
    return _int4_mixed.predicted(measured, proxies, classes)


def _proxies(model: Model, by_weight: dict, first: dict, samples: list, threads: int) -> dict:
    """{weight name: e} (:mod:`.proxy`), rows of all inputs from one pass over ``samples``."""
    rows = _int4_proxy.input_rows(model, {t.node.inputs[0].name: t.shape[1] for t in by_weight.values()}, samples)
    out = {}
    for name, t in by_weight.items():
        deq = _int4_quant.dequantize(codes(first[t.key]))
        out[name] = _int4_proxy.output_error(t.load(), deq, rows[t.node.inputs[0].name], threads)
    del rows
    give_back()
    return out


def _measure(model: Model, candidates: dict, names: list, samples: list, views=None) -> dict:
    """{name: measured loss} (:func:`.mixed.sensitivities`, one session) for ``names``."""
    if not names:
        return {}
    losses = _int4_mixed.sensitivities(model.to_proto(), {n: candidates[n] for n in names}, samples, views)
    give_back()  # the sensitivity session's run buffers
    return losses


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
