"""``int8`` with nearest rounding against ``int8(rounding=adaround)`` (issue 14), one model at a time.

    flock /tmp/bench.lock python benchmarks/measure_adaround.py --models mtcnn_onet,ppocrv4_det --calib 32

Per model (samples from ``inputs.py``; calibration and evaluation sets disjoint):

1. ``fuse``, ``fuse,int8`` and ``fuse,int8(rounding=adaround)`` (``--pipelines`` replaces the
   two int8 ones), each through our CLI in a measured child process (``run_suite.run_pipeline``:
   wall time and peak RSS, interpreter and imports included); the int8 report entry gives the
   layers left on static int8 / on a fallback rung (``dynamic``, ``weights``) / float, the pass's
   own seconds, the budget used on the held-out calibration samples and the adaround metrics;
2. ONE interleaved :func:`onnxslim_kit.bench.benchmark` of [original, every variant] on the
   evaluation samples, ORT optimizations on, 1 intra-op thread (run the script under ``flock
   /tmp/bench.lock``): latency × original (median of per-round ratios, P10–P90), the per-view
   fidelity (:func:`onnxslim_kit.fidelity.judge`, worst evaluation sample);
3. per variant, what ORT executes (``measure_int8_floor.runs_int8``: share of MACs in int8 kernels).

Writes ``results/<--name>.md`` and ``.json`` (rewritten after every model, so a partial run
keeps what it measured). Shared 2-core machine: the load average is recorded per model.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import inputs
import measure_int8_floor as floor
import run_suite

HERE = Path(__file__).resolve().parent
PIPELINES = ["fuse,int8", "fuse,int8(rounding=adaround)"]


def parse_args(argv: list) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="mtcnn_onet,ppocrv4_det,ppocrv4_rec,yolov8n_doclaynet")
    parser.add_argument("--pipelines", nargs="*", default=PIPELINES)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--calib", type=int, default=32)
    parser.add_argument("--eval", type=int, default=16)
    parser.add_argument("--tool-timeout", type=float, default=1800.0)
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--name", default="int8-adaround-" + datetime.now(timezone.utc).strftime("%Y-%m-%d"))
    return parser.parse_args(argv)


def int8_entry(output: str | None) -> dict:
    """The int8 pass's entry of a produced model's report (empty when none)."""
    report = Path(output).with_suffix(".report.json") if output else None
    if report is None or not report.is_file():
        return {}
    entries = [e for e in json.loads(report.read_text()).get("passes", []) if e["name"].startswith("int8")]
    return entries[-1] if entries else {}


METRICS = ("layers_int8", "layers_dynamic", "layers_weights", "layers_float", "budget_used", "budget_allowed",
           "seconds_calibration", "seconds_adaround", "seconds_bias_correction", "seconds_fallback",
           "adaround_layers", "adaround_channels", "adaround_error_ratio")


def produce(name: str, args, work: Path) -> tuple:
    """``(source model, samples, {pipeline: tool row})``: every pipeline run through the CLI."""
    src = inputs.model_path(name)
    data = inputs.build(name, n_calib=args.calib, n_eval=args.eval, path=src)
    tools, npz = {}, run_suite.save_calib(data.calib, work / f"{name}.calib.npz")
    for i, pipeline in enumerate(["fuse", *args.pipelines]):
        row = tools[pipeline] = run_suite.run_pipeline(pipeline, src, work / f"{name}.{i}.onnx", npz, args.tool_timeout)
        run_suite.log(f"  {name} {pipeline}: {run_suite.status(row)}")
    return src, data, tools


def measure_model(name: str, args, work: Path) -> dict:
    from onnxslim_kit.bench import benchmark

    start, record = time.perf_counter(), {"model": name, "load_before": [round(x, 2) for x in os.getloadavg()]}
    src, data, tools = produce(name, args, work)
    paths = {"original": src, **{p: Path(row["output"]) for p, row in tools.items() if row["output"]}}
    report = benchmark(list(paths.values()), data.eval, names=list(paths), threads=(1,), runs=args.runs,
                       warmup=args.warmup, opt_level="all", metric=data.metric, memory=False)
    rows, produced = {row["name"]: row for row in report.rows}, list(paths)[1:]
    record.update(bench_settings=report.settings, variants={})
    for pipeline, tool in tools.items():
        entry = {"tool": {k: tool.get(k) for k in ("error", "notes", "wall_seconds", "peak_rss_mb")}}
        pass_entry = int8_entry(tool.get("output"))
        if pass_entry:
            entry["int8"] = {"seconds": round(pass_entry.get("seconds", 0.0), 1),
                             **{k: pass_entry["metrics"][k] for k in METRICS if k in pass_entry.get("metrics", {})},
                             "notes": pass_entry.get("notes", [])}
        if pipeline in produced:
            row = rows.get(pipeline) or {}
            entry.update(x_original=row.get("latency_ratio_vs_first"), spread=row.get("latency_ratio_spread"),
                         views=row.get("views"), worst_cos=floor.min_cosine(row.get("views")),
                         metric=row.get("metric"), runs=floor.runs_int8(Path(tool["output"]), data.eval[0]))
        record["variants"][pipeline] = entry
    record["load_after"] = [round(x, 2) for x in os.getloadavg()]
    record["seconds"] = round(time.perf_counter() - start, 1)
    return record


HEADER = ["pipeline", "static int8 / dynamic / weights / float layers", "MACs in int8 kernels",
          "worst cos (eval)", "views (worst eval sample)", "task (vs original)", "budget used (held-out)",
          "× original (P10–P90)", "int8 pass s (adaround s)", "tool s", "tool peak MB", "fit error ratio"]


def cells(pipeline: str, entry: dict) -> list:
    tool, q = entry["tool"], entry.get("int8", {})
    if tool["error"] or "x_original" not in entry:
        return [pipeline, f"failed: {(tool['error'] or '').replace('|', '/')}"] + [""] * (len(HEADER) - 2)
    layers = "/".join(str(q.get(k, "—")) for k in ("layers_int8", "layers_dynamic", "layers_weights", "layers_float"))
    share = (entry.get("runs") or {}).get("int8_mac_share")
    spread = entry.get("spread")
    return [pipeline, layers if q else "—", f"{share * 100:.1f}%" if share is not None else "—",
            floor.fmt(entry["worst_cos"], ".4f"),
            "; ".join(f"{k}: {v}" for k, v in floor.worst_views(entry.get("views")).items()),
            floor.task_text(entry.get("metric")),
            f"{q['budget_used']:.3f}/{q['budget_allowed']:.2f}" if "budget_used" in q else "—",
            floor.fmt(entry["x_original"]) + (f" ({spread[0]:.2f}–{spread[1]:.2f})" if spread else ""),
            (f"{q['seconds']:.1f}" + (f" ({q['seconds_adaround']:.1f})" if "seconds_adaround" in q else "")) if q else "—",
            floor.fmt(tool["wall_seconds"], ".1f"), floor.fmt(tool["peak_rss_mb"], ".0f"),
            str(q.get("adaround_error_ratio", "—"))]


def markdown(results: dict) -> str:
    lines = [f"# int8: nearest vs AdaRound weight rounding — {results['started']}", "", f"`{results['command']}`", "",
             f"Machine: {results['machine']}. Calibration {results['calib']} samples (the pass holds out every "
             f"4th to judge its target), evaluation {results['eval']} other samples. One interleaved bench per model, "
             "ORT optimizations on, 1 intra-op thread. MACs in int8 kernels: `onnxslim_kit.executed` on ORT's "
             "optimized graph. Views: `onnxslim_kit.fidelity.judge` per output view, worst evaluation sample. "
             "Tool s / MB: one measured child process (imports included); int8 pass s from its report. Fit error "
             "ratio: Σ over the rounded layers of the weight-rounding output error on the fit rows, adaround / "
             "nearest.", ""]
    for name, rec in results["models"].items():
        lines += [f"## {name}", "", f"load average {rec['load_before']} → {rec['load_after']}; {rec['seconds']} s", "",
                  "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
        lines += ["| " + " | ".join(c.replace("|", "/") for c in cells(p, e)) + " |" for p, e in rec["variants"].items()]
        lines.append("")
    return "\n".join(lines)


def main(argv: list | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    results = {"started": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M+00:00"),
               "command": "python benchmarks/measure_adaround.py " + shlex.join(argv),
               "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} logical CPUs (shared)",
               "calib": args.calib, "eval": args.eval, "models": {}}
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"{args.name}.json"
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            run_suite.log(f"{name}:")
            results["models"][name] = measure_model(name, args, Path(tmp))
            out.write_text(json.dumps(results, indent=1, default=str) + "\n")
            out.with_suffix(".md").write_text(markdown(results) + "\n")
    print(f"wrote {out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
