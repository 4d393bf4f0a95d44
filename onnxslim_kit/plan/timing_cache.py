"""The plan's timing cache: measured latencies keyed by what was timed and where.

Key (one JSON object per entry, under ``"entries"``)::

    key = sha256(candidate bytes) | provider | threads | onnxruntime version | CPU model

The CPU model is ``model name`` from /proc/cpuinfo, else :func:`platform.processor`, else
:func:`platform.machine`. An entry holds the candidate's paired latency ratio against the
original (the median over rounds of t_cand(r) / t_orig(r), :func:`onnxslim_kit.bench.paired_ratio`),
its [P10, P90] spread, its median milliseconds and the sha256 of the original it was paired
with (an entry paired with another original is not used). As TensorRT's builder does with its
timing cache: with every candidate found here, nothing is timed and the same choice results,
so the planned output is byte-identical on a rerun.

Other measures share the file: a session's peak memory (goal memory, :mod:`.memory`) and an
op profile (``--html``, :mod:`.profile`) are stored under the same key plus ``|memory`` or
``|profile``; they are not paired, so they carry no original's sha256.

The file is read once (a missing file is an empty cache; an unreadable or malformed one is a
one-line error) and written atomically after the plan, entries sorted by key. While the
candidates run, ``int8``'s per-layer kernel timings go to the same file
(:func:`shared_with_passes`: ``$ONNXSLIM_KIT_TIMINGS``, keys ``int8-layer|…`` and ``int8-model|…``,
merged and replaced atomically by the pass); writing keeps the entries found on disk that the
plan does not hold, so a shipped cache lets a second plan time nothing, int8 included, on a
machine whose own cache folder is empty.
"""

from __future__ import annotations

import hashlib
import json
import os
from contextlib import contextmanager
from pathlib import Path

from ..errors import UserError
from ..runtime import TIMINGS_ENV, cpu_model  # noqa: F401 - cpu_model re-exported: part of every key

FORMAT = 1


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def machine_fields(provider: str, threads: int) -> dict:
    """What besides the model makes a timing: provider, threads, ORT version, CPU model."""
    import onnxruntime

    return {"provider": provider, "threads": int(threads), "onnxruntime": onnxruntime.__version__,
            "cpu": cpu_model()}


def cache_key(model_sha256: str, machine: dict, measure: str = "latency") -> str:
    fields = [model_sha256, machine["provider"], str(machine["threads"]), machine["onnxruntime"], machine["cpu"]]
    return "|".join(fields + ([] if measure == "latency" else [measure]))


class TimingCache:
    """``get(sha, machine, reference_sha)`` / ``put(...)`` over a JSON file (or in memory: path None)."""

    def __init__(self, path=None):
        self.path = Path(path) if path else None
        self.entries = {}
        self.hits = 0
        self.added = 0
        if self.path is not None and self.path.exists():
            self.entries = _read(self.path)

    def get(self, model_sha256: str, machine: dict, reference_sha256: str | None,
            measure: str = "latency") -> dict | None:
        """The entry, or None; ``reference_sha256`` None: an unpaired measure (no original to match)."""
        entry = self.entries.get(cache_key(model_sha256, machine, measure))
        if entry is None or (reference_sha256 is not None and entry.get("reference_sha256") != reference_sha256):
            return None
        self.hits += 1
        return dict(entry)

    def put(self, model_sha256: str, machine: dict, reference_sha256: str | None, timing: dict,
            measure: str = "latency") -> None:
        paired = {} if reference_sha256 is None else {"reference_sha256": reference_sha256}
        self.entries[cache_key(model_sha256, machine, measure)] = {**timing, **paired, **machine}
        self.added += 1

    def to_json(self) -> str:
        """The entries, with those on disk it does not hold (the passes' timings) kept."""
        on_disk = _read(self.path) if self.path is not None and self.path.exists() else {}
        entries = {**on_disk, **self.entries}
        return json.dumps({"format": FORMAT, "entries": dict(sorted(entries.items()))}, indent=2)


@contextmanager
def shared_with_passes(cache: TimingCache):
    """While open, ``int8``'s per-layer timings read and extend ``cache``'s file (module docstring);
    an in-memory cache changes nothing."""
    if cache.path is None:
        yield
        return
    before = os.environ.get(TIMINGS_ENV)
    os.environ[TIMINGS_ENV] = str(cache.path.resolve())
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(TIMINGS_ENV, None)
        else:
            os.environ[TIMINGS_ENV] = before


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise UserError(f"--timing-cache {path}: cannot read it ({exc.strerror or exc})") from None
    except ValueError as exc:
        raise UserError(f"--timing-cache {path}: not JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("entries"), dict):
        raise UserError(f"--timing-cache {path}: not an onnxslim_kit timing cache (format {FORMAT})")
    return data["entries"]
