"""The plan on Ray (``--executor ray``): the candidates' optimize runs as parallel tasks, the
timing as one task on one node.

What runs where:

1. The driver (the ``plan`` process) reads the model file and the data once and puts them in
   the object store (``ray.put``): the model's bytes; ``--calib`` / ``--eval`` as the file's bytes,
   or a folder's ``.npz`` / ``.npy`` files by name (a Python source, from the API, as the object).
2. One task per pipeline (``num_cpus=1``; all submitted at once, Ray runs as many at a time as
   the cluster has CPUs): it writes the model and the data into a temporary folder on its node
   under the same file names, runs :func:`onnxslim_kit.optimize` there with the plan's settings
   (the fidelity judgement is inside its report) and returns the model's bytes and the report as
   a dict. The driver rebuilds the report (:func:`report_from_dict`), puts back the input path and
   the sources the user named, and refuses (one line) a worker that runs other versions than the
   driver (:func:`onnxslim_kit.recipe.tool_versions`): the bytes would not be the local ones.
3. After every optimize task has finished, the timing: ONE task for every candidate not in the
   timing cache (one interleaved benchmark, as locally), pinned to the driver's node
   (``NodeAffinitySchedulingStrategy(soft=False)``) and reserving all of that node's CPUs (and
   GPUs), so Ray schedules nothing else there while it runs: two timings on one node would
   corrupt each other. The driver's node, because the timing cache's key (CPU model, …) is the
   driver's machine. A node that offers Ray no CPU (a head started with ``--num-cpus 0``) is timed
   in the driver's own process instead.
4. Goal memory's peaks and ``--html``'s op profiles run in the driver, as locally.
5. ``int8``'s per-layer kernel timings (its ``speed`` decision) run inside the optimize tasks,
   each reading and extending the plan's ``--timing-cache`` file (``$ONNXSLIM_KIT_TIMINGS``, set
   in the tasks' runtime environment): a path the workers must see (one machine, or a shared
   folder). Two int8 candidates on one node may time one layer kind at the same time; each
   kind is timed as the fastest of several runs, which a busy core only makes slower, and a
   cached kind is never timed again. ``ONNXSLIM_KIT_SPEED=off`` leaves them out.

``budget_s``: ``fuse`` always finishes; once ``budget_s`` seconds have passed since the start, the
tasks not finished are cancelled and their pipelines reported as skipped.

Every task's pipeline (or ``timing``), node, process and start / end (``time.time()``) are kept in
:attr:`RayExecutor.tasks` (the plan's JSON report: ``executor.tasks``).
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from ..errors import SlimError, UserError
from ..runtime import TIMINGS_ENV
from .candidates import Candidate, finish
from .local import LocalExecutor

DATA_SUFFIXES = (".npz", ".npy")


def pack_model(model) -> dict:
    """The model file's name and bytes; a model with external data is refused (one line)."""
    import onnx

    path = Path(model)
    proto = onnx.load(str(path), load_external_data=False)
    if _has_external(proto.graph):
        raise UserError(f"--executor ray: {path} keeps weights in external data; plan it with --executor local")
    return {"name": path.name, "bytes": path.read_bytes()}


def _has_external(graph) -> bool:
    import onnx

    tensors = list(graph.initializer) + [a.t for n in graph.node for a in n.attribute if a.HasField("t")]
    if any(t.data_location == onnx.TensorProto.EXTERNAL for t in tensors):
        return True
    return any(_has_external(g) for n in graph.node for a in n.attribute for g in [*a.graphs, a.g] if g.node)


def pack_source(source) -> dict | None:
    """A ``calib=`` / ``eval_data=`` source as it travels to the workers."""
    if source is None:
        return None
    if not isinstance(source, (str, Path)):
        return {"object": source}
    path = Path(source)
    if path.is_dir():
        files = {p.name: p.read_bytes() for p in sorted(path.iterdir()) if p.suffix in DATA_SUFFIXES and p.is_file()}
        return {"dir": path.name, "files": files}
    if path.is_file():
        return {"file": path.name, "bytes": path.read_bytes()}
    return {"object": source}  # not there: optimize says so, as it would locally


def unpack(folder: Path, pack: dict | None):
    """The source ``pack`` stands for, written under ``folder`` when it is files."""
    if pack is None:
        return None
    if "object" in pack:
        return pack["object"]
    folder.mkdir(parents=True, exist_ok=True)
    if "file" in pack:
        (folder / pack["file"]).write_bytes(pack["bytes"])
        return str(folder / pack["file"])
    target = folder / pack["dir"]
    target.mkdir()
    for name, data in pack["files"].items():
        (target / name).write_bytes(data)
    return str(target)


def _where() -> dict:
    import ray

    from .timing_cache import cpu_model

    return {"node": ray.get_runtime_context().get_node_id(), "pid": os.getpid(), "cpu": cpu_model()}


def optimize_task(model: dict, calib, eval_data, pipeline: str, settings: dict, shown: dict) -> tuple:
    """A worker: ``(the model's bytes or None, what happened)``; ``shown`` maps the temporary
    paths back to the user's in error lines."""
    from .. import optimize

    meta = {"kind": "optimize", "pipeline": pipeline, **_where(), "started": time.time()}
    with tempfile.TemporaryDirectory(prefix="slim-plan-ray-") as tmp:
        path = unpack(Path(tmp), {"file": model["name"], "bytes": model["bytes"]})
        data = {"calib": unpack(Path(tmp) / "calib", calib), "eval_data": unpack(Path(tmp) / "eval", eval_data)}
        start = time.perf_counter()
        try:
            proto, report = optimize(path, pipeline, **settings, **data)
        except SlimError as exc:
            line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            for temporary, original in [(path, shown["model"])] + [(data[k], shown[k]) for k in data]:
                if isinstance(temporary, str) and original is not None:
                    line = line.replace(temporary, original)
            return None, {**meta, "exception": exc, "error": line, "seconds": time.perf_counter() - start,
                          "ended": time.time()}
        seconds = time.perf_counter() - start
        serialized = proto.SerializeToString()
    return serialized, {**meta, "report": report.to_dict(), "seconds": seconds, "ended": time.time()}


def bench_task(model: dict, names: list, samples: list, machine: dict, timing: dict, *candidates) -> tuple:
    """A worker: the one benchmark of the original and ``candidates`` (their bytes)."""
    import onnx

    meta = {"kind": "timing", "pipelines": list(names), **_where(), "started": time.time()}
    with tempfile.TemporaryDirectory(prefix="slim-plan-ray-") as tmp:
        path = unpack(Path(tmp), {"file": model["name"], "bytes": model["bytes"]})
        protos = [onnx.load_from_string(data) for data in candidates]
        rows = LocalExecutor().bench(path, protos, names, samples, machine, timing)
    return rows, {**meta, "ended": time.time()}


def report_from_dict(data: dict):
    """The :class:`onnxslim_kit.report.Report` that :meth:`~onnxslim_kit.report.Report.to_dict` wrote."""
    from dataclasses import fields

    from ..report import PassReport, Report

    names = {f.name for f in fields(Report)}
    report = Report(**{k: v for k, v in data.items() if k in names})
    report.passes = [PassReport(**p) for p in data["passes"]]
    return report


def _trace(meta: dict) -> dict:
    kept = ("kind", "pipeline", "pipelines", "node", "pid", "cpu", "started", "ended")
    return {k: (round(meta[k], 3) if k in ("started", "ended") else meta[k]) for k in kept if k in meta}


class RayExecutor:
    """The plan's work on a Ray cluster (module docstring); a context manager that starts a
    local cluster (or connects to ``address``) unless Ray is already initialised, and shuts down
    only what it started."""

    name = "ray"

    def __init__(self, ray, address: str | None = None):
        self.ray, self.address, self.started = ray, address, False
        self.tasks = []
        self._model_ref, self._bytes = None, {}

    def __enter__(self):
        import logging

        if self.ray.is_initialized():
            return self
        try:
            if self.address:
                self.ray.init(address=self.address, logging_level=logging.WARNING)
            else:
                self.ray.init(num_cpus=_cpus(), include_dashboard=False, logging_level=logging.WARNING)
        except (ConnectionError, RuntimeError, ValueError, TimeoutError) as exc:
            where = f"--ray-address {self.address}" if self.address else "--executor ray"
            raise UserError(f"{where}: cannot start Ray ({str(exc).splitlines()[0] if str(exc) else exc!r})") from None
        self.started = True
        return self

    def __exit__(self, *_):
        if self.started:
            self.ray.shutdown()
            self.started = False
        return False

    def describe(self) -> dict:
        return {"name": self.name, "address": self.address or "local", "tasks": list(self.tasks)}

    def _put(self, pack):
        try:
            return self.ray.put(pack)
        except Exception as exc:  # a Python source (the API) that cannot be pickled
            raise UserError(f"--executor ray: the data cannot be sent to the workers ({exc}); pass a file") from None

    def candidates(self, model, pipelines, settings, budget_s, progress, log) -> tuple:
        start = time.perf_counter()
        self._model_ref = self._put(pack_model(model))
        calib, eval_data = settings.get("calib"), settings.get("eval_data")
        shown = {"model": str(model), "calib": _shown(calib), "eval_data": _shown(eval_data)}
        task_settings = {k: v for k, v in settings.items() if k not in ("calib", "eval_data", "progress")}
        calib_ref, eval_ref = self._put(pack_source(calib)), self._put(pack_source(eval_data))
        remote = self.ray.remote(optimize_task)
        env = {TIMINGS_ENV: os.environ[TIMINGS_ENV]} if os.environ.get(TIMINGS_ENV) else {}
        extra = {"runtime_env": {"env_vars": env}} if env else {}  # int8's layer timings: the plan's cache file
        refs = {p: remote.options(name=f"plan {p}", num_cpus=1, num_returns=2, max_retries=0, **extra).remote(
                    self._model_ref, calib_ref, eval_ref, p, task_settings, shown) for p in pipelines}
        metas, stopped = self._collect(refs, budget_s, start, progress, log)
        candidates = []
        for pipeline in pipelines:
            if pipeline not in metas:
                candidates.append(Candidate(pipeline, skipped=f"time budget of {budget_s:g} s spent"))
                continue
            candidates.append(self._candidate(pipeline, refs[pipeline][0], metas[pipeline], model, calib, eval_data))
        return candidates, stopped

    def _collect(self, refs: dict, budget_s, start: float, progress, log) -> tuple:
        """``{pipeline: what its task returned}`` as they finish; at the budget, cancel the rest
        (never ``fuse``: it is waited for)."""
        by_ref = {meta_ref: p for p, (_, meta_ref) in refs.items()}
        metas = {}

        def finished():
            pending = list(by_ref)
            while pending:
                left = None if budget_s is None else budget_s - (time.perf_counter() - start)
                timeout = None if left is None or ("fuse" in refs and "fuse" not in metas) else max(left, 0)
                ready, pending = self.ray.wait(pending, num_returns=1, timeout=timeout)
                if not ready:
                    for ref in pending:
                        self.ray.cancel(ref, force=True)
                    return
                pipeline = by_ref[ready[0]]
                metas[pipeline] = self.ray.get(ready[0])
                self.tasks.append(_trace(metas[pipeline]))
                yield pipeline

        bar = progress(finished(), desc="plan", total=len(refs)) if progress else finished()
        for pipeline in bar:
            meta = metas[pipeline]
            log(f"plan: {pipeline}: {meta.get('error') or 'done'} (node {meta['node'][:8]}, {meta['seconds']:.1f} s)")
        return metas, len(metas) < len(refs)

    def _candidate(self, pipeline: str, data_ref, meta: dict, model, calib, eval_data) -> Candidate:
        import onnx

        from ..recipe import describe_source, tool_versions

        candidate = Candidate(pipeline, seconds=meta["seconds"])
        if "exception" in meta:
            if pipeline == "fuse":
                raise meta["exception"]
            candidate.error = meta["error"]
            return candidate
        report = report_from_dict(meta["report"])
        local = tool_versions()
        if report.tool != local:
            differ = ", ".join(f"{k} {report.tool.get(k)} (here {v})" for k, v in local.items() if report.tool.get(k) != v)
            raise UserError(f"--executor ray: node {meta['node'][:8]} runs {differ}; install the same versions on every node")
        report.input_path = str(model)
        report.sources = {"calib": describe_source(calib), "eval": describe_source(eval_data)}
        data = self.ray.get(data_ref)
        self._bytes[pipeline] = data_ref
        return finish(candidate, onnx.load_from_string(data), report, data)

    def bench(self, model, protos, names, samples, machine, timing) -> list:
        """A timing task (module docstring, step 3): the candidates' one, or a choice's confirmation."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        timing = {k: v for k, v in timing.items() if k != "progress"}
        node = self.ray.get_runtime_context().get_node_id()
        resources = next((n["Resources"] for n in self.ray.nodes() if n["NodeID"] == node and n["Alive"]), {})
        if not resources.get("CPU"):
            began = time.time()
            rows = LocalExecutor().bench(model, protos, names, samples, machine, timing)
            self.tasks.append({"kind": "timing", "pipelines": list(names), "node": node, "pid": os.getpid(),
                               "where": "driver", "started": round(began, 3), "ended": round(time.time(), 3)})
            return rows
        blobs = [self._bytes.get(n) or self.ray.put(p.SerializeToString()) for n, p in zip(names, protos)]
        strategy = NodeAffinitySchedulingStrategy(node_id=node, soft=False)
        task = self.ray.remote(bench_task).options(
            name="plan timing", num_cpus=resources["CPU"], num_gpus=resources.get("GPU", 0),
            scheduling_strategy=strategy, max_retries=0)
        rows, meta = self.ray.get(task.remote(self._model_ref, list(names), samples, machine, timing, *blobs))
        self.tasks.append(_trace(meta))
        return rows


def _shown(source):
    return str(source) if isinstance(source, (str, Path)) else None


def _cpus() -> int:
    """The CPUs this process may run on (a local cluster's size)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
