"""A pruned candidate judged by the fidelity contract, and the figures the report gets.

The candidate runs (ONNX Runtime, one thread, on its own arrays, :func:`model_outputs`) on the judged samples ``fid.samples`` — held
out from the data the pass fits (:mod:`onnxslim_kit.fidelity.context`) — and its outputs are
scored per output view against the original's (``fid.judge``): ``used`` is the fraction of
the target's loss budget the worst bound view takes, the target holds for this pass iff
``used ≤ fid.allowed``.

A search (:mod:`onnxslim_kit.passes.prune.search`) holds its candidates to more samples:
those and up to ``SPARE_SAMPLES`` (64; fewer where the original's outputs on them would pass
``SPARE_BYTES``, 256 MB) fit samples the re-fit did not use (``samples=`` of them
fit it) — :func:`judge_in_stages`. On orientation, ``prune(ratio=0.675)`` held cosine 0.9998 on
the 32 held-out samples and gave 0.07–0.25 on 4 of 8 fresh 32-sample draws; the 64 spare
fit samples showed it (worst cosine 0.66) — a failure on about one input in 50 that 32 judged
samples miss two times in three, and that a search choosing the largest amount holding on them
keeps by construction (``benchmarks/results/prune-spare-2026-12-03-s14-r0675.md``).

Reported: ``target``, ``budget_used``, ``budget_allowed``, ``ratio_reached`` (the share of
the prunable compute removed, the quantity ``ratio=`` asks for, counted by
:class:`onnxslim_kit.passes.prune.cost.CostModel`), ``compute_removed`` (the same over all
the compute the cost model counts), ``views`` (per-view figures) and a note naming the
binding view and the samples.
"""

from __future__ import annotations

import numpy as np

from onnxslim_kit.api import make_session, run

from onnxslim_kit.passes.prune.held import release

SPARE_SAMPLES = 64
SPARE_BYTES = 256 << 20


def model_outputs(model, samples: list) -> list:
    """``model``'s graph outputs on each of ``samples`` (one dict per sample): a session on the
    model's own arrays (no copy of its weights), without packed weight copies — as the
    original's reference outputs are computed (:mod:`onnxslim_kit.fidelity.context`) — its
    weight pages dropped after (:mod:`onnxslim_kit.passes.prune.held`)."""
    proto, arrays = model.session_proto()
    names = [o.name for o in proto.graph.output]
    session = make_session(proto, threads=1, arena=False, arrays=arrays, prepack=False)
    try:
        return [{k: v for k, v in run(session, sample).items() if k in names} for sample in samples]
    finally:
        del session
        release(model)


def judge_model(model, fid):
    """The :class:`onnxslim_kit.fidelity.judge.Verdict` of ``model`` on ``fid.samples``."""
    return fid.judge(model_outputs(model, fid.samples))


def spare_samples(ctx, used: int, fid) -> list:
    """Up to ``SPARE_SAMPLES`` fit samples after the first ``used`` (the ones the pass fitted),
    fewer where the original's outputs on them would pass ``SPARE_BYTES`` (a language model's
    logits: 25 MB a sample at 128 tokens × 50k classes)."""
    per_sample = sum(np.asarray(v).nbytes for v in fid.reference[0].values()) if fid.reference else 0
    count = min(SPARE_SAMPLES, SPARE_BYTES // max(per_sample, 1))
    return ctx.feed.take(used + count)[used:] if count else []


def judge_in_stages(model, fid, wide):
    """``model``'s verdict on ``wide.samples`` (``fid``'s samples, then spare ones,
    :meth:`onnxslim_kit.fidelity.context.Fidelity.widened`), run in two stages: a candidate that
    misses on ``fid.samples`` is not run on the rest (its verdict there is the answer)."""
    first = model_outputs(model, fid.samples)
    verdict = fid.judge(first)
    if wide is fid or not fid.met(verdict):
        return verdict
    return wide.judge(first + model_outputs(model, wide.samples[len(fid.samples):]))


def report(result, fid, verdict, reached: float, compute_removed: float) -> None:
    """The metrics and the note of the module docstring."""
    result.metrics["target"] = str(fid.target)
    result.metrics["budget_used"] = round(verdict.used, 4)
    result.metrics["budget_allowed"] = round(fid.allowed, 4)
    result.metrics["ratio_reached"] = round(reached, 4)
    result.metrics["compute_removed"] = round(compute_removed, 4)
    result.metrics["views"] = [s.to_dict() for s in verdict.scores]
    held = "holds" if fid.met(verdict) else "missed"
    result.notes.append(f"fidelity {held}: {verdict.binding} binds, {verdict.used:.0%} of the {fid.target} budget "
                        f"used (allowed {fid.allowed:.0%}), judged on {verdict.samples} "
                        f"{fid.judged_on or 'samples'}; ratio reached {reached:.3f} of the prunable compute")
