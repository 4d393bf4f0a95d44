"""The drift search of ``fp16``: which float16 candidates to move back to float32.

A *trial* is a set ``H`` of plan indices in float16. Its model is the float32 emulation that
rounds every float16 weight and tensor (:func:`.apply.emulate`), after island merging
(:func:`.plan.merge_islands`). It is judged by the fidelity contract
(:mod:`onnxslim_kit.fidelity`): its outputs on the held-out samples ``fid.samples`` (never the
samples the ranges were observed on) against the *original* model's ``fid.reference``, view
by view (each output on its own scale, each branch of a concatenated head, the decisions of
Softmax/Sigmoid heads), giving the budget fraction

    u(H) = the target's loss of the worst bound view / the target's budget

and ``H`` meets the target when no NaN/Inf appears where float32 had none and

    u(H) ≤ a,   a = max(fid.allowed, u(∅))

(``fid.allowed``: the share of the budget the pipeline left this pass, 1 under the pass's own
``target=``; ``u(∅)``: the pass's input itself, so when earlier passes already spent more than
this share the pass may not make the model worse, and ``H = ∅`` always meets). :func:`rank`
orders the float16 nodes by the error they add on one *fit* sample,

    score(v) = max_out ‖a − b‖/‖a‖  −  max_in ‖a − b‖/‖a‖   (a: float32, b: the trial)

and the pass keeps the longest suffix of that ranking in float16 that meets the target
(binary search over prefixes moved to float32; ``H = ∅`` reproduces the input model).

Memory (a model much larger than the machine's spare memory): the float16 value of each
weight, ``fp16(W)``, is computed once (:meth:`Search.half_of`, reading one weight at a time
from its file map) and shared by every trial and by the result. A trial's emulation reads it
as ``Cast(fp16(W) → float)`` evaluated by ONNX Runtime at run time (float16 → float32 is
exact, so this is the rounded weight ``fp32(fp16(W))`` one layer at a time, never a float32
copy of the model); weights of float32 nodes stay the input's arrays or file maps. A trial's
session gets the arrays themselves (:meth:`.model.Model.session_proto`), without ORT's
pre-packed weight copies; the cache keeps each trial's scores only, never its model.
"""

from __future__ import annotations

import gc
import inspect

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx_graphsurgeon.ir.tensor import LazyValues

from onnxslim_kit.activations import iter_activations
from onnxslim_kit.model import Model
from onnxslim_kit.runtime import give_back, make_session, run

from onnxslim_kit.passes.fp16.apply import apply, emulate
from onnxslim_kit.passes.fp16.plan import CastModel, build_plan, merge_islands

# ORT's pre-packed weight copies (MatMul/Gemm/Conv): a second copy of the weights per session
_PREPACK = {"prepack": False} if "prepack" in inspect.signature(make_session).parameters else {}


class Trial:
    """The scores of one assignment (its model is rebuilt when needed, never kept): the
    verdict of the fidelity contract and whether a NaN/Inf appeared where float32 had none."""

    def __init__(self, half, verdict, nonfinite: bool):
        self.half = half
        self.verdict = verdict
        self.cosine = verdict.worst("cosine")  # the worst view's worst-sample cosine
        self.max_rel = verdict.worst("rel")
        self.nonfinite = nonfinite
        self.ok = False


class Search:
    """Measures candidate assignments (sets of plan indices in float16) on the emulation,
    judged by ``fid`` (a :class:`onnxslim_kit.fidelity.Fidelity`) on ``fid.samples``."""

    def __init__(self, base, plan_args, opts, fid):
        self.base, self.plan_args, self.fid = base, plan_args, fid
        self.samples = fid.samples
        self.keep_io, self.merge_limit = opts["keep_io"], opts["merge_limit"]
        self.count = 0
        self.halves: dict = {}  # weight name → its float16 values, shared by the trials and the result
        self.used: set = set()  # the names the model being built reads
        self.allowed = fid.allowed
        self.reference_name = "the original model"
        self.finite = fid.reference  # what a NaN/Inf is checked against
        own = outputs(base, self.samples)
        if nonfinite(fid.reference, own):
            self.finite = own  # earlier passes already made NaN/Inf: this pass may keep them
        start = fid.judge(own)
        if not fid.met(start):  # earlier lossy passes already spent more than this pass's share
            self.allowed = start.used
            self.reference_name = (f"the original model (earlier passes already use {start.used:.0%} of the "
                                   f"budget: this pass may not make it worse)")
        del own
        self.cache = {}

    def half_of(self, constant: gs.Constant) -> np.ndarray:
        """``fp16(W)`` of a float32 main-graph weight, computed on first use (the float32 values
        are read without caching them in the graph: one weight's copy alive at a time)."""
        self.used.add(constant.name)
        if constant.name not in self.halves:
            self.halves[constant.name] = read(constant).astype(np.float16)
        return self.halves[constant.name]

    def _keep_used(self) -> None:
        """Drop the float16 values the model just built does not read (a trial with many float32
        nodes reads their float32 weights from the input: holding both would be 1.5× them)."""
        for name in set(self.halves) - self.used:
            del self.halves[name]
        self.used = set()
        give_back()

    def _plan(self):
        model = Model.from_proto(self.base)
        return model, build_plan(model.graph, *self.plan_args)

    def emulation(self, half: set) -> tuple:
        """(the float16 set after island merging, the emulation model of ``half``)."""
        model, infos = self._plan()
        merged = merge_islands(CastModel(model.graph, infos, self.keep_io), half, self.merge_limit)
        emulate(model, infos, merged, self.keep_io, self.half_of)
        self._keep_used()
        model.commit()
        return merged, model

    def evaluate(self, half: set) -> Trial:
        key = frozenset(half)
        if key not in self.cache:
            self.count += 1
            merged, model = self.emulation(half)
            got = outputs(model, self.samples)
            del model
            trial = Trial(merged, self.fid.judge(got), nonfinite(self.finite, got))
            del got
            _collect()
            trial.ok = self._meets(trial)
            self.cache[key] = trial
        return self.cache[key]

    def build(self, trial: Trial) -> tuple:
        """The real float16 model of ``trial`` (its weights the shared float16 arrays) and the
        number of Casts it has."""
        model, infos = self._plan()
        casts = apply(model, infos, trial.half, self.keep_io, self.half_of)
        self._keep_used()
        model.commit()
        return model, casts

    def _meets(self, trial: Trial) -> bool:
        if trial.nonfinite:
            return False
        return self.fid.target.metric == "none" or trial.verdict.met(self.allowed)


def _collect() -> None:
    """Free what a trial left (onnx-graphsurgeon graphs are reference cycles: a dropped graph and
    the activations the ranking held wait for the cycle collector, measured +130 MB on a 279 MB
    decoder) and give the heap's free pages back."""
    gc.collect()
    give_back()


def read(constant: gs.Constant) -> np.ndarray:
    """A constant's values without caching them in the graph (a file-mapped weight stays
    unmapped once the caller drops the array)."""
    lazy = getattr(constant, "_values", None)
    return np.asarray(lazy.load() if isinstance(lazy, LazyValues) else constant.values)


def session(model, extra_outputs=None) -> tuple:
    """``(session, weights)``: a one-thread session of a proto or a :class:`Model`, without ORT's
    arena (each run's buffers go back) and its pre-packed weight copies; a Model's in-memory
    weights are graph inputs, ``weights`` their arrays, fed with every sample (ORT reads fed
    arrays in place; initializers handed over as arrays it copies: measured, a float16 array of
    100 MB cost 100 MB more)."""
    if not isinstance(model, Model):
        return make_session(model, threads=1, arena=False, extra_outputs=extra_outputs, **_PREPACK), {}
    proto, arrays = model.session_proto()
    # lazy values (a proto's tensor not read yet) are read here; arrays are fed as they are
    arrays = {k: np.ascontiguousarray(v.load() if isinstance(v, LazyValues) else v) for k, v in (arrays or {}).items()}
    kept = [t for t in proto.graph.initializer if t.name not in arrays]
    moved = [t for t in proto.graph.initializer if t.name in arrays]
    del proto.graph.initializer[:]
    proto.graph.initializer.extend(kept)
    proto.graph.input.extend(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in moved)
    return make_session(proto, threads=1, arena=False, extra_outputs=extra_outputs, **_PREPACK), arrays


def outputs(model, samples: list) -> list:
    ort_session, weights = session(model)
    return [run(ort_session, {**s, **weights}) for s in samples]


def nonfinite(reference: list, got: list) -> bool:
    """Whether a float output of ``got`` is NaN/Inf where ``reference``'s is finite (or the other
    way round), on any sample."""
    for ref, out in zip(reference, got):
        for name, a in ref.items():
            a, b = np.asarray(a), np.asarray(out.get(name, a))
            if a.dtype.kind == "f" and a.shape == b.shape and not np.array_equal(np.isfinite(a), np.isfinite(b)):
                return True
    return False


def _relative_errors(search: Search, half: set, base: onnx.ModelProto, sample: dict):
    """``rel(name)``: ‖a − b‖/‖a‖ of tensor ``name`` on ``sample`` between the float32 model (a)
    and the emulation of ``half`` (b); inf where their finite entries differ."""
    search.used = set()
    search._keep_used()  # the float32 run maps the input's weights: not with the float16 ones too
    names = [o for node in base.graph.node for o in node.output]
    first = next(iter_activations(base, names, [sample], threads=1))
    first.update({k: np.asarray(v) for k, v in sample.items()})
    give_back()
    _, model = search.emulation(half)
    produced = {o.name for node in model.graph.nodes for o in node.outputs}
    names = [name for name in names if name in produced]
    ort_session, weights = session(model, names)
    observed = {k: v for k, v in run(ort_session, {**sample, **weights}).items() if k in set(names)}
    del ort_session, weights
    observed.update({k: np.asarray(v) for k, v in sample.items()})
    del model

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

    return rel


def rank(search: Search, trial: Trial, base: onnx.ModelProto, infos: list, half: set, sample: dict) -> list:
    """Float16 plan indices, the ones adding the most relative error first (on ``sample``)."""
    rel = _relative_errors(search, trial.half, base, sample)
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
    ranked = rank(search, best, base, infos, half0, sample)
    _collect()
    lo, hi = 0, len(ranked)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        trial = search.evaluate(half0 - set(ranked[:mid]))
        lo, hi = (lo, mid) if trial.ok else (mid, hi)
    dropped = ranked[:hi]
    return search.evaluate(half0 - set(dropped)), dropped
