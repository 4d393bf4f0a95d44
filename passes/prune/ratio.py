"""Structured pruning at a ratio: choose the units to cut per group, cut, re-fit.

In three steps a search over the amount (:mod:`onnxslim_kit.passes.prune.search`) reuses:
:func:`make_plan` (statistics, scores and the cost model of the model before the cut, once),
:func:`choose` (the units ``prune(ratio=r)`` removes) and :func:`cut` (remove them, re-fit).
``prune(ratio=r)`` itself cuts exactly that and reports its verdict under the fidelity target
(:mod:`onnxslim_kit.passes.prune.judged`).

Selection, with ``P_g`` the prunable (not blocked) units of group ``g`` and ``T_g`` all its
units:

* ``scope=layer``: ``n_g = ⌊ratio · |P_g|⌋`` lowest-scored units of each group;
* ``scope=global``: the ``⌊ratio · Σ|P_g|⌋`` lowest-scored prunable units of the model (scores
  are normalised per layer, :mod:`onnxslim_kit.passes.prune.importance`); ``n_g`` = how many fell in ``g``.

The cut and re-fitted weights are held in a scratch file, read pages dropped after each use
(:mod:`onnxslim_kit.passes.prune.held`).

Removed channels are not simply dropped: their mean over the calibration data ``E[x_c]``
moves into each consumer's bias (the same fold as strip's constants; at a padded Conv it
is exact away from the borders) — the zeroth-order part of the layer-wise correction,
before the re-fit (:mod:`onnxslim_kit.passes.prune.refit`) does the rest.

No group loses more than ``max_ratio`` of its units (default min(2·ratio, 0.9)): a global
ranking would otherwise empty the layers whose scores happen to be spread wide — typically
the squeeze convs of SE blocks, which see one row per sample and so are re-fitted only
loosely (the ridge prior keeps them near their pruned weights).

With ``max_loss=β`` > 0 (a per-group error budget) a group gives up only as many of its lowest
units as hold at most β of its importance mass ``Σ_{u∈g} score(u)`` (the importance before any
``cost`` division; with ``taylor`` the share of the consumers' output energy the cut units carry,
to first order): where every channel matters the group is spared, where importance sits in a
few channels it is cut the full amount.

With ``alloc=sensitivity`` (the default; applies to ``scope=global`` without ``max_loss``, which
ask for a given share per group) the selection above only sets the budget, counted node by node
by :class:`._prune_cost.CostModel` (MACs with channel counts rounded up to ``multiple``, or measured
latency with ``cost=latency``): the larger of what the units it picked, ranked by importance
alone, save (a cost-weighted ranking picks the expensive units, which would make the budget far
larger) and ``ratio`` times what cutting every prunable unit would save. The second term is the
floor that makes ``ratio`` mean compute: on ppocrv4_det the 30% least important units sit in the
cheap 384-channel layers at 1/32 resolution and save only 11% of the MACs. :mod:`onnxslim_kit.passes.prune.sensitivity`
then measures, group by group, the output loss of cutting more or fewer of its lowest units,
spends that budget where the loss per saved cost is smallest, and keeps the ranked selection
that saves the same (the smallest ratio ≥ ``ratio`` that does) instead when the measured loss of
that one is smaller.

Then per group the kept count ``k = |T_g| − n_g`` is rounded *up* to a multiple of
``multiple`` and raised to ``min_channels``; the group is left whole (reason counted) when
that leaves nothing to cut. Rounding up keeps every source's channel count a multiple of
``multiple`` when the group's full count is (vectorised kernels work on blocks of 4/8/16).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from onnxslim_kit.api import PassResult, pass_fidelity

from onnxslim_kit.passes.prune.apply import apply
from onnxslim_kit.passes.prune.cost import CostModel
from onnxslim_kit.passes.prune.held import release, spill_to_scratch
from onnxslim_kit.passes.prune.importance import activation_stats, consumer_inputs, unit_costs, unit_scores
from onnxslim_kit.passes.prune.latency import node_times, unit_latency
from onnxslim_kit.passes.prune.refit import Refitter
from onnxslim_kit.passes.prune.judged import judge_model, report
from onnxslim_kit.passes.prune.sensitivity import Curves


def max_share(ratio: float, max_ratio: float) -> float:
    """Largest fraction of one group that may go: ``max_ratio``, or by default min(2·ratio, 0.9)."""
    return max_ratio if max_ratio > 0 else min(2 * ratio, 0.9)


def ranking(cg, scores: dict) -> tuple:
    """``([(group, its prunable units by ascending score)], every prunable unit by ascending
    score)`` — once per analysis and ``scores`` (a search selects at many ratios)."""
    def make():
        blocked = cg.blocked_units()
        key = lambda u: (scores.get(u, 0.0), u)  # noqa: E731
        groups = [(g, sorted((u for u in g if u not in blocked), key=key)) for g in cg.source_groups()]
        return scores, groups, sorted((u for _, ranked in groups for u in ranked), key=key)
    answer = cg.cached(("ranking", id(scores)), make)
    if answer[0] is not scores:  # another dict at a reused address
        cg.memo.pop(("ranking", id(scores)))
        answer = cg.cached(("ranking", id(scores)), make)
    return answer[1], answer[2]


def select(cg, scores: dict, ratio: float, scope: str, min_channels: int, multiple: int, result,
           cap: float = 1.0, importance: dict | None = None, max_loss: float = 0.0) -> set:
    groups, pool = ranking(cg, scores)
    wanted: dict = {}
    if scope == "global":
        chosen = set(pool[: int(ratio * len(pool))])
        for i, (_, prunable) in enumerate(groups):
            wanted[i] = sum(u in chosen for u in prunable)
    else:
        for i, (_, prunable) in enumerate(groups):
            wanted[i] = int(ratio * len(prunable))
    removed = set()
    for i, (group, prunable) in enumerate(groups):
        if not prunable:
            continue
        n = min(wanted[i], len(prunable), int(cap * len(group)))
        keep = len(group) - n
        keep = max(math.ceil(keep / multiple) * multiple if multiple > 1 else keep, min_channels)
        n = len(group) - keep
        if n <= 0:
            if wanted[i] > 0:
                result.skip("group kept whole (min_channels / multiple)")
            continue
        if max_loss > 0:
            n = within_budget(prunable, n, group, importance or scores, max_loss, multiple, result)
        removed.update(prunable[:n])
    return removed


def within_budget(ranked: list, n: int, group: list, importance: dict, max_loss: float, multiple: int,
                  result) -> int:
    """Largest ``n' ≤ n`` (in steps of ``multiple``) whose cut units hold at most ``max_loss`` of
    the group's importance mass ``Σ_g score``."""
    total = sum(importance.get(u, 0.0) for u in group)
    step = max(multiple, 1)
    allowed = n
    while allowed > 0 and sum(importance.get(u, 0.0) for u in ranked[:allowed]) > max_loss * total:
        allowed -= step
    allowed = max(allowed, 0)
    if allowed < n:
        result.skip("group cut less (max_loss)" if allowed else "group kept whole (max_loss)")
    return allowed


def consumer_masks(cg, keep: dict) -> list:
    """(consumer, its output keep mask or None) for consumers that lost inputs, in graph order."""
    order = {id(n): i for i, n in enumerate(cg.graph.nodes)}
    out = []
    for c in cg.consumers:
        if keep[c.tensor.name].all():
            continue
        out_mask = keep.get(c.node.outputs[0].name)
        out.append((order[id(c.node)], c, None if out_mask is None or out_mask.all() else out_mask))
    return [(c, m) for _, c, m in sorted(out, key=lambda t: t[0])]


@dataclass
class Plan:
    """What every cut of one model shares: the teacher (the model before the cut), the fit
    samples, the activation statistics, the scores, the cost model and (``alloc=sensitivity``)
    the loss curves, measured once with the levels of ``cap``."""

    teacher: object
    samples: list
    stats: dict
    importance: dict
    scores: dict
    cost_model: CostModel
    multiple: int
    cap: float
    curves: Curves | None = None

    def prunable_saved(self, cg) -> float:
        """What cutting every prunable unit would save (the denominator of the ratio reached)."""
        blocked = cg.blocked_units()
        return self.cost_model.saved([u for g in cg.source_groups() for u in g if u not in blocked])


def make_plan(model, ctx, cg, result, cap: float) -> Plan:
    """The :class:`Plan` of ``model`` (analysed as ``cg``), fitted on ``ctx.feed``."""
    opts = ctx.options
    teacher = model.to_proto()
    samples = ctx.feed.take(max(opts["samples"], 1))
    stats = activation_stats(cg, teacher, samples, consumer_inputs(cg))
    scores = importance = unit_scores(cg, opts["criterion"], stats, opts["seed"])
    costs = node_cost = None
    multiple = max(opts["multiple"], 1)
    if opts["cost"] == "latency":
        times = node_times(teacher, samples[0])
        result.metrics["profiled_ms"] = round(1e3 * sum(times), 3)
        costs = unit_latency(cg, times)
        node_cost = {id(node): t for node, t in zip(cg.graph.nodes, times)}
    elif opts["cost"] == "macs":
        costs = unit_costs(cg)
    if opts["cost"] != "none":
        mean = float(np.mean(list(costs.values()))) if costs else 1.0
        scores = {u: v * mean / max(costs.get(u, mean), 1e-12) for u, v in scores.items()}
    release(model)  # the weight pages the statistics read
    return Plan(teacher, samples, stats, importance, scores, CostModel(cg, node_cost, multiple), multiple, cap)


def sensitivity_applies(opts) -> bool:
    return opts["alloc"] == "sensitivity" and opts["scope"] == "global" and not opts["max_loss"]


def choose(cg, plan: Plan, ratio: float, opts, result, progress=lambda it, **_: it) -> set:
    """The units ``prune(ratio=ratio)`` removes (see the module docstring)."""
    multiple, min_channels = plan.multiple, opts["min_channels"]
    cap = max_share(ratio, opts["max_ratio"])
    removed = select(cg, plan.scores, ratio, opts["scope"], min_channels, multiple, result, cap,
                     plan.importance, opts["max_loss"])
    if not removed or not sensitivity_applies(opts):
        return removed
    # the budget comes from the ranking by importance alone: a cost-weighted ranking picks the
    # expensive units, and their summed cost would be a far larger budget (det, cost=latency:
    # MACs 0.19 of fuse at ratio 0.35)
    budget = removed if plan.scores is plan.importance else select(
        cg, plan.importance, ratio, opts["scope"], min_channels, multiple, result, cap)

    def ranked(target: float, cost_model) -> set:
        """The ranked selection at the smallest ratio ≥ ``ratio`` that saves ``target``."""
        def pick(r):
            return select(cg, plan.importance, r, "global", min_channels, multiple, PassResult(), cap)
        lo, hi = ratio, 1.0
        best = pick(hi)
        for _ in range(12):
            mid = (lo + hi) / 2
            chosen = pick(mid)
            if cost_model.saved(chosen) >= target:
                hi, best = mid, chosen
            else:
                lo = mid
        return best

    if plan.curves is None:
        plan.curves = Curves(cg, plan.teacher, plan.stats, plan.samples, plan.importance, plan.cost_model,
                             plan.cap, min_channels, multiple, result, progress)
    return plan.curves.choose(budget, min(cap, plan.cap), result, floor=ratio, fallback=ranked)


def cut(model, cg, plan: Plan, removed: set, opts, result, progress=lambda it, **_: it) -> None:
    """Remove ``removed`` from ``model`` (analysed as ``cg``), the means folded, then re-fit."""
    result.metrics["units_pruned"] = len(removed)
    means = {i: plan.stats[c.tensor.name][0] for i, c in enumerate(cg.consumers)}
    spill_to_scratch(model)  # the cut and re-fitted weights: file pages, not heap
    keep = apply(model, cg, removed, means)
    release(model)
    result.rewrite("prune channel", len(removed))
    if opts["refit"]:
        refitter = Refitter(model, plan.teacher, plan.samples, opts["seed"])
        refitter.refit_all(consumer_masks(cg, keep), result, progress)
    shrunk = [(s.node, keep[s.node.outputs[0].name]) for s in cg.sources if not keep[s.node.outputs[0].name].all()]
    result.metrics["sources_shrunk"] = len(shrunk)
    if opts["explain"]:
        result.notes.extend(f"cut {node.op} {node.name!r}: {len(mask)} → {int(mask.sum())} channels"
                            for node, mask in shrunk)
    if opts["refit"]:
        result.notes.append(f"re-fit on {len(plan.samples)} calibration samples (the ones the passes fit)")


def prune_by_ratio(model, ctx, result, analyse_model) -> None:
    """``prune(ratio=…)``: exactly that ratio; the verdict on the judged samples reported."""
    opts = ctx.options
    cg = analyse_model(model, ctx)
    plan = make_plan(model, ctx, cg, result, max_share(opts["ratio"], opts["max_ratio"]))
    removed = choose(cg, plan, opts["ratio"], opts, result, ctx.progress)
    if not removed:
        result.skip(f"nothing to prune at this ratio: cuts come in steps of multiple={plan.multiple} channels, "
                    f"at most max_ratio={plan.cap:g} of a group, keeping min_channels={opts['min_channels']}")
        return
    reached = plan.cost_model.saved(removed) / max(plan.prunable_saved(cg), 1e-30)
    cut(model, cg, plan, removed, opts, result, ctx.progress)
    fid = pass_fidelity(ctx)
    report(result, fid, judge_model(model, fid), reached, plan.cost_model.saved(removed) / max(
        plan.cost_model.full(), 1e-30))
