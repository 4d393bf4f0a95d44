"""``prune`` without ``ratio=``: remove as much compute as the fidelity budget allows.

A candidate amount ``r`` is ``prune(ratio=r)`` as :mod:`onnxslim_kit.passes.prune.ratio`
makes it — the same selection (with ``alloc=sensitivity`` the loss curves are measured once,
with the levels of the largest cap ``max_share(R_MAX)``, and each candidate allocates on them
with its own cap ``max_share(r)``), the same cut and re-fit on the fit samples (``ctx.feed``) —
then judged against the original on the held-out samples ``fid.samples`` and — where it holds
there — on up to 64 fit samples the re-fit did not use (:mod:`onnxslim_kit.passes.prune.judged`:
a search keeps the largest amount that holds on its judged samples, so with 32 of them it keeps
an amount whose failures are rarer than about one input in 32 only by luck). Bisection over ``r ∈ [0, R_MAX]``::

    lo = 0 (the stripped model), hi = R_MAX
    repeat:  r = (lo + hi) / 2;  candidate(r) holds (used ≤ fid.allowed) → lo = r, keep it
                                                          otherwise      → hi = r

and the candidate kept is the one of the largest ``r`` that held (the damage is taken as
monotone in ``r``: a larger ``r`` removes more of the same ranked units; where it is not,
the search keeps a smaller amount than it could, never one that misses). ``R_MAX = 0.9``,
the largest share of a group that may go. An ``r`` that selects nothing (cuts come in blocks
of ``multiple`` channels) moves ``lo`` up without a trial; one that selects the same units as
a candidate already judged reuses its verdict.

Then the search **backs off**: the candidate at ``(1 − backoff) · r`` (``backoff`` = 0.2 by
default) of the largest ``r`` that held is cut, judged and kept when it holds (the stripped model
when it does not). A search that keeps the largest amount holding on its judged samples keeps one
at the edge of a cliff where the loss grows tenfold per step of ``r``, and an input a little
harder than the judged ones sits past that edge. On orientation (96 judged samples: 32 held out,
64 spare) the search kept ``r`` = 0.62; fresh 32-sample draws then went down to cosine 0.766.
``r`` = 0.5625 held 0.9999 on the judged samples and one fresh draw still gave 0.896; ``r`` = 0.45
and the back-off's 0.495 gave 1.0000 on all 8 draws
(``benchmarks/results/prune-spare-2026-12-03-s14.md``). The report
says what was backed off from (``backoff_from``).

Cost: one channel analysis, one statistics run on the fit samples, the sensitivity curves
once, then at most ``MAX_TRIALS`` = 6 judged candidates (in at most ``MAX_STEPS`` = 10
bisection steps) and the back-off's, each: the cut, its re-fit (one teacher run, one truncated student run per
wave of re-fitted layers), one run on the judged samples and, where it holds there, one on the
spare ones (once, before the trials: the original's run on them). Six trials resolve ``r`` to
``R_MAX / 2⁶ ≈ 0.014``. The report gives every trial as ``[r, ratio reached, budget used,
held]`` (``search``) and the seconds of the shared preparation and of each trial
(``search_seconds``) and how many samples judged them (``search_samples``).

The target ``none`` (the pass's ``target=none`` / ``0``, or the pipeline's ``--target none``)
means no search: the stripped model is kept.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, fields

from onnxslim_kit.api import PassResult, pass_fidelity

from onnxslim_kit.passes.prune.held import release
from onnxslim_kit.passes.prune.judged import judge_in_stages, judge_model, report, spare_samples
from onnxslim_kit.passes.prune.ratio import Plan, choose, cut, make_plan, max_share, sensitivity_applies
from onnxslim_kit.passes.prune.sensitivity import Curves, levels

R_MAX = 0.9
MAX_TRIALS = 6
MAX_STEPS = 10


@dataclass
class Trial:
    ratio: float
    reached: float
    compute: float
    verdict: object
    result: PassResult
    model: object = None
    seconds: float = 0.0
    removed: frozenset = frozenset()


def cuttable(cg, cap: float, opts) -> bool:
    """Whether any group has a cut size within ``cap``, ``min_channels`` and ``multiple``."""
    blocked = cg.blocked_units()
    for group in cg.source_groups():
        prunable = sum(u not in blocked for u in group)
        if prunable and levels(len(group), prunable, cap, opts["min_channels"], max(opts["multiple"], 1), 1):
            return True
    return False


def prune_to_target(model, ctx, result, analyse_model) -> None:
    """Prune ``model`` by the largest amount that holds ``pass_fidelity(ctx)`` (module docstring)."""
    opts = ctx.options
    fid = pass_fidelity(ctx)
    if fid.target.metric == "none":
        result.notes.append("target none: no search, only the constant channels stripped")
        return
    cg = analyse_model(model, ctx)
    cap = max_share(R_MAX, opts["max_ratio"])
    if not cuttable(cg, cap, opts):
        result.skip(f"nothing to prune: no group can lose a block of multiple={max(opts['multiple'], 1)} channels "
                    f"keeping min_channels={opts['min_channels']}")
        return
    start = time.perf_counter()
    plan = make_plan(model, ctx, cg, result, cap)
    if sensitivity_applies(opts):
        plan.curves = Curves(cg, plan.teacher, plan.stats, plan.samples, plan.importance, plan.cost_model, cap,
                             opts["min_channels"], plan.multiple, result, ctx.progress)
    wide = fid.widened(spare_samples(ctx, len(plan.samples), fid), "fit samples the re-fit did not use")
    prepared = time.perf_counter() - start
    best, trials = bisect(model, ctx, cg, plan, fid, wide, analyse_model)
    found = best
    if best is not None and opts["backoff"] > 0:
        best = back_off(model, ctx, cg, plan, fid, wide, analyse_model, best, trials)
    result.metrics["search_samples"] = len(wide.samples)
    result.metrics["search"] = [[round(t.ratio, 4), round(t.reached, 4), round(t.verdict.used, 4),
                                 fid.met(t.verdict)] for t in trials]
    result.metrics["search_seconds"] = [round(prepared, 2)] + [round(t.seconds, 2) for t in trials]
    if found is not None and best is not found:
        result.metrics["backoff_from"] = round(found.ratio, 4)
        result.notes.append(f"backed off from r={found.ratio:.3g} (the largest amount that held, "
                            f"{found.reached:.3f} of the prunable compute) by backoff={opts['backoff']:g}"
                            + ("" if best else ": the smaller amount missed, only the constant channels stripped"))
    if best is None and found is not None:
        report(result, wide, judge_model(model, wide), 0.0, 0.0)
        return
    if best is None:
        least = min(trials, key=lambda t: t.reached, default=None)
        result.notes.append(f"no amount held the target: the smallest judged (r={least.ratio:.3g}, "
                            f"{least.reached:.3f} of the prunable compute) used {least.verdict.used:.0%} of the "
                            f"budget, {least.verdict.binding} binding" if least else "no amount removed anything")
        report(result, fid, judge_model(model, fid), 0.0, 0.0)
        return
    for f in fields(model):  # the kept candidate becomes the model (its graph and its names)
        setattr(model, f.name, getattr(best.model, f.name))
    _merge(result, best.result)
    report(result, wide, best.verdict, best.reached, best.compute)
    result.notes.append(f"searched the amount: {len(trials)} candidates judged, r={best.ratio:.3g} kept")


def bisect(model, ctx, cg, plan: Plan, fid, wide, analyse_model) -> tuple:
    """(the kept :class:`Trial` or None, every judged trial in order); a trial holds iff it
    holds on ``wide.samples`` (:func:`onnxslim_kit.passes.prune.judged.judge_in_stages`)."""
    lo, hi = 0.0, R_MAX
    best, trials, seen = None, [], {}
    for _ in range(MAX_STEPS):
        if len(trials) >= MAX_TRIALS:
            break
        r = (lo + hi) / 2
        trial_result = PassResult()
        removed = choose(cg, plan, r, ctx.options, trial_result, ctx.progress)
        if not removed:
            lo = r
            continue
        key = frozenset(removed)
        trial = seen.get(key)
        if trial is None:
            trial = seen[key] = judged_trial(model, ctx, cg, plan, r, removed, trial_result, fid, wide,
                                             analyse_model)
            trials.append(trial)
        if fid.met(trial.verdict):
            lo = r
        else:
            hi = r
        if fid.met(trial.verdict) and (best is None or trial.reached > best.reached):
            best, dropped = trial, best
        else:
            dropped = trial if trial is not best else None
        if dropped is not None:
            dropped.model = None  # only the kept candidate's graph is held
    return best, trials


def back_off(model, ctx, cg, plan: Plan, fid, wide, analyse_model, found: Trial, trials: list):
    """The candidate at ``(1 − backoff) · r`` of the largest amount ``r`` that held (judged and
    appended to ``trials``; ``found`` when it selects the same units), or None when it misses
    or selects nothing (module docstring)."""
    r = found.ratio * (1 - ctx.options["backoff"])
    trial_result = PassResult()
    removed = choose(cg, plan, r, ctx.options, trial_result, ctx.progress)
    if removed == found.removed:
        return found
    found.model = None
    judged = next((t for t in trials if t.removed == removed), None)
    if not removed or (judged is not None and not fid.met(judged.verdict)):  # nothing, or a known miss
        return None
    trial = judged_trial(model, ctx, cg, plan, r, removed, trial_result, fid, wide, analyse_model)
    trials.append(trial)
    return trial if fid.met(trial.verdict) else None


def judged_trial(model, ctx, cg, plan: Plan, r: float, removed: set, result, fid, wide, analyse_model) -> Trial:
    """``removed`` cut from a copy of ``model`` (sharing its unchanged weights), re-fitted, judged."""
    start = time.perf_counter()
    release(model)  # the original's weight pages read so far (:mod:`onnxslim_kit.passes.prune.held`)
    trial = model.snapshot()
    trial_cg = analyse_model(trial, ctx, shapes=cg.shapes)
    if len(trial_cg.all_units()) != len(cg.all_units()):
        raise RuntimeError("prune: the copy's channel analysis differs from the model's")
    saved = plan.cost_model.saved(removed)
    cut(trial, trial_cg, plan, removed, ctx.options, result, ctx.progress)
    trial.commit()
    verdict = judge_in_stages(trial, fid, wide)
    return Trial(r, saved / max(plan.prunable_saved(cg), 1e-30), saved / max(plan.cost_model.full(), 1e-30),
                 verdict, result, trial, time.perf_counter() - start, frozenset(removed))


def _merge(result, other) -> None:
    result.rewrites.update(other.rewrites)
    result.skipped.update(other.skipped)
    result.notes.extend(other.notes)
    result.metrics.update(other.metrics)
    result.modified = result.modified or other.modified
