"""The ladder search of the int8 fallback: which layers leave static int8, and how far.

:func:`choose_fallback` over the layers ranked by :func:`rank_layers`; the rule and its
measurements are in :mod:`onnxslim_kit.passes.int8.fallback`'s docstring (step 3).
"""

from __future__ import annotations


def rank_layers(names: list, build_one, rank_score, progress=lambda it, **_: it, local=None,
                refine: int | None = None, gated=None) -> tuple:
    """(names most sensitive first, sensitivities): ``local()`` gives local sensitivities
    (None: every layer alone in int8, ``build_one(name)``, its budget fraction ``rank_score(proto)`` end to
    end); with ``local`` and ``refine``, the ``refine`` most locally sensitive are re-scored end to end and put first.
    ``gated(names) -> {name: sensitivity}`` scores many layers from one session (the layers
    it leaves out get their own build)."""
    sens = local() if local is not None else {}
    order = sorted(names, key=lambda n: -sens.get(n, 0.0))
    todo = names if local is None else order[: refine or 0]
    e2e = gated(todo) if gated is not None and todo else {}
    e2e.update({name: float(rank_score(build_one(name)))
                for name in progress([n for n in todo if n not in e2e], desc="int8 sensitivity")})
    head = sorted(e2e, key=lambda n: -e2e[n])
    return head + [n for n in order if n not in e2e], {**sens, **e2e}


TIGHT = 0.5  # choose_fallback: a level whose base uses more of the budget tries "all but one" first


def smallest_k(m: int, ok, tight: bool = False) -> int:
    """Smallest ``k`` in 1..m with ``ok(k)`` (``ok`` monotone, ``ok(m)`` true): k = 1, 2, 4, …
    until it holds, then a bisection between the last two. ``tight`` (``ok(m)`` itself is near
    the limit, so that few of the m can move): the search starts from the top instead —
    ``k = m − 1``, then ``m − 2, m − 4, m − 8, …`` while they hold, then a bisection — so an
    answer near ``m`` takes a trial or two instead of ``log₂ m`` doublings and a bisection
    (yolov8n_doclaynet: no layer on the weights rung could go back to static int8, 5 trials → 1;
    33 of 34 had to stay: 7 trials → 2)."""
    if tight and m > 1:
        if not ok(m - 1):
            return m
        k_ok, step = m - 1, 1
        while True:
            k = max(k_ok - step, 1)
            if k == k_ok:
                return k_ok
            if not ok(k):
                k_bad = k
                break
            k_ok, step = k, 2 * step
    else:
        k_ok, k_bad, k = None, 0, 1
        while k_ok is None:
            k = min(k, m)
            if k == m or ok(k):
                k_ok = k
            else:
                k_bad, k = k, 2 * k
    while k_ok - k_bad > 1:
        mid = (k_ok + k_bad) // 2
        if ok(mid):
            k_ok = mid
        else:
            k_bad = mid
    return k_ok


def choose_fallback(names: list, build, score, allowed: float, options: dict | None = None,
                    progress=lambda it, **_: it, log=None, local=None, rank_score=None,
                    refine: int | None = None, gated=None, ranking: list | None = None) -> tuple:
    """The smallest fallback (most sensitive layers first, deepest first) that uses at most
    ``allowed`` of the budget.

    ``options``: ``{layer: [rung, …]}``, the fallback rungs of each layer between static int8
    and float, in order (default none: int8 or float). A layer at *level* ``d`` takes its
    ``d``-th choice of ``["int8", *rungs, "float"]`` (clipped at float). ``build(assign) ->
    proto`` with ``assign = {layer: choice}`` (missing: float); ``score(proto, stop_above)``
    the budget fraction it uses (see :class:`Scorer`). Over the ranking of :func:`rank_layers`:

    1. ``d``: the smallest level that meets the target with *every* layer at it (every layer
       float uses nothing: not run);
    2. for ``level = d, d − 1, …, 1``: the layers not yet fixed are at ``level``; the smallest
       ``j`` such that the ``j`` most sensitive of them stay there and the others move one
       level up (towards int8) still meets the target; those ``j`` are fixed.

    Without rungs this is the plain search for the ``k`` most sensitive layers to keep float.
    Returns (``{layer: choice}``, its score — what ``score`` returned, 0.0 when every layer is
    float —, sensitivities). ``ranking``: kept for a search at another allowance (:mod:`.kernels`).
    """
    rank_score = rank_score or score
    choices = {n: ["int8", *[r for r in (options or {}).get(n, ()) if r != "float"], "float"] for n in names}
    n = len(names)
    full = score(build({name: "int8" for name in names}), allowed)
    if full <= allowed:
        return {name: "int8" for name in names}, full, {}
    ranking = [] if ranking is None else ranking  # [order, sens]: ranked once, then reused
    order, sens = ranking[:] = ranking or rank_layers(names, lambda name: build({name: "int8"}), rank_score,
                                                       progress, local, refine, gated)
    cache = {}

    def assign(levels) -> dict:
        return {name: choices[name][min(lv, len(choices[name]) - 1)] for name, lv in zip(order, levels)}

    def value(levels):
        key = tuple(levels)
        if key not in cache:
            chosen = assign(levels)
            cache[key] = 0.0 if all(c == "float" for c in chosen.values()) else score(build(chosen), allowed)
        return cache[key]

    depth = max(len(c) for c in choices.values()) - 1
    d = next(lv for lv in range(1, depth + 1) if lv == depth or value([lv] * n) <= allowed)
    levels, start = [d] * n, 0
    for level in range(d, 0, -1):
        def trial(j, level=level, start=start, fixed=tuple(levels)):
            return list(fixed[:start + j]) + [level - 1] * (n - start - j)
        if level < d and value(trial(0)) <= allowed:
            j = 0
        else:
            tight = value(list(levels)) > TIGHT * allowed  # the level's base: known, not run again
            j = smallest_k(n - start, lambda j, trial=trial: value(trial(j)) <= allowed, tight) if start < n else 0
        levels, start = trial(j), start + j
    chosen = assign(levels)
    if log:
        moved = sum(c != "int8" for c in chosen.values())
        log(f"int8: {moved} of {n} layers off static int8 for the target "
            f"({sum(c == 'float' for c in chosen.values())} float)")
    return chosen, value(levels), sens
