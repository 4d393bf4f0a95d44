"""Measure ``svd`` and ``cluster`` on the real models of the suite: size, fidelity, task, latency.

    python benchmarks/measure_svd_cluster.py                          # the default cases below
    python benchmarks/measure_svd_cluster.py --cases "ppocrv4_det:fuse,cluster(k=16)" --runs 10
    python benchmarks/measure_svd_cluster.py --cases "minilm_l6:svd" --calib 32 --eval 32 --name svd-s2

For each ``model:pipeline`` case: calibration and evaluation samples from ``inputs.py`` (the
suite's own: 16 + 16 by default, different pages/lines/faces), the pipeline run in-process
with the calibration samples as ``--calib``, then :func:`onnxslim_kit.bench.benchmark` on the
evaluation samples — the original and the result interleaved run by run, 1 intra-op thread,
ORT graph optimizations ``all`` (as deployed: the cluster decoder is folded at load) — for
raw/zlib size, worst output cosine, the task metric of ``tasks.py`` and the paired latency
ratio. The pass's own notes (chosen k per layer, ranks) are copied into the results file,
``benchmarks/results/<--name>-<UTC date>.md``. Latency on a shared 2-core machine is noisy:
the ratio is a median of paired rounds and the load average is recorded.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import inputs

HERE = Path(__file__).resolve().parent
DEFAULT_CASES = [
    "ppocrv4_det:fuse,cluster(k=16)",
    "ppocr_cls_v2:fuse,cluster(k=16)",
    "ppocr_cls_v2:fuse,cluster(k=16,min_size=128)",
    "orientation:fuse,cluster(k=16)",
    "mtcnn_onet:fuse,cluster(k=16)",
    "mtcnn_onet:fuse,cluster(k=16,encode=dense,grid=channel),int8",
]


def parse_args(argv: list) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="*", default=DEFAULT_CASES, help="model:pipeline pairs")
    parser.add_argument("--calib", type=int, default=16, help="calibration samples (default 16)")
    parser.add_argument("--eval", type=int, default=16, help="evaluation samples (default 16)")
    parser.add_argument("--runs", type=int, default=15, help="timed interleaved rounds (default 15)")
    parser.add_argument("--out", type=Path, default=HERE / "results", help="results folder")
    parser.add_argument("--name", default="svd_cluster", help="results file stem (default svd_cluster)")
    parser.add_argument("--append", action="store_true", help="add to today's results file instead of replacing it")
    return parser.parse_args(argv)


def measure(model: str, pipeline: str, args) -> dict:
    from onnxslim_kit.bench import benchmark
    from onnxslim_kit.calibration import CalibrationFeed, input_specs
    from onnxslim_kit.model import load_proto
    from onnxslim_kit.pipeline import parse_pass_list, run_pipeline

    path = inputs.model_path(model)
    data = inputs.build(model, n_calib=args.calib, n_eval=args.eval, path=path)
    original = load_proto(path)
    start = time.perf_counter()
    out, report = run_pipeline(original, parse_pass_list(pipeline), CalibrationFeed(input_specs(original), data.calib))
    seconds = time.perf_counter() - start
    bench = benchmark([original, out], data.eval, names=["original", pipeline], runs=args.runs, warmup=3,
                      metric=data.metric, memory=False)
    base, row = bench.rows
    row["size_ratio"] = row["size_bytes"] / base["size_bytes"]
    row["zlib_ratio"] = row["size_compressed_bytes"] / base["size_compressed_bytes"]
    row["macs_ratio"] = row["macs"] / base["macs"] if base.get("macs") else None
    return {"model": model, "pipeline": pipeline, "seconds": round(seconds, 1), "row": row,
            "passes": [(p.name, p.metrics, p.notes) for p in report.passes if p.name in ("svd", "cluster", "int8")]}


def summary_line(result: dict) -> str:
    row = result["row"]
    drift = {k: d for k, d in (row.get("drift") or {}).items() if d}
    cosines = [d["cosine"] for d in drift.values()]
    per_output = ", ".join(f"{k} {fmt(d['cosine'])}" for k, d in drift.items()) if len(drift) > 1 else ""
    metric = row.get("metric") or {}
    return (f"| {result['model']} | `{result['pipeline']}` | {fmt(row['size_ratio'])} raw, {fmt(row['zlib_ratio'])} "
            f"zlib | {fmt(row['macs_ratio'])} | {fmt(min(cosines) if cosines else None)}{' (' + per_output + ')' if per_output else ''} | "
            f"{metric.get('task', '')}: {fmt(metric.get('score'))} (orig {fmt(metric.get('score_original'))}), "
            f"agreement {fmt(metric.get('agreement'))} | {fmt(row.get('latency_ratio_vs_first'))} "
            f"(spread {fmt(row.get('latency_ratio_spread'))}) | {result['seconds']} |")


def fmt(value) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k} {fmt(v)}" for k, v in value.items())
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 10 else f"{value:.1f}"
    return "" if value is None else str(value)


def render(results: list, args, command: str, load_before: tuple, date: datetime) -> str:
    lines = [f"# svd / cluster measurements, {date.isoformat(timespec='minutes')}", "",
             f"Command: `{command}`",
             f"Load average before / now: {load_before} / {os.getloadavg()} (2 shared cores: latency is noisy).",
             (f"{args.calib} calibration / {args.eval} evaluation samples (inputs.py), ORT opt all, 1 thread, "
              f"{args.runs} interleaved rounds."), "",
             ("| model | pipeline | size vs original | MACs vs original | worst output cosine | task | latency ratio "
              "| pipeline s |"),
             "|---|---|---|---|---|---|---|---|"]
    lines += [summary_line(r) for r in results]
    kept = ("size_bytes", "size_compressed_bytes", "nodes", "macs", "latency_ms")
    for r in results:
        row = {k: v for k, v in r["row"].items() if k in kept}
        lines += ["", f"## {r['model']}: `{r['pipeline']}`", "", f"Row: `{row!r}`"]
        for name, metrics, notes in r["passes"]:
            lines += ["", f"{name}: `{metrics}`", ""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def main(argv: list | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    command = f"python benchmarks/{Path(__file__).name} {' '.join(sys.argv[1:] if argv is None else argv)}"
    load_before, date = os.getloadavg(), datetime.now(timezone.utc)
    args.out.mkdir(parents=True, exist_ok=True)
    target = args.out / f"{args.name}-{date.date().isoformat()}.md"
    earlier = target.read_text() + "\n" if args.append and target.exists() else ""
    results = []
    for case in args.cases:
        model, pipeline = case.split(":", 1)
        print(f"{model}: {pipeline}", flush=True)
        results.append(measure(model, pipeline, args))
        print("  " + summary_line(results[-1]), flush=True)
        target.write_text(earlier + render(results, args, command, load_before, date))  # after every case
    print(target)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
