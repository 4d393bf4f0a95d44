"""Measuring models side by side with ONNX Runtime: latency, throughput, memory, size, drift.

Timing
    Per (provider, threads) group, one session per model; ``session_seconds`` is the wall time
    of creating it (a throwaway session first initialises ORT's process-wide environment, so
    the first model does not pay for that). Then ``warmup`` untimed rounds and ``runs`` timed
    rounds. Round r runs every model once on the same input (sample r mod S), in an order
    rotated by r (:func:`interleaved_order`)::

        r=0: A B C    r=1: B C A    r=2: C A B    r=3: A B C …

    so slow drift of a shared machine (other jobs, clocks, heat) hits every model alike and no
    model always runs right after another. A run's time is ``time.perf_counter`` around
    ``session.run`` only; inputs are prepared beforehand.

Statistics of the per-run latencies (milliseconds)
    :func:`percentile` interpolates linearly between closest ranks (numpy's default): with
    x₍₀₎ ≤ … ≤ x₍ₙ₋₁₎ and h = (n − 1)·q/100,  P_q = x₍⌊h⌋₎ + (h − ⌊h⌋)·(x₍⌊h⌋₊₁₎ − x₍⌊h⌋₎).
    median = P₅₀, p90, p99, mean, min.
    ``throughput_per_s`` = batch · 1000 / mean  (items per second, one inference at a time).
    ``latency_ratio_vs_first`` = median over rounds r of t_m(r) / t_first(r): paired within a
    round, so drift between rounds cancels; ``latency_ratio_spread`` = [P₁₀, P₉₀] of the ratios.

Memory (``peak_memory_mb``)
    tracemalloc does not see ONNX Runtime's C++ allocations, and the benchmarking process's RSS
    mixes all models. So each row is run again in a fresh child process, after the timing: it
    loads the inputs, reads its RSS (baseline), resets the kernel's RSS high-water mark (writes
    5 to /proc/self/clear_refs, Linux ≥ 4.0), creates the session, runs min(runs, 10)
    inferences and reads VmHWM::

        peak_memory_mb = (VmHWM − baseline) / 2²⁰    what the session and its runs added
        peak_rss_mb    = VmHWM / 2²⁰                  the whole child process at its peak

    Without clear_refs the child's ``ru_maxrss`` stands in for VmHWM (an upper bound: it also
    covers the imports); ``memory_method`` says which was used.

Size and cost
    ``size_bytes``: the file (plus its external data) or the serialized proto;
    ``size_compressed_bytes``: those bytes through zlib (level 9) or lzma (preset 6), where
    weight clustering and sparsity show their gain. ``params``, ``nodes``:
    :func:`report.model_stats`; ``macs``: :func:`bench_macs.estimate_macs` at the benchmarked
    input shapes.

What runs (``executed``)
    Per model and provider, once (before the timing): :func:`executed.executed` — the graph ORT
    writes after its optimisations at the benchmarked ``opt_level``: int8 kernels and float
    compute ops by kind, the share of MACs and of weight elements in int8 kernels, and the
    DequantizeLinear nodes it left with the op each feeds. A QDQ model that ORT cannot fuse
    shows as float here, whatever its Q/DQ count.

Drift
    Each model's outputs on every sample vs the first model's in the same group:
    :func:`metrics.compare` per sample, :func:`metrics.merge` (worst case) per output. Outputs
    match by name, else by position when both models have as many outputs. ``metric`` is the
    user's hook ``metric(first_model_outputs, outputs) -> dict`` over all samples.
"""

from __future__ import annotations

import json
import lzma
import os
import platform
import subprocess
import sys
import tempfile
import time
import zlib
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
import onnxruntime as ort

from .bench_macs import estimate_macs
from .bench_render import render
from .calibration import input_specs
from .errors import UserError
from .executed import executed
from .metrics import compare, merge
from .model import load_proto, save_proto
from .report import _json_default, model_stats
from .runtime import OPT_LEVELS, make_session, prepare_feed, run

PROVIDERS = {
    "cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider", "tensorrt": "TensorrtExecutionProvider",
    "openvino": "OpenVINOExecutionProvider", "dml": "DmlExecutionProvider", "coreml": "CoreMLExecutionProvider",
    "rocm": "ROCMExecutionProvider", "migraphx": "MIGraphXExecutionProvider", "dnnl": "DnnlExecutionProvider",
    "xnnpack": "XnnpackExecutionProvider", "qnn": "QNNExecutionProvider", "webgpu": "WebGpuExecutionProvider",
    "azure": "AzureExecutionProvider",
}
INSTALL_HINTS = {
    "cuda": "pip install onnxruntime-gpu (and a CUDA driver)", "tensorrt": "pip install onnxruntime-gpu with TensorRT",
    "openvino": "pip install onnxruntime-openvino", "dml": "pip install onnxruntime-directml (Windows)",
    "coreml": "the standard onnxruntime wheel on macOS",
}
MEMORY_RUNS = 10


# --- providers ---------------------------------------------------------------------------

def short_name(provider: str) -> str:
    for short, full in PROVIDERS.items():
        if full == provider:
            return short
    return provider


def list_providers() -> list:
    """The execution providers of the installed onnxruntime, short names where known."""
    return [short_name(p) for p in ort.get_available_providers()]


def resolve_provider(name: str) -> str:
    """The full ORT name of ``name`` (short or full); UserError when this machine lacks it."""
    full = PROVIDERS.get(name.strip().lower(), name.strip())
    if full not in ort.get_available_providers():
        hint = INSTALL_HINTS.get(short_name(full))
        raise UserError(
            f"provider {name!r} is not available in this onnxruntime {ort.__version__}; available: "
            f"{', '.join(list_providers())}" + (f" (for {short_name(full)}: {hint})" if hint else "")
        )
    return full


# --- statistics and ordering -----------------------------------------------------------

def percentile(values, q: float) -> float:
    """The q-th percentile (0 ≤ q ≤ 100), linear between closest ranks (see module docstring)."""
    xs = sorted(float(v) for v in values)
    if not xs:
        raise ValueError("percentile of no values")
    h = (len(xs) - 1) * q / 100.0
    lo = int(h)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (h - lo) * (xs[hi] - xs[lo])


def latency_stats(seconds) -> dict:
    ms = [s * 1000.0 for s in seconds]
    return {
        "median": percentile(ms, 50), "p90": percentile(ms, 90), "p99": percentile(ms, 99),
        "mean": sum(ms) / len(ms), "min": min(ms),
    }


def interleaved_order(n_models: int, round_index: int) -> list:
    """Model indices in the order they run in round ``round_index`` (rotated each round)."""
    start = round_index % n_models
    return [(start + k) % n_models for k in range(n_models)]


def timed_rounds(runners: list, runs: int, warmup: int = 0, progress=None, desc: str = "bench") -> list:
    """Run ``runners[m](r)`` interleaved; ``times[m][r]`` in seconds for the ``runs`` timed rounds."""
    progress = progress or (lambda it, **_: it)
    n = len(runners)
    times = [[0.0] * runs for _ in runners]
    if n == 0:
        return times
    for r in progress(range(warmup + runs), desc=desc, total=warmup + runs):
        for m in interleaved_order(n, r):
            start = time.perf_counter()
            runners[m](r)
            elapsed = time.perf_counter() - start
            if r >= warmup:
                times[m][r - warmup] = elapsed
    return times


def paired_ratio(times: list, reference: list) -> tuple:
    """(median, [P10, P90]) of round-by-round ratios ``times[r] / reference[r]``."""
    ratios = [t / ref for t, ref in zip(times, reference) if ref > 0]
    if not ratios:
        return None, None
    return percentile(ratios, 50), [percentile(ratios, 10), percentile(ratios, 90)]


# --- inputs, drift, size -----------------------------------------------------------------

def batched(samples: list, specs: list, batch: int | None) -> list:
    """Samples whose inputs with a dynamic first axis are stacked to ``batch`` along axis 0
    (following samples appended in turn, cycling); other inputs are left as they are."""
    if batch is None:
        return list(samples)
    if batch < 1:
        raise UserError(f"--batch {batch}: must be at least 1")
    dynamic = [s.name for s in specs if s.rank >= 1 and not (isinstance(s.shape[0], int) and s.shape[0] > 0)]
    if not dynamic:
        raise UserError(f"--batch {batch}: no input of the first model has a dynamic first axis")
    out = []
    for i, sample in enumerate(samples):
        new = dict(sample)
        for name in dynamic:
            parts, count, j = [], 0, i
            while count < batch:
                part = np.asarray(samples[j % len(samples)][name])
                if part.shape[0] == 0:
                    raise UserError(f"--batch: input {name!r} has an empty first axis")
                parts.append(part)
                count += part.shape[0]
                j += 1
            new[name] = np.concatenate(parts)[:batch]
        out.append(new)
    return out


def output_drift(reference: list, outputs: list) -> dict:
    """``{output: Drift dict}``: worst case over the samples of ``outputs`` vs ``reference``."""
    ref_names, names = list(reference[0]), list(outputs[0])
    if set(ref_names) <= set(names):
        pairs = [(n, n) for n in ref_names]
    elif len(ref_names) == len(names):
        pairs = list(zip(ref_names, names))
    else:
        return {n: None for n in ref_names}
    return {
        ref: merge([compare(a[ref], b[name]) for a, b in zip(reference, outputs)]).to_dict()
        for ref, name in pairs
    }


def view_drift(views, runtime, reference: list, outputs: list) -> list | None:
    """Per output view (:mod:`.fidelity.views`, found from the first model's graph): worst-sample
    cosine, relative error, decision agreement — as the optimize report judges them."""
    from .fidelity import Target, judge

    if views is None or not len(views) or set(reference[0]) - set(outputs[0]):
        return None
    return [score.to_dict() for score in judge(views, reference, outputs, Target("none"), runtime).scores]


def _views_of(proto: onnx.ModelProto, feeds: list) -> tuple:
    """The first model's output views and, when a view needs them, its tail tensors per feed."""
    from .fidelity import find_views
    from .fidelity.context import reference_outputs

    try:
        views = find_views(proto)
        runtime = reference_outputs(proto, feeds, views)[1] if views.runtime_tensors else None
    except Exception:  # noqa: BLE001 - views are a refinement; a model they cannot label keeps its drift
        return None, None
    return views, runtime


def _files_of(path: Path, proto: onnx.ModelProto) -> list:
    """The model file and the external-data files it references."""
    files = [path]
    for tensor in onnx.external_data_helper._get_all_tensors(proto):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            location = {e.key: e.value for e in tensor.external_data}.get("location")
            if location and path.parent / location not in files:
                files.append(path.parent / location)
    return files


def size_info(path: Path | None, proto: onnx.ModelProto, codec: str = "zlib") -> dict:
    """Raw and compressed bytes of the model as stored (file + external data, or the proto)."""
    compressor = zlib.compressobj(9) if codec == "zlib" else lzma.LZMACompressor(preset=6)
    raw = compressed = 0
    if path is not None:
        on_disk = onnx.load(str(path), load_external_data=False)
        for file in _files_of(path, on_disk):
            with open(file, "rb") as fh:
                while chunk := fh.read(1 << 22):
                    raw += len(chunk)
                    compressed += len(compressor.compress(chunk))
    else:
        data = proto.SerializeToString()
        raw, compressed = len(data), len(compressor.compress(data))
    return {"size_bytes": raw, "size_compressed_bytes": compressed + len(compressor.flush()), "compression": codec}


# --- peak memory in a child process --------------------------------------------------------

def _status_kb(key: str) -> int | None:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _reset_high_water_mark() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def _save_feeds(feeds: list, path: Path) -> None:
    arrays, index = [], []
    for i, feed in enumerate(feeds):
        for name, value in feed.items():
            index.append([i, name])
            arrays.append(np.asarray(value))
    np.savez(path, *arrays)
    path.with_suffix(".json").write_text(json.dumps(index))


def _load_feeds(path: Path) -> list:
    index = json.loads(path.with_suffix(".json").read_text())
    feeds = [dict() for _ in range(max((i for i, _ in index), default=-1) + 1)]
    with np.load(path) as data:
        for k, (i, name) in enumerate(index):
            feeds[i][name] = data[f"arr_{k}"]
    return feeds


def _memory_child(argv: list) -> None:
    """Child process entry: prints {peak_memory_mb, peak_rss_mb, memory_method} as JSON."""
    model, feeds_path, provider, threads, opt_level, runs = argv
    feeds = _load_feeds(Path(feeds_path))
    baseline = _status_kb("VmRSS")
    cleared = _reset_high_water_mark()
    session = make_session(model, opt_level, int(threads), _provider_list(provider))
    for r in range(int(runs)):
        run(session, feeds[r % len(feeds)])
    if cleared and _status_kb("VmHWM") is not None:
        peak, method = _status_kb("VmHWM"), "VmHWM after clear_refs, minus RSS before the session"
    else:
        import resource

        scale = 1 if sys.platform != "darwin" else 1 / 1024  # macOS reports bytes
        peak, method = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale), "ru_maxrss (upper bound)"
    print(json.dumps({
        "peak_memory_mb": round(max(peak - baseline, 0) / 1024, 3) if baseline is not None else None,
        "peak_rss_mb": round(peak / 1024, 3), "memory_method": method,
    }))


def peak_memory(model_path, feeds: list, provider: str, threads: int, opt_level: str, runs: int) -> dict:
    """Peak memory of creating a session and running it, measured in a fresh child process."""
    with tempfile.TemporaryDirectory(prefix="slim-bench-") as tmp:
        feeds_path = Path(tmp) / "feeds.npz"
        _save_feeds(feeds, feeds_path)
        code = "import sys; from onnxslim_kit.bench import _memory_child; _memory_child(sys.argv[1:])"
        args = [str(model_path), str(feeds_path), provider, str(threads), opt_level, str(runs)]
        proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"peak_memory_mb": None, "peak_rss_mb": None, "memory_method": f"child failed: {last[:200]}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --- the benchmark ---------------------------------------------------------------------------

@dataclass
class Entry:
    name: str
    path: Path | None
    proto: onnx.ModelProto
    static: dict = field(default_factory=dict)


def _provider_list(provider: str) -> list:
    return [provider] if provider == "CPUExecutionProvider" else [provider, "CPUExecutionProvider"]


def _entries(models: list, names: list | None) -> list:
    if names is not None and len(names) != len(models):
        raise UserError(f"{len(names)} names for {len(models)} models")
    entries = []
    for i, model in enumerate(models):
        if isinstance(model, onnx.ModelProto):
            path, proto, default = None, model, f"model{i}"
        elif isinstance(model, (str, Path)):
            path, proto = Path(model), load_proto(model)
            default = path.name[:-5] if path.name.endswith(".onnx") else path.name
        else:
            raise UserError(f"benchmark() takes paths or onnx.ModelProto, not {type(model).__name__}")
        name = names[i] if names else default
        taken = {e.name for e in entries}
        suffix = 2
        while name in taken:
            name, suffix = f"{name}#{suffix}", suffix + 1
        entries.append(Entry(name, path, proto))
    return entries


def _static_stats(entry: Entry, feed: dict, codec: str) -> dict:
    stats = model_stats(entry.proto)
    shapes = {k: list(np.shape(v)) for k, v in feed.items()}
    macs, unresolved = estimate_macs(entry.proto, shapes, feed)
    return {**size_info(entry.path, entry.proto, codec), "params": stats["params"], "nodes": stats["nodes"],
            "macs": macs, "macs_unresolved_nodes": unresolved}


def _executed(entry: Entry, provider: str, opt_level: str, feed: dict) -> dict:
    """What ORT runs for ``entry`` on ``provider`` (module docstring); ``{"error": …}`` when it
    cannot build the session (the timing row says so too)."""
    shapes = {k: list(np.shape(v)) for k, v in feed.items()}
    try:
        return executed(entry.path or entry.proto, provider, opt_level, shapes, feed, proto=entry.proto)
    except Exception as exc:  # noqa: BLE001 - a model ORT cannot load is a row with an error, not a crash
        return {"error": f"ONNX Runtime: {_first_line(exc)}"}


def _init_ort_environment() -> None:
    """One throwaway session, so the first model's session time excludes ORT's global setup."""
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])
    graph = onnx.helper.make_graph([onnx.helper.make_node("Identity", ["x"], ["y"])], "init", [x],
                                   [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])])
    make_session(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 13)]))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:300]


def _run_group(entries, feeds, provider, threads, opt_level, runs, warmup, metric, memory, files, progress,
               views=(None, None)):
    """Rows of one (provider, threads) group: sessions, outputs, interleaved timing, memory."""
    rows, sessions, outputs = [], {}, {}
    for m, entry in enumerate(entries):
        row = {"name": entry.name, "path": str(entry.path) if entry.path else None,
               "provider": short_name(provider), "threads": threads, "opt_level": opt_level, **entry.static,
               "error": None}
        rows.append(row)
        try:
            start = time.perf_counter()
            session = make_session(entry.path or entry.proto, opt_level, threads, _provider_list(provider))
            row["session_seconds"] = time.perf_counter() - start
            row["session_providers"] = [short_name(p) for p in session.get_providers()]
            outputs[m] = [run(session, feed) for feed in feeds]
            sessions[m] = session
        except Exception as exc:  # noqa: BLE001 - a model ORT cannot run is a row, not a crash
            row["error"] = f"ONNX Runtime: {_first_line(exc)}"
    active = sorted(sessions)
    runners = []
    for m in active:
        model_feeds = [prepare_feed(sessions[m], f) for f in feeds]  # integer-I/O models get their integers
        runners.append(lambda r, s=sessions[m], mf=model_feeds: s.run(None, mf[r % len(mf)]))
    times = dict(zip(active, timed_rounds(runners, runs, warmup, progress, f"{short_name(provider)} ×{threads}")))
    batch = rows[0]["batch"]
    for m, row in enumerate(rows):
        if m not in times:
            continue
        row["latency_ms"] = stats = latency_stats(times[m])
        row["throughput_per_s"] = batch * 1000.0 / stats["mean"] if stats["mean"] > 0 else None
        ratio, spread = paired_ratio(times[m], times[0]) if 0 in times else (None, None)
        row["latency_ratio_vs_first"], row["latency_ratio_spread"] = ratio, spread
        row["drift"] = output_drift(outputs[0], outputs[m]) if 0 in outputs else None
        row["views"] = view_drift(*views, outputs[0], outputs[m]) if 0 in outputs and m else None
        row["metric"] = metric(outputs[0], outputs[m]) if metric and 0 in outputs else None
        if memory:
            row.update(peak_memory(files[m], feeds, provider, threads, opt_level, max(1, min(runs, MEMORY_RUNS))))
    return rows


@dataclass
class BenchReport:
    rows: list
    settings: dict = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({"settings": self.settings, "rows": self.rows}, indent=2, default=_json_default)

    def table(self) -> str:
        return render(self.rows, markdown=False)

    def markdown(self) -> str:
        return render(self.rows, markdown=True)


def benchmark(
    models: list,
    samples: list,
    *,
    names: list | None = None,
    providers=("cpu",),
    threads=(1,),
    runs: int = 50,
    warmup: int = 5,
    opt_level: str = "all",
    batch: int | None = None,
    metric: Callable | None = None,
    progress=None,
    memory: bool = True,
    compression: str = "zlib",
) -> BenchReport:
    """Benchmark ``models`` (paths or ModelProtos) on ``samples`` (``{input: array}`` dicts);
    one row per (model, provider, threads), the first model being the reference."""
    if not models:
        raise UserError("no models to benchmark")
    if not samples:
        raise UserError("no input samples")
    if runs < 1 or warmup < 0:
        raise UserError(f"runs must be ≥ 1 and warmup ≥ 0 (got runs={runs}, warmup={warmup})")
    if opt_level not in OPT_LEVELS:
        raise UserError(f"opt level {opt_level!r}: one of {', '.join(OPT_LEVELS)}")
    if compression not in ("zlib", "lzma"):
        raise UserError(f"compression {compression!r}: zlib or lzma")
    if any(int(t) < 0 for t in threads):
        raise UserError("threads must be ≥ 0 (0: ONNX Runtime's default)")
    full_providers = [resolve_provider(p) for p in providers]
    entries = _entries(models, names)
    specs = input_specs(entries[0].proto)
    feeds = batched(samples, specs, batch)
    leading = [np.shape(feeds[0][s.name])[0] for s in specs if s.rank >= 1 and s.name in feeds[0]]
    batch_size = batch or (leading[0] if leading else 1)
    for entry in entries:
        entry.static = {"batch": batch_size, **_static_stats(entry, feeds[0], compression)}
    _init_ort_environment()
    views = _views_of(entries[0].proto, feeds)
    rows = []
    with tempfile.TemporaryDirectory(prefix="slim-bench-") as tmp:
        files = [None] * len(entries)
        if memory:  # the child process needs a file
            files = [e.path or save_proto(e.proto, Path(tmp) / f"model{i}.onnx") for i, e in enumerate(entries)]
        for provider in full_providers:
            runs_as = [_executed(e, provider, opt_level, feeds[0]) for e in entries]
            for t in threads:
                group = _run_group(entries, feeds, provider, int(t), opt_level, runs, warmup, metric, memory,
                                   files, progress, views)
                for row, what in zip(group, runs_as):
                    row["executed"] = what
                rows += group
    settings = {
        "date_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "runs": runs, "warmup": warmup, "opt_level": opt_level, "batch": batch_size, "samples": len(feeds),
        "providers": [short_name(p) for p in full_providers], "threads": [int(t) for t in threads],
        "compression": compression, "memory": memory, "order": "interleaved, rotated each round",
        "versions": {"onnxruntime": ort.__version__, "onnx": onnx.__version__, "numpy": np.__version__,
                     "python": platform.python_version()},
        "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(), "processor": platform.processor()},
    }
    return BenchReport(rows, settings)
