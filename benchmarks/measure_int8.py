"""``int8`` against ONNX Runtime's ``quantize_static`` on the same samples, one model at a time.

    python benchmarks/measure_int8.py --models ppocrv4_det,ppocr_cls_v2 --runs 20
    python benchmarks/measure_int8.py --models ppocr_cls_v2 --pipelines "fuse,int8" "fuse,int8(speed_check=false)"

Per model (samples from ``inputs.py``, as ``run_suite.py`` makes them):

1. every ``--pipelines`` entry through our CLI and ``quantize_static`` (``anchors.py``'s
   ``ort_static``: QDQ, per-channel int8 weights, uint8 activations, min-max), each in a
   measured child process (:func:`anchors.measure`: wall time and peak RSS of that process,
   interpreter and imports included), ``--repeats`` times alternating, medians reported;
   the *calibration phase* separately: ours from the int8 report (``seconds_calibration``:
   SmoothQuant channel peaks, activation histograms and ranges — not the bias correction
   or the fallback search, reported beside it), theirs timed inside the same
   ``quantize_static`` run, from ``create_calibrator`` (augmented model, session) to the end
   of ``compute_data`` (``collect_data`` over the same samples in between), by wrapping
   ORT's ``create_calibrator`` in the child (:func:`timed_ort_static`);
2. :func:`onnxslim_kit.bench.benchmark` on the evaluation samples, ORT optimizations on,
   1 intra-op thread, models interleaved round by round: latency ratio vs fp32 (median of
   per-round ratios, P10–P90), worst cosine over outputs and samples, the task metric;
3. our ``int8`` report (layers kept float, search builds and runs, notes) next to it.

Writes ``results/int8-<date>.md``. Numbers on this shared 2-core machine are noisy: the
tool times depend on the load of the other engineers' jobs (printed with the table).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import anchors
import inputs
import numpy as np
import run_suite

HERE = Path(__file__).resolve().parent


def parse_args(argv: list) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="ppocrv4_det,ppocrv4_rec,ppocr_cls_v2,orientation")
    parser.add_argument("--pipelines", nargs="*", default=["fuse,int8"])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--calib", type=int, default=16)
    parser.add_argument("--eval", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=1, help="tool runs each (median wall time and memory)")
    parser.add_argument("--no-anchor", action="store_true", help="skip quantize_static")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--name", help="file stem (default int8-<UTC date>)")
    return parser.parse_args(argv)


def int8_entry(row: dict) -> dict:
    """Our report's int8 entry for a produced model (empty for anchors)."""
    report = Path(row["output"] or "").with_suffix(".report.json") if row.get("output") else None
    if report is None or not report.is_file():
        return {}
    entries = [e for e in json.loads(report.read_text()).get("passes", []) if e["name"].startswith("int8")]
    return entries[-1] if entries else {}


def measure_model(name: str, args, work: Path) -> list:
    """Rows ``{variant, tool, bench, int8}`` for one model."""
    from onnxslim_kit.bench import benchmark

    src = inputs.model_path(name)
    data = inputs.build(name, n_calib=args.calib, n_eval=args.eval, path=src)
    calib = run_suite.save_calib(data.calib, work / f"{name}.calib.npz")
    runners = {}
    for pipeline in args.pipelines:
        slug = "".join(c if c.isalnum() else "_" for c in pipeline)
        dst = work / f"{name}.{slug}.onnx"
        runners[f"ours: {pipeline}"] = lambda p=pipeline, d=dst: run_suite.run_pipeline(p, src, d, calib, 900)
    if not args.no_anchor:
        dst = work / f"{name}.ort_static.onnx"
        runners["quantize_static"] = lambda d=dst: run_ort_static(src, d, calib)
    runs = {variant: [] for variant in runners}
    for _ in range(max(1, args.repeats)):  # tools alternate, so the load of the machine hits all alike
        for variant, runner in runners.items():
            runs[variant].append(runner())
            print(f"  {name} {variant}: {run_suite.status(runs[variant][-1])}", flush=True)
    tools = [median_row(variant, rows) for variant, rows in runs.items()]
    produced = [r for r in tools if r["output"]]
    report = benchmark([src] + [Path(r["output"]) for r in produced], data.eval,
                       names=["fp32"] + [r["variant"] for r in produced], threads=(1,), runs=args.runs,
                       warmup=args.warmup, opt_level="all", metric=data.metric, memory=False)
    bench = {row["name"]: row for row in report.rows}
    rows = [{"variant": "fp32", "tool": None, "bench": bench["fp32"], "int8": {}}]
    rows += [{"variant": r["variant"], "tool": r, "bench": bench.get(r["variant"], {}), "int8": int8_entry(r)}
             for r in tools]
    return rows


def timed_ort_static(src: Path, dst: Path, calib: Path) -> dict:
    """``anchors``' quantize_static run, with its calibration phase timed (run in the child).

    ORT's ``create_calibrator`` is wrapped: the clock starts when quantize_static calls it
    and stops when the calibrator's ``compute_data`` returns."""
    import importlib
    import time

    ort_quantize = importlib.import_module("onnxruntime.quantization.quantize")  # the module, not the function

    phase = {}
    create = ort_quantize.create_calibrator

    def timed_create(*args, **kwargs):
        phase["start"] = time.perf_counter()
        calibrator = create(*args, **kwargs)
        compute = calibrator.compute_data

        def timed_compute():
            out = compute()
            phase["seconds"] = time.perf_counter() - phase["start"]
            return out

        calibrator.compute_data = timed_compute
        return calibrator

    ort_quantize.create_calibrator = timed_create
    notes = []
    anchors._ort_static(Path(src), Path(dst), Path(calib), notes)
    return {"notes": notes, "seconds_calibration": phase.get("seconds")}


def run_ort_static(src: Path, dst: Path, calib: Path) -> dict:
    """quantize_static as ``anchors.run_anchor("ort_static")`` runs it (measured child), plus
    its calibration phase's wall time (:func:`timed_ort_static`)."""
    row = anchors.new_row("ort_static")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--ort-static-child", str(Path(src).resolve()),
           str(Path(dst).resolve()), str(Path(calib).resolve())]
    anchors.run_tool(row, cmd, Path(dst), 900)
    try:
        info = json.loads(row.pop("stdout").strip().splitlines()[-1])
        row["notes"], row["seconds_calibration"] = info["notes"], info["seconds_calibration"]
    except (IndexError, ValueError, KeyError):
        pass
    return row


def median_row(variant: str, rows: list) -> dict:
    """The last run's row with the median wall time and peak memory of all runs."""
    row = {**rows[-1], "variant": variant}
    ok = [r for r in rows if not r["error"]]
    for row_ in rows:  # ours: the calibration phase from the int8 report
        row_.setdefault("seconds_calibration", int8_entry(row_).get("metrics", {}).get("seconds_calibration"))
    for key in ("wall_seconds", "peak_rss_mb", "seconds_calibration"):
        values = [r[key] for r in ok if r[key] is not None]
        row[key] = float(np.median(values)) if values else row.get(key)
        row[key + "_all"] = values
    return row


def cells(row: dict, fp32: dict) -> list:
    bench, tool, entry = row["bench"], row["tool"], row["int8"]
    if tool and tool["error"]:
        return [row["variant"], f"failed: {tool['error']}"] + [""] * (len(HEADER) - 2)
    drift = bench.get("drift") or {}
    cos = min((d["cosine"] for d in drift.values() if d), default=None) if tool else None
    metric = bench.get("metric") or {}
    ratio, spread = bench.get("latency_ratio_vs_first"), bench.get("latency_ratio_spread")
    size = bench.get("size_bytes", 0) / max(1, fp32.get("size_bytes", 1))
    metrics = entry.get("metrics", {})
    rungs = "".join(f" / {metrics[f'layers_{r}']} {r}" for r in ("dynamic", "weights") if metrics.get(f"layers_{r}"))
    search = (f"{metrics.get('layers_float', 0)} float / {metrics.get('layers_int8', 0)} int8{rungs}, "
              f"{metrics.get('fallback_builds', 0)} builds" if metrics else "")
    phases = ", ".join(f"{label} {metrics[key]:.1f}" for label, key in
                       (("bias corr.", "seconds_bias_correction"), ("fallback", "seconds_fallback")) if key in metrics)
    phases = f"; s: {phases}" if phases else ""
    calib_s = tool.get("seconds_calibration") if tool else None
    notes = "; ".join(entry.get("notes", [])[:2])
    return [row["variant"],
            "reference" if tool is None else (f"{cos:.4f}" if cos is not None else "—"),
            f"{metric.get('score', float('nan')):.3f}" + (f" (agree {metric['agreement']:.2f})"
                                                          if metric.get("agreement") is not None else ""),
            f"{ratio:.2f}× ({spread[0]:.2f}–{spread[1]:.2f})" if ratio and spread and tool else "1.00×",
            f"{size:.2f}×",
            (f"{tool['wall_seconds']:.1f}" + (f" ({', '.join(f'{v:.0f}' for v in tool['wall_seconds_all'])})"
                                               if len(tool["wall_seconds_all"]) > 1 else "")) if tool else "",
            f"{calib_s:.1f}" if calib_s is not None else "",
            f"{tool['peak_rss_mb']:.0f}" if tool else "",
            search + phases, notes.replace("|", "/")]


HEADER = ["variant", "worst cos", "task (vs labels)", "latency × fp32 (P10–P90)", "size × fp32", "tool s",
          "calibration s", "tool peak MB", "int8 layers", "notes"]


def markdown(results: dict, command: str) -> str:
    intro = ("ORT CPU, 1 intra-op thread, optimizations on, models interleaved; latency ratio = median of "
             "per-round ratios. Tool time and peak memory: one child process each (interpreter and imports "
             "included). Calibration s: ours = SmoothQuant peaks + activation ranges (int8 report); "
             "quantize_static = create_calibrator → collect_data → compute_data inside its run. "
             "Shared 2-core machine: noisy, especially tool times (load average below).")
    lines = [f"# int8 vs quantize_static — {results['started']}", "", f"`{command}`", "", intro, ""]
    for name, rows in results["models"].items():
        lines += [f"## {name}", "", f"load average before: {results['load'][name]}", "",
                  "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
        fp32 = rows[0]["bench"]
        lines += ["| " + " | ".join(cells(r, fp32)) + " |" for r in rows]
        lines.append("")
    return "\n".join(lines)


def main(argv: list | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--ort-static-child"]:  # SRC DST NPZ: the measured quantize_static child
        print(json.dumps(timed_ort_static(*map(Path, argv[1:4]))))
        return 0
    args = parse_args(argv)
    command = "python benchmarks/measure_int8.py " + " ".join(shlex.quote(a) for a in argv)
    started = datetime.now(timezone.utc)
    results = {"started": started.isoformat(timespec="minutes"), "models": {}, "load": {}}
    with tempfile.TemporaryDirectory(prefix="int8-measure-") as tmp:
        for name in [m.strip() for m in args.models.split(",") if m.strip()]:
            results["load"][name] = tuple(round(x, 1) for x in os.getloadavg())
            print(name, flush=True)
            results["models"][name] = measure_model(name, args, Path(tmp))
    text = markdown(results, command)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{args.name or 'int8-' + started.strftime('%Y-%m-%d')}.md"
    path.write_text(text + "\n")
    print(text)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
