"""Confirming a latency choice against ``fuse`` in a second, independent timing run.

One interleaved benchmark pairs every candidate with the original round by round, so within
that run the noise of a ratio is small. Between runs it is not: on two shared cores a
sub-millisecond model moves by 5–8 % from one run to the next (load, where the session's
buffers land). The plan's run said ``fuse,fp16`` was 0.844× the original against ``fuse``'s
0.920× on silero_vad, and a later benchmark of the same two files found fp16 1.056× *slower*
than ``fuse`` (``benchmarks/results/plan-2026-12-03-s10.md``). A choice other than ``fuse``
whose advantage is that small is a coin toss that may cost speed; ``fuse`` (lossless, the
simplest) is the safe answer.

Rule (goal latency, chosen candidate c ≠ ``fuse``): c, ``fuse`` and the original are timed once
more in one interleaved benchmark; with r₂ the paired ratios of that second run vs the original,

    keep c  ⇔  r₂(c) / r₂(fuse) ≤ KEEP (0.98)

else ``fuse`` is chosen. The second run goes into the timing cache (key: c's sha256 and the
machine plus ``|confirm``; the entry holds the original's and ``fuse``'s sha256, an entry for
another original or another ``fuse`` is not used), so a rerun with the cache times nothing and
chooses the same, and the recipe replays without timing as before.
"""

from __future__ import annotations

KEEP = 0.98
MEASURE = "confirm"


def confirm(model, chosen, fuse, samples, machine, cache, reference_sha: str, timing: dict, executor) -> dict | None:
    """The second run's verdict on ``chosen`` (module docstring): ``{"pipeline", "ratio",
    "fuse_ratio", "ratio_vs_fuse", "kept", "cached"}``, or ``{"pipeline", "error", "kept": False}``
    when a model failed to run; None when there is nothing to confirm (``chosen`` is ``fuse``)."""
    if chosen is fuse:
        return None
    found = cache.get(chosen.sha256, machine, reference_sha, measure=MEASURE)
    if found is not None and found.get("fuse_sha256") == fuse.sha256:
        record = {k: found[k] for k in ("ratio", "fuse_ratio", "ratio_vs_fuse")} | {"cached": True}
    else:
        rows = executor.bench(model, [fuse.proto, chosen.proto], [fuse.pipeline, chosen.pipeline], samples,
                              machine, timing)
        ratios = [row.get("latency_ratio_vs_first") for row in rows[1:3]]
        if any(r is None or row.get("error") for r, row in zip(ratios, rows[1:3])):
            error = next((row.get("error") for row in rows[1:3] if row.get("error")), None) or "not timed"
            return {"pipeline": chosen.pipeline, "error": error, "kept": False}
        fuse_ratio, ratio = ratios
        record = {"ratio": ratio, "fuse_ratio": fuse_ratio, "ratio_vs_fuse": ratio / fuse_ratio}
        cache.put(chosen.sha256, machine, reference_sha, {**record, "fuse_sha256": fuse.sha256}, measure=MEASURE)
        record["cached"] = False
    return {"pipeline": chosen.pipeline, **record, "kept": record["ratio_vs_fuse"] <= KEEP}


def line(record: dict | None) -> str:
    """The table's line about the confirmation ('' when there was none)."""
    if not record:
        return ""
    if record.get("error"):
        return f"{record['pipeline']} not confirmed against fuse ({record['error'][:60]}): fuse chosen"
    verdict = "kept" if record["kept"] else f"not {KEEP:g}× or faster: fuse chosen"
    return (f"confirmed against fuse in a second run: {record['pipeline']} {record['ratio_vs_fuse']:.3f}× fuse "
            f"({verdict})" + (", cached" if record.get("cached") else ""))
