"""Holding an end-to-end fidelity target: which of the planned factorisations to keep.

Per-layer budgets do not bound the model's output error — errors compound and are amplified
downstream (attention softmax, a classifier head feeding a softmax). So with a target the
pass measures: the planned rewrites are ordered by estimated damage per FLOP saved,
``(1 − e(r)) / ΔFLOPs`` (``e(r)``: kept energy), and the longest prefix whose model the
fidelity contract accepts (:mod:`onnxslim_kit.fidelity`: its outputs on the pipeline's judged
samples, view by view against the *original* model, use a budget fraction ``u ≤ allowed``,
the share of the target's loss budget this pass may take the model to) is found by bisection
— ⌈log₂(n + 1)⌉ + 1 evaluations, assuming that adding rewrites does not lower ``u``
(monotone in practice).
"""

from __future__ import annotations

from onnxslim_kit.runtime import make_session, run

from onnxslim_kit.passes.svd.rewrite import apply


def judged(model, fid):
    """The verdict (:class:`onnxslim_kit.fidelity.Verdict`) of ``model`` as it stands, on
    ``fid.samples`` against the original."""
    for graph in model.all_graphs():
        graph.toposort()
    session = make_session(model.to_proto(), threads=1)
    return fid.judge([run(session, sample) for sample in fid.samples])


def select(model, plans: list, fid) -> tuple:
    """Apply the longest damage-ordered prefix of ``plans`` that ``fid`` accepts.

    ``plans``: objects with ``layer``, ``a``, ``b``, ``mode``, ``damage`` (sort key). Returns
    ``(kept plans, verdict)``; the kept rewrites are left applied to ``model``.
    """
    ordered = sorted(plans, key=lambda p: p.damage)
    undos = []

    def set_prefix(n: int) -> None:
        while len(undos) > n:
            undos.pop()()
        for plan in ordered[len(undos):n]:
            undos.append(apply(model, plan.layer, plan.a, plan.b, plan.mode))

    set_prefix(len(ordered))
    verdict = judged(model, fid)
    if fid.met(verdict):
        return ordered, verdict
    good, bad, good_verdict = 0, len(ordered), None
    while bad - good > 1:
        mid = (good + bad) // 2
        set_prefix(mid)
        found = judged(model, fid)
        if fid.met(found):
            good, good_verdict = mid, found
        else:
            bad = mid
    set_prefix(good)
    return ordered[:good], good_verdict if good_verdict is not None else judged(model, fid)
