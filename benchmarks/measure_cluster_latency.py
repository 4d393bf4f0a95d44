"""``fuse`` vs ``fuse,cluster(k=16)`` on the conv models of the suite: size, fidelity, latency, session time.

    python benchmarks/measure_cluster_latency.py                       # every conv model, 200 rounds
    python benchmarks/measure_cluster_latency.py --models ppocr_cls_v2 --runs 50 --suffix -cls

For each model: 16 calibration and 16 evaluation samples from ``inputs.py``; both pipelines
run in-process from the original (the cluster pipeline with the calibration samples as
``--calib``); then, on the evaluation samples, ORT graph optimisations ``all`` (as deployed:
the cluster decoder is folded when the session is created), 1 intra-op thread:

* latency: :func:`onnxslim_kit.bench.benchmark`, the two models interleaved run by run, in two
  blocks with the order swapped (fused first, then clustered first), so that a first-in-round
  advantage cancels; per block the median of the round-by-round ratios clustered / fused and
  their [P10, P90];
* session creation: ``--sessions`` sessions of each model, alternating, median seconds and the
  median of the paired ratios;
* with ``--control``, an A/A block: the fused model against a byte-identical copy, the same
  way — how far from 1 the ratio strays on this machine when nothing differs;
* whether the graphs ORT runs are the same: op types and initializer shapes of both models
  after ORT's optimisations (the decoder folded), compared as sorted lists;
* size (raw and zlib) vs the original file and vs the fused one; worst output cosine and the
  task metric of ``tasks.py`` (agreement with the fused model, which is the original up to
  float rounding) from the benchmark.

The load average (2 shared cores) is recorded before and after every model. Results:
``benchmarks/results/cluster-<UTC date>-s3<suffix>.md``, rewritten after every model.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import zlib
from datetime import datetime, timezone
from pathlib import Path

import inputs

HERE = Path(__file__).resolve().parent
CONV_MODELS = ["ppocrv4_det", "ppocrv4_rec", "ppocr_cls_v2", "orientation", "mtcnn_pnet", "mtcnn_onet", "silero_vad"]


def parse_args(argv: list) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="*", default=CONV_MODELS)
    parser.add_argument("--pipeline", default="fuse,cluster(k=16)", help="the clustered pipeline")
    parser.add_argument("--runs", type=int, default=200, help="timed interleaved rounds per block (default 200)")
    parser.add_argument("--sessions", type=int, default=10, help="session creations per model (default 10)")
    parser.add_argument("--calib", type=int, default=16)
    parser.add_argument("--eval", type=int, default=16)
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--suffix", default="", help="results file name suffix")
    parser.add_argument("--control", action="store_true",
                        help="also an A/A block: the fused model against a byte-identical copy (the noise floor)")
    return parser.parse_args(argv)


def sizes(path: Path) -> tuple:
    blob = path.read_bytes()
    return len(blob), len(zlib.compress(blob, 6))


def session_times(paths: list, count: int) -> list:
    """Seconds to create a session (opt all, 1 thread), ``count`` times per model, alternating."""
    from onnxslim_kit.runtime import make_session

    make_session(str(paths[0]), "all", 1)  # ORT's process-wide setup out of the timings
    times = [[] for _ in paths]
    for _ in range(count):
        for i, path in enumerate(paths):
            start = time.perf_counter()
            make_session(str(path), "all", 1)
            times[i].append(time.perf_counter() - start)
    return times


def optimized_structure(path: Path, tmp: Path) -> tuple:
    """Op types (with domains) and initializer shapes of the graph ORT runs (opt all, 1 thread),
    as sorted lists: equal for two models means the same kernels on weights of the same shapes."""
    import onnx
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    so.optimized_model_filepath = str(tmp / f"{path.stem}.optimized.onnx")
    ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    graph = onnx.load(so.optimized_model_filepath).graph
    ops = sorted(f"{n.domain}:{n.op_type}" for n in graph.node)
    shapes = sorted((t.data_type, tuple(t.dims)) for t in graph.initializer)
    return ops, shapes


def measure(model: str, args, tmp: Path) -> dict:
    import onnx

    from onnxslim_kit.bench import benchmark
    from onnxslim_kit.calibration import CalibrationFeed, input_specs
    from onnxslim_kit.model import load_proto
    from onnxslim_kit.pipeline import parse_pass_list, run_pipeline

    load_before = os.getloadavg()
    path = inputs.model_path(model)
    data = inputs.build(model, n_calib=args.calib, n_eval=args.eval, path=path)
    original = load_proto(path)
    fused, _ = run_pipeline(original, parse_pass_list("fuse"), CalibrationFeed(input_specs(original), data.calib))
    start = time.perf_counter()
    clustered, report = run_pipeline(original, parse_pass_list(args.pipeline),
                                     CalibrationFeed(input_specs(original), data.calib))
    seconds = time.perf_counter() - start
    paths = [tmp / f"{model}.fuse.onnx", tmp / f"{model}.cluster.onnx"]
    onnx.save(fused, paths[0])
    onnx.save(clustered, paths[1])
    blocks = []
    for order in ((0, 1), (1, 0)):
        bench = benchmark([str(paths[i]) for i in order], data.eval, names=[["fuse", "cluster"][i] for i in order],
                          runs=args.runs, warmup=10, metric=data.metric, memory=False)
        ratio, spread = bench.rows[1]["latency_ratio_vs_first"], bench.rows[1]["latency_ratio_spread"]
        if order[0] == 1:  # clustered first: invert to clustered / fused
            ratio, spread = 1 / ratio, [1 / spread[1], 1 / spread[0]]
        row = bench.rows[order.index(1)]
        blocks.append({"ratio": ratio, "spread": spread, "row": row,
                       "fused_ms": bench.rows[order.index(0)]["latency_ms"]["median"]})
    control = None
    if args.control:
        copy = tmp / f"{model}.fuse-copy.onnx"
        copy.write_bytes(paths[0].read_bytes())
        bench = benchmark([str(paths[0]), str(copy)], data.eval, names=["fuse", "fuse copy"], runs=args.runs,
                          warmup=10, memory=False)
        control = {"ratio": bench.rows[1]["latency_ratio_vs_first"], "spread": bench.rows[1]["latency_ratio_spread"]}
    first = blocks[0]["row"]  # fused is the reference in the first block: drift and agreement vs fused
    sessions = session_times(paths, args.sessions)
    structures = [optimized_structure(p, tmp) for p in paths]
    cluster = next((p for p in report.passes if p.name == "cluster"), None)
    return {
        "model": model, "seconds": round(seconds, 1), "load_before": load_before, "load_after": os.getloadavg(),
        "original": sizes(Path(path)), "fuse": sizes(paths[0]), "cluster": sizes(paths[1]),
        "cosine": min((d["cosine"] for d in (first.get("drift") or {}).values() if d), default=None),
        "top1": min((d["top1"] for d in (first.get("drift") or {}).values() if d and d.get("top1") is not None),
                    default=None),
        "metric": first.get("metric") or {}, "blocks": blocks,
        "session_s": [statistics.median(t) for t in sessions],
        "session_ratio": statistics.median(b / a for a, b in zip(*sessions)),
        "control": control, "same_graph": structures[0] == structures[1], "optimized_nodes": len(structures[1][0]),
        "metrics": cluster.metrics if cluster else {}, "notes": cluster.notes if cluster else [],
        "skipped": dict(cluster.skipped) if cluster else {},
    }


def fmt(value, digits: int = 4) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def render(results: list, args, command: str, date: datetime, commit: str) -> str:
    lines = [f"# cluster: size, fidelity, latency and session time, {date.isoformat(timespec='minutes')}", "",
             f"Command: `{command}`  ", f"Commit: `{commit}`  ",
             (f"{args.calib} calibration / {args.eval} evaluation samples (inputs.py); ORT opt all, 1 thread; "
              f"latency: 2 blocks × {args.runs} interleaved rounds (fused first, then clustered first), "
              f"median of round-by-round ratios clustered / fused [P10, P90]; {args.sessions} alternating "
              "session creations per model. 2 shared cores: load average (1, 5, 15 min) per model."), "",
             ("| model | size vs original (raw / zlib) | size vs fused (raw / zlib) | worst cosine vs fused "
              "| worst top-1 agreement (per position) | task "
              "| latency ratio block 1 | block 2 | A/A control | fused median ms | session s fused / clustered (paired ratio) "
              "| ORT-optimized graphs equal | load before → after | pipeline s |"),
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        o, f, c = r["original"], r["fuse"], r["cluster"]
        m = r["metric"]
        b1, b2 = r["blocks"]
        ctl = r.get("control")
        control = f"{ctl['ratio']:.4f} [{ctl['spread'][0]:.3f}, {ctl['spread'][1]:.3f}]" if ctl else "—"
        lines.append(
            f"| {r['model']} | {c[0] / o[0]:.4f} / {c[1] / o[1]:.4f} | {c[0] / f[0]:.4f} / {c[1] / f[1]:.4f} "
            f"| {r['cosine']:.5f} | {fmt(r.get('top1'))} | {m.get('task', '')}: {fmt(m.get('score'))} (ref {fmt(m.get('score_original'))}), "
            f"agreement {fmt(m.get('agreement'))} "
            f"| {b1['ratio']:.4f} [{b1['spread'][0]:.3f}, {b1['spread'][1]:.3f}] "
            f"| {b2['ratio']:.4f} [{b2['spread'][0]:.3f}, {b2['spread'][1]:.3f}] | {control} | {b1['fused_ms']:.2f} "
            f"| {r['session_s'][0]:.3f} / {r['session_s'][1]:.3f} ({r['session_ratio']:.3f}) "
            f"| {'yes' if r['same_graph'] else 'NO'} ({r['optimized_nodes']} nodes) "
            f"| {tuple(round(x, 2) for x in r['load_before'])} → {tuple(round(x, 2) for x in r['load_after'])} "
            f"| {r['seconds']} |")
    for r in results:
        lines += ["", f"## {r['model']}", "",
                  f"Bytes: original {r['original'][0]} (zlib {r['original'][1]}), fused {r['fuse'][0]} "
                  f"({r['fuse'][1]}), clustered {r['cluster'][0]} ({r['cluster'][1]}).", "",
                  f"cluster metrics: `{r['metrics']}`", "", f"skipped: `{r['skipped']}`", ""]
        lines += [f"- {n}" for n in r["notes"]]
    return "\n".join(lines) + "\n"


def main(argv: list | None = None) -> int:
    import subprocess

    args = parse_args(sys.argv[1:] if argv is None else argv)
    command = f"python benchmarks/{Path(__file__).name} {' '.join(sys.argv[1:] if argv is None else argv)}"
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=HERE).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "passes/cluster.py", "passes/_cluster_*",
                            "benchmarks/measure_cluster_latency.py"], capture_output=True, text=True,
                           cwd=HERE.parent).stdout.split()
    commit += f" (cluster files modified: {' '.join(dirty[1::2])})" if dirty else " (cluster files committed)"
    date = datetime.now(timezone.utc)
    args.out.mkdir(parents=True, exist_ok=True)
    target = args.out / f"cluster-{date.date().isoformat()}-s3{args.suffix}.md"
    results = []
    with tempfile.TemporaryDirectory(prefix="cluster-latency-") as tmp:
        for model in args.models:
            print(model, flush=True)
            results.append(measure(model, args, Path(tmp)))
            target.write_text(render(results, args, command, date, commit))  # after every model
            print(render(results, args, command, date, commit).split("\n")[7 + len(results)], flush=True)
    print(target)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
