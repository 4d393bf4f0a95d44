"""``plan``: the fastest (or smallest) model that holds the fidelity target, chosen by measurement.

Increments 1 and 2 (issue 17): the candidates are fixed whole pipelines (:mod:`.candidates`),
each run by :func:`onnxslim_kit.optimize` with the plan's data, seed and target; those that hold the
target on held-out samples are timed together with the original by
:func:`onnxslim_kit.bench.benchmark` (interleaved rounds, paired ratios vs the original) unless
the timing cache (:mod:`.timing_cache`) already has them; :mod:`.choose` picks one. The chosen
candidate's optimize report is the recipe: it replays to the same bytes without timing.

Steps and their bounds:

1. ``fuse`` first, always (lossless; its error is the plan's error);
2. each further pipeline in order, unless ``budget_s`` seconds have passed since the start
   (then it is reported as skipped; the budget bounds the optimize runs, the one timing step
   after them is always done, for every feasible candidate not cached);
3. candidates with the same computation as an earlier one are timed once (``same_as``;
   :func:`.candidates.content_sha256`);
4. goal size needs no timing: nothing is timed and the cache is not touched;
5. goal memory measures each feasible candidate's session peak instead of timing it
   (:mod:`.memory`), through the same cache;
6. ``profile=True`` (``--html``): the original and the chosen model are profiled by ORT
   (:mod:`.profile`, latency by op type), through the same cache;
7. goal latency: a choice other than ``fuse`` is timed once more with ``fuse`` and the
   candidates near it; the fastest over both runs is chosen, and kept only when the second
   run puts it 2 % ahead of ``fuse`` (:mod:`.confirm`);
8. a per-layer mix (:mod:`.mix`): when ``fuse,dynamic`` was tried and misses the target, the
   MatMul/Gemm layers are ordered by an estimate of their dynamic-int8 error and a binary search
   (at most ⌈log₂ N⌉ more optimize runs) finds the fewest to keep float so that the target holds;
   that mix is one more candidate, timed and chosen by the same rules (``mix_search=False``:
   off; not started once the budget is spent).

Where the optimize runs and the one benchmark run is the executor's business (:mod:`.executor`:
this process, or Ray tasks, :mod:`.ray_executor`); duplicates, cache look-ups and the choice are
made here, after every optimize run has finished, in the order of the pipelines, so both
executors choose the same candidate from the same cache. ``pipelines``: a subset to try
(:func:`.candidates.checked_pipelines`; ``fuse`` always first).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from . import confirm, memory, mix
from . import profile as op_profile
from .candidates import GOALS, Candidate, checked_pipelines
from .choose import choose, pareto_front
from .local import LocalExecutor
from .timing_cache import TimingCache, machine_fields, shared_with_passes

__all__ = ["plan", "PlanResult", "GOALS"]


@dataclass
class PlanResult:
    candidates: list
    chosen: Candidate
    front: list
    settings: dict
    timed: int = 0  # candidates timed in this run (0: all from the cache, or goal size)
    cache_hits: int = 0
    seconds: float = 0.0
    budget_stopped: bool = False
    reference: dict = field(default_factory=dict)  # the original's size and median latency (or peak)
    measured: int = 0  # goal memory: peaks measured in this run (0: all from the cache)
    profiles: dict = field(default_factory=dict)  # profile=True: {"original", "chosen"} latency by op
    executor: dict = field(default_factory=dict)  # where it ran: {"name"} (ray: its address and tasks)
    sensitivity: dict = field(default_factory=dict)  # the mix's per-layer estimate (:func:`.mix.search`)
    confirmation: dict | None = None  # goal latency: the second run against fuse (:mod:`.confirm`)


def _mark_duplicates(candidates: list) -> None:
    """``same_as``: the first earlier candidate with the same computation (in the order tried;
    :func:`.candidates.content_sha256`)."""
    seen = {}
    for candidate in candidates:
        key = candidate.content or candidate.sha256
        if key in seen:
            candidate.same_as = seen[key]
        elif key:
            seen[key] = candidate.pipeline


def _time(model, candidates, samples, machine, cache, reference_sha, timing, executor) -> tuple:
    """Timings from the cache, else one interleaved benchmark of the original and the rest
    (``executor.bench``: one benchmark, never two at a time)."""
    unique = [c for c in candidates if c.usable and c.same_as is None]
    missing = []
    for c in unique:
        cached = cache.get(c.sha256, machine, reference_sha)
        if cached is not None:
            c.timing = {k: cached[k] for k in ("ratio", "spread", "median_ms")} | {"cached": True}
        else:
            missing.append(c)
    reference = {}
    if missing:
        rows = executor.bench(model, [c.proto for c in missing], [c.pipeline for c in missing], samples,
                              machine, timing)
        reference["median_ms"] = (rows[0].get("latency_ms") or {}).get("median")
        for c, row in zip(missing, rows[1:]):
            if row.get("error") or row.get("latency_ratio_vs_first") is None:
                c.error = row.get("error") or "not timed"
                continue
            c.timing = {"ratio": row["latency_ratio_vs_first"], "spread": list(row["latency_ratio_spread"]),
                        "median_ms": row["latency_ms"]["median"]}
            cache.put(c.sha256, machine, reference_sha, c.timing)
            c.timing = {**c.timing, "cached": False}
    by_pipeline = {c.pipeline: c for c in candidates}
    for c in candidates:
        if c.same_as is not None:
            c.timing = by_pipeline[c.same_as].timing
    return len(missing), reference


def _measure(model, candidates, goal, samples, machine, cache, runs, warmup, progress, executor) -> tuple:
    """``(timed, measured, reference)``: goal latency times, goal memory measures peaks."""
    from ..recipe import file_sha256

    if goal == "latency":
        timed, reference = _time(model, candidates, samples, machine, cache, file_sha256(model),
                                 {"runs": runs, "warmup": warmup, "progress": progress}, executor)
        return timed, 0, reference
    if goal == "memory":
        measured, peak = memory.measure(model, candidates, samples, machine, cache, file_sha256(model), runs)
        return 0, measured, {"peak_mb": peak["peak_mb"]}
    return 0, 0, {}


def plan(model, *, calib=None, eval_data=None, target=None, goal: str = "latency", provider: str = "cpu",
         threads: int = 1, timing_cache: TimingCache | None = None, budget_s: float | None = None,
         runs: int = 50, warmup: int = 5, input_shapes: dict | None = None, num_samples: int = 8,
         seed: int = 0, progress=None, log=None, profile: bool = False, pipelines=None,
         executor=None, mix_search: bool = True) -> PlanResult:
    """Plan ``model`` (a path): see the module docstring. ``timing_cache``: read and extended
    (an in-memory one when None). ``pipelines``: the candidates to try (default: the goal's, see
    :mod:`.candidates`; ``fuse`` is tried first in any case). ``executor``: where the work runs
    (:mod:`.executor`; default this process). ``mix_search``: after the pipelines, search a per-layer
    dynamic/float mix when ``fuse,dynamic`` misses the target (:mod:`.mix`)."""
    import logging

    from ..bench import resolve_provider, short_name
    from ..calibration import CalibrationFeed, input_specs
    from ..errors import UserError
    from ..model import load_proto
    from ..recipe import file_sha256

    if goal not in GOALS:
        raise UserError(f"goal {goal!r}: one of {', '.join(GOALS)}")
    pipelines = checked_pipelines(pipelines, goal)
    start = time.perf_counter()
    log = log or logging.getLogger("onnxslim_kit").info
    full_provider = resolve_provider(provider)
    settings = {"calib": calib, "eval_data": eval_data, "target": target, "input_shapes": input_shapes or {},
                "num_samples": num_samples, "seed": seed}
    if progress is not None:
        settings["progress"] = progress
    cache = timing_cache if timing_cache is not None else TimingCache()
    machine = machine_fields(full_provider, threads)
    executor = executor if executor is not None else LocalExecutor()
    sensitivity = {}
    with executor, shared_with_passes(cache):
        candidates, stopped = executor.candidates(model, pipelines, settings, budget_s, progress, log)
        if mix_search and not stopped:
            deadline = None if budget_s is None else start + budget_s
            candidates += mix.search(model, candidates, settings, executor, log, deadline, record=sensitivity)
        _mark_duplicates(candidates)
        samples = []
        if goal != "size" or profile:
            feed = CalibrationFeed(input_specs(load_proto(model)), eval_data if eval_data is not None else calib,
                                   input_shapes, num_samples=num_samples, seed=seed)
            samples = list(feed)
        timed, measured, reference = _measure(model, candidates, goal, samples, machine, cache, runs, warmup,
                                              progress, executor)
        chosen, confirmation = choose(candidates, goal), None
        if goal == "latency":
            fuse = candidates[0]
            confirmation = confirm.confirm(model, chosen, fuse, samples, machine, cache, file_sha256(model),
                                           {"runs": runs, "warmup": warmup, "progress": progress}, executor,
                                           candidates)
            if confirmation is not None and not confirmation["kept"]:
                chosen = next(c for c in candidates if c.pipeline == confirmation["instead"])
    profiles = {}
    if profile:
        profiles = {"original": op_profile.cached_latency(model, file_sha256(model), samples, machine, cache),
                    "chosen": op_profile.cached_latency(chosen.proto, chosen.sha256, samples, machine, cache)}
    first = candidates[0].report
    plan_settings = {"goal": goal, "target": first.target, "provider": short_name(full_provider),
                     "threads": int(threads), "runs": runs, "warmup": warmup, "budget_s": budget_s,
                     "machine": machine, "pipelines": list(pipelines), "seed": seed}
    return PlanResult(candidates, chosen, pareto_front(candidates), plan_settings, timed=timed,
                      cache_hits=cache.hits, seconds=time.perf_counter() - start, budget_stopped=stopped,
                      reference={"size_bytes": first.before.get("bytes"), **reference}, measured=measured,
                      profiles=profiles, executor=executor.describe(), sensitivity=sensitivity,
                      confirmation=confirmation)
