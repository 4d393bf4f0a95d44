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

Each float weight is read once for the step (:class:`ScratchSeen`, the ``visit`` of
:func:`.rounds.quantize_all`): with it in memory, its int4 result gives the proxy (on input
rows taken before, one pass) and the dequantized copy in the stored layout that the
sensitivity runs and the emulation feed (a scratch file's pages). Issue 16's 2.75 GB decoder
read every weight 3–4 times before (the int4 results, the proxy, the emulation copies).
"""

from __future__ import annotations

import numpy as np

from onnxslim_kit.model import Model
from onnxslim_kit.api import PassResult, pass_fidelity
from onnxslim_kit.runtime import give_back
from onnxslim_kit.streaming import ScratchArrays

import onnxslim_kit.passes.int4.judged as _int4_judged
import onnxslim_kit.passes.int4.mixed as _int4_mixed
import onnxslim_kit.passes.int4.proxy as _int4_proxy
import onnxslim_kit.passes.int4.quant as _int4_quant
from onnxslim_kit.passes.int4.rewrite import rewrite_int8, rewrite_nbits8, stored_layout
from onnxslim_kit.passes.int4.rounds import quantize_all


def promote(model: Model, targets: list, opts: dict, ctx, fmt: str, result: PassResult) -> tuple:
    """Quantize every target to int4, measure each one's output loss alone, promote the worst to
    8 bits within ``max_ratio`` (:mod:`onnxslim_kit.passes.int4.mixed`). Returns (targets left for int4, their int4
    results by key, (float bytes, bytes) of the promoted layers)."""
    costs, budget = _costs(model, targets, opts, fmt)
    if budget <= 0 or not costs:
        result.notes.append(f"mixed precision: no 8-bit layer fits max_ratio={opts['max_ratio']}")
        return targets, quantize_all(model, targets, opts, ctx, result), (0, 0)
    fid = pass_fidelity(ctx)
    judged = fid.target.metric != "none"
    by_weight = {t.weight.name: t for t in targets if t.weight.name in costs}
    wanted = set(costs) | (set(_int4_judged.emulated(targets)) if judged else set())
    seen = ScratchSeen(ScratchArrays(), wanted)  # dequantized int4 weights: file pages, not heap
    try:
        samples = ctx.feed.take(min(opts["samples"], 16))
        proxy = len(costs) > opts["measured"]
        if proxy:
            seen.rows = _int4_proxy.input_rows(model, {t.node.inputs[0].name: t.shape[1] for t in by_weight.values()},
                                               samples, threads=_int4_mixed.RUN_THREADS)
            seen.proxied, seen.blas = set(costs), opts["threads"]
        first = quantize_all(model, targets, opts, ctx, result, visit=seen.visit)
        seen.rows = None
        give_back()
        size = sum(t.float_bytes for t in by_weight.values())
        samples = samples[:_int4_mixed.sample_count(len(samples), size)]
        losses = _losses(model, by_weight, seen, (costs, budget), (samples, fid.views, proxy), opts, result)
        chosen = _int4_mixed.select(costs, losses, budget)
        encoded: dict = {}  # the 8-bit encodings the fidelity stop made (scratch maps)
        if judged and chosen:
            chosen = _fidelity_stop(model, targets, seen, (costs, losses, chosen), fid, fmt, result, encoded)
        spent = _promote(model, targets, (chosen, costs, encoded), fmt, opts, result)
    finally:
        seen.scratch.close()
    result.metrics["int8_layers"] = sorted(t.node.name for t in targets if t.weight.name in chosen)
    return [t for t in targets if t.weight.name not in chosen], first, tuple(spent)


def _promote(model: Model, targets: list, choice: tuple, fmt: str, opts: dict, result: PassResult) -> list:
    """Rewrite the ``chosen`` layers at 8 bits (``encoded``: {weight name: (codes, scales)} made
    already, copied out of the scratch file); returns [their float bytes, their 8-bit bytes]."""
    chosen, costs, encoded = choice
    spent = [0, 0]
    for t in targets:
        if t.weight.name not in chosen:
            continue
        if fmt == "nbits":
            made = encoded.get(t.weight.name)
            rewrite_nbits8(model, t, opts, tuple(np.array(a) for a in made) if made is not None else None)
        else:
            rewrite_int8(model, t)
        spent[0] += t.float_bytes
        spent[1] += costs[t.weight.name][1]
        result.rewrite("MatMul/Gemm→8-bit (mixed precision)")
    return spent


class ScratchSeen:
    """What :func:`promote` keeps of each layer while :func:`.rounds.quantize_all` has its float
    weight: the dequantized int4 weight in the stored layout (``wanted`` weights, the first
    layer of a shared one) as a map of ``scratch``, and the proxy ``e`` of the ``proxied``
    weights on ``rows`` (:mod:`.proxy`, BLAS threads ``blas``)."""

    def __init__(self, scratch: ScratchArrays, wanted: set):
        self.scratch, self.wanted = scratch, wanted
        self.int4: dict = {}
        self.proxies: dict = {}
        self.rows, self.proxied, self.blas = None, set(), 1

    def visit(self, target, wt: np.ndarray, qw):
        """The proxy and the dequantized copy of one layer (any thread); returns the callable that
        keeps them (the scratch write: :func:`.rounds.quantize_all` calls it in the layers' order)."""
        name = target.weight.name
        if name not in self.wanted or name in self.int4:
            return None
        deq = _int4_quant.dequantize(qw)
        proxy = (_int4_proxy.output_error(wt, deq, self.rows[target.node.inputs[0].name], self.blas)
                 if name in self.proxied else None)
        stored = stored_layout(target, deq)
        del deq

        def keep() -> None:
            if name in self.int4:  # a weight shared by layers: the first layer's, in order
                return
            if proxy is not None:
                self.proxies[name] = proxy
            self.int4[name] = self.scratch.put(stored)
        return keep


def _fidelity_stop(model: Model, targets: list, seen: ScratchSeen, choice: tuple, fid, fmt: str,
                   result: PassResult, encoded: dict) -> set:
    """The greedy choice's shortest prefix that holds ``fid`` (all of it when none does), :mod:`.judged`;
    ``encoded`` gets the 8-bit encodings the trials made."""
    costs, losses, chosen = choice
    order = sorted(chosen, key=lambda n: (-losses.get(n, 0.0) / max(costs[n][1] - costs[n][0], 1), n))
    emulation = _int4_judged.Emulation(model, targets, seen.int4, seen.scratch, fid, fmt)
    try:
        kept, verdict, trials = _int4_judged.stop(emulation, order, losses)
        result.metrics["mixed_probes"] = list(emulation.probes)
        result.metrics["mixed_stacked"] = bool(emulation.runs.checked)  # later trials ran the samples as one batch
        encoded.update(emulation.encoded)
    finally:
        emulation.close()
    _int4_judged.report(result, fid, verdict, len(kept), len(order), trials)
    return set(kept)


def _losses(model: Model, by_weight: dict, seen: ScratchSeen, choice: tuple, data: tuple, opts: dict,
            result: PassResult) -> dict:
    """{weight name: loss} for the candidates: measured for all when there are at most
    ``measured`` (``proxy`` false); else the proxy for all, measured for one per class and for
    the shortlist near the cut, predicted for the rest (:mod:`.mixed`); one session."""
    costs, budget = choice
    samples, views, proxy = data
    values = {name: (lambda m=m: m) for name, m in seen.int4.items() if name in costs}  # maps, fed where they lie
    sensitivity = _int4_mixed.Sensitivity(model.to_proto(), list(costs), samples, views)
    try:
        if not proxy:
            measured = sensitivity.losses(values)
            result.metrics.update(mixed_candidates=len(costs), mixed_measured=len(measured),
                                  mixed_samples=len(samples), mixed_suffix_runs=_suffixes(sensitivity, measured))
            return measured
        proxies = seen.proxies
        nodes = {id(t.node) for t in by_weight.values()}
        classes = {name: _int4_proxy.role(t.node, nodes) for name, t in by_weight.items()}
        reps = _int4_mixed.representatives(costs, proxies, classes, opts["measured"])
        measured = sensitivity.losses({n: values[n] for n in reps})
        losses = _int4_mixed.predicted(measured, proxies, classes)
        more = _int4_mixed.shortlist(costs, losses, budget, opts["measured"] - len(measured), measured)
        measured.update(sensitivity.losses({n: values[n] for n in more}))
    finally:
        sensitivity.close()
        seen.scratch.release()
        give_back()  # the sensitivity session's run buffers
    result.metrics.update(mixed_candidates=len(costs), mixed_measured=len(measured),
                          mixed_classes=len(set(classes.values())), mixed_samples=len(samples),
                          mixed_suffix_runs=_suffixes(sensitivity, measured))
    return _int4_mixed.predicted(measured, proxies, classes)


def _suffixes(sensitivity, measured: dict) -> int:
    """How many measured candidates ran as suffixes (:mod:`.suffix`)."""
    return sum(name in sensitivity.suffixed for name in measured)


def _costs(model: Model, targets: list, opts: dict, fmt: str) -> tuple:
    """({weight name: (int4 bytes, 8-bit bytes)} of the candidates, the byte budget for 8-bit layers)."""
    by_weight = {}
    for t in targets:
        by_weight.setdefault(t.weight.name, set()).add(t.key)
    float_total = int4_total = 0
    costs, seen = {}, set()
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
    return costs, int(opts["max_ratio"] * float_total) - int4_total
