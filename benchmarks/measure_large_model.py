"""Every pass and three anchors on one large decoder (``build_large_decoder.py``), in one run.

    python benchmarks/measure_large_model.py --layers 2 --hidden 512 --mlp 2048 --name l2h512   # ≈ 34 MB
    python benchmarks/measure_large_model.py --mem-cap-gb 20                                    # full 2.75 GB
    python benchmarks/measure_large_model.py --model my.onnx --features 80 --name mine           # a given model
    python benchmarks/measure_large_model.py fit results/large-model-*-l2h512.json results/large-model-*-l4h1024.json

Steps, each in a child process (the benchmark process itself holds no model):

1. build the model (skipped with ``--model``); write the data: 4 calibration samples and 2
   held-out samples ``[1, seq, F]`` ~ N(0, 1) from separate seeds (``calib.npz``,
   ``eval.npz``, stacked along axis 0);
2. the reference: the original's outputs on the 2 held-out samples (``ref.npz``);
3. every ``--pipelines`` entry through ``python -m onnxslim_kit MODEL --passes P --calib
   calib.npz --eval eval.npz``, then the anchors: onnxsim and ORT ``quantize_static`` (QDQ)
   through ``anchors.py``'s child protocol, ORT ``MatMulNBitsQuantizer`` (its C++
   round-to-nearest, ``DefaultWeightOnlyQuantConfig``, block 64, asymmetric: the settings of
   our ``int4`` defaults) through this file's own child; then the ``--after-anchors`` pipelines
   (slow ones last, so that a run stopped early has the anchors' rows);
4. for each output written: a drift child loads it with plain ONNX Runtime (CPU, 1 thread) and
   runs the held-out samples — cosine per output and sample vs ``ref.npz``
   (``onnxslim_kit.metrics.compare``); the worst is the row's figure.

Measured per child (:func:`anchors.measure`): exit code, wall time, ``ru_maxrss`` (the
largest single process of the tree: Linux's ``wait4`` folds in reaped descendants' peaks),
and the peak RSS of the whole process tree, the sum over the child and its descendants
sampled with psutil every 0.2 s (misses spikes shorter than that; counts pages of a file
mapped by two processes twice). The row's peak is the larger of the two. Caps: every child
runs under ``RLIMIT_AS = --mem-cap-gb`` (set on this process before any child starts and
inherited; *per process*, and virtual: a memory-mapped data file counts in full) and
``--time-cap-s``; a child over a cap is a row marked ``memory cap`` / ``time cap``, the run
goes on. Output: ``results/large-model-<date>-<name>.md`` and ``.json`` (exact command,
versions, CPU, the 1-minute load before and after, every row), rewritten after each row
(``finished`` is empty until the last one): a stopped run keeps the rows it measured.

A fixed state of the code while others edit the checkout: copy ``onnxslim_kit/`` and ``passes/``
(as ``onnxslim_kit/passes``) to a folder and run with ``PYTHONPATH=<folder>``; every child
inherits it, and the results name the folder the code came from (``code``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shlex
import shutil
import signal
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

import anchors
import build_large_decoder as builder
import suite_report

HERE = Path(__file__).resolve().parent
SELF = HERE / "measure_large_model.py"
PIPELINES = ["fuse", "fuse,int8", "fuse,dynamic", "fuse,fp16", "fuse,int4(method=rtn)", "fuse,int4", "fuse,svd",
             "fuse,cluster", "fuse,prune", "fuse,compact"]
ANCHORS = ["onnxsim", "ort_static", "ort_nbits"]
MEMORY_ERRORS = re.compile(r"MemoryError|bad_alloc|Unable to allocate|Failed to allocate|Cannot allocate memory|"
                           r"out of memory", re.IGNORECASE)
SAMPLE_SECONDS = 0.2


# --- measuring -----------------------------------------------------------------------------

class TreeSampler:
    """Sampled every 0.2 s over this process's descendants: the peak of their summed RSS, of
    their summed anonymous RSS (RSS − file-backed and shared pages: what a memory-mapped weight
    file does not account for; the memory that must fit in RAM), and their CPU seconds (user +
    system, each process's last sample: up to 0.2 s short per process)."""

    def __init__(self):
        import psutil

        self._me = psutil.Process()
        self._errors = (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess)
        self.peak = self.peak_anon = 0
        self._cpu: dict = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def cpu_seconds(self) -> float:
        return sum(self._cpu.values())

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_SECONDS):
            total = anon = 0
            for proc in self._me.children(recursive=True):
                try:
                    with proc.oneshot():
                        memory = proc.memory_info()
                        times = proc.cpu_times()
                    total, anon = total + memory.rss, anon + memory.rss - memory.shared
                    self._cpu[(proc.pid, proc.create_time())] = times.user + times.system
                except self._errors:
                    pass
            self.peak, self.peak_anon = max(self.peak, total), max(self.peak_anon, anon)

    def kill_all(self) -> None:
        """Stop every descendant (an interrupted benchmark leaves no child running)."""
        for proc in self._me.children(recursive=True):
            try:
                proc.kill()
            except self._errors:
                pass

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def run_child(label: str, cmd: list, timeout: float) -> dict:
    """One measured child, in a fresh working directory: a row, whatever happens."""
    workdir = tempfile.mkdtemp(prefix="large-model-")
    try:
        start = time.perf_counter()
        with TreeSampler() as sampler:
            try:
                result = anchors.measure(cmd, timeout=timeout, cwd=workdir)
            except BaseException:
                sampler.kill_all()
                raise
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    tree_mb = round(sampler.peak / 2**20, 1)
    peaks = [v for v in (tree_mb, result["peak_rss_mb"]) if v]
    row = {"run": label, "command": shlex.join(map(str, cmd)), "exit": result["returncode"],
           "wall_s": result["wall_seconds"], "cpu_s": round(sampler.cpu_seconds, 1), "peak_rss_tree_mb": tree_mb,
           "ru_maxrss_mb": result["peak_rss_mb"], "peak_anon_tree_mb": round(sampler.peak_anon / 2**20, 1),
           "peak_rss_mb": max(peaks) if peaks else None, "stdout": result["stdout"], "error": None}
    err = result["stderr"] or result["stdout"]
    if result["timed_out"]:  # killed with its wrapper: the wall time is ours, start-up included
        row["status"], row["error"] = "time cap", f"killed after {timeout:.0f} s"
        row["wall_s"] = round(time.perf_counter() - start, 3)
    elif result["returncode"] == 0:
        row["status"] = "ok"
    elif MEMORY_ERRORS.search(err) or result["returncode"] in (-6, -9, 134, 137):
        row["status"], row["error"] = "memory cap", anchors.last_error_line(err)
    else:
        row["status"], row["error"] = "failed", anchors.last_error_line(err)
    return row


def folder_mb(folder: Path) -> float:
    return round(sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file()) / 1e6, 2)


# --- the children --------------------------------------------------------------------------

def _session(path: str, prepack: bool):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    if not prepack:  # no packed weight copies: a float model larger than memory can still run
        options.add_session_config_entry("session.disable_prepacking", "1")
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def _feeds(session, eval_npz: str) -> list:
    with np.load(eval_npz) as data:
        arrays = {k: data[k] for k in data.files}
    dtypes = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64}
    count = len(next(iter(arrays.values())))
    return [{i.name: arrays[i.name][s].astype(dtypes.get(i.type, arrays[i.name].dtype)) for i in session.get_inputs()}
            for s in range(count)]


def child_drift(model: str, eval_npz: str, ref_npz: str, write_ref: bool, prepack: bool = True) -> dict:
    """Load ``model`` in ORT, run the held-out samples; write them (``write_ref``) or compare."""
    from onnxslim_kit.metrics import compare

    out = {"loads": False, "runs": False, "cosine": {}, "worst_cosine": None, "error": None}
    try:
        session = _session(model, prepack)
    except Exception as exc:  # noqa: BLE001 - the row records why ORT refused the model
        out["error"] = f"ORT load: {type(exc).__name__}: {anchors.last_error_line(str(exc))}"
        return out
    out["loads"] = True
    names = [o.name for o in session.get_outputs()]
    try:
        results = [session.run(None, feed) for feed in _feeds(session, eval_npz)]
    except Exception as exc:  # noqa: BLE001
        out["error"] = f"ORT run: {type(exc).__name__}: {anchors.last_error_line(str(exc))}"
        return out
    out["runs"] = True
    if write_ref:
        np.savez(ref_npz, **{f"{n}:{s}": r[k] for s, r in enumerate(results) for k, n in enumerate(names)})
        return out
    with np.load(ref_npz) as ref:
        ref_names = list(dict.fromkeys(key.rsplit(":", 1)[0] for key in ref.files))
        for k, ref_name in enumerate(ref_names):  # by name, else by position
            j = names.index(ref_name) if ref_name in names else k
            out["cosine"][ref_name] = [round(compare(ref[f"{ref_name}:{s}"], r[j].astype(np.float32)).cosine, 6)
                                       for s, r in enumerate(results)]
    out["worst_cosine"] = min((c for v in out["cosine"].values() for c in v), default=None)
    return out


def child_nbits(src: str, dst: str) -> None:
    """ONNX Runtime's MatMulNBitsQuantizer, C++ round-to-nearest, block 64, asymmetric."""
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig, MatMulNBitsQuantizer

    config = DefaultWeightOnlyQuantConfig(block_size=64, is_symmetric=False)
    quantizer = MatMulNBitsQuantizer(onnx.load(src), block_size=64, is_symmetric=False, algo_config=config)
    quantizer.process()
    quantizer.model.save_model_to_file(dst, use_external_data_format=True)


def child_main(argv: list) -> int:
    kind, *rest = argv
    if kind == "drift":
        model, eval_npz, ref_npz, mode, *packing = rest
        print(json.dumps(child_drift(model, eval_npz, ref_npz, mode == "write-ref", packing != ["no-prepack"])))
    elif kind == "nbits":
        child_nbits(*rest)
        print(json.dumps(["DefaultWeightOnlyQuantConfig(block_size=64, is_symmetric=False): C++ RTN"]))
    return 0


# --- the run -------------------------------------------------------------------------------

def write_data(cfg: builder.Config, folder: Path, seq: int) -> tuple:
    """calib.npz (4 samples, seed 1) and eval.npz (2 held-out samples, seed 2), [1, seq, F] each."""
    paths = []
    for name, count, seed in (("calib", 4, 1), ("eval", 2, 2)):
        rng = np.random.default_rng(seed)
        path = folder / f"{name}.npz"
        np.savez(path, features=rng.standard_normal((count, 1, seq, cfg.features), dtype=np.float32))
        paths.append(path)
    return tuple(paths)


def job_command(job: str, model: Path, out: Path, calib: Path, eval_npz: Path) -> list:
    if job in ANCHORS[:2]:
        return [sys.executable, HERE / "anchors.py", job, model, out, "--calib", calib]
    if job == "ort_nbits":
        return [sys.executable, SELF, "_child", "nbits", model, out]
    return [sys.executable, "-m", "onnxslim_kit", model, "--passes", job, "-o", out, "--calib", calib, "--eval",
            eval_npz, "-q", "--report", out.parent.parent / (out.parent.name + ".report.json")]


def drift_of(row: dict, out: Path, files: dict, args) -> None:
    """The drift child on ``out``: loads / runs / worst cosine into ``row``."""
    cmd = [sys.executable, SELF, "_child", "drift", out, files["eval"], files["ref"], "compare", _packing(args)]
    check = run_child("drift", cmd, args.time_cap_s)
    row["drift_wall_s"], row["drift_peak_rss_mb"] = check["wall_s"], check["peak_rss_mb"]
    try:
        found = json.loads(check["stdout"].strip().splitlines()[-1])
    except (IndexError, ValueError):
        found = {"loads": None, "runs": None, "worst_cosine": None, "cosine": {},
                 "error": f"drift child {check['status']}: {check['error']}"}
    row.update({k: found[k] for k in ("loads", "runs", "worst_cosine", "cosine")})
    if found.get("error"):
        row["drift_error"] = found["error"]


def pass_summary(report: Path) -> list | None:
    """Per pass of our CLI's ``--report``: its seconds (inside the tool) and its size/round metrics."""
    if not report.is_file():
        return None
    keep = ("gptq_rounds", "weight_ratio", "mixed_samples", "mixed_trials", "mixed_probes")
    return [{"name": p["name"], "seconds": p.get("seconds"), "rolled_back": p.get("rolled_back"),
             **{k: v for k, v in (p.get("metrics") or {}).items() if k in keep}}
            for p in json.loads(report.read_text()).get("passes", [])]


def run_job(job: str, files: dict, work: Path, args) -> dict:
    slug = re.sub(r"[^\w]+", "_", job).strip("_")
    folder = work / "rows" / slug
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    out = folder / "out.onnx"
    (folder.parent / (folder.name + ".report.json")).unlink(missing_ok=True)  # never an earlier run's
    row = run_child(job, job_command(job, files["model"], out, files["calib"], files["eval"]), args.time_cap_s)
    row["kind"] = "anchor" if job in ANCHORS else "ours"
    stdout = row.pop("stdout")
    if row["kind"] == "anchor" and row["status"] == "ok":
        try:
            row["notes"] = json.loads(stdout.strip().splitlines()[-1])
        except (IndexError, ValueError):
            pass
    if row["status"] == "ok" and not out.is_file():
        row["status"], row["error"] = "failed", "exited 0 but wrote no model"
    row["output_mb"] = folder_mb(folder) if out.is_file() else None
    row["passes"] = pass_summary(folder.parent / (folder.name + ".report.json"))
    row.update({"loads": None, "runs": None, "worst_cosine": None, "cosine": {}})
    if out.is_file():
        drift_of(row, out, files, args)
    if not args.keep_outputs:
        shutil.rmtree(folder, ignore_errors=True)
    return row


def prepare(args, work: Path) -> tuple:
    """The model (built in a measured child unless given), the data, the reference: (files, rows)."""
    cfg = config_of(args)
    rows = []
    if args.model:
        model = Path(args.model).resolve()
    else:
        model = work / "model" / "decoder.onnx"
        flags = [f"--{k}={getattr(cfg, k)}" for k in ("layers", "hidden", "mlp", "heads", "features", "vocab", "seed")]
        rows.append(run_child("build", [sys.executable, HERE / "build_large_decoder.py", *flags, "--out", model],
                              args.time_cap_s))
        rows[-1].pop("stdout")
        if rows[-1]["status"] != "ok":
            raise SystemExit(f"error: the build failed: {rows[-1]['error']}")
    calib, eval_npz = write_data(cfg, work, args.seq)
    files = {"model": model, "calib": calib, "eval": eval_npz, "ref": work / "ref.npz"}
    ref = run_child("reference", [sys.executable, SELF, "_child", "drift", model, eval_npz, files["ref"],
                                  "write-ref", _packing(args)], args.time_cap_s)
    rows.append(ref)
    stdout = ref.pop("stdout")
    found = json.loads(stdout.strip().splitlines()[-1]) if ref["status"] == "ok" else {}
    if not found.get("runs"):
        raise SystemExit(f"error: ORT cannot run the original: {found.get('error') or ref['error']}")
    return files, rows


def _packing(args) -> str:
    return "no-prepack" if args.no_prepack else "prepack"


def config_of(args) -> builder.Config:
    return builder.Config(**{k: getattr(args, k) for k in ("layers", "hidden", "mlp", "heads", "features", "vocab",
                                                           "seed")})


def model_bytes(model: Path) -> int:
    import onnx
    from onnx.external_data_helper import ExternalDataInfo, _get_all_tensors, uses_external_data

    proto = onnx.load(str(model), load_external_data=False)
    data = {ExternalDataInfo(t).location for t in _get_all_tensors(proto) if uses_external_data(t)}
    return model.stat().st_size + sum((model.parent / name).stat().st_size for name in data)


def code_source() -> str:
    """Where the children's onnxslim_kit comes from (PYTHONPATH may point at a snapshot of the code)."""
    from importlib.util import find_spec

    return str(Path(find_spec("onnxslim_kit").origin).parent)


def parse_args(argv: list) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = builder.Config()
    for field in ("layers", "hidden", "mlp", "heads", "features", "vocab", "seed"):
        parser.add_argument(f"--{field}", type=int, default=getattr(defaults, field), help="builder flag")
    parser.add_argument("--model", help="measure this model instead of building one (input features [B, T, F])")
    parser.add_argument("--seq", type=int, default=32, help="sequence length of the samples (default 32)")
    parser.add_argument("--pipelines", nargs="*", default=PIPELINES, help="our --passes values (default: all)")
    parser.add_argument("--anchors", default=",".join(ANCHORS), help=f"comma list or none (default {ANCHORS})")
    parser.add_argument("--after-anchors", nargs="*", default=[],
                        help="more --passes values, run after the anchors (slow ones last: a run stopped early "
                             "still has the anchors' rows)")
    parser.add_argument("--mem-cap-gb", type=float, default=16.0, help="RLIMIT_AS of every child (default 16)")
    parser.add_argument("--time-cap-s", type=float, default=1800.0, help="wall-time cap per child (default 1800)")
    parser.add_argument("--work", type=Path, help="working folder (default: a temporary one, removed)")
    parser.add_argument("--no-prepack", action="store_true",
                        help="reference and drift sessions without ORT's packed weight copies (models > RAM)")
    parser.add_argument("--keep-outputs", action="store_true", help="keep each row's output model")
    parser.add_argument("--name", help="results/large-model-<date>-<name>.md (default: l<L>h<H>)")
    parser.add_argument("--results", type=Path, default=HERE / "results")
    return parser.parse_args(argv)


def main(argv: list) -> int:
    if argv[:1] == ["_child"]:
        return child_main(argv[1:])
    if argv[:1] == ["fit"]:
        return fit_main(argv[1:])
    args = parse_args(argv)
    anchor_list = [] if args.anchors in ("", "none") else args.anchors.split(",")
    unknown = [a for a in anchor_list if a not in ANCHORS]
    if unknown:
        print(f"error: unknown anchor {unknown[0]!r}; anchors: {', '.join(ANCHORS)}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # kill → KeyboardInterrupt: children stopped
    cap = int(args.mem_cap_gb * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))  # inherited by every child
    run = {"command": "python benchmarks/measure_large_model.py " + shlex.join(argv),
           "started": datetime.now(timezone.utc), "load_average_before": os.getloadavg()}
    work = args.work or Path(tempfile.mkdtemp(prefix="large-model-run-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        files, rows = prepare(args, work)
        size = model_bytes(files["model"])
        jobs = [*args.pipelines, *anchor_list, *args.after_anchors]
        stem = write_results(args, run, size, rows, final=not jobs)
        for done, job in enumerate(jobs, 1):
            rows.append(run_job(job, files, work, args))
            print(_line(rows[-1], size), flush=True)
            stem = write_results(args, run, size, rows, final=done == len(jobs))  # a stopped run keeps its rows
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    print(f"wrote {stem}.md and .json")
    return 0


def write_results(args, run: dict, size: int, rows: list, final: bool) -> Path:
    """``results/large-model-<date>-<name>.md`` and ``.json`` of the rows so far (``final``:
    every job ran; otherwise the files say how many are still to come)."""
    results = {"command": run["command"], "started": run["started"].isoformat(timespec="seconds"),
               "finished": datetime.now(timezone.utc).isoformat(timespec="seconds") if final else None,
               "load_average_before": run["load_average_before"], "load_average_after": os.getloadavg(),
               "config": vars(config_of(args)) if not args.model else {"model": args.model},
               "model_bytes": size, "samples": {"calib": 4, "eval": 2, "shape": [1, args.seq, args.features]},
               "caps": {"mem_cap_gb": args.mem_cap_gb, "time_cap_s": args.time_cap_s},
               "ort_prepacking": not args.no_prepack,
               "code": code_source(), "machine": suite_report.cpu_info(), "versions": suite_report.versions(),
               "git": suite_report.git_state(), "rows": rows}
    for row in rows:
        row["rss_over_model"] = round(row["peak_rss_mb"] * 2**20 / size, 2) if row.get("peak_rss_mb") else None
    name = args.name or (f"l{args.layers}h{args.hidden}" if not args.model else Path(args.model).stem)
    stem = args.results / f"large-model-{run['started'].date().isoformat()}-{name}"
    args.results.mkdir(parents=True, exist_ok=True)
    Path(f"{stem}.json").write_text(json.dumps(results, indent=1) + "\n")
    Path(f"{stem}.md").write_text(markdown(results))
    return stem


# --- the extrapolation ---------------------------------------------------------------------

FIT_FIGURES = (("peak_rss_mb", "peak RSS MB"), ("peak_anon_tree_mb", "anon MB"), ("cpu_s", "CPU s"),
               ("wall_s", "wall s"))


def linear_fit(sizes: list, values: list) -> tuple:
    """Least squares ``value = a + b·size`` (exact through two points); (a, b, worst relative residual)."""
    x, y = np.asarray(sizes, float), np.asarray(values, float)
    b, a = np.polyfit(x, y, 1)
    residual = np.abs(a + b * x - y) / np.maximum(np.abs(y), 1e-9)
    return float(a), float(b), float(residual.max())


def fit_main(argv: list) -> int:
    """``fit RESULTS.json ... [--at-gb 2.75 28]``: per run found in every file, each figure fitted
    as a + b·size (size in GB of the model), and its value at the ``--at-gb`` sizes, as Markdown."""
    parser = argparse.ArgumentParser(prog="measure_large_model.py fit")
    parser.add_argument("results", nargs="+", type=Path)
    parser.add_argument("--at-gb", nargs="+", type=float, default=[2.75, 28.0])
    args = parser.parse_args(argv)
    files = [json.loads(path.read_text()) for path in args.results]
    if len(files) < 2:
        print("error: fit needs results of at least two model sizes", file=sys.stderr)
        return 2
    sizes = [f["model_bytes"] / 1e9 for f in files]
    runs = [r["run"] for r in files[0]["rows"] if all(any(x["run"] == r["run"] for x in f["rows"]) for f in files)]
    at = " | ".join(f"at {gb:g} GB" for gb in args.at_gb)
    print(f"sizes (GB): {', '.join(f'{s:.4f}' for s in sizes)}\n")
    print(f"| run | figure | measured | a + b·GB | worst residual | {at} |")
    print("|---|---|---|---|---|" + "---|" * len(args.at_gb))
    for run in runs:
        rows = [next(x for x in f["rows"] if x["run"] == run) for f in files]
        if any(r["status"] != "ok" for r in rows):
            statuses = ", ".join(r["status"] for r in rows)
            print(f"| {run} | — | not ok in every file: {statuses} | | |" + " |" * len(args.at_gb))
            continue
        for key, label in FIT_FIGURES:
            values = [r.get(key) for r in rows]
            if any(v is None for v in values):
                continue
            a, b, worst = linear_fit(sizes, values)
            cells = " | ".join(f"{a + b * gb:,.0f}" for gb in args.at_gb)
            measured = ", ".join(f"{v:g}" for v in values)
            print(f"| {run} | {label} | {measured} | {a:.1f} + {b:.1f}·GB | {worst:.0%} | {cells} |")
    return 0


# --- the report ----------------------------------------------------------------------------

def _cell(value, spec: str = "") -> str:
    return "—" if value is None else format(value, spec)


def _line(row: dict, size: int) -> str:
    peak = row.get("peak_rss_mb")
    ratio = f"{peak * 2**20 / size:.2f}" if peak else "—"
    return (f"{row['run']:<24} {row['status']:<10} exit {row['exit']}  {_cell(row['wall_s'], '.1f')} s  "
            f"cpu {_cell(row.get('cpu_s'), '.1f')} s  "
            f"peak {_cell(peak, '.0f')} MB (×{ratio} model)  out {_cell(row.get('output_mb'))} MB  "
            f"cos {_cell(row.get('worst_cosine'), '.6f')}  {row.get('error') or row.get('drift_error') or ''}")


def markdown(results: dict) -> str:
    m, v, size = results["machine"], results["versions"], results["model_bytes"]
    cfg = results["config"]
    head = [f"# Large model: every pass and the anchors on one decoder ({size / 1e6:.1f} MB)", "",
            f"- Command: `{results['command']}`",
            f"- Started {results['started']}, finished {results['finished'] or '— (still running: rows so far)'}; "
            f"1-minute load "
            f"{results['load_average_before'][0]:.2f} before, {results['load_average_after'][0]:.2f} after "
            f"({m['logical_cpus']} logical CPUs, shared with other jobs).",
            f"- Model: `build_large_decoder.py` {', '.join(f'{k}={v_}' for k, v_ in cfg.items())}; "
            f"{size:,} bytes (.onnx + .data). Samples: 4 calibration, 2 held-out, shape {results['samples']['shape']}.",
            f"- Caps per child: RLIMIT_AS {results['caps']['mem_cap_gb']} GB, {results['caps']['time_cap_s']:.0f} s.",
            f"- Code: onnxslim_kit from `{results['code']}`; git {results['git'].get('commit')}.",
            f"- CPU: {m['model']}, flags {', '.join(m['flags'])}; " + ", ".join(f"{k} {x}" for k, x in v.items() if x),
            "- Peak RSS: the larger of the process tree's summed RSS (psutil, every 0.2 s) and the largest "
            "process's `ru_maxrss` (`anchors.measure`), in MB and as a multiple of the model's bytes; anon: the "
            "tree's peak anonymous RSS (RSS − file-backed/shared pages: mapped weights excluded). "
            "CPU s: user + system seconds of the tree (sampled likewise; on a shared machine the "
            "load-independent figure). Cosine: worst over outputs and the 2 held-out samples, vs the original, "
            "plain ORT (CPU, 1 thread).", "",
            "| run | status | exit | wall s | CPU s | peak RSS MB (tree / max proc) | anon MB | RSS ÷ model "
            "| output MB | ORT loads / runs | worst cosine | error (or notes) |", "|---" * 12 + "|"]
    body = []
    for r in results["rows"]:
        yes = {True: "yes", False: "no", None: "—"}
        notes = "notes: " + "; ".join(r["notes"]) if r.get("notes") else ""
        error = (r.get("error") or r.get("drift_error") or notes).replace("|", "\\|")[:160]
        body.append(f"| {r['run']} | {r['status']} | {r['exit']} | {_cell(r['wall_s'], '.1f')} | "
                    f"{_cell(r.get('cpu_s'), '.1f')} | "
                    f"{_cell(r['peak_rss_mb'], '.0f')} ({_cell(r['peak_rss_tree_mb'], '.0f')} / "
                    f"{_cell(r['ru_maxrss_mb'], '.0f')}) | {_cell(r.get('peak_anon_tree_mb'), '.0f')} | "
                    f"{_cell(r.get('rss_over_model'), '.2f')} | "
                    f"{_cell(r.get('output_mb'))} | {yes[r.get('loads')]} / {yes[r.get('runs')]} | "
                    f"{_cell(r.get('worst_cosine'), '.6f')} | {error} |")
    return "\n".join(head + body) + "\n"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
