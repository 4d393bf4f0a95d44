"""Fidelity target and per-layer fallback of the ``int8`` pass.

Target ``METRIC:VALUE`` (``cos:0.99`` or ``top1:0.99``), measured against the *original*
model's outputs on the evaluation samples (ORT, optimisations off):

* ``cos``  — the worst cosine similarity over outputs and samples;
* ``top1`` — the argmax agreement over all rows of all samples, worst output (outputs
  without a class axis are judged by cosine instead).

Search (each step builds the model with a set of int8 layers and scores it):

1. all candidate layers int8 — done if the target holds;
2. sensitivity ``s_l`` of every layer ``l``:

   * ``local``: the relative squared error ``s_l`` of each layer quantized alone, measured
     with the bias correction (one run of the float model carrying a fake-quantized twin of
     every layer, :mod:`._quant_correct`) — how much 8 bits hurt the layer itself, free but
     a coarse ranking (it ignores how the error grows downstream: with 1 − cos as the local
     error, PP-OCRv4 rec sent 33 layers back to float where e2e sent 3);
   * ``e2e``: each layer alone in int8, ``s_l = 1 − score`` at the outputs (one build and
     run per layer — the best ranking, ~60 sessions on a detector);
   * ``hybrid``: the local ranking, then the ``refine`` most locally sensitive layers are
     re-scored end to end and put first in that order (``refine`` sessions);
   * ``auto`` (default, decided in ``int8.py``): e2e when at least a quarter of the layers
     are MatMul/Gemm, else hybrid. Measured (2026-11-29, loaded machine, noisy times):
     PP-OCRv4 det hybrid 10 float layers in 17 s vs e2e 7 in 44 s (same box agreement);
     MiniLM hybrid sent nearly every layer to float (int8 then no faster: kept float)
     where e2e kept 27 of 50 in int8 at 0.87× the float latency;

3. the most sensitive ``k`` layers go back to float for ``k = 1, 2, 4, …`` until the target
   holds, then a bisection between the last two ``k`` finds the smallest such ``k``.
   ``k = n`` is the float model itself, so the search always ends.

The search only needs *pass / fail* at each ``k``, so a trial stops at the first sample
that proves failure: the score can only fall with more samples (``cos``: a minimum), or
for ``top1`` the agreement cannot reach the target even if all remaining rows agree::

    bound = (Σ_seen agree·rows + rows_remaining) / rows_total  <  target  ⇒  fail
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import onnxruntime as ort

from onnxslim_kit.errors import UserError
from onnxslim_kit.metrics import compare, cosine
from onnxslim_kit.runtime import make_session, run, session_options

METRICS = ("cos", "top1")


def parse_target(text: str):
    """``"cos:0.99"`` → ("cos", 0.99); empty / ``none`` → None."""
    text = (text or "").strip()
    if text in ("", "none", "off"):
        return None
    metric, _, value = text.partition(":")
    try:
        number = float(value)
    except ValueError:
        number = None
    if metric not in METRICS or number is None or not 0 < number <= 1:
        raise UserError(f"int8(target={text}): expected cos:VALUE or top1:VALUE with 0 < VALUE ≤ 1")
    return metric, number


class SharedWeights:
    """The large float constants every trial model keeps unchanged, handed to ORT once.

    A trial proto's copies of them are replaced by in-memory external-data stubs and the
    session gets the arrays through ``add_external_initializers`` (no copy, no parsing): the
    search builds one session per trial, and for an 88 MB model this is most of its cost.
    :meth:`strip` goes further: a trial graph's unchanged constants get empty placeholder
    arrays *before* export, so the weights are not even copied into the proto (MiniLM:
    half of the search time was that copy).
    """

    def __init__(self, graph, min_size: int = 4096):
        self.arrays = {}
        for tensor in graph.tensors().values():
            values = getattr(tensor, "values", None)
            if isinstance(values, np.ndarray) and values.dtype == np.float32 and values.size >= min_size:
                self.arrays[tensor.name] = (values, ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(values)))

    def strip(self, graph) -> None:
        """Give ``graph``'s (a trial copy's) shared constants empty placeholders; the copy's
        Constant objects are its own, the arrays are never touched."""
        for tensor in graph.tensors().values():
            entry = self.arrays.get(tensor.name)
            if entry is not None and isinstance(tensor, gs.Constant) and tensor.values is entry[0]:
                tensor.values = np.empty(0, np.float32)

    def session(self, proto):
        used = []
        for init in proto.graph.initializer:
            entry = self.arrays.get(init.name)
            if entry is None or init.data_type != onnx.TensorProto.FLOAT:
                continue
            if tuple(init.dims) == (0,):  # a placeholder of strip()
                del init.dims[:]
                init.dims.extend(entry[0].shape)
            elif tuple(init.dims) != entry[0].shape:
                continue
            init.ClearField("raw_data")
            init.ClearField("float_data")
            init.data_location = onnx.TensorProto.EXTERNAL
            del init.external_data[:]
            init.external_data.add(key="location", value="in-memory")
            used.append(init.name)
        so = session_options("disable", 1)
        if used:
            so.add_external_initializers(used, [self.arrays[n][1] for n in used])
        return ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])


class Scorer:
    """Scores candidate protos against the reference outputs on fixed samples."""

    def __init__(self, original, samples: list, metric: str, shared: SharedWeights | None = None):
        self.samples = samples
        self.metric = metric
        self.shared = shared
        session = make_session(original, threads=1)
        self.reference = [run(session, s) for s in samples]
        self.names = [n for n, v in self.reference[0].items() if np.asarray(v).dtype.kind == "f"]
        self.rows = [int(np.prod(np.shape(self.reference[0][n])[:-1])) or 1 for n in self.names]
        self.builds = 0
        self.runs = 0

    def head(self, n: int) -> "Scorer":
        """A scorer on the first ``n`` samples, sharing the reference outputs (no new runs)."""
        other = object.__new__(Scorer)
        other.__dict__.update(self.__dict__, samples=self.samples[:n], reference=self.reference[:n], builds=0, runs=0)
        return other

    def __call__(self, proto, stop_below: float | None = None) -> float:
        """The score of ``proto``; with ``stop_below``, a bound ``< stop_below`` as soon as
        the samples seen prove the final score would be below it."""
        self.builds += 1
        session = self.shared.session(proto) if self.shared is not None else make_session(proto, threads=1)
        state = {n: [] for n in self.names}  # per output: per-sample cos, or (agree, rows)
        for i, (sample, ref) in enumerate(zip(self.samples, self.reference)):
            got = run(session, sample)
            self.runs += 1
            for name in self.names:
                if name in got:
                    state[name].append(self._sample_score(ref[name], got[name]))
            bound = self._bound(state, len(self.samples) - i - 1)
            if stop_below is not None and bound < stop_below:
                return bound
        return self._bound(state, 0)

    def _sample_score(self, ref, got):
        if self.metric == "top1":
            agree = compare(ref, got).top1
            if agree is not None:
                return agree, int(np.prod(np.shape(ref)[:-1])) or 1
        finite = np.isfinite(ref)
        return cosine(ref, got) if finite.all() else cosine(ref[finite], got[finite])

    def _bound(self, state: dict, remaining: int) -> float:
        """Upper bound of the final score given the samples seen (exact when none remain)."""
        scores = []
        for values in state.values():
            if not values:
                continue
            if isinstance(values[0], tuple):
                seen = sum(rows for _, rows in values)
                total = seen + remaining * values[0][1]
                scores.append((sum(a * rows for a, rows in values) + remaining * values[0][1]) / total)
            else:
                scores.append(min(values))
        return float(min(scores)) if scores else 1.0


def choose_float_layers(names: list, build, score, target: float, progress=lambda it, **_: it, log=None,
                        local=None, rank_score=None, refine: int | None = None, exact_float: bool = True):
    """Smallest set of layers (most sensitive first) to keep float so ``score ≥ target``.

    ``build(enabled: set) -> proto``; ``score(proto, stop_below)`` (see :class:`Scorer`);
    ``local()`` gives local sensitivities (None: end to end for every layer, scored by
    ``rank_score``, default ``score``); with ``local`` and ``refine``, the ``refine`` most
    locally sensitive layers are re-scored end to end and put first. ``exact_float``: the
    build with no int8 layer is the float model (score 1, not run). Returns (float layer
    names, final score, sensitivities).
    """
    rank_score = rank_score or score
    everything = set(names)
    full = score(build(everything), target)
    if full >= target:
        return [], full, {}
    sens = local() if local is not None else {}
    order = sorted(names, key=lambda n: -sens.get(n, 0.0))
    todo = names if local is None else order[: refine or 0]
    e2e = {name: 1.0 - rank_score(build({name})) for name in progress(todo, desc="int8 sensitivity",
                                                                         total=len(todo))}
    head = sorted(e2e, key=lambda n: -e2e[n])
    order = head + [n for n in order if n not in e2e]
    sens = {**sens, **e2e}
    cache = {}

    def ok(k: int) -> bool:
        if k not in cache:
            cache[k] = score(build(everything - set(order[:k])), target) if k < len(order) or not exact_float \
                else 1.0
        return cache[k] >= target or k == len(order)  # all float: nothing more to try

    k_ok, k_bad = None, 0
    k = 1
    while k_ok is None:
        k = min(k, len(order))
        if ok(k):
            k_ok = k
        else:
            k_bad = k
            k *= 2
    while k_ok - k_bad > 1:
        mid = (k_ok + k_bad) // 2
        if ok(mid):
            k_ok = mid
        else:
            k_bad = mid
    if log:
        log(f"int8: {k_ok} of {len(order)} layers kept float for the target")
    return order[:k_ok], cache.get(k_ok, 1.0), sens
