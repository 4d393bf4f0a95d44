"""Goal memory: each candidate's session peak, measured in a fresh child process, cached.

The measure is :func:`onnxslim_kit.bench.peak_memory` (what ``bench`` reports as
``peak_memory_mb``): a child process loads the inputs, reads its RSS, resets the kernel's
high-water mark, creates the session (``opt_level="all"``, the plan's provider and threads, ORT's
arena and pre-packing on: the deployed settings) and runs min(runs, 10) inferences::

    peak_mb(c) = (VmHWM − RSS before the session) / 2²⁰

The original is measured too (its peak is the reference the ratio is taken against, reported,
never used for the choice). Candidates with the same computation (``same_as``) are measured once. Every peak goes
into the timing cache under the key of the timing plus ``|memory``
(:func:`.timing_cache.cache_key`): with every candidate cached nothing is measured and the
choice is the same. A child that fails leaves the candidate unmeasured (an error on its row);
it is never chosen.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

MEASURE = "memory"
MEMORY_RUNS = 10


def measure(model_path, candidates: list, samples: list, machine: dict, cache, reference_sha: str,
            runs: int) -> tuple:
    """Peaks into ``candidate.memory`` (``{"peak_mb", "method", "cached"}``); returns
    ``(measured in this run, the original's peak entry)``."""
    from ..bench import peak_memory

    runs = max(1, min(runs, MEMORY_RUNS))
    unique = [c for c in candidates if c.usable and c.same_as is None]
    measured = 0

    def one(sha: str, path) -> dict:
        nonlocal measured
        cached = cache.get(sha, machine, None, measure=MEASURE)
        if cached is not None:
            return {"peak_mb": cached["peak_mb"], "method": cached["method"], "cached": True}
        row = peak_memory(path, samples, machine["provider"], machine["threads"], "all", runs)
        measured += 1
        entry = {"peak_mb": row.get("peak_memory_mb"), "method": row.get("memory_method")}
        if entry["peak_mb"] is not None:
            cache.put(sha, machine, None, entry, measure=MEASURE)
        return {**entry, "cached": False}

    reference = one(reference_sha, model_path)
    with tempfile.TemporaryDirectory(prefix="slim-plan-memory-") as tmp:
        for i, c in enumerate(unique):
            path = Path(tmp) / f"candidate{i}.onnx"
            path.write_bytes(c.proto.SerializeToString())
            c.memory = one(c.sha256, path)
            if c.memory["peak_mb"] is None:
                c.error = f"peak memory not measured: {c.memory['method']}"
    by_pipeline = {c.pipeline: c for c in candidates}
    for c in candidates:
        if c.same_as is not None:
            c.memory = by_pipeline[c.same_as].memory
    return measured, reference
