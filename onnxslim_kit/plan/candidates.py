"""The plan's search space (increment 1) and running one candidate.

A candidate is a fixed pipeline run by :func:`onnxslim_kit.optimize` on the model with the
plan's data, seed and target, exactly as ``python -m onnxslim_kit MODEL --passes P`` would run
it (so its report is a recipe that replays to the same bytes). Goals latency and memory try
``LATENCY_PIPELINES`` in order (``fuse,dynamic(weights=s8)``: the u8·s8 kernels, faster than the
exact default encoding on CPUs without VNNI, judged by this machine's own kernels — a choice the
plan makes by measurement, :mod:`onnxslim_kit.passes.dynamic`); goal size adds ``fuse,cluster`` (clustering shrinks the file
once compressed, not what a session holds or how fast it runs).

Whether a candidate holds the target (:func:`fidelity_of`): ``fuse`` alone (no lossy pass) always
does. Otherwise the last lossy pass that was not rolled back carries the pipeline's verdict on
held-out samples: ``pipeline_met`` (judged against the whole budget, used ≤ 1) where the pass
spent the pipeline's share, else ``met`` (a pass given its own ``target=``). Every lossy pass
rolled back leaves the model lossless: it holds. A candidate whose optimize raised a
:class:`~onnxslim_kit.errors.SlimError` is recorded with the error's line and never chosen;
``fuse`` raising is the plan's error (the model or the data is not usable).

Two candidates are the same (``same_as``, timed once) when they compute the same thing:
:func:`content_sha256` hashes the model with every initializer in one encoding (raw bytes), so
a pass that changed nothing but rewrote ``float_data`` as ``raw_data`` (``prune`` on mtcnn_pnet,
nothing pruned) is not a second model to time, and to choose by noise.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import SlimError, UserError
from .timing_cache import sha256_bytes

LATENCY_PIPELINES = ("fuse", "fuse,int8", "fuse,dynamic", "fuse,dynamic(weights=s8)", "fuse,fp16", "fuse,prune",
                     "fuse,prune,int8")
SIZE_PIPELINES = LATENCY_PIPELINES + ("fuse,cluster",)
GOALS = ("latency", "size", "memory")


def pipelines_for(goal: str) -> tuple:
    return SIZE_PIPELINES if goal == "size" else LATENCY_PIPELINES


def _split_pipelines(text: str) -> list:
    """``text`` split at the ``;`` outside parentheses (a selector option may hold ``;``)."""
    pieces, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += (ch == "(") - (ch == ")")
        if ch == ";" and depth == 0:
            pieces.append(text[start:i])
            start = i + 1
    return pieces + [text[start:]]


def checked_pipelines(pipelines, goal: str) -> tuple:
    """The pipelines to try: the goal's when ``pipelines`` is None, else the given ones (a list, or
    one text with ``;`` between pipelines, outside parentheses) with ``fuse`` first (added when not named); each is
    parsed and its passes and options resolved here, so a typo is a one-line error before any work."""
    from ..pipeline import parse_pass_list, resolve

    if pipelines is None:
        return pipelines_for(goal)
    given = _split_pipelines(pipelines) if isinstance(pipelines, str) else list(pipelines)
    given = [str(p).strip() for p in given if str(p).strip()]
    if not given:
        raise UserError("--pipelines: no pipeline given (e.g. 'fuse;fuse,int8')")
    for pipeline in given:
        try:
            resolve(parse_pass_list(pipeline))
        except UserError as exc:
            raise UserError(f"--pipelines {pipeline!r}: {exc}") from None
    twice = sorted({p for p in given if given.count(p) > 1})
    if twice:
        raise UserError(f"--pipelines: {twice[0]!r} is named twice")
    return ("fuse",) + tuple(p for p in given if p != "fuse")


@dataclass
class Candidate:
    pipeline: str
    proto: object = None  # onnx.ModelProto, None when it failed or was not tried
    report: object = None  # onnxslim_kit.report.Report
    sha256: str | None = None
    size_bytes: int | None = None
    met: bool = False
    used: float | None = None  # budget fraction of the pipeline's target used (0 for lossless)
    binding: str = ""  # the view and metric that bind, from the verdict
    error: str | None = None
    skipped: str | None = None  # why it was not tried (the time budget)
    same_as: str | None = None  # an earlier candidate with the same computation (content_sha256)
    content: str | None = None  # content_sha256 of proto
    timing: dict | None = None  # latency ratio vs the original, spread, median ms, cached?
    memory: dict | None = None  # goal memory: the session's peak MB, how it was read, cached?
    seconds: float = 0.0  # wall time of its optimize run
    notes: list = field(default_factory=list)
    label: str | None = None  # a short name for the table (a per-layer mix's pipeline is long)

    @property
    def display(self) -> str:
        return self.label or self.pipeline

    @property
    def usable(self) -> bool:
        return self.proto is not None and self.met and self.error is None

    def to_dict(self) -> dict:
        return {"pipeline": self.pipeline, "met": self.met, "used": self.used, "binding": self.binding,
                "size_bytes": self.size_bytes, "sha256": self.sha256, "error": self.error,
                "skipped": self.skipped, "same_as": self.same_as, "timing": self.timing, "memory": self.memory,
                "optimize_seconds": round(self.seconds, 3), "notes": list(self.notes), "label": self.label}


def fidelity_of(report) -> tuple:
    """``(met, used, binding)`` of a candidate's report (module docstring)."""
    last = next((p.fidelity for p in reversed(report.passes) if p.fidelity and not p.rolled_back), None)
    if last is None:
        return True, 0.0, "lossless"
    met = last.get("pipeline_met")
    if met is None:
        met = bool(last.get("met"))
    used = last.get("used")
    used = float("inf") if used == "inf" else float(used)
    return bool(met), used, str(last.get("binding") or "")


def run_candidate(model_path, pipeline: str, settings: dict, optimize) -> Candidate:
    """Run ``pipeline`` through ``optimize(model_path, pipeline, **settings)``; errors of the
    candidate are recorded, except for ``fuse`` (the first, lossless one), where they are raised."""
    import time

    start = time.perf_counter()
    candidate = Candidate(pipeline)
    try:
        proto, report = optimize(model_path, pipeline, **settings)
    except SlimError as exc:
        if pipeline == "fuse":
            raise
        candidate.error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        candidate.seconds = time.perf_counter() - start
        return candidate
    candidate.seconds = time.perf_counter() - start
    return finish(candidate, proto, report, proto.SerializeToString())


def finish(candidate: Candidate, proto, report, data: bytes) -> Candidate:
    """``candidate`` with its optimize result: ``proto``, its ``report`` and ``data`` (the
    proto's serialized bytes, which its sha256 and size are of)."""
    candidate.proto, candidate.report = proto, report
    candidate.sha256, candidate.size_bytes = sha256_bytes(data), len(data)
    candidate.content = content_sha256(proto, candidate.sha256)
    candidate.met, candidate.used, candidate.binding = fidelity_of(report)
    candidate.notes = [f"{p.name}: rolled back" for p in report.passes if p.rolled_back]
    return candidate


def content_sha256(proto, sha256: str) -> str:
    """sha256 of ``proto`` with every initializer of its main graph as raw bytes (the same
    numbers in ``float_data`` and in ``raw_data`` hash alike); ``sha256`` (that of ``proto``'s
    serialized bytes) when every initializer is raw already: no second serialization."""
    import onnx
    from onnx import numpy_helper

    listed = [i for i, t in enumerate(proto.graph.initializer)
              if not t.HasField("raw_data") and t.data_location != onnx.TensorProto.EXTERNAL]
    if not listed:
        return sha256
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    for i in listed:
        tensor = copy.graph.initializer[i]
        tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor), tensor.name))
    return sha256_bytes(copy.SerializeToString())
