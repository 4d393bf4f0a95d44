"""Sensitivity-aware choice of the number of centroids per layer (``cluster(target=…)``).

One codebook size for every layer treats them alike; they are not: on PP-OCRv4 det after
``fuse``, k = 16 everywhere gives output cosine 0.969 on held-out pages, while most layers
alone cost less than 1e-4 of cosine. So the pass judges candidates by the fidelity contract
(:mod:`onnxslim_kit.fidelity`): a configuration's outputs on the pipeline's held-out samples
``fid.samples``, view by view against the *original* model's outputs, give a verdict whose
budget fraction ``u`` (``verdict.used``) must stay ``≤ fid.allowed`` (the share of the target's
loss budget this pass may take the model to):

1. ``u(all at k)``: the model with every candidate clustered at ``k``. Within ``allowed``:
   done, every layer keeps ``k``.
2. Each layer has a *ladder* of levels (:func:`ladder`): ``k`` with the shared codebook,
   ``k`` with a codebook per row (:mod:`onnxslim_kit.passes.cluster.maths.rows`; ``rows`` option), ``k_high`` (256
   centroids in uint8 by default, with a float16 codebook of its own), float — without the
   levels that cost at least as many bytes as a later one (a small layer goes straight to
   float). For every step, the layer's bytes ``b_i(s)`` and its own damage ``d_i(s)``: the
   mean relative squared output error with only that layer at step ``s`` (the others float)
   on ``rank_samples`` samples of the data the pass fits (``ctx.feed``, never the judged
   ones; against the model before the pass) — its effect on the model output, amplification downstream
   included (smoother than the worst cosine, which a single flipped decision moves by 0.05
   on PP-OCRv4 rec, and roughly additive over layers). A layer whose damage is nil (an If
   branch the samples never take) stays at ``k``.
3. For a price ``λ`` every layer takes the step minimising ``b_i(s) + λ · d_i(s)`` — for the
   extra bytes, the largest drop in damage across all layers and steps at once. Larger ``λ``
   never picks a coarser step, so the smallest ``λ`` (among the prices at which some layer
   changes step) whose configuration holds ``u ≤ allowed`` is found by bisection (assumes a
   finer configuration never hurts; nearly so in practice, not exactly, so the configuration
   found holds the target but is not always the smallest).

The step-by-step choice this replaces (every layer moved up one step before any moved two,
by damage per byte within the step) had to move *every* layer of PP-OCRv4 rec to the per-row
step before any could reach k_high and missed the target there, so it ended with 30 layers at
k_high and 17 float (0.30× the original); with prices: 0.19× (results
``cluster-2026-11-29-s3*.md``).

All evaluations run in one ONNX Runtime session in which the candidate weights are graph
inputs (:func:`feedable`), fed their float values — read-only maps of the weights' file for a model left on disk, which
ORT reads in place (as overridable initializers ORT copied every one of them into the
session) — and a configuration overrides them, ``{weight name: decoded values}``, so no model
is rebuilt or re-serialised per trial. A configuration's decoded weights go to a scratch file
(:class:`onnxslim_kit.streaming.ScratchArrays`: file pages, dropped after the run, not heap).
The judged outputs are the session's graph outputs; the tail tensors a view needs (the
branches of a concatenated head) are the original's, which ``fid`` holds.

Large models: step 2's damages take one whole-model run per layer, step and sample; when those
runs would read more than ``MEASURE_BYTES`` of weights, most of them come from a local proxy
scaled per class of layers (:mod:`onnxslim_kit.passes.cluster.damage`), and the measured ones
run on at most ``SAMPLE_BYTES / weight bytes`` samples (one at 2.75 GB, as int4's).
"""

from __future__ import annotations

import numpy as np
import onnx

from onnxslim_kit.model import proto_graphs
from onnxslim_kit.runtime import give_back, make_session, run
from onnxslim_kit.streaming import ScratchArrays, copy_fields, release_pages, tensor_array

from onnxslim_kit.passes.cluster.damage import proxied as proxied_damages

from onnxslim_kit.passes.cluster.maths.kmeans import at_most_distinct
from onnxslim_kit.passes.cluster.stream import group_bytes, member_bytes

FLOAT = None  # level of a layer left unclustered
UNCHANGED = 1e-9  # 1 − cosine of equal outputs, float64 rounding
MEASURE_BYTES = 64 << 30  # weight bytes the measured damages may read before a proxy stands in (:mod:`.damage`)
SAMPLE_BYTES = 4 << 30  # then: weight bytes one measured damage may read (1 sample at 2.75 GB, as int4)
ROWS = "rows"  # level of a layer with a codebook per row (k centroids each, :mod:`onnxslim_kit.passes.cluster.maths.rows`)


def feedable(proto: onnx.ModelProto, names: list) -> tuple:
    """``(a copy of proto whose initializers names are graph inputs instead, {name: float
    values})``: the values a read-only map of the weights' file for a weight left on disk
    (:func:`onnxslim_kit.streaming.tensor_array`), else a copy of its bytes. An initializer of
    an If/Loop/Scan body moves to the main graph: the body reads it as an outer-scope value,
    so weights inside control flow (silero-vad's If branches) can be fed too."""
    out = onnx.ModelProto()
    copy_fields(proto, out, skip=("graph",))
    copy_fields(proto.graph, out.graph, skip=("initializer",))
    out.ir_version = max(out.ir_version, 4)
    wanted, values = set(names), {}
    for graph in list(proto_graphs(out.graph))[1:]:  # the bodies, nested ones included
        for t in [t for t in graph.initializer if t.name in wanted]:
            values[t.name] = tensor_array(t)
            graph.initializer.remove(t)
    for t in proto.graph.initializer:
        if t.name in wanted:
            values[t.name] = tensor_array(t)
        else:
            out.graph.initializer.append(t)
    declared = {i.name for i in out.graph.input}
    for name in names:
        if name not in declared:
            dims = list(values[name].shape)
            dtype = onnx.helper.np_dtype_to_tensor_dtype(values[name].dtype)
            out.graph.input.append(onnx.helper.make_tensor_value_info(name, dtype, dims))
    return out, values


class Trials:
    """Weight configurations in one session: judged on ``fid.samples`` (:meth:`verdict`), and
    each layer's damage on ``rank_samples`` (fit samples, :meth:`error`)."""

    def __init__(self, proto: onnx.ModelProto, names: list, rank_samples: list, fid):
        self.names, self.rank_samples, self.fid = names, rank_samples, fid
        model, self.weights = feedable(proto, names)
        self.session = make_session(model, threads=1)
        del model
        self.reference = [self._run(s, {}) for s in rank_samples]  # the model before the pass
        self.evaluations = 0

    def _run(self, sample: dict, values: dict) -> dict:
        """:func:`onnxslim_kit.runtime.run` with the weights fed: their float values, ``values``
        where given."""
        return run(self.session, {**sample, **self.weights, **values})

    def error(self, values: dict) -> float:
        """Mean relative squared error ``‖o − r‖² / ‖r‖²`` over float outputs and the rank
        samples: a layer's damage, smoother than the worst cosine (an error that flips no
        decision still counts) and roughly additive over layers."""
        self.evaluations += 1
        total, count = 0.0, 0
        for ref, sample in zip(self.reference, self.rank_samples):
            out = self._run(sample, values)
            for name, r in ref.items():
                if r.dtype.kind == "f":
                    r64, o64 = r.astype(np.float64), out[name].astype(np.float64)
                    total += float(np.sum((o64 - r64) ** 2) / max(np.sum(r64 ** 2), 1e-30))
                    count += 1
        return total / max(count, 1)

    def verdict(self, values: dict):
        """The fidelity verdict (:class:`onnxslim_kit.fidelity.Verdict`) with ``{weight name:
        array}`` fed, on the judged samples against the original."""
        self.evaluations += 1
        return self.fid.judge([self._run(s, values) for s in self.fid.samples])

    def verdict_of(self, items: list, chosen: list):
        """:meth:`verdict` of ``items`` at their ``chosen`` levels, decoded into a scratch file
        (the float weights' pages, which a configuration does not read, dropped first)."""
        for values in self.weights.values():
            release_pages(values)
        scratch = ScratchArrays()
        try:
            return self.verdict({it.name: _decoded(scratch, it.levels[lv]) for it, lv in zip(items, chosen)
                                 if lv is not FLOAT})
        finally:
            scratch.close()
            give_back()


def _decoded(scratch: ScratchArrays, clustered):
    """``clustered``'s decoded values as a map of ``scratch``; the pages of its labels (a large
    model's are a scratch file's too) are dropped once read."""
    values = scratch.put(clustered.decoded())
    release_pages(clustered.labels)
    return values


def choose(proto, items: list, rank_samples: list, fid, levels: list, proxy: bool = False) -> tuple:
    """``(levels, verdict, trials)``: one level per item, from its ladder (:func:`ladder` over
    ``levels``, cheapest first, :data:`FLOAT` last), holding ``fid.met`` if any configuration
    does. ``items`` have ``name`` (the initializer), ``values``, ``levels`` (``{level:
    Clustered}``) and ``drop_pages()``; ``rank_samples``: fit samples for the per-layer damages; ``proxy``: the
    damages of the items with input ``rows`` may come from the proxy of a large model
    (:mod:`onnxslim_kit.passes.cluster.damage`)."""
    ladders = [ladder(it, levels) for it in items]
    for item in items:  # the exact-limit probe of :func:`ladder` read a value on every page of the weight
        item.drop_pages()
    weight_bytes = sum(int(it.values.nbytes) for it in items)
    runs = sum(len(steps) - 1 for steps in ladders) * len(rank_samples)
    proxied = proxy and runs * weight_bytes > MEASURE_BYTES
    if proxied:
        rank_samples = rank_samples[:max(1, SAMPLE_BYTES // max(weight_bytes, 1))]
    trials = Trials(proto, [it.name for it in items], rank_samples, fid)
    low = [steps[0] for steps in ladders]
    verdict = trials.verdict_of(items, low)
    if fid.met(verdict) or not items:
        return low, verdict, trials

    def measure(item, level) -> float:
        values = item.levels[level].decoded()
        release_pages(item.levels[level].labels)
        return trials.error({item.name: values})
    costs = [[_bytes(item, lv, levels[0]) for lv in steps] for item, steps in zip(items, ladders)]
    damages = (proxied_damages(items, ladders, measure) if proxied else
               [[0.0 if lv is FLOAT else measure(item, lv) for lv in steps] for item, steps in zip(items, ladders)])
    for steps, cost, damaged in zip(ladders, costs, damages):
        if damaged[0] <= UNCHANGED:  # the layer does not change the output (an If branch not taken)
            del steps[1:], cost[1:], damaged[1:]
    prices = _prices(costs, damages)  # every λ at which some layer changes level, ascending

    def at(price: float) -> list:
        return [steps[_cheapest(c, d, price)] for steps, c, d in zip(ladders, costs, damages)]

    good, bad, good_verdict = len(prices) - 1, -1, None
    while good - bad > 1:
        mid = (good + bad) // 2
        found = trials.verdict_of(items, at(prices[mid]))
        if fid.met(found):
            good, good_verdict = mid, found
        else:
            bad = mid
    chosen = at(prices[good])
    return chosen, trials.verdict_of(items, chosen) if good_verdict is None else good_verdict, trials


def _cheapest(costs: list, damages: list, price: float) -> int:
    """The step minimising ``bytes + price · damage`` (ties: the more faithful one)."""
    totals = list(damages) if price == float("inf") else [c + price * d for c, d in zip(costs, damages)]
    best = min(totals)
    return max(i for i, t in enumerate(totals) if t <= best)


def _prices(costs: list, damages: list) -> list:
    """Sorted λ at which :func:`_cheapest` can change for some layer, and ∞ (every layer at its
    most faithful step)."""
    found = {0.0}
    for c, d in zip(costs, damages):
        for i in range(len(c)):
            for j in range(i + 1, len(c)):
                if d[i] > d[j] and c[j] > c[i]:
                    found.add((c[j] - c[i]) / (d[i] - d[j]))
    return sorted(found) + [float("inf")]


def ladder(item, levels: list) -> list:
    """The item's levels (``levels`` in order of fidelity), without those that cost at least as
    many bytes as a later one (float included), then :data:`FLOAT`; a weight at the exact limit
    of the first level, or one whose first level does not save bytes, stays there."""
    low = levels[0]
    if at_most_distinct(item.values, low) or _bytes(item, low, low) >= _bytes(item, FLOAT, low):
        return [low]  # exact; or not worth encoding at all (the encoder leaves it float, with that reason)
    steps, cheapest = [FLOAT], _bytes(item, FLOAT, low)
    for level in reversed(levels):
        cost = _bytes(item, level, low)
        if cost < cheapest:
            steps.insert(0, level)
            cheapest = cost
    return steps


def _bytes(item, level, low: int) -> float:
    """Bytes of ``item`` at ``level``: float; at ``low``, labels + scales (the codebook and
    decoder shared with the layers of its layout); above ``low``, what the encoder counts for a
    group of its own — codebook and decoding nodes included (a layer moved up often has no other
    layer of its layout at that level: a 256-entry codebook and its nodes cost more than the
    float weights of MTCNN P-Net's first conv)."""
    if level is FLOAT:
        return item.values.nbytes
    clustered = item.levels[level]
    if level == low:
        return clustered.stored_bytes()
    return member_bytes(clustered, False) + group_bytes([clustered], False)
