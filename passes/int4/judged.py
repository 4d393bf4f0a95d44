"""The fidelity stop of ``int4``'s mixed precision: how many of the chosen 8-bit layers to keep.

The greedy choice (:func:`.mixed.select`, loss per extra byte within ``max_ratio``) gives an
order ``c_1, c_2, …, c_m``. The candidate ``P_j`` keeps ``c_1 … c_j`` at 8 bits and every other
layer at int4; it is judged by the fidelity contract (:mod:`onnxslim_kit.fidelity`): its
outputs on the held-out samples ``fid.samples`` against the original's ``fid.reference``,
per output view, give the budget fraction ``u(j)``, and

    j* = min { j ∈ [0, m] : u(j) ≤ fid.allowed }        (m when none meets: the size cap binds)

found by a bracketing search over ``j`` (``u`` taken as non-increasing in ``j``: each step
moves one more layer from 4 to 8 bits), after ``j = 0`` is judged. The probes are placed by the
predicted losses (:func:`stop`): with ``S(j)`` the summed loss of ``c_1 … c_j`` and ``L`` that of
every candidate, ``u`` is taken as linear in ``S`` between the bracket's judged ends (the upper
end, before one is judged, the point ``(L, 0)``: no int4 loss left), the next probe the smallest
``j`` whose ``S(j)`` reaches the line's crossing of ``fid.allowed``; a probe that does not halve
the bracket makes the next one a bisection (at most about twice bisection's trials). Same
``j*`` as a bisection for a non-increasing ``u``, fewer trials when the losses predict it
(``tests/passes/int4/test_int4_costs.py``; the report's ``mixed_probes`` lists the judged
``(j, u(j))``). So the step stops promoting once the pipeline's share of the budget holds (a smaller
model than ``max_ratio`` allows), and promotes up to ``max_ratio`` while the target is missed
(``j = m`` judged and missed). ``target=none`` judges nothing and keeps all ``m``.

The candidate model is an *emulation*: the model as the pass received it, with every
targeted weight a graph input fed its dequantized value in the stored layout (int4 from the
results held for the choice; 8-bit as :func:`.rewrite.rewrite_nbits8` / :func:`.rewrite.rewrite_int8`
would store it), one ONNX Runtime session for all trials (:data:`.mixed.RUN_THREADS` intra-op threads; the judged
samples stacked into one run once the first trial has shown that gives the same outputs bit for
bit, :mod:`.batched`). Not emulated: MatMulNBits
``accuracy_level=4``'s int8 activations (the pipeline's verification judges the real model),
a weight shared by several layers is fed the first layer's int4 values, and a weight also
read by another node (a tied embedding table) is not fed (that layer reads as float). Memory: the
session's float weights plus one dequantized copy of the targeted weights (built once, while
:func:`.rounds.quantize_all` has each float weight, :class:`.promote.ScratchSeen`;
a promoted layer's 8-bit copy, made on its first trial, replaces its int4 one for the trials
that promote it), written to a scratch file (:class:`onnxslim_kit.streaming.ScratchArrays`)
and fed as its maps: file pages, dropped after each trial, never heap (a 933 MB decoder: the
step's peak anonymous memory 1288 MB → about 330 MB, sampled in one ``fuse,int4(method=rtn)`` run;
its RSS now the 0.94 GB of file pages a whole-model run reads).
"""

from __future__ import annotations

import numpy as np

from onnxslim_kit.runtime import give_back, make_session, prepare_feed

import onnxslim_kit.passes.int4.batched as _int4_batched
import onnxslim_kit.passes.int4.mixed as _int4_mixed
import onnxslim_kit.passes.int4.quant as _int4_quant
from onnxslim_kit.passes.int4.rewrite import stored_layout


def eight_bit(target, fmt: str, keep=None) -> np.ndarray:
    """The 8-bit weight of ``target`` in its stored layout, as the rewrite would encode it;
    ``keep(codes, scale)``, when given, gets the ``nbits`` encoding (:func:`.rewrite.rewrite_nbits8`
    takes it instead of reading and quantizing the float weight again)."""
    wt = target.load()
    if fmt == "nbits":
        block = _int4_mixed.int8_block(wt.shape[1])
        codes, scale = _int4_quant.quantize_int8_blocks(wt, block)
        if keep is not None:
            keep(codes, scale)
        deq = _int4_quant.dequantize_int8_blocks(codes, scale, wt.shape[1])
    else:
        q, scale = _int4_quant.quantize_int8_columns(wt.T)
        deq = (q.astype(np.float32) * scale).T
    return stored_layout(target, deq)


class Emulation:
    """One session of the model with the targeted weights as inputs; :meth:`judge` a promotion.
    ``int4``: {weight name: its dequantized int4 weight in the stored layout, a map of
    ``scratch``} (made while the weights were quantized, :func:`.promote.promote`)."""

    def __init__(self, model, targets: list, int4: dict, scratch, fid, fmt: str):
        self.fid, self.fmt, self.scratch = fid, fmt, scratch
        self.targets = emulated(targets)
        proto, _ = _int4_mixed.weights_as_inputs(model.to_proto(), list(self.targets))
        self.session = make_session(proto, "basic", threads=_int4_mixed.RUN_THREADS, arena=False, prepack=False)
        del proto
        self.outputs = [o.name for o in self.session.get_outputs()]
        self.feeds = [prepare_feed(self.session, s) for s in fid.samples]
        self.runs = _int4_batched.Runs(self.session, self.outputs, self.feeds)  # stacked once checked equal
        self.int4 = {name: int4[name] for name in self.targets}
        self.int8: dict = {}  # the 8-bit values of the layers a trial promoted, made once
        self.encoded: dict = {}  # their nbits (codes, scales), maps of ``scratch``: the rewrite's
        self.count, self.probes = 0, []

    def judge(self, promoted: list):
        """The verdict of the model with ``promoted`` (weight names) at 8 bits, the rest int4."""
        self.count += 1
        weights = dict(self.int4)
        for name in promoted:
            if name in weights:
                if name not in self.int8:
                    self.int8[name] = self.scratch.put(eight_bit(self.targets[name], self.fmt, self._keeper(name)))
                weights[name] = self.int8[name]
        got = self.runs.run(weights)
        del weights
        self.scratch.release()  # the next trial reads other pages
        verdict = self.fid.judge(got)
        self.probes.append((len(promoted), round(float(verdict.used), 4)))  # (j, u(j)) for the report
        return verdict

    def _keeper(self, name: str):
        """``keep(codes, scale)`` for :func:`eight_bit`: the encoding to the scratch file, for the rewrite."""
        def keep(codes: np.ndarray, scale: np.ndarray) -> None:
            self.encoded[name] = (self.scratch.put(codes), self.scratch.put(scale))
        return keep

    def close(self) -> None:
        self.session = self.int4 = self.int8 = self.feeds = self.runs = None  # (encoded: the caller's)
        give_back()


def emulated(targets: list) -> dict:
    """{weight name: its first target} of the weights every reader of which is a target (not a
    tied embedding's table): those the emulation feeds."""
    nodes = {id(t.node) for t in targets}
    out: dict = {}
    for t in targets:
        if all(id(user) in nodes for user in t.weight.outputs):
            out.setdefault(t.weight.name, t)
    return out


def stop(emulation: Emulation, order: list, losses: dict) -> tuple:
    """``(the first j* names of order, the verdict of that promotion, trials)`` (module docstring);
    ``losses``: the predicted loss of every candidate, which places the probes."""
    fid = emulation.fid
    verdicts = {0: emulation.judge([])}
    if fid.met(verdicts[0]) or not order:
        return [], verdicts[0], emulation.count
    gained = np.cumsum([0.0] + [max(losses.get(n, 0.0), 0.0) for n in order])  # S(j)
    total = max(float(sum(max(v, 0.0) for v in losses.values())), float(gained[-1]))
    lo, hi, halve = 0, None, False  # u(lo) > allowed; u(hi) ≤ allowed (None: not yet found)
    while hi is None or hi - lo > 1:
        top = len(order) if hi is None else hi - 1
        if halve:
            j = (lo + top + 1) // 2
        else:  # where u, linear in S between the bracket's ends, meets the allowed fraction
            right = (gained[hi], verdicts[hi].used) if hi is not None else (total, 0.0)
            j = _crossing(gained, (gained[lo], verdicts[lo].used), right, fid.allowed)
        j = min(max(j, lo + 1), top)
        width = (top if hi is None else hi) - lo
        verdicts[j] = emulation.judge(order[:j])
        if fid.met(verdicts[j]):
            hi = j
        elif j == len(order):
            return list(order), verdicts[j], emulation.count  # the size cap binds
        else:
            lo = j
        halve = not halve and ((top if hi is None else hi) - lo) * 2 > width  # a poor guess: bisect next
    return list(order[:hi]), verdicts[hi], emulation.count


def _crossing(gained: np.ndarray, left: tuple, right: tuple, allowed: float) -> int:
    """The smallest ``j`` whose ``S(j)`` reaches the point where the line through ``left`` and
    ``right`` ((S, u) pairs) falls to ``allowed``."""
    (s0, u0), (s1, u1) = left, right
    if not (np.isfinite(u0) and np.isfinite(u1)) or u0 <= u1 or s1 <= s0:
        return int(np.searchsorted(gained, (s0 + s1) / 2))
    at = s0 + (u0 - allowed) / (u0 - u1) * (s1 - s0)
    return int(np.searchsorted(gained, at - 1e-12 * abs(at)))


def report(result, fid, verdict, kept: int, chosen: int, trials: int) -> None:
    """``target``, ``budget_used``, ``budget_allowed``, the per-view figures and the note."""
    result.metrics["target"] = str(fid.target)
    result.metrics["budget_used"] = round(verdict.used, 4)
    result.metrics["budget_allowed"] = round(fid.allowed, 4)
    result.metrics["views"] = [s.to_dict() for s in verdict.scores]
    result.metrics["mixed_trials"] = trials
    held = "holds" if fid.met(verdict) else "missed within max_ratio"
    result.notes.append(
        f"mixed precision: {kept} of the {chosen} 8-bit layers max_ratio allows; fidelity {held}: "
        f"{verdict.binding} binds (int4 emulated with dequantized weights), {verdict.used:.0%} of the "
        f"{fid.target} budget used (allowed {fid.allowed:.0%}), judged on {verdict.samples} "
        f"{fid.judged_on or 'samples'}")
