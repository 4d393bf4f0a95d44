"""Sensitivity-aware choice of the number of centroids per layer (``cluster(target=…)``).

One codebook size for every layer treats them alike; they are not: on PP-OCRv4 det after
``fuse``, k = 16 everywhere gives output cosine 0.969 on held-out pages, while most layers
alone cost less than 1e-4 of cosine. So the pass measures, on calibration data:

1. ``c(all at k)``: the model with every candidate clustered at ``k``. At or above ``target``:
   done, every layer keeps ``k``.
2. Each layer's own damage ``d_i = 1 − c(only layer i at k, the others float)`` — the layer's
   effect on the model output, amplification downstream included.
3. Layers are ordered by damage per extra byte, ``d_i / (bytes_i(up) − bytes_i(k))``
   (``up`` = ``k_high``, 256 centroids in uint8 by default, with a codebook of its own; or
   float for a layer whose float weights take no more bytes than that), and the shortest
   prefix moved up that brings ``c ≥ target`` is found by bisection (assumes fewer coarse
   layers never hurt; nearly so in practice, not exactly: on PP-OCR cls v2 one layer up
   reached 0.9975 where three missed 0.995 — so the prefix found holds the target but is not
   always the shortest). If all layers up still miss the target, the same order moves a
   prefix back to float.

All evaluations run in one ONNX Runtime session in which the candidate weights are
*overridable initializers* (also listed as graph inputs): a configuration is a feed
``{weight name: decoded values}``, so no model is rebuilt or re-serialised per trial.
``c`` is the worst cosine over float outputs and samples against the model before the pass.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from onnxslim_kit.metrics import compare, merge
from onnxslim_kit.runtime import make_session, run

FLOAT = None  # level of a layer left unclustered


def overridable(proto: onnx.ModelProto, names: list) -> onnx.ModelProto:
    """A copy of ``proto`` whose initializers ``names`` are also graph inputs (feedable). An
    initializer of an If/Loop/Scan body moves to the main graph first: the body reads it as an
    outer-scope value, so weights inside control flow (silero-vad's If branches) can be fed too."""
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    out.ir_version = max(out.ir_version, 4)
    inits = {t.name: t for t in out.graph.initializer}
    wanted = set(names) - set(inits)
    for graph in _bodies(out.graph):
        for t in [t for t in graph.initializer if t.name in wanted]:
            out.graph.initializer.append(t)
            graph.initializer.remove(t)
            inits[t.name] = out.graph.initializer[-1]
    for name in names:
        t = inits[name]
        out.graph.input.append(helper.make_tensor_value_info(name, t.data_type, list(t.dims)))
    return out


def _bodies(graph: onnx.GraphProto):
    """Every subgraph of ``graph``, nested ones included."""
    for node in graph.node:
        for attr in node.attribute:
            for body in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)):
                yield body
                yield from _bodies(body)


class Trials:
    """Output cosine of weight configurations, all in one session."""

    def __init__(self, proto: onnx.ModelProto, names: list, samples: list):
        self.names, self.samples = names, samples
        self.session = make_session(overridable(proto, names), threads=1)
        self.reference = [run(self.session, s) for s in samples]
        self.evaluations = 0

    def _run(self, sample: dict, values: dict) -> dict:
        """Like :func:`onnxslim_kit.runtime.run`, plus the overridden initializers (which
        ``session.get_inputs()`` does not list)."""
        if not values:
            return run(self.session, sample)
        feed = {spec.name: sample[spec.name] for spec in self.session.get_inputs() if spec.name in sample}
        names = [o.name for o in self.session.get_outputs()]
        return dict(zip(names, self.session.run(names, {**feed, **values})))

    def cosine(self, values: dict, samples: int | None = None) -> float:
        """Worst output cosine with ``{weight name: array}`` fed over the first ``samples``."""
        self.evaluations += 1
        chosen = self.samples[:samples] if samples else self.samples
        outs = [self._run(s, values) for s in chosen]
        worst = 1.0
        for name, ref in self.reference[0].items():
            if ref.dtype.kind == "f":
                worst = min(worst, merge([compare(r[name], o[name]) for r, o in zip(self.reference, outs)]).cosine)
        return worst


def choose(proto, items: list, samples: list, target: float, low: int, high: int, rank_samples: int = 4) -> tuple:
    """``(levels, measured cosine, trials)``: one level per item — ``low``, ``high`` or
    :data:`FLOAT` — holding ``target`` if any configuration does. ``items`` have ``name`` (the
    initializer) and ``levels`` (``{k: Clustered}``)."""
    trials = Trials(proto, [it.name for it in items], samples)

    def config(levels):
        return {it.name: it.levels[lv].decoded() for it, lv in zip(items, levels) if lv is not FLOAT}

    n = len(items)
    start = [low] * n
    measured = trials.cosine(config(start))
    if measured >= target or not n:
        return start, measured, trials
    damage = np.array([1 - trials.cosine({it.name: it.levels[low].decoded()}, rank_samples) for it in items])
    up = [FLOAT if it.values.nbytes <= _bytes(it, high, low) else high for it in items]
    extra = np.array([max(_bytes(it, lv, low) - _bytes(it, low, low), 1) for it, lv in zip(items, up)])
    order = list(np.argsort(-(damage / extra), kind="stable"))

    def prefix(p: int, first, rest) -> list:
        levels = [rest] * n if rest is low else list(up)
        for i in order[:p]:
            levels[i] = up[i] if first is high else first
        return levels

    for first, rest in ((high, low), (FLOAT, high)):
        # prefix 0 is known to miss: all at `low` (measured), or all up (the first round)
        good, bad = n, 0
        good_cos = 1.0 if first is FLOAT else trials.cosine(config(prefix(n, first, rest)))
        if good_cos < target:
            continue
        while good - bad > 1:
            mid = (good + bad) // 2
            cos = trials.cosine(config(prefix(mid, first, rest)))
            if cos >= target:
                good, good_cos = mid, cos
            else:
                bad = mid
        return prefix(good, first, rest), good_cos, trials
    return [FLOAT] * n, 1.0, trials


def _bytes(item, level, low: int) -> float:
    """Bytes of ``item`` at ``level``: float, or labels + scales, plus a whole codebook above
    ``low`` (a layer moved up often has no other layer of its layout at that level to share
    it: 1 KB at k = 256, more than a small layer's float weights)."""
    if level is FLOAT:
        return item.values.nbytes
    clustered = item.levels[level]
    return clustered.stored_bytes() + (clustered.codebook.nbytes if level != low and clustered.share else 0)
