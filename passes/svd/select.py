"""Holding an end-to-end output target: which of the planned factorisations to keep.

Per-layer budgets do not bound the model's output error — errors compound and are amplified
downstream (attention softmax, a classifier head feeding a softmax). So with ``target`` set,
the pass measures: the planned rewrites are ordered by estimated damage per FLOP saved,
``(1 − e(r)) / ΔFLOPs`` (``e(r)``: kept energy), and the longest prefix whose model keeps
``min cosine ≥ target`` over every float output and every evaluation sample (vs the model
before the pass, ONNX Runtime) is found by bisection — ⌈log₂(n + 1)⌉ + 1 evaluations,
assuming that adding rewrites does not improve the output (monotone in practice).
"""

from __future__ import annotations

from onnxslim_kit.metrics import compare, merge
from onnxslim_kit.runtime import make_session, run

from onnxslim_kit.passes.svd.rewrite import apply


def output_cosine(model, samples: list, reference: list) -> float:
    """Worst cosine over float outputs and samples of ``model`` against ``reference``."""
    for graph in model.all_graphs():
        graph.toposort()
    session = make_session(model.to_proto(), threads=1)
    worst = 1.0
    results = [run(session, sample) for sample in samples]
    for name, ref in reference[0].items():
        if ref.dtype.kind != "f":
            continue
        drift = merge([compare(r[name], out[name]) for r, out in zip(reference, results)])
        worst = min(worst, drift.cosine)
    return worst


def reference_outputs(model, samples: list) -> list:
    session = make_session(model.to_proto(), threads=1)
    return [run(session, sample) for sample in samples]


def select(model, plans: list, samples: list, target: float) -> tuple:
    """Apply the longest damage-ordered prefix of ``plans`` holding ``target``.

    ``plans``: objects with ``layer``, ``a``, ``b``, ``mode``, ``damage`` (sort key). Returns
    ``(kept plans, measured cosine)``; the kept rewrites are left applied to ``model``.
    """
    reference = reference_outputs(model, samples)
    ordered = sorted(plans, key=lambda p: p.damage)
    undos = []

    def set_prefix(n: int) -> None:
        while len(undos) > n:
            undos.pop()()
        for plan in ordered[len(undos):n]:
            undos.append(apply(model, plan.layer, plan.a, plan.b, plan.mode))

    set_prefix(len(ordered))
    measured = output_cosine(model, samples, reference)
    if measured >= target:
        return ordered, measured
    good, bad, good_cos = 0, len(ordered), 1.0
    while bad - good > 1:
        mid = (good + bad) // 2
        set_prefix(mid)
        cos = output_cosine(model, samples, reference)
        if cos >= target:
            good, good_cos = mid, cos
        else:
            bad = mid
    set_prefix(good)
    return ordered[:good], good_cos
