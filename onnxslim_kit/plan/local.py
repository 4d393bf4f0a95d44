"""The local executor: the plan's work in this process, one pipeline after the other.

See :mod:`.executor` for what an executor does; this one runs each pipeline through
:func:`onnxslim_kit.optimize` in turn (no new pipeline is started once the time budget is spent)
and the one benchmark here.
"""

from __future__ import annotations

import time

from .candidates import Candidate, run_candidate


def progress_note(bar, candidates: list) -> None:
    """The progress bar's note: how many candidates hold the target so far, and the smallest."""
    if hasattr(bar, "set_postfix_str"):
        met = [c for c in candidates if c.usable]
        smallest = min(met, key=lambda c: c.size_bytes).pipeline if met else "-"
        bar.set_postfix_str(f"{len(met)} met, smallest {smallest}")


def state_line(candidate: Candidate) -> str:
    return candidate.error or ("met" if candidate.met else "MISSED") + f", {candidate.binding}"


class LocalExecutor:
    """Everything in this process, one pipeline after the other."""

    name = "local"

    def __init__(self):
        self.tasks = []

    def __enter__(self):
        return self

    def __exit__(self, *_):
        return False

    def describe(self) -> dict:
        return {"name": self.name}

    def candidates(self, model, pipelines, settings, budget_s, progress, log) -> tuple:
        """No new pipeline is started once ``budget_s`` has passed (``fuse`` always runs)."""
        from .. import optimize

        start, candidates, stopped = time.perf_counter(), [], False
        bar = progress(pipelines, desc="plan", total=len(pipelines)) if progress else pipelines
        for pipeline in bar:
            if pipeline != "fuse" and budget_s is not None and time.perf_counter() - start > budget_s:
                stopped = True
                candidates.append(Candidate(pipeline, skipped=f"time budget of {budget_s:g} s spent"))
                continue
            candidate = run_candidate(model, pipeline, settings, optimize)
            candidates.append(candidate)
            log(f"plan: {pipeline}: {state_line(candidate)}")
            progress_note(bar, candidates)
        return candidates, stopped

    def bench(self, model, protos, names, samples, machine, timing) -> list:
        from .. import bench

        result = bench.benchmark([model] + list(protos), samples, names=["original"] + list(names),
                                 providers=[machine["provider"]], threads=[machine["threads"]],
                                 memory=False, **timing)
        return result.rows
