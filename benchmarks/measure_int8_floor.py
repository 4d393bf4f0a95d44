"""The int8 floor of each conv model, and how much of its speed-up each int8 tool keeps.

    python benchmarks/measure_int8_floor.py --models ppocr_cls_v2,orientation,mtcnn_pnet,mtcnn_onet

Per model (samples from ``inputs.py``; calibration and evaluation sets disjoint):

1. the variants, each in a measured child process (:func:`anchors.measure`: wall time and
   peak RSS, interpreter and imports included): ``fuse``; the *int8 floor*
   (:data:`FLOOR`: our int8 with every guard and the fallback off, so every Conv/Gemm/MatMul
   is quantized whatever its fidelity); our ``fuse,int8`` at the default target; NNCF default
   and MIXED presets; ORT ``quantize_static`` (``anchors.py``), all on the same samples;
2. ONE interleaved :func:`onnxslim_kit.bench.benchmark` of [original, every variant] on the
   evaluation samples, ORT optimizations on, 1 intra-op thread, under ``flock
   /tmp/bench.lock`` (the whole script is meant to run under it): latency ratio = median of
   per-round ratios, P10–P90; the ratio vs ``fuse`` is the ratio of the two ratios' medians
   (both paired to the original in the same rounds);
3. per variant :func:`onnxslim_kit.executed.executed` (what ORT runs after its optimizations:
   int8 kernels, share of MACs in them, float compute left) and the bench's fidelity views
   (:func:`onnxslim_kit.fidelity.judge` per output view, worst evaluation sample).

Share of the speed-up kept, with ``fuse`` as the baseline (the float model a user would
deploy; int8 is applied after it)::

    kept = (t_fuse − t_variant) / (t_fuse − t_floor)     (latencies as ratios × original)

1 = all of the floor's speed-up, 0 = none, < 0 = slower than ``fuse``; undefined ("—") where
the floor is not faster than ``fuse``.

Writes ``results/<--name>.md`` and ``.json``. Shared 2-core machine: the load average is
printed with every model.
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

import anchors
import inputs
import measure_fidelity
import numpy as np
import run_suite

HERE = Path(__file__).resolve().parent
FUSE = "fuse"
FLOOR = "fuse,int8(target=none,speed=off,fallback=false,max_range=0,heads=false,log=false,concat_ratio=0,grouped=int8)"
OURS = "fuse,int8"
NNCF_ANCHORS = ["nncf", "nncf_mixed"]
CONV_MODELS = ["ppocr_cls_v2", "orientation", "mtcnn_pnet", "mtcnn_onet", "ppocrv4_rec", "ppocrv4_det",
               "yolov8n_coco", "yolov8n_doclaynet", "picodet_layout", "ddddocr"]


def parse_args(argv: list) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(CONV_MODELS[:4]))
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--calib", type=int, default=16)
    parser.add_argument("--eval", type=int, default=16)
    parser.add_argument("--pipelines", nargs="*", default=[], help="more of our pipelines, measured beside ours")
    parser.add_argument("--tool-timeout", type=float, default=900.0)
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--name", help="file stem (default int8-floor-<UTC date>)")
    parser.add_argument("--render", type=Path, help="only re-write the .md of this results .json (no runs)")
    return parser.parse_args(argv)


def kept_share(t_fuse: float | None, t_variant: float | None, t_floor: float | None) -> float | None:
    """(t_fuse − t_variant) / (t_fuse − t_floor); None where the floor is not faster than fuse."""
    if None in (t_fuse, t_variant, t_floor) or t_fuse - t_floor <= 0:
        return None
    return (t_fuse - t_variant) / (t_fuse - t_floor)


def floor_pays(fuse_spread: list | None, floor_spread: list | None) -> bool:
    """Whether the floor is faster than ``fuse`` beyond the rounds' noise: the floor's P90
    ratio below fuse's P10 (else the share's denominator is noise and it is not reported)."""
    return bool(fuse_spread and floor_spread) and floor_spread[1] < fuse_spread[0]


def worst_views(views: list | None) -> dict:
    """``{view: "cos 0.9981" / "agree 0.97" / "rel 0.01"}`` of the bench's judged views."""
    out = {}
    for v in views or []:
        parts = [f"{key[:5] if key != 'cosine' else 'cos'} {v[key]:.4f}" for key in ("cosine", "agreement", "rel")
                 if isinstance(v.get(key), (int, float))]
        out[v["view"]] = ", ".join(parts)
    return out


def min_cosine(views: list | None) -> float | None:
    values = [v["cosine"] for v in views or [] if isinstance(v.get("cosine"), (int, float))]
    return min(values) if values else None


def runs_int8(path: Path, sample: dict) -> dict:
    """What ORT executes (executed.py), the fields the report needs."""
    from onnxslim_kit.executed import executed

    try:
        s = executed(str(path), input_shapes={k: list(np.shape(v)) for k, v in sample.items()}, feed=sample)
    except Exception as exc:  # noqa: BLE001 - a row, not a crash
        return {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"}
    return {k: s[k] for k in ("int8_ops", "float_ops", "int8_mac_share", "int8_weight_share", "macs_int8",
                              "macs_float", "macs_unresolved", "unfused_by_op", "float_ops_with_int8_weights")}


def int8_notes(output: str | None) -> list:
    """The notes of our int8 pass's report entry (why layers stayed float, measured), if any."""
    report = Path(output).with_suffix(".report.json") if output else None
    if report is None or not report.is_file():
        return []
    entries = [e for e in json.loads(report.read_text()).get("passes", []) if e["name"].startswith("int8")]
    return list(entries[-1].get("notes", [])) if entries else []


def measure_model(name: str, args, work: Path) -> dict:
    from onnxslim_kit.bench import benchmark

    record = {"model": name, "load_before": [round(x, 2) for x in os.getloadavg()]}
    start = time.perf_counter()
    src = inputs.model_path(name)
    data = inputs.build(name, n_calib=args.calib, n_eval=args.eval, path=src)
    calib = run_suite.save_calib(data.calib, work / f"{name}.calib.npz")
    tools = {}
    for label, pipeline in (("fuse", FUSE), ("floor", FLOOR), ("ours", OURS), *((p, p) for p in args.pipelines)):
        dst = work / f"{name}.{label}.onnx"
        tools[label] = run_suite.run_pipeline(pipeline, src, dst, calib, args.tool_timeout)
        run_suite.log(f"  {name} {label}: {run_suite.status(tools[label])}")
    for tool in NNCF_ANCHORS + ["ort_static"]:
        tools[tool] = anchors.run_anchor(tool, src, work / f"{name}.{tool}.onnx", calib, args.tool_timeout)
        run_suite.log(f"  {name} {tool}: {run_suite.status(tools[tool])}")
    produced = [label for label, row in tools.items() if row["output"]]
    report = benchmark([src] + [Path(tools[label]["output"]) for label in produced], data.eval,
                       names=["original", *produced], threads=(1,), runs=args.runs, warmup=args.warmup,
                       opt_level="all", metric=data.metric, memory=False)
    rows = {row["name"]: row for row in report.rows}
    record["bench_settings"] = report.settings
    ratio = {label: (rows.get(label) or {}).get("latency_ratio_vs_first") for label in produced}
    spread = {label: (rows.get(label) or {}).get("latency_ratio_spread") for label in produced}
    record["floor_pays"] = floor_pays(spread.get("fuse"), spread.get("floor"))
    record["variants"] = {}
    for label, tool in tools.items():
        entry = {"tool": {k: tool.get(k) for k in ("output", "error", "notes", "wall_seconds", "peak_rss_mb")},
                 "int8_notes": int8_notes(tool.get("output"))}
        if label in produced:
            row = rows.get(label) or {}
            x = ratio[label]
            entry.update(x_original=x, spread=row.get("latency_ratio_spread"), latency_ms=row.get("latency_ms"),
                         x_fuse=x / ratio["fuse"] if x and ratio.get("fuse") else None,
                         kept=kept_share(ratio.get("fuse"), x, ratio.get("floor")) if record["floor_pays"] else None,
                         views=row.get("views"), worst_cos=min_cosine(row.get("views")), metric=row.get("metric"),
                         error=row.get("error"), runs=runs_int8(Path(tool["output"]), data.eval[0]))
        record["variants"][label] = entry
    record["original"] = {"latency_ms": (rows.get("original") or {}).get("latency_ms"),
                          "runs": runs_int8(src, data.eval[0])}
    record["load_after"] = [round(x, 2) for x in os.getloadavg()]
    record["seconds"] = round(time.perf_counter() - start, 1)
    return record


def fmt(value, spec: str = ".2f") -> str:
    return "—" if value is None else format(value, spec)


def ops_text(counts: dict | None) -> str:
    return ", ".join(f"{op} ×{n}" for op, n in sorted((counts or {}).items())) or "none"


def task_text(metric: dict | None) -> str:
    """The suite's task metric of the variant against the original's outputs (``agreement``)."""
    if not metric or metric.get("agreement") is None:
        return "—"
    return f"{metric['agreement']:.3f} ({metric.get('task', '')})"


HEADER = ["variant", "× original (P10–P90)", "× fuse", "speed-up kept", "MACs in int8 kernels",
          "float compute left", "worst cos (eval)", "views (worst sample)", "task (vs original)", "tool s",
          "tool peak MB"]


def variant_cells(label: str, entry: dict) -> list:
    tool = entry["tool"]
    if tool["error"] or "x_original" not in entry:
        return [label, f"failed: {(tool['error'] or '').replace('|', '/')}"] + [""] * (len(HEADER) - 2)
    runs, spread = entry["runs"], entry.get("spread")
    span = f" ({spread[0]:.2f}–{spread[1]:.2f})" if spread else ""
    share = runs.get("int8_mac_share")
    return [label, fmt(entry["x_original"]) + span, fmt(entry["x_fuse"]),
            fmt(entry["kept"] * 100 if entry["kept"] is not None else None, ".0f") + ("%" if entry["kept"] is not None else ""),
            (f"{share * 100:.1f}%" if share is not None else runs.get("error", "—")),
            ops_text(runs.get("float_ops")) if "float_ops" in runs else "—",
            fmt(entry["worst_cos"], ".4f"), "; ".join(f"{k}: {v}" for k, v in worst_views(entry["views"]).items()),
            task_text(entry.get("metric")),
            fmt(tool["wall_seconds"], ".1f"), fmt(tool["peak_rss_mb"], ".0f")]


def markdown(results: dict) -> str:
    lines = [f"# int8 floor and speed-up kept — {results['started']}", "", f"`{results['command']}`", ""]
    if results.get("rerendered"):
        lines += [f"Re-rendered from its .json (noise rule of the speed-up share applied): `{results['rerendered']}`", ""]
    lines += [
             f"Floor = `{FLOOR}`; ours = `{OURS}` (default target); NNCF {results.get('nncf_version')} default "
             "and MIXED presets, ORT `quantize_static` (QDQ, per-channel, uint8 activations, min-max), all "
             f"calibrated on the same {results['calib']} samples; latency and views on {results['eval']} other "
             "samples. One interleaved bench per model, ORT optimizations on, 1 intra-op thread, under "
             "`flock /tmp/bench.lock`. × original: median of per-round ratios (P10–P90); × fuse = that / fuse's. "
             "Speed-up kept = (t_fuse − t) / (t_fuse − t_floor), baseline `fuse`. MACs in int8 kernels: "
             "`onnxslim_kit.executed` on ORT's optimized graph. Views: `onnxslim_kit.fidelity.judge` per output "
             "view, worst evaluation sample. Tool s / MB: one measured child process (imports included).", ""]
    for name, rec in results["models"].items():
        if "variants" not in rec:
            lines += [f"## {name}", "", f"skipped: {rec.get('skipped')}", ""]
            continue
        orig = rec["original"]
        lines += [f"## {name}", "", f"original: {fmt((orig['latency_ms'] or {}).get('median'), '.2f')} ms median; float compute "
                  f"{ops_text(orig['runs'].get('float_ops'))}; load average {rec['load_before']} → {rec['load_after']}; "
                  + ("the floor is faster than fuse beyond the P10–P90 spread" if rec.get("floor_pays") else
                     "the floor is NOT faster than fuse beyond the P10–P90 spread: speed-up kept not reported"),
                  "", "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
        lines += ["| " + " | ".join(c.replace("|", "/") for c in variant_cells(label, entry)) + " |"
                  for label, entry in rec["variants"].items()]
        notes = [(label, note) for label, entry in rec["variants"].items() for note in entry.get("int8_notes", [])]
        if notes:
            lines += ["", "Our int8 report's notes (why layers stayed float):", ""]
            lines += [f"- {label}: {note}" for label, note in notes]
        lines.append("")
    return "\n".join(lines)


def rerender(path: Path) -> Path:
    """The .md of a results .json again, the noise rule (:func:`floor_pays`) applied to it."""
    results = json.loads(path.read_text())
    results["rerendered"] = f"python benchmarks/measure_int8_floor.py --render {path}"
    for rec in results["models"].values():
        variants = rec.get("variants", {})
        rec["floor_pays"] = floor_pays(*(variants.get(k, {}).get("spread") for k in ("fuse", "floor")))
        for entry in variants.values():
            if "x_original" in entry and not rec["floor_pays"]:
                entry["kept"] = None
    path.write_text(json.dumps(results, indent=1) + "\n")
    path.with_suffix(".md").write_text(markdown(results) + "\n")
    return path.with_suffix(".md")


def main(argv: list | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.render:
        print(f"wrote {rerender(args.render)}")
        return 0
    started = datetime.now(timezone.utc)
    try:
        import nncf
        version = nncf.__version__
    except ImportError:
        version = None
    results = {"started": started.isoformat(timespec="minutes"), "calib": args.calib, "eval": args.eval,
               "command": "python benchmarks/measure_int8_floor.py " + " ".join(shlex.quote(a) for a in argv),
               "nncf_version": version, "floor": FLOOR, "ours": OURS, "models": {}}
    with tempfile.TemporaryDirectory(prefix="int8-floor-") as tmp:
        for name in [m.strip() for m in args.models.split(",") if m.strip()]:
            run_suite.log(name)
            try:
                results["models"][name] = measure_model(name, args, Path(tmp))
            except Exception as exc:  # noqa: BLE001 - one model's failure is a row
                results["models"][name] = {"skipped": f"{type(exc).__name__}: {exc}"}
    stem = args.name or f"int8-floor-{started.strftime('%Y-%m-%d')}"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{stem}.json").write_text(json.dumps(results, indent=1, default=measure_fidelity.json_default) + "\n")
    text = markdown(results)
    (args.out / f"{stem}.md").write_text(text + "\n")
    print(text)
    print(f"wrote {args.out / stem}.md/.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
