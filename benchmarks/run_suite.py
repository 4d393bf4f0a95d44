"""The benchmark suite: our pipelines and the other tools on real models, side by side.

    python benchmarks/run_suite.py                                   # everything (≈ 20–30 min here)
    python benchmarks/run_suite.py --models mtcnn_onet --pipelines fuse --anchors onnxslim --runs 3
    python benchmarks/run_suite.py --pipelines fuse "fuse,int8" "fuse,prune(ratio=0.3)"

Per model (``inputs.py`` makes its calibration and evaluation samples):

1. every pipeline of ``--pipelines`` runs through our CLI (``python -m onnxslim_kit MODEL
   --passes P --calib calib.npz``) and every anchor of ``--anchors`` through ``anchors.py``,
   each in a child process whose wall time and peak memory are measured the same way
   (:func:`anchors.measure`); a pass that is not registered, a tool that fails, a model ORT
   will not load — each is a row with the reason, never a crash;
2. :func:`onnxslim_kit.bench.benchmark` measures the original and every result together on
   the evaluation samples, interleaved run by run, 1 intra-op thread by default, once per
   ``--opt-levels`` (ORT graph optimizations ``all`` — as deployed — and ``disable``):
   nodes, size (raw and zlib), latency and the paired latency ratio vs the original,
   fidelity (cosine / max abs / top-1 per output, worst case over samples) and the task
   metric of ``tasks.py``;
3. writes ``results/<date>.md`` and ``.json`` (``suite_report.py``) with the exact command,
   package versions, CPU, thread settings and the machine's load while it ran.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

import anchors
import inputs
import suite_report

HERE = Path(__file__).resolve().parent


def parse_args(argv: list) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(inputs.MODELS),
                        help=f"comma list (default: all: {','.join(inputs.MODELS)})")
    parser.add_argument("--pipelines", nargs="*", default=["fuse"],
                        help='our pipelines, each a --passes value: fuse "fuse,int8" "fuse,prune(ratio=0.3)"')
    parser.add_argument("--anchors", default=",".join(anchors.ANCHORS),
                        help=f"comma list of other tools, or none (default: {','.join(anchors.ANCHORS)})")
    parser.add_argument("--runs", type=int, default=30, help="timed rounds per opt level (default 30)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed rounds first (default 3)")
    parser.add_argument("--calib", type=int, default=16, help="calibration samples per model (default 16)")
    parser.add_argument("--eval", type=int, default=16, help="evaluation samples per model (default 16)")
    parser.add_argument("--opt-levels", default="all,disable",
                        help="ORT graph optimization levels (default all,disable)")
    parser.add_argument("--threads", type=int, default=1, help="ORT intra-op threads (default 1)")
    parser.add_argument("--no-memory", action="store_true", help="skip the per-model peak-memory child runs")
    parser.add_argument("--tool-timeout", type=float, default=900.0, help="seconds per tool run (default 900)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated inputs (default 0)")
    parser.add_argument("--out", type=Path, default=HERE / "results",
                        help="results folder (default benchmarks/results)")
    parser.add_argument("--name", help="results file stem (default: today's UTC date)")
    parser.add_argument("--work", type=Path, help="keep the produced models here (default: a temp folder)")
    return parser.parse_args(argv)


# --- producing the variants --------------------------------------------------------------

def save_calib(samples: list, path: Path) -> Path:
    """Samples stacked along a new axis 0 per input (the format of our --calib and NpzReader)."""
    np.savez(path, **{name: np.stack([s[name] for s in samples]) for name in samples[0]})
    return path


def unregistered_passes(pipeline: str) -> list:
    """Names in ``pipeline`` that no registered pass has (empty: all known)."""
    from onnxslim_kit.pipeline import available_passes, parse_pass_list

    known = available_passes()
    return [spec.name for spec in parse_pass_list(pipeline) if spec.name not in known]


def run_pipeline(pipeline: str, src: Path, dst: Path, calib: Path, timeout: float) -> dict:
    """Our CLI on ``src`` in a measured child process; a row like :func:`anchors.run_anchor`'s."""
    row = anchors.new_row(f"ours: {pipeline}")
    try:
        missing = unregistered_passes(pipeline)
    except Exception as exc:  # noqa: BLE001 - a broken pass registry is a row, not a crash
        missing, row["error"] = [], f"pass registry: {type(exc).__name__}: {exc}"
    if missing:
        row["error"] = f"pass {', '.join(map(repr, missing))} is not registered yet"
    if row["error"]:
        return row
    report = dst.with_suffix(".report.json")
    report.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "onnxslim_kit", str(src), "--passes", pipeline, "-o", str(dst), "--calib", str(calib),
           "--report", str(report), "-q"]
    anchors.run_tool(row, cmd, dst, timeout).pop("stdout")
    if report.is_file():
        for entry in json.loads(report.read_text()).get("passes", []):
            if entry.get("rolled_back"):
                row["notes"].append(f"{entry['name']}: rolled back by verification")
            check = entry.get("verification") or {}
            if check.get("status") not in (None, "ok", "drift"):
                row["notes"].append(f"{entry['name']}: verification {check['status']}: {check.get('message', '')}")
    return row


def produce(name: str, src: Path, calib: Path, work: Path, args) -> list:
    """Every pipeline's and anchor's output for one model, as tool rows."""
    rows = []
    for pipeline in args.pipelines:
        slug = "".join(c if c.isalnum() else "_" for c in pipeline)
        rows.append(run_pipeline(pipeline, src, work / f"{name}.ours_{slug}.onnx", calib, args.tool_timeout))
        rows[-1]["variant"] = f"ours:{pipeline}"
        log(f"  {rows[-1]['variant']:<28} {status(rows[-1])}")
    for tool in args.anchor_list:
        rows.append(anchors.run_anchor(tool, src, work / f"{name}.{tool}.onnx", calib, args.tool_timeout))
        rows[-1]["variant"] = tool
        log(f"  {tool:<28} {status(rows[-1])}")
    return rows


# --- measuring them ----------------------------------------------------------------------

def measure_variants(src: Path, tool_rows: list, data, args) -> dict:
    """``{opt level: BenchReport rows}`` for the original + every variant that was produced."""
    from onnxslim_kit.bench import benchmark

    produced = [r for r in tool_rows if r["output"]]
    models = [src] + [Path(r["output"]) for r in produced]
    names = ["original"] + [r["variant"] for r in produced]
    groups = {}
    for i, level in enumerate(args.opt_level_list):
        start = time.perf_counter()
        report = benchmark(models, data.eval, names=names, threads=(args.threads,), runs=args.runs,
                           warmup=args.warmup, opt_level=level, metric=data.metric,
                           memory=not args.no_memory and i == 0)
        groups[level] = {"rows": report.rows, "settings": report.settings,
                         "seconds": round(time.perf_counter() - start, 1)}
        log(f"  measured {len(models)} models, ORT opt {level}: {groups[level]['seconds']} s")
    return groups


def status(row: dict) -> str:
    took = f"{row['wall_seconds']} s, {row['peak_rss_mb']} MB" if row.get("wall_seconds") is not None else ""
    return f"error: {row['error']}" if row["error"] else f"ok ({took})"


def log(message: str) -> None:
    print(message, flush=True)


def source(name: str) -> dict:
    """Where the model comes from: the pinned wheel and sha256, or how MiniLM was exported."""
    if name == "minilm_l6":
        import export_minilm

        return {"requirement": export_minilm.REQUIREMENT, "exported_with": export_minilm.TORCH_REQUIREMENT,
                "opset": export_minilm.OPSET}
    from onnxslim_kit.zoo import MODELS

    zoo = MODELS[name]
    return {"requirement": zoo.requirement, "member": zoo.member, "sha256": zoo.sha256}


def run_model(name: str, args, work_root: Path) -> dict:
    """Everything about one model: inputs, tool rows, benchmark groups (or the reason it was skipped)."""
    record = {"model": name, "started_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "load_before": os.getloadavg()}
    try:
        src = inputs.model_path(name)
    except Exception as exc:  # noqa: BLE001 - e.g. torch missing for MiniLM: a skipped model, not a crash
        record["skipped"] = f"{type(exc).__name__}: {exc}"
        log(f"{name}: skipped ({record['skipped']})")
        return record
    log(f"{name}: {src}")
    data = inputs.build(name, n_calib=args.calib, n_eval=args.eval, seed=args.seed, path=src)
    work = work_root / name
    work.mkdir(parents=True, exist_ok=True)
    calib = save_calib(data.calib, work / "calib.npz")
    record.update({"path": str(src), "source": source(name), "inputs": {k: [list(np.shape(v)), str(np.asarray(v).dtype)]
                                                for k, v in data.eval[0].items()},
                   "calib_samples": len(data.calib), "eval_samples": len(data.eval), "input_notes": data.notes})
    record["tools"] = produce(name, src, calib, work, args)
    record["groups"] = measure_variants(src, record["tools"], data, args)
    record["load_after"] = os.getloadavg()
    return record


def main(argv: list | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    args.model_list = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in args.model_list if m not in inputs.MODELS]
    if unknown:
        print(f"unknown model(s) {', '.join(unknown)}; models: {', '.join(inputs.MODELS)}", file=sys.stderr)
        return 2
    args.anchor_list = [] if args.anchors.strip() in ("", "none") else [a.strip() for a in args.anchors.split(",")]
    bad = [a for a in args.anchor_list if a not in anchors.ANCHORS]
    if bad:
        print(f"unknown anchor(s) {', '.join(bad)}; anchors: {', '.join(anchors.ANCHORS)}", file=sys.stderr)
        return 2
    args.opt_level_list = [o.strip() for o in args.opt_levels.split(",") if o.strip()]
    given = sys.argv[1:] if argv is None else argv
    command = "python benchmarks/run_suite.py " + " ".join(shlex.quote(a) for a in given)
    started = datetime.now(timezone.utc)
    with tempfile.TemporaryDirectory(prefix="slim-suite-") as tmp:
        work_root = args.work or Path(tmp)
        records = [run_model(name, args, work_root) for name in args.model_list]
    finished = datetime.now(timezone.utc)
    results = suite_report.assemble(records, args, command, started, finished)
    md, js = suite_report.write(results, args.out, args.name or started.strftime("%Y-%m-%d"))
    log(f"wrote {md} and {js}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
