"""The drift search of ``fp16``: which float16 candidates to move back to float32.

A *trial* is a set ``H`` of plan indices in float16. Its model is the float32 emulation that
rounds every float16 weight and tensor (:func:`.apply.emulate`), after island merging
(:func:`.plan.merge_islands`); its drift against the reference outputs ``y`` (the original
model, or this pass's input when earlier passes already miss the target) over the samples is

    cos(H) = min over outputs of the worst-sample cosine(y, ŷ_H),   rel(H) = max relative error

and ``H`` meets ``target`` when no NaN/Inf appears where float32 had none and ``cos(H) ≥ X``
(``cos:X``) or ``rel(H) ≤ X`` (``rel:X``). :func:`rank` orders the float16 nodes by the error
they add on one sample,

    score(v) = max_out ‖a − b‖/‖a‖  −  max_in ‖a − b‖/‖a‖   (a: float32, b: the trial)

and the pass keeps the longest suffix of that ranking in float16 that meets the target
(binary search over prefixes moved to float32; ``H = ∅`` reproduces the input model).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from onnxslim_kit.activations import iter_activations
from onnxslim_kit.metrics import compare, merge
from onnxslim_kit.model import Model
from onnxslim_kit.runtime import make_session, run

from onnxslim_kit.passes.fp16.apply import apply, emulate
from onnxslim_kit.passes.fp16.plan import CastModel, build_plan, merge_islands


class Trial:
    def __init__(self, half, model, drift):
        self.half, self.model = half, model  # model: the float16-rounding emulation
        self.cosine = min((d.cosine for d in drift.values()), default=1.0)
        self.max_rel = max((d.max_rel for d in drift.values()), default=0.0)
        self.nonfinite = any(d.nonfinite_mismatch for d in drift.values())
        self.ok = False


class Search:
    """Measures candidate assignments (sets of plan indices in float16) on the emulation."""

    def __init__(self, base, plan_args, opts, samples, original, target):
        self.base, self.plan_args, self.samples, self.target = base, plan_args, samples, target
        self.keep_io, self.merge_limit = opts["keep_io"], opts["merge_limit"]
        self.count = 0
        self.reference = outputs(original, samples)
        self.reference_name = "the original model"
        if not self._meets(Trial(set(), None, drift(self.reference, outputs(base, samples)))):
            self.reference = outputs(base, samples)  # earlier lossy passes already miss the target
            self.reference_name = "the input of this pass (earlier passes already miss the target)"
        self.cache = {}

    def _plan(self):
        model = Model.from_proto(self.base)
        return model, build_plan(model.graph, *self.plan_args)

    def evaluate(self, half: set) -> Trial:
        key = frozenset(half)
        if key not in self.cache:
            self.count += 1
            model, infos = self._plan()
            merged = merge_islands(CastModel(model.graph, infos, self.keep_io), half, self.merge_limit)
            emulate(model, infos, merged, self.keep_io)
            model.commit()
            proto = model.to_proto()
            trial = Trial(merged, proto, drift(self.reference, outputs(proto, self.samples)))
            trial.ok = self._meets(trial)
            self.cache[key] = trial
        return self.cache[key]

    def build(self, trial: Trial) -> tuple:
        """The real float16 model of ``trial`` and the number of Casts it has."""
        model, infos = self._plan()
        casts = apply(model, infos, trial.half, self.keep_io)
        model.commit()
        return model, casts

    def _meets(self, trial: Trial) -> bool:
        if trial.nonfinite:
            return False
        if self.target is None:
            return True
        kind, value = self.target
        return trial.cosine >= value if kind == "cos" else trial.max_rel <= value


def outputs(proto: onnx.ModelProto, samples: list) -> list:
    session = make_session(proto, threads=1)
    return [run(session, s) for s in samples]


def drift(reference: list, outputs: list) -> dict:
    drift = {}
    for name in reference[0]:
        if name in outputs[0] and np.asarray(reference[0][name]).dtype.kind == "f":
            drift[name] = merge([compare(r[name], o[name]) for r, o in zip(reference, outputs)])
    return drift


def rank(trial: Trial, base: onnx.ModelProto, infos: list, half: set, sample: dict) -> list:
    """Float16 plan indices, the ones adding the most relative error first (on ``sample``)."""
    produced = {o for node in trial.model.graph.node for o in node.output}
    names = [o for node in base.graph.node for o in node.output if o in produced]
    first = next(iter_activations(base, names, [sample], threads=1))
    first.update({k: np.asarray(v) for k, v in sample.items()})
    observed = next(iter_activations(trial.model, names, [sample], threads=1))
    observed.update({k: np.asarray(v) for k, v in sample.items()})

    def rel(name):
        if name not in observed or name not in first or np.asarray(first[name]).dtype.kind != "f":
            return 0.0
        a, b = np.asarray(first[name], dtype=np.float64), np.asarray(observed[name], dtype=np.float64)
        if a.shape != b.shape:
            return 0.0
        if not np.all(np.isfinite(b) == np.isfinite(a)):
            return float("inf")
        ok = np.isfinite(a)
        norm = np.linalg.norm(a[ok])
        return float(np.linalg.norm(a[ok] - b[ok]) / norm) if norm > 0 else 0.0

    scores = {}
    for k in half:
        node = infos[k].node
        out_err = max((rel(node.outputs[i].name) for i in infos[k].outs), default=0.0)
        in_err = max((rel(t.name) for t in node.inputs if isinstance(t, gs.Variable) and t.name), default=0.0)
        scores[k] = out_err - in_err if np.isfinite(out_err) else float("inf")
    return sorted(half, key=lambda k: (-scores[k], k))


def fallback(search: Search, base: onnx.ModelProto, infos: list, half0: set, sample: dict) -> tuple:
    """``(the best trial, the plan indices moved to float32 for the target)``: every candidate in
    float16 when that meets the target, else the shortest prefix of :func:`rank` that does."""
    best = search.evaluate(half0)
    if best.ok:
        return best, []
    ranked = rank(best, base, infos, half0, sample)
    lo, hi = 0, len(ranked)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        trial = search.evaluate(half0 - set(ranked[:mid]))
        lo, hi = (lo, mid) if trial.ok else (mid, hi)
    dropped = ranked[:hi]
    return search.evaluate(half0 - set(dropped)), dropped
