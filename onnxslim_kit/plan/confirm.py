"""Confirming a latency choice against ``fuse`` in a second, independent timing run.

One interleaved benchmark pairs every candidate with the original round by round, so within
that run the noise of a ratio is small. Between runs it is not: on two shared cores a
sub-millisecond model moves by 5–8 % from one run to the next (load, where the session's
buffers land). The plan's run said ``fuse,fp16`` was 0.844× the original against ``fuse``'s
0.920× on silero_vad, and a later benchmark of the same two files found fp16 1.056× *slower*
than ``fuse`` (``benchmarks/results/plan-2026-12-03-s10.md``). A choice other than ``fuse``
whose advantage is that small is a coin toss that may cost speed; ``fuse`` (lossless, the
simplest) is the safe answer.

Between near-equal candidates the same noise decides: on ppocr_cls_v2 the plan's run put
``fuse,prune,int8`` at 0.532× against ``fuse,prune``'s 0.554×, and the benchmark that followed
found it 1.054× *slower* (``benchmarks/results/plan-2026-12-07-s15.md``; orientation 1.050×);
the next plan took ``fuse,prune`` (a smaller file within 3 %), and that benchmark found
``fuse,prune,int8`` 1.038× faster on orientation (``plan-2026-12-08-s18.md``). One run cannot
order candidates a few per cent apart; two runs halve the variance of their ratio.

Rule (goal latency, chosen candidate c ≠ ``fuse``): the contenders — c and every feasible
distinct candidate within :data:`NEAR` (5 %) of c's ratio r₁ in the plan's run — ``fuse`` and
the original are timed once more in one interleaved benchmark, giving r₂. Each contender's
pooled ratio is ``p = √(r₁ · r₂)`` (both runs, paired with the original); the choice is the
lowest ``p``, where several are within :data:`TIE` (1 %) of it the smallest file, then the
lower ``p``, then the order tried; and it is kept only when

    r₂(choice) / r₂(``fuse``) ≤ KEEP (0.98)

else ``fuse`` is chosen. The second run goes into the timing cache (key: c's sha256 and the
machine plus ``|confirm``; the entry holds the original's, ``fuse``'s and the contenders'
sha256, an entry for another original or other contenders is not used), so a rerun with the
cache times nothing and chooses the same, and the recipe replays without timing as before.
"""

from __future__ import annotations

import math

KEEP = 0.98
NEAR = 0.05  # contenders: within this of the chosen ratio in the plan's run
TIE = 0.01  # pooled ratios within this of the best: the smallest file
MEASURE = "confirm"


def contenders(chosen, candidates: list) -> list:
    """``chosen`` and the feasible distinct candidates (not ``fuse``) whose ratio in the plan's
    run is within :data:`NEAR` of its, in the order tried."""
    ratio = (chosen.timing or {}).get("ratio")

    def near(candidate) -> bool:
        other = (candidate.timing or {}).get("ratio")
        return ratio is not None and other is not None and other <= ratio * (1 + NEAR)

    return [c for c in candidates if c is chosen or (c.usable and c.same_as is None and c.pipeline != "fuse"
                                                     and near(c))] or [chosen]


def confirm(model, chosen, fuse, samples, machine, cache, reference_sha: str, timing: dict, executor,
            candidates: list | None = None) -> dict | None:
    """The second run's verdict on ``chosen`` (module docstring): ``{"pipeline", "ratio",
    "fuse_ratio", "ratio_vs_fuse", "ratios", "pooled", "kept", "cached", "instead"}``
    (``instead``: the pipeline chosen, ``chosen``'s own when kept, ``fuse`` or another
    contender), or ``{"pipeline", "error", "kept": False, "instead": "fuse"}`` when a model
    failed to run; None when there is nothing to confirm (``chosen`` is ``fuse``)."""
    if chosen is fuse:
        return None
    group = contenders(chosen, candidates or [chosen])
    members = {c.pipeline: c.sha256 for c in group if c is not chosen}
    found = cache.get(chosen.sha256, machine, reference_sha, measure=MEASURE)
    cached = found is not None and found.get("fuse_sha256") == fuse.sha256 and found.get("contenders", {}) == members
    if cached:
        ratios = found.get("ratios") or {"fuse": found["fuse_ratio"], chosen.pipeline: found["ratio"]}
    else:
        ratios = _second_run(model, group, fuse, samples, machine, timing, executor)
        if "error" in ratios:
            return {"pipeline": chosen.pipeline, "error": ratios["error"], "kept": False, "instead": "fuse"}
        cache.put(chosen.sha256, machine, reference_sha,
                  {"ratio": ratios[chosen.pipeline], "fuse_ratio": ratios["fuse"],
                   "ratio_vs_fuse": ratios[chosen.pipeline] / ratios["fuse"], "fuse_sha256": fuse.sha256,
                   "contenders": members, "ratios": ratios}, measure=MEASURE)
    pooled, instead = _decide(group, ratios)
    return {"pipeline": chosen.pipeline, "ratio": ratios[chosen.pipeline], "fuse_ratio": ratios["fuse"],
            "ratio_vs_fuse": ratios[chosen.pipeline] / ratios["fuse"], "ratios": ratios, "pooled": pooled,
            "cached": cached, "kept": instead == chosen.pipeline, "instead": instead}


def _second_run(model, group: list, fuse, samples, machine, timing: dict, executor) -> dict:
    """``{pipeline: r₂}`` of ``fuse`` and the contenders from one interleaved benchmark, or
    ``{"error": line}`` when a model failed to run."""
    rows = executor.bench(model, [fuse.proto] + [c.proto for c in group], ["fuse"] + [c.pipeline for c in group],
                          samples, machine, timing)
    got = [row.get("latency_ratio_vs_first") for row in rows[1:]]
    if len(got) != len(group) + 1 or any(r is None or row.get("error") for r, row in zip(got, rows[1:])):
        return {"error": next((row.get("error") for row in rows[1:] if row.get("error")), None) or "not timed"}
    return dict(zip(["fuse"] + [c.pipeline for c in group], got))


def _decide(group: list, ratios: dict) -> tuple:
    """(pooled ratio of each contender, the pipeline chosen): the module docstring's rule."""
    pooled = {c.pipeline: math.sqrt(c.timing["ratio"] * ratios[c.pipeline]) if (c.timing or {}).get("ratio")
              else ratios[c.pipeline] for c in group}
    best = min(pooled.values())
    order = {c.pipeline: i for i, c in enumerate(group)}
    sizes = {c.pipeline: c.size_bytes or 0 for c in group}
    pick = min((p for p in pooled if pooled[p] <= best * (1 + TIE)), key=lambda p: (sizes[p], pooled[p], order[p]))
    return pooled, pick if ratios[pick] / ratios["fuse"] <= KEEP else "fuse"


def line(record: dict | None) -> str:
    """The table's line about the confirmation ('' when there was none)."""
    if not record:
        return ""
    if record.get("error"):
        return f"{record['pipeline']} not confirmed against fuse ({record['error'][:60]}): fuse chosen"
    instead = record.get("instead", "fuse")
    if record["kept"]:
        verdict = "kept"
    elif instead == "fuse":
        verdict = f"not {KEEP:g}× or faster: fuse chosen"
    else:
        verdict = f"{instead} faster over both runs: it is chosen"
    others = ", ".join(f"{p} {r / record['fuse_ratio']:.3f}×" for p, r in (record.get("ratios") or {}).items()
                       if p not in ("fuse", record["pipeline"]))
    return (f"confirmed against fuse in a second run: {record['pipeline']} {record['ratio_vs_fuse']:.3f}× fuse "
            + (f"({others} fuse) " if others else "") + f"({verdict})" + (", cached" if record.get("cached") else ""))
