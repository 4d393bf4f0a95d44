"""Choosing the planned model, and the Pareto front of what was tried.

Feasible: the candidates that hold the target (:attr:`.candidates.Candidate.usable`); ``fuse``
alone is lossless and always feasible.

Goal latency, with r(c) the paired latency ratio of candidate c vs the original:

1. F = the feasible candidates that were timed; r* = min over F of r(c);
2. ties: T = {c ∈ F : r(c) ≤ r*·(1 + TIE)} with TIE = 0.03; within T the smallest file wins,
   then the lower ratio, then the earlier pipeline (the order tried: deterministic);
3. never slower than fuse: a choice with r(c) > r(fuse) is replaced by ``fuse`` (possible only
   through the tie rule, which may prefer a smaller file up to 3 % slower than the fastest).

Goal memory, with m(c) the session's peak (:mod:`.memory`): the same three rules with m in place
of r — the smallest peak m*, ties within TIE of m* to the smallest file, and never more than
``fuse``'s peak.

Goal size: the smallest file among the feasible candidates; ties (equal bytes) the lower
ratio when timed, then the earlier pipeline.

Pareto front (over the feasible candidates, duplicates by bytes counted once): c is on it
unless some d is no worse on every axis (latency ratio or peak memory, size, budget used) and
better on one. An axis not measured (no timing under goal size or memory, no peak under goal
latency or size) is left out of the comparison.
"""

from __future__ import annotations

TIE = 0.03


def _ratio(candidate) -> float | None:
    return (candidate.timing or {}).get("ratio")


def _peak(candidate) -> float | None:
    return (getattr(candidate, "memory", None) or {}).get("peak_mb")


def choose(candidates: list, goal: str):
    """The chosen candidate (module docstring); ``fuse`` must be among ``candidates``."""
    feasible = [c for c in candidates if c.usable and c.same_as is None]
    fuse = next(c for c in candidates if c.pipeline == "fuse")
    order = {c.pipeline: i for i, c in enumerate(candidates)}
    if goal == "size":
        return min(feasible, key=lambda c: (c.size_bytes, _ratio(c) if _ratio(c) is not None else 0.0,
                                            order[c.pipeline]))
    value = _peak if goal == "memory" else _ratio
    measured = [c for c in feasible if value(c) is not None]
    if not measured:
        return fuse
    best = min(value(c) for c in measured)
    ties = [c for c in measured if value(c) <= best * (1 + TIE)]
    chosen = min(ties, key=lambda c: (c.size_bytes, value(c), order[c.pipeline]))
    if value(fuse) is not None and value(chosen) > value(fuse):
        return fuse
    return chosen


def _axes(candidate, measures: tuple) -> tuple:
    used = candidate.used if candidate.used is not None else 0.0
    return tuple(m(candidate) for m in measures) + (candidate.size_bytes, used)


def pareto_front(candidates: list) -> list:
    """The pipelines on the Pareto front of the feasible candidates (module docstring), in order."""
    feasible = [c for c in candidates if c.usable and c.same_as is None]
    measures = tuple(m for m in (_ratio, _peak) if feasible and all(m(c) is not None for c in feasible))
    points = [(c, _axes(c, measures)) for c in feasible]

    def dominated(point) -> bool:
        return any(all(o <= p for o, p in zip(other, point)) and other != point for _, other in points)

    return [c.pipeline for c, point in points if not dominated(point)]
