"""Fidelity target and per-layer fallback of the ``int8`` pass.

A candidate is judged by the fidelity contract (:mod:`onnxslim_kit.fidelity`): its outputs on
the *held-out* samples ``fid.samples`` (never the samples it was calibrated on) against the
*original* model's ``fid.reference``, view by view (each output on its own scale, each branch
of a concatenated head on its own, the decisions of Softmax / Sigmoid heads, integer outputs
exactly). A candidate's *score* is the budget fraction it uses, ``u = verdict.used`` (0: the
original's outputs; 1: all of the target's loss budget); it is accepted when
``u ≤ fid.allowed``, the share of the budget the pipeline left this pass (1 under the pass's
own ``target=``). Lower is better everywhere below.

Search (each step builds the model with a set of int8 layers and scores it):

1. all candidate layers int8 — done if the target holds;
2. sensitivity ``s_l`` of every layer ``l``:

   * ``local``: the relative squared error ``s_l`` of each layer quantized alone, measured
     with the bias correction (one run of the float model carrying a fake-quantized twin of
     every layer on the fit samples, :mod:`onnxslim_kit.passes.int8.correct`) — how much 8 bits
     hurt the layer itself, free but a coarse ranking (it ignores how the error grows
     downstream: with 1 − cos as the local error, PP-OCRv4 rec sent 33 layers back to float
     where e2e sent 3);
   * ``e2e``: each layer alone in int8, ``s_l = u`` at the outputs — the best ranking; with
     ``gated_ranking`` (default) from *one* session holding every layer's fake-quantized twin
     behind a bool input (``Where``), one run per layer with its switch on
     (:func:`._quant_qdq.add_gated_twins`; the same ranking as one build per layer, to 1e-5,
     on PP-OCRv4 det and MiniLM; MiniLM 66 → 17 builds), else one build per layer;
   * ``hybrid``: the local ranking, then the ``refine`` most locally sensitive layers are
     re-scored end to end and put first in that order (``refine`` sessions);
   * ``auto`` (default, decided in ``int8.py``): e2e when at least a quarter of the layers
     are MatMul/Gemm and layers × weight bytes ≤ 16 GiB (the e2e ranking runs the whole model
     once per layer: the 2.75 GB decoder's 194 runs took > 10 minutes), else hybrid. Measured (2026-11-29, loaded machine, noisy times):
     PP-OCRv4 det hybrid 10 float layers in 17 s vs e2e 7 in 44 s (same box agreement);
     MiniLM hybrid sent nearly every layer to float (int8 then no faster: kept float)
     where e2e kept 27 of 50 in int8 at 0.87× the float latency.

   The end-to-end ranking judges on the first ``rank_samples`` held-out samples, with the
   target's metric — but a ``top1`` or ``metric`` target ranks by ``cos`` of the same value:
   one layer alone rarely flips a decision, so agreements tie and cannot rank;
3. the ladder search of :func:`.ladder.choose_fallback`: the shallowest level of the ladder
   (``int8 → rung₁ → … → float``) that meets the target with every layer at it, then, level
   by level back towards int8, the fewest most sensitive layers that must stay at each
   level (doubling ``k = 1, 2, 4, …``, then a bisection; from the top down where the level's
   base is near the limit, :func:`.ladder.smallest_k`). Without rungs: the ``k`` most
   sensitive layers go float. All layers float is the float model itself (``u = 0``, not
   run), so the search always ends.

Scoring runs the first sample alone and, when the samples are small (≤ 1 MB of inputs),
stack along a free batch axis and give the original model's per-sample outputs when
batched, the rest in batches of ``BATCH_SAMPLES`` (per-run overhead dominates small models; not for
candidates with DynamicQuantizeLinear, whose range spans the batch).

The search only needs *pass / fail*, so a trial stops as soon as the samples seen prove
failure. After each sample, that sample alone is judged: the worst cosine (a minimum over the
samples) and the worst relative error (a maximum) seen so far can only get worse with more
samples, so the budget fraction they use is a lower bound of the final ``u``::

    u_cos/rel(samples seen)  >  allowed   ⇒  fail

Decision agreements are pooled over the samples (``Σ hits / Σ counted``). They are bounded
after the first sample (where a failing candidate mostly fails) by judging it with the
samples not run yet *completed by the reference itself*: an agreement is at its best when
each remaining sample adds exactly its reference's decisions, all agreeing (a sample's hits ≤
its reference count ≤ its counted, and ``(h + a) / (c + a)`` is the largest such ratio). That
judges every sample once more, so it is not repeated — except for large inputs (more than
``BATCH_BYTES`` a sample, where a run costs far more than a judgement): there it is
repeated after each sample (yolov8n_doclaynet at 1024², whose score sets fail on a later
sample: a failing trial stops there instead of running all of them). A user ``metric:V`` has
no bound and runs every sample. Only a trial that ran every sample gets a verdict.

Threads: sessions run on one intra-op thread, except for large samples (more than
``BATCH_BYTES`` of inputs, :func:`run_threads`), whose trials, twins' runs and gated ranking
use every core — a 1024² run is one long chain of large kernels that ORT splits by output
blocks, so the values are bitwise those of one thread (checked on yolov8n_doclaynet's float,
static-QDQ and weights-rung models at 1, 2, 3 and 8 threads, every intermediate tensor), while
the small models' runs are dominated by per-op overhead that more threads only add to. A
session with more than one thread does not spin (``allow_spinning=0``): on a machine whose
cores are busy, spinning workers took the cores the run needed (yolov8n_doclaynet at 1024²,
2 cores under load ≈ 4: 1.61 s a calibration run spinning, 1.14 s not, 0.99 s on one thread).
Large samples' trials also run with ORT's optimizations on, on its int8 kernels
(:func:`.kernels.trials_on_kernels`).
"""

from __future__ import annotations

import gc
import tempfile
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import onnxruntime as ort

from onnxslim_kit.runtime import (
    EXTERNAL_FOLDER,
    add_outputs,
    give_back,
    make_session,
    map_anchored,
    prepare_feed,
    session_options,
)
from onnxslim_kit.runtime import run as run_once
from onnxslim_kit.fidelity.judge import drift_scores
from onnxslim_kit.streaming import set_location

from onnxslim_kit.passes._quant.smooth import is_lazy

BATCH_BYTES = 1 << 20  # scoring samples up to this size (inputs) run batched ...
BATCH_SAMPLES = 2  # ... this many at a time (MiniLM, during a run: 7 samples +40 MB, 4 +24, 2 +14; 105 → 108 runs)
SPIN = "session.intra_op.allow_spinning"  # session config key: "0" = idle workers sleep
BATCH_COUPLED = {"DynamicQuantizeLinear"}  # ops whose result for one sample depends on the others
STAND_IN = "stand-in.bin"  # SharedWeights: the sparse file external stubs name


def run(session, sample: dict) -> dict:
    """:func:`onnxslim_kit.runtime.run`, then the run's freed intermediates given back."""
    try:
        return run_once(session, sample)
    finally:
        give_back()


class SharedWeights:
    """Large constants handed to ORT as in-memory arrays instead of through the trial proto.

    :meth:`strip` gives a trial graph's large constants (float weights, their int8
    encodings) empty placeholder arrays *before* export, so the weights are not copied into
    the proto (MiniLM: half of the search time was that copy); :meth:`session` makes the
    placeholders external-data stubs and hands ORT the arrays themselves
    (``SessionOptions.add_initializer``: ORT runs on the caller's buffer). The float
    weights of ``graph`` get their ``OrtValue`` once; other arrays (encodings made for a
    trial) one per trial.

    Measured on ORT 1.32 (100 MB MatMul weight, RSS per session): ``add_external_initializers``
    copies the array (+100 MB); ``add_initializer`` does not. MatMul's pre-packing would make
    a packed copy of a constant float weight: the calibration and scoring sessions turn it off
    (``prepack=False``, all of them, since MLAS rounds the two paths differently). Weights left
    on disk are handed over the same way, as file maps (:func:`~onnxslim_kit.runtime.map_anchored`). The
    stubs name a sparse file of zeros (ORT checks that an external tensor's file exists and
    is long enough; the initializer given replaces it unread).
    """

    def __init__(self, graph, min_size: int = 4096):
        self.min_size = min_size
        self.cached = {}   # id(array) -> (array, OrtValue) for the model's own weights
        self.pending = {}  # placeholders of the last strip(): name -> (array, OrtValue)
        self.folder = None  # TemporaryDirectory holding the sparse stand-in file
        self.folder_size = 0
        for tensor in graph.tensors().values():
            values = None if is_lazy(tensor) else getattr(tensor, "values", None)  # smoothed weights stay lazy
            if isinstance(values, np.ndarray) and values.size >= min_size:
                self.cached[id(values)] = self._entry(values)

    @staticmethod
    def _entry(values: np.ndarray) -> tuple:
        values = np.ascontiguousarray(values)
        return values, ort.OrtValue.ortvalue_from_numpy(values)

    def strip(self, graph) -> None:
        """Give ``graph``'s (a trial copy's) large constants empty placeholders; the copy's
        Constant objects are its own, the arrays are never touched. The graph's constant-only
        nodes are put first too (:func:`constants_first`)."""
        self.pending = {}
        for tensor in graph.tensors().values():
            values = getattr(tensor, "values", None)
            if isinstance(tensor, gs.Constant) and isinstance(values, np.ndarray) and values.size >= self.min_size:
                self.pending[tensor.name] = self.cached.get(id(values)) or self._entry(values)
                tensor.values = np.empty(0, values.dtype)
        constants_first(graph)

    def _stand_in(self, nbytes: int) -> str:
        """The folder of a sparse file of at least ``nbytes`` (no disk blocks, no memory)."""
        if self.folder is None:
            self.folder = tempfile.TemporaryDirectory(prefix="slim-int8-", ignore_cleanup_errors=True)
        if nbytes > self.folder_size:
            with open(Path(self.folder.name) / STAND_IN, "wb") as fh:
                fh.truncate(nbytes)
            self.folder_size = nbytes
        return self.folder.name

    def session(self, proto, prepack: bool = True, threads: int = 1, opt_level: str = "disable"):
        """A session of ``proto`` (exported after :meth:`strip`) on the arrays themselves.
        ``prepack=False``: ORT keeps no packed copy of the constant float MatMul weights (the
        gated ranking: MiniLM 40 MB less; the same ranking measured on MiniLM). ``threads``: ORT's
        intra-op threads (0: its default, the machine's cores; more than one: no spinning, see
        the module docstring). ``opt_level``: ORT's graph optimizations (``all``: its fused int8
        kernels, :mod:`.kernels`)."""
        used = []
        for init in proto.graph.initializer:
            entry = self.pending.get(init.name)
            if entry is None or tuple(init.dims) != (0,):
                continue
            del init.dims[:]
            init.dims.extend(entry[0].shape)
            set_location(init, STAND_IN, 0, entry[0].nbytes)
            used.append(init.name)
        given = {**{n: self.pending[n] for n in used}, **map_anchored(proto, STAND_IN)}  # + weights left on disk
        if opt_level != "disable":  # ORT's constant folding reads the stubs' bytes (zeros), not the arrays
            _embed(proto, given)
            given = {}
        so = session_options(opt_level, threads, prepack)
        if threads != 1:
            so.add_session_config_entry(SPIN, "0")
        so.enable_cpu_mem_arena = False  # the arena keeps each run's peak for the session's life (MiniLM gated
        # ranking: +160 MB held over 47 runs); without it intermediates go back as they are freed
        if given:
            so.add_session_config_entry(EXTERNAL_FOLDER, self._stand_in(max(a.nbytes for a, _ in given.values())))
            for name, (_, value) in given.items():
                so.add_initializer(name, value)
        session = ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])
        session.slim_arrays = {**self.pending, **given}  # ORT reads these buffers in place: alive with the session
        self.pending = {}
        give_back()
        return session


def _embed(proto, given: dict) -> None:
    """Fill ``proto``'s stubs of the ``given`` arrays (name → (array, OrtValue)) with their bytes
    (a copy, in the proto)."""
    for init in proto.graph.initializer:
        if init.name in given:
            del init.external_data[:]
            init.data_location = onnx.TensorProto.DEFAULT
            init.raw_data = np.ascontiguousarray(given[init.name][0]).tobytes()
    return {}


def large_samples(samples: list) -> bool:
    """Whether the samples' inputs exceed ``BATCH_BYTES`` each (the first one's)."""
    return bool(samples) and sum(np.asarray(v).nbytes for v in samples[0].values()) > BATCH_BYTES


def run_threads(samples: list) -> int:
    """Intra-op threads for runs over ``samples``: 0 (every core) when they are large, else 1
    (module docstring)."""
    return 0 if large_samples(samples) else 1


def constants_first(graph) -> None:
    """Put the nodes that compute from constants only (a weight's DequantizeLinear, the
    ``weights`` rung's Cast → Mul) first in ``graph.nodes``, in their order.

    ONNX Runtime orders a session's nodes by a depth-first walk up from the outputs that
    visits a node's producers highest index first: a weight's DQ appended after the layers
    ran before everything upstream of its layer, so every layer's float weight was alive at
    once (MiniLM, every layer static: +34 MB per run). First in the list, each runs just before
    its reader (+6 MB). The order changes no number."""
    known = {}

    def constant_only(node) -> bool:
        if id(node) not in known:
            known[id(node)] = False  # a cycle (never in a valid graph) counts as not constant
            known[id(node)] = all(isinstance(t, gs.Constant) or (t.inputs and constant_only(t.inputs[0]))
                                  or (not t.inputs and not t.name) for t in node.inputs)
        return known[id(node)]

    graph_inputs = {id(t) for t in graph.inputs}
    first = [n for n in graph.nodes if not any(id(t) in graph_inputs for t in n.inputs) and constant_only(n)]
    if first:
        chosen = {id(n) for n in first}
        graph.nodes = first + [n for n in graph.nodes if id(n) not in chosen]


def trial_copy(model):
    """A copy of ``model`` to try things on: arrays shared (never mutated), the set of used
    names shared too (a trial's fresh names only reserve more names in the original)."""
    return replace(model, graph=model.graph.copy())


def collect_trials() -> None:
    """Free the dropped trial graphs: onnx-graphsurgeon's nodes and tensors refer to each
    other (and to themselves, through their input / output lists), so a dropped trial waits
    for the cycle collector. Called before each trial is built (MiniLM's search held ~15 MB
    of dead trials between collections); inside :func:`search_scope` only the objects made
    since are walked."""
    gc.collect()
    give_back()


@contextmanager
def search_scope():
    """While open, the objects that exist when it opens (the model, the modules) are left out
    of the cycle collector's walks (``gc.freeze``; thawed on exit): :func:`collect_trials`
    walks the trials only (MiniLM: 43 → 3 ms a call, 0.8 s of the pass before)."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def activations(model, names: list, samples, lazy: bool = False, threads: int = 1):
    """:func:`onnxslim_kit.activations.iter_activations` without copying the weights: the
    session gets the arrays themselves (:class:`SharedWeights`; MiniLM's 88 MB of weights
    cost ~1.7 s to export and hand over otherwise), no arena, the heap given back after each
    run. A consumer that drops each dict (or pops the tensors as it uses them) frees them
    before the next run. ``lazy``: the values are ``OrtValue`` s, made arrays by the
    consumer one at a time (``.numpy()`` copies: all outputs as arrays at once hold them
    twice until the run's own buffers go; PP-OCRv4 det with every layer's twin: 124 tensors).
    ``threads``: see :meth:`SharedWeights.session`. The session holds only the nodes the
    ``names`` depend on (:func:`keep_only`)."""
    shared = SharedWeights(model.graph)
    trial = trial_copy(model)
    keep_only(trial.graph, names)
    shared.strip(trial.graph)
    proto = trial.to_proto()
    add_outputs(proto, names)  # a fresh proto without the shared weights: no copy needed
    session = shared.session(proto, prepack=False, threads=threads)
    wanted = list(dict.fromkeys(names))
    keep = set(wanted)
    for sample in samples:
        if lazy:
            feed = {k: ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(v))
                    for k, v in prepare_feed(session, sample).items()}
            values = session.run_with_ort_values(wanted, feed)
            yield dict(zip(wanted, values))
            del values
            give_back()
        else:
            yield {k: v for k, v in run(session, sample).items() if k in keep}
    del session
    give_back()


def keep_only(graph, names) -> None:
    """``graph`` (a trial copy) cut to what the tensors ``names`` depend on: they become its
    only outputs, the other nodes go. Each kept node computes what it computed in the whole
    graph (sessions at ``opt_level=disable``: node by node), so the values read are the same;
    the weights of the nodes cut are never exported nor read. The bias correction of the
    decoder's front Conv read one layer instead of the whole model and its smoothed weights
    (933 MB decoder: 1.1 GB of anonymous memory less)."""
    tensors = graph.tensors()
    wanted = [tensors[n] for n in dict.fromkeys(names) if n in tensors]
    if len(wanted) == len(set(names)):  # else (a name not in the graph): left whole, as before
        graph.outputs = wanted
        graph.cleanup(remove_unused_graph_inputs=False)


class Used(float):
    """A budget fraction ``u`` (a float, compared as one) with the verdict it came from (None
    for a bound from an early stop)."""

    verdict = None

    @classmethod
    def of(cls, verdict) -> "Used":
        out = cls(verdict.used)
        out.verdict = verdict
        return out


def ranking_fidelity(fid):
    """``fid`` with the target the ranking judges by (see the module docstring)."""
    from onnxslim_kit.api import Target

    if fid.target.metric in ("top1", "metric"):
        return replace(fid, target=Target("cos", fid.target.value), metric=None)
    return fid


class Scorer:
    """Judges candidate protos on the held-out samples of ``fid`` (a
    :class:`onnxslim_kit.api.Fidelity`): the budget fraction each uses (:class:`Used`)."""

    def __init__(self, fid, shared: SharedWeights | None = None, kernels: bool = False):
        self.fid = fid
        self.kernels = kernels  # trials run on ORT's fused int8 kernels (optimizations on), not emulated
        self.samples = list(fid.samples)
        self.reference = fid.reference
        self.runtime = fid.runtime
        self.shared = shared
        self.builds = 0
        self.runs = 0
        self.bounded, self.pooled = self._bounds(fid)
        self.large = large_samples(self.samples)  # a run costs far more than a judgement: bound after each
        self.threads = run_threads(self.samples)
        self.batch = self._stack(self.samples[1:])
        if self.batch is not None:
            session = make_session(fid.original, threads=1, prepack=False)  # does a batch give each sample's?
            if not self._batch_agrees(session):
                self.batch = None
            del session
            give_back()

    @staticmethod
    def _bounds(fid) -> tuple:
        """Whether a trial judged by ``fid`` is bounded after each sample (cosine, relative
        error) and whether after the first one by its pooled decisions (module docstring)."""
        return (fid.target.metric in ("cos", "rel"),
                fid.target.metric in ("cos", "top1") and any(view.decides for view in fid.views))

    def _batch_agrees(self, session) -> bool:
        """Whether the original model run on the batch gives each sample's own outputs (a
        Reshape to a constant batch of 1, say, would mix or reject samples)."""
        try:
            got = run(session, self.batch)
        except Exception:  # noqa: BLE001 - ORT rejects the batch: score one sample at a time
            return False
        for j, ref in enumerate(self.reference[1:]):
            for name, value in ref.items():
                part = got.get(name)
                if part is None or np.ndim(part) == 0 or np.shape(part)[0] != len(self.samples) - 1:
                    return False
                scale = float(np.abs(value).max()) if np.size(value) else 0.0
                if np.shape(part[j:j + 1]) != np.shape(value) or not np.allclose(
                        part[j:j + 1], value, rtol=1e-4, atol=1e-5 * scale + 1e-12, equal_nan=True):
                    return False
        return True

    def head(self, n: int, fid=None) -> "Scorer":
        """A scorer on the first ``n`` samples (judged by ``fid``'s target, default this one's),
        sharing the reference outputs (no new runs)."""
        other = object.__new__(Scorer)
        fid = fid or self.fid
        other.__dict__.update(self.__dict__, fid=fid, samples=self.samples[:n], reference=self.reference[:n],
                              runtime=self.runtime[:n] if self.runtime is not None else None, builds=0, runs=0,
                              batch=self._stack(self.samples[1:n]) if self.batch is not None else None)
        other.bounded, other.pooled = self._bounds(fid)
        return other

    @staticmethod
    def _stack(samples: list) -> dict | None:
        """``samples`` as one batch (axis 0), when they are small (≤ ``BATCH_BYTES`` each),
        have batch size 1 and equal shapes; else None."""
        if len(samples) < 2 or any(s.keys() != samples[0].keys() for s in samples):
            return None
        first = samples[0]
        if large_samples(samples) or any(
                np.ndim(v) == 0 or np.shape(v)[0] != 1 or any(np.shape(s[k]) != np.shape(v) for s in samples)
                for k, v in first.items()):
            return None
        return {k: np.concatenate([np.asarray(s[k]) for s in samples]) for k in first}

    def _outputs(self, session, extra: dict | None, batch: bool = True):
        """``(sample index, outputs)`` in order: the first sample alone (a failing candidate
        mostly fails there), the others in batched runs of ``BATCH_SAMPLES`` when the model
        takes any batch size (per-run overhead dominates small models: MiniLM), else one run
        each."""
        feed = (lambda s: {**s, **extra}) if extra else (lambda s: s)
        self.runs += 1
        yield 0, run(session, feed(self.samples[0]))
        rest = len(self.samples) - 1
        if batch and self.batch is not None and all(not isinstance(i.shape[0], int) for i in session.get_inputs()
                                          if i.name in self.batch and i.shape):
            for start in range(0, rest, BATCH_SAMPLES):
                size = min(BATCH_SAMPLES, rest - start)
                self.runs += 1
                got = run(session, feed({k: v[start:start + size] for k, v in self.batch.items()}))
                if not all(np.ndim(v) and np.shape(v)[0] == size for v in got.values()):
                    break  # the session did not batch: one run per sample for the rest
                for j in range(size):
                    yield start + j + 1, {k: v[j:j + 1] for k, v in got.items()}
            else:
                return
            rest_from = start + 1
        else:
            rest_from = 1
        for i in range(rest_from, len(self.samples)):
            self.runs += 1
            yield i, run(session, feed(self.samples[i]))

    def __call__(self, proto, stop_above: float | None = None) -> Used:
        """The budget fraction ``proto`` uses; with ``stop_above``, a lower bound
        ``> stop_above`` as soon as the samples seen prove the final one would exceed it."""
        self.builds += 1
        # DynamicQuantizeLinear takes its range over the whole tensor: a batch would change it
        batch = not any(node.op_type in BATCH_COUPLED for node in proto.graph.node)
        level = "all" if self.kernels else "disable"
        session = (self.shared.session(proto, prepack=False, threads=self.threads, opt_level=level)
                   if self.shared is not None else make_session(proto, level, threads=self.threads, prepack=False))
        try:
            return self.score_session(session, stop_above, batch=batch)
        finally:
            del session  # the trial's weights (ORT's copy) go before the next build
            give_back()

    def score_session(self, session, stop_above: float | None = None, extra: dict | None = None,
                      batch: bool = True) -> Used:
        """:meth:`__call__` on a ready session; ``extra`` is added to every sample's feed (and
        its outputs are not judged); ``batch=False``: one run per sample even when the samples
        stack."""
        names = set(self.reference[0]) if self.reference else set()
        got, worst = [], {}
        for i, outputs in self._outputs(session, extra, batch):
            got.append({k: v for k, v in outputs.items() if k in names})
            if stop_above is None or i + 1 == len(self.samples):
                continue
            bound = self._bound(worst, got[-1], i) if self.bounded else 0.0
            if self.pooled and bound <= stop_above and (i == 0 or self.large):  # the decisions too
                bound = self.judge(got + self.reference[i + 1:]).used
            if bound > stop_above:
                return Used(bound)
        return Used.of(self.judge(got))

    def _bound(self, worst: dict, outputs: dict, i: int) -> float:
        """The budget fraction the worst cosine and relative error seen so far use (``worst``:
        metric → loss, updated with sample ``i``): a lower bound of the final one."""
        for score in drift_scores(self.fid.views, [self.reference[i]], [outputs],
                                  [self.runtime[i]] if self.runtime is not None else None):
            if score.cosine is not None:
                worst["cos"] = max(worst.get("cos", 0.0), 1.0 - score.cosine)
            if score.rel is not None:
                worst["rel"] = max(worst.get("rel", 0.0), score.rel)
        return self.fid.target.used(worst)

    def judge(self, got: list):
        """The verdict on the outputs ``got``, one dict per sample (for a bound, the samples
        not run yet completed by the reference itself)."""
        return self.fid.judge(got, reference=self.reference, runtime=self.runtime)
