"""Confirming a latency choice against ``fuse`` in a second, independent timing run.

One interleaved benchmark pairs every candidate with the original round by round, so within
that run the noise of a ratio is small. Between runs it is not: on two shared cores a
sub-millisecond model moves by 5–8 % from one run to the next (load, where the session's
buffers land). The plan's run said ``fuse,fp16`` was 0.844× the original against ``fuse``'s
0.920× on silero_vad, and a later benchmark of the same two files found fp16 1.056× *slower*
than ``fuse`` (``benchmarks/results/plan-2026-12-03-s10.md``). A choice other than ``fuse``
whose advantage is that small is a coin toss that may cost speed; ``fuse`` (lossless, the
simplest) is the safe answer.

The same holds between a pipeline and its own prefix: ``fuse,prune,int8`` timed 0.532× against
``fuse,prune``'s 0.554× in the plan's run on ppocr_cls_v2, and 1.054× *slower* than it in the
benchmark that followed (the int8 pass had left nearly every layer float: 375.4 KB against
374.6; ``benchmarks/results/plan-2026-12-07-s15.md``; orientation the same, 1.050×). A pass that
does not measurably pay for itself is a risk (more drift) for nothing.

Rule (goal latency, chosen candidate c ≠ ``fuse``): the chain S = ``fuse``, the feasible
candidates whose pipeline is a proper prefix of c's (``fuse,prune`` for ``fuse,prune,int8``),
then c — simplest first — and the original are timed once more in one interleaved benchmark;
with r₂ the paired ratios of that second run vs the original and b the fastest of S in it,

    chosen = the first (simplest) s in S with  r₂(b) / r₂(s) > KEEP (0.98)

— a simpler pipeline stands unless the fastest one beats it by more than 2 %. With S =
{``fuse``, c} this is: keep c ⇔ r₂(c) / r₂(``fuse``) ≤ KEEP. The second run goes into the
timing cache (key: c's sha256 and the machine plus ``|confirm``; the entry holds the
original's, ``fuse``'s and the other members' sha256, an entry for another original or another
chain is not used), so a rerun with the cache times nothing and chooses the same, and the
recipe replays without timing as before.
"""

from __future__ import annotations

KEEP = 0.98
MEASURE = "confirm"


def simpler(chosen, candidates: list) -> list:
    """The chain S of the module docstring without ``fuse``: the feasible candidates whose
    pipeline is a proper prefix of ``chosen``'s, fewest passes first, then ``chosen``."""
    from .candidates import passes_of

    mine = passes_of(chosen.pipeline)

    def prefix(candidate) -> bool:
        theirs = passes_of(candidate.pipeline)
        return len(theirs) < len(mine) and theirs == mine[:len(theirs)]

    prefixes = [c for c in candidates if c is not chosen and c.usable and c.same_as is None
                and c.pipeline != "fuse" and prefix(c)]
    return sorted(prefixes, key=lambda c: len(passes_of(c.pipeline))) + [chosen]


def confirm(model, chosen, fuse, samples, machine, cache, reference_sha: str, timing: dict, executor,
            candidates: list | None = None) -> dict | None:
    """The second run's verdict on ``chosen`` (module docstring): ``{"pipeline", "ratio",
    "fuse_ratio", "ratio_vs_fuse", "kept", "cached", "instead"}`` (``instead``: the pipeline
    chosen in its place, ``fuse`` or a simpler one), or ``{"pipeline", "error", "kept": False,
    "instead": "fuse"}`` when a model failed to run; None when there is nothing to confirm
    (``chosen`` is ``fuse``)."""
    if chosen is fuse:
        return None
    chain = simpler(chosen, candidates or [chosen])
    members = {c.pipeline: c.sha256 for c in chain[:-1]}
    found = cache.get(chosen.sha256, machine, reference_sha, measure=MEASURE)
    if found is not None and found.get("fuse_sha256") == fuse.sha256 and found.get("simpler", {}) == members:
        ratios = found.get("ratios") or {"fuse": found["fuse_ratio"], chosen.pipeline: found["ratio"]}
        cached = True
    else:
        protos = [fuse.proto] + [c.proto for c in chain]
        rows = executor.bench(model, protos, ["fuse"] + [c.pipeline for c in chain], samples, machine, timing)
        got = [row.get("latency_ratio_vs_first") for row in rows[1:]]
        if len(got) != len(protos) or any(r is None or row.get("error") for r, row in zip(got, rows[1:])):
            error = next((row.get("error") for row in rows[1:] if row.get("error")), None) or "not timed"
            return {"pipeline": chosen.pipeline, "error": error, "kept": False, "instead": "fuse"}
        ratios = dict(zip(["fuse"] + [c.pipeline for c in chain], got))
        cache.put(chosen.sha256, machine, reference_sha,
                  {"ratio": ratios[chosen.pipeline], "fuse_ratio": ratios["fuse"],
                   "ratio_vs_fuse": ratios[chosen.pipeline] / ratios["fuse"], "fuse_sha256": fuse.sha256,
                   "simpler": members, "ratios": ratios}, measure=MEASURE)
        cached = False
    best = min(ratios.values())
    instead = next(p for p in ratios if best / ratios[p] > KEEP)
    return {"pipeline": chosen.pipeline, "ratio": ratios[chosen.pipeline], "fuse_ratio": ratios["fuse"],
            "ratio_vs_fuse": ratios[chosen.pipeline] / ratios["fuse"], "ratios": ratios, "cached": cached,
            "kept": instead == chosen.pipeline, "instead": instead}


def line(record: dict | None) -> str:
    """The table's line about the confirmation ('' when there was none)."""
    if not record:
        return ""
    if record.get("error"):
        return f"{record['pipeline']} not confirmed against fuse ({record['error'][:60]}): fuse chosen"
    instead = record.get("instead", "fuse")
    if record["kept"]:
        verdict = "kept"
    else:
        verdict = f"not {KEEP:g}× or faster than {instead}: {instead} chosen"
    others = ", ".join(f"{p} {r / record['fuse_ratio']:.3f}×" for p, r in (record.get("ratios") or {}).items()
                       if p not in ("fuse", record["pipeline"]))
    return (f"confirmed against fuse in a second run: {record['pipeline']} {record['ratio_vs_fuse']:.3f}× fuse "
            + (f"({others} fuse) " if others else "") + f"({verdict})" + (", cached" if record.get("cached") else ""))
