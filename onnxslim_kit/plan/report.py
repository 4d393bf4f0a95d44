"""The plan's terminal table and JSON report.

Table: one row per pipeline tried — whether it holds the target, the binding view and the
share of the target's budget it used, its latency ratio vs the original (median of paired
per-round ratios, [P10–P90] spread; ``cached`` when from the timing cache), its size, and the
choice (``◀ chosen``; ``front`` marks the Pareto front). Under goal memory the latency column
is the session's peak memory instead (MB, ``cached`` when from the cache). JSON: the settings, every candidate
(:meth:`.candidates.Candidate.to_dict`), the front, the chosen pipeline, what was timed, and
the planning time, the second run that confirmed (or overturned) a latency choice, where it ran (``executor``: ``ray``'s tasks, :mod:`.ray_executor`), and (``--html``) the op profiles of the original and the chosen model.
"""

from __future__ import annotations

import json

from ..report import _json_default, _size
from . import confirm

HEADER = ("pipeline", "met", "binding (budget used)", "latency ×orig [P10–P90]", "size", "")


def _latency(candidate) -> str:
    timing = candidate.timing
    if not timing:
        return "—"
    low, high = timing["spread"]
    return f"{timing['ratio']:.3f} [{low:.2f}–{high:.2f}]" + (" cached" if timing.get("cached") else "")


def _peak(candidate) -> str:
    memory = candidate.memory
    if not memory or memory.get("peak_mb") is None:
        return "—"
    return f"{memory['peak_mb']:.1f} MB" + (" cached" if memory.get("cached") else "")


def _state(candidate) -> str:
    if candidate.skipped:
        return "skipped"
    if candidate.error:
        return "error"
    return "yes" if candidate.met else "NO"


def _binding(candidate) -> str:
    if candidate.skipped or candidate.error:
        return (candidate.skipped or candidate.error)[:60]
    used = candidate.used
    spent = "∞" if used == float("inf") else f"{used:.0%}"
    return f"{candidate.binding[:44]} ({spent})"


def _mark(candidate, result) -> str:
    marks = []
    if candidate is result.chosen:
        marks.append("◀ chosen")
    if candidate.pipeline in result.front:
        marks.append("front")
    if candidate.same_as:
        marks.append(f"= {candidate.same_as}")
    return ", ".join(marks)


def table(result) -> str:
    memory = result.settings["goal"] == "memory"
    rows = [HEADER[:3] + ("session peak",) + HEADER[4:] if memory else HEADER]
    for c in result.candidates:
        rows.append((c.display, _state(c), _binding(c), _peak(c) if memory else _latency(c),
                     _size(c.size_bytes) if c.size_bytes is not None else "—", _mark(c, result)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADER))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths).rstrip())
    s = result.settings
    timing = {"size": "not timed (goal size)",
              "memory": f"{result.measured} peaks measured, {result.cache_hits} from the timing cache"}.get(
        s["goal"], f"{result.timed} timed, {result.cache_hits} from the timing cache")
    lines.append(f"goal {s['goal']}, target {s['target']}, {s['provider']} ×{s['threads']} threads; "
                 f"{timing}; planned in {result.seconds:.1f} s"
                 + (f" on Ray ({result.executor.get('address')})" if result.executor.get("name") == "ray" else "")
                 + ("; time budget spent, later pipelines skipped" if result.budget_stopped else ""))
    confirmed = confirm.line(result.confirmation)
    return "\n".join(lines + ([confirmed] if confirmed else []))


def to_dict(result) -> dict:
    return {"settings": result.settings, "chosen": result.chosen.pipeline, "front": list(result.front),
            "candidates": [c.to_dict() for c in result.candidates], "reference": result.reference,
            "timed": result.timed, "measured": result.measured, "profiles": result.profiles,
            "cache_hits": result.cache_hits, "seconds": round(result.seconds, 3),
            "budget_stopped": result.budget_stopped, "executor": result.executor,
            "sensitivity": result.sensitivity, "confirmation": result.confirmation}


def to_json(result) -> str:
    return json.dumps(to_dict(result), indent=2, default=_json_default)
