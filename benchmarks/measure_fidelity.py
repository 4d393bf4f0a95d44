"""Issue 18's honesty benchmark: does the report's held-out fidelity predict what a separate
evaluation set measures, and does ``fuse,prune,int8`` at the default target keep the decisions?

    python benchmarks/measure_fidelity.py                                     # all suite models
    python benchmarks/measure_fidelity.py --models ppocr_cls_v2,mtcnn_onet --pipelines fuse,int8

Per model (``onnxslim_kit.zoo.MODELS``; samples from ``inputs.build(name, n_calib, n_eval)``):

1. ``fuse`` and every ``--pipelines`` entry through our CLI in a measured child process
   (``run_suite.run_pipeline``: ``python -m onnxslim_kit MODEL --passes P --calib calib.npz
   --report r.json -o out.onnx``, default target); with 128 calibration samples the pipeline
   fits 96 and judges on the 32 it holds out (one in each block of four);
2. the report's fidelity of the last lossy pass that was measured and kept (judged against
   the original): per view the worst-sample cosine, the decision agreement, the relative
   error; the budget ``used``, the binding view, ``met``;
3. :func:`onnxslim_kit.bench.benchmark` of [original, fuse, pipelines…] together on the
   evaluation samples (a separate stream of the same generator), interleaved, 1 intra-op
   thread: per view the same figures (``row["views"]``), the paired latency ratio vs the
   original and the task metric of ``tasks.py``.

Per view v, with c the worst-sample cosine and a the decision agreement (held-out: the report;
eval: the bench)::

    Δc = |c_held − c_eval|,   Δa = |a_held − a_eval|,   honest(v) ⇔ max(Δc, Δa) ≤ 0.01

(a figure missing on either side is not compared). With the defaults both sides judge 32
samples (128 calibration samples: the pipeline holds out 32, :data:`onnxslim_kit.fidelity.context.MAX_JUDGE_SAMPLES`);
with 32 calibration samples a worst-of-8 figure was compared with a worst-of-32 one
(``results/fidelity-2026-12-02-final.md``: 19 of 23 views within 0.01; at 128, the
``-s7-*`` files). Two more columns show how much of a gap is the sample count: the same
figures on the disjoint 8-sample chunks of the eval set (their min–max), and whether the
held-out figure lies within 0.01 of that range. A control runs the bench on the report's own
held-out samples: its |Δ| to the report is the measuring's share of any gap (≈ 0 expected).

The budget fraction on the eval set is the target's (:meth:`onnxslim_kit.fidelity.Target.used`)
with losses ``cos`` = max_v (1 − c_eval), ``decision`` = max_v (1 − a_eval), ``rel`` = max_v
rel_eval. Decisions kept: every ``scores`` / ``probs`` view has c_eval ≥ 0.99 and a_eval ≥ 0.99,
every ``exact`` view a_eval ≥ 0.99.
Detectors (a metric with ``kept_mean``) must keep ≥ 95 % of the original's detections.

Latency: ``× original`` is the bench's paired ratio (median of per-round ratios, P10–P90);
``× fuse`` = (pipeline × original) / (fuse × original), both from the same interleaved run (a
ratio of medians, not itself paired). Writes ``results/fidelity-<date>.md`` and ``.json``
after every model (a run cut short leaves what it measured), with the exact command, the
versions and the load average (``os.getloadavg``) before and after each model.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

import inputs
import run_suite
import suite_report

HERE = Path(__file__).resolve().parent
TOLERANCE = 0.01  # issue 18: held-out figure within 0.01 of the eval figure
SLACK = 1e-9  # |1 − 0.99| is a hair over 0.01 in binary: a difference of exactly the tolerance is within
FLOOR = 0.99  # decision views: cosine and agreement
KEPT_FLOOR = 0.95  # detectors: share of the original's detections kept
DECISION_KINDS = ("scores", "probs", "exact", "ctc")
FUSE = "fuse"


def parse_args(argv: list) -> argparse.Namespace:
    from onnxslim_kit.zoo import MODELS

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma list (default: {','.join(MODELS)})")
    parser.add_argument("--pipelines", nargs="*", default=["fuse,prune,int8"],
                        help="each a --passes value (default fuse,prune,int8); fuse alone always runs too")
    parser.add_argument("--calib", type=int, default=128,
                        help="calibration samples (default 128: 32 held out, as many as --eval's default)")
    parser.add_argument("--eval", type=int, default=32, help="evaluation samples (default 32)")
    parser.add_argument("--runs", type=int, default=30, help="timed bench rounds (default 30)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed bench rounds (default 3)")
    parser.add_argument("--tool-timeout", type=float, default=1800.0, help="seconds per CLI run (default 1800)")
    parser.add_argument("--out", type=Path, default=HERE / "results", help="results folder")
    parser.add_argument("--name", help="file stem (default fidelity-<UTC date>)")
    return parser.parse_args(argv)


# --- the comparison (pure) ------------------------------------------------------------------

def number(value) -> float | None:
    """A figure of a report or bench dict as a float (``"inf"``/``"nan"`` strings too); None if absent."""
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def last_fidelity(report: dict) -> dict | None:
    """The fidelity entry of the last lossy pass that was measured and not rolled back: the
    written model judged against the original on the held-out samples."""
    for entry in reversed(report.get("passes", [])):
        if entry.get("fidelity") and not entry.get("rolled_back"):
            return {"pass": entry["name"], **entry["fidelity"]}
    return None


def pass_entries(report: dict) -> list:
    """Per pass of the report after the first (fuse): lossless or not, modified, rolled back, the
    budget used of the allowed share (a lossy pass's verdict vs the original), its metrics."""
    out = []
    for entry in report.get("passes", [])[1:]:
        fid = entry.get("fidelity") or {}
        out.append({"name": entry["name"], "lossless": entry.get("lossless"), "modified": entry.get("modified"),
                    "rolled_back": entry.get("rolled_back"), "used": fid.get("used"), "allowed": fid.get("allowed"),
                    "metrics": entry.get("metrics", {})})
    return out


def passes_text(passes: list) -> str:
    """``prune lossless, int8 0.89/1.00 (int8 12, float 3)``: a lossy pass's budget used /
    allowed (and the layers int8 kept in int8 or float), ``unchanged`` where a pass did nothing."""
    parts = []
    for p in passes:
        if p["rolled_back"] or not p["modified"]:
            state = "rolled back" if p["rolled_back"] else "unchanged"
        elif p["lossless"]:
            state = "lossless"
        else:
            state = f"{fmt(p['used'], '.2f')}/{fmt(p['allowed'], '.2f')}"
        m = p["metrics"]
        if "layers_int8" in m:
            state += f" (int8 {m['layers_int8']}, float {m.get('layers_float', 0)})"
        parts.append(f"{p['name']} {state}")
    return ", ".join(parts) or "—"


def _delta(held: float | None, evaluated: float | None) -> float | None:
    if held is None or evaluated is None or not (math.isfinite(held) and math.isfinite(evaluated)):
        return None
    return abs(held - evaluated)


def compare_views(held: list, evaluated: list | None, tolerance: float = TOLERANCE) -> list:
    """One row per view (the report's order, then any view only the bench has): held-out and
    eval cosine / agreement / rel, their differences and whether both are within ``tolerance``
    (None: nothing to compare)."""
    by_name = {v["view"]: v for v in evaluated or []}
    names = [v["view"] for v in held] + [n for n in by_name if n not in {v["view"] for v in held}]
    held_by = {v["view"]: v for v in held}
    rows = []
    for name in names:
        h, e = held_by.get(name, {}), by_name.get(name, {})
        row = {"view": name, "kind": h.get("kind") or e.get("kind")}
        for key in ("cosine", "agreement", "rel"):
            row[f"{key}_held"], row[f"{key}_eval"] = number(h.get(key)), number(e.get(key))
        row["cosine_delta"] = _delta(row["cosine_held"], row["cosine_eval"])
        row["agreement_delta"] = _delta(row["agreement_held"], row["agreement_eval"])
        deltas = [d for d in (row["cosine_delta"], row["agreement_delta"]) if d is not None]
        row["within"] = all(d <= tolerance + SLACK for d in deltas) if deltas else None
        rows.append(row)
    return rows


def eval_losses(views: list) -> dict:
    """Worst losses over the eval views: ``cos`` (1 − cosine), ``decision`` (1 − agreement), ``rel``."""
    losses = {}
    for view in views:
        for metric, loss in (("cos", None if number(view.get("cosine")) is None else 1.0 - number(view["cosine"])),
                             ("decision", None if number(view.get("agreement")) is None
                              else 1.0 - number(view["agreement"])),
                             ("rel", number(view.get("rel")))):
            if loss is not None:
                losses[metric] = max(losses.get(metric, -math.inf), loss)
    return losses


def eval_used(views: list | None, target: str) -> float | None:
    """The target's budget fraction on the eval views (≤ 1: the target holds there)."""
    from onnxslim_kit.fidelity import Target

    if not views:
        return None
    return Target.parse(target).used(eval_losses(views))


def decisions_kept(views: list | None, floor: float = FLOOR) -> dict:
    """``{ok, failing}``: every decision view at ``floor`` on the eval set (ok None: no decision view
    or no eval views)."""
    decision = [v for v in views or [] if v.get("kind") in DECISION_KINDS]
    failing = []
    for view in decision:
        cos, agree = number(view.get("cosine")), number(view.get("agreement"))
        low = [f"{label} {value:.4f}" for label, value in (("cos", cos), ("agree", agree))
               if value is not None and not value >= floor]
        if low:
            failing.append(f"{view['view']} {', '.join(low)}")
    return {"ok": (not failing) if decision else None, "failing": failing, "views": len(decision)}


def task_figures(metric: dict | None) -> dict:
    """The task metric's headline (score vs the original's), agreement and, for detectors, the
    share of the original's detections kept (mean and worst sample)."""
    if not metric:
        return {}
    out = {key: metric.get(key) for key in ("task", "score", "score_original", "agreement")}
    if "kept_mean" in metric:
        out.update(kept_mean=metric["kept_mean"], kept_worst=metric.get("kept_worst"),
                   kept_ok=metric["kept_mean"] >= KEPT_FLOOR)
    return out


def speed(rows: dict, name: str) -> dict:
    """Latency of bench row ``name`` × the original (paired, P10–P90) and × fuse (ratio of ratios)."""
    row, fuse = rows.get(name) or {}, rows.get(FUSE) or {}
    ratio, spread = row.get("latency_ratio_vs_first"), row.get("latency_ratio_spread")
    fuse_ratio = fuse.get("latency_ratio_vs_first")
    vs_fuse = ratio / fuse_ratio if ratio and fuse_ratio else None
    return {"x_original": ratio, "x_original_spread": spread, "x_fuse": vs_fuse,
            "faster_than_fuse": None if vs_fuse is None else vs_fuse < 1.0,
            "latency_ms": (row.get("latency_ms") or {}).get("median")}


def summarize(report: dict | None, bench_row: dict | None, rows: dict, name: str) -> dict:
    """Everything the tables print about one pipeline of one model."""
    fid = last_fidelity(report or {})
    target = (report or {}).get("target") or "cos:0.99"
    evaluated = (bench_row or {}).get("views")
    views = compare_views(fid["views"] if fid else [], evaluated)
    compared = [v for v in views if v["within"] is not None]
    return {
        "target": target, "fidelity": fid, "views": views,
        "report": None if fid is None else {k: fid.get(k) for k in ("pass", "used", "allowed", "binding", "met",
                                                                    "pipeline_met", "samples", "judged_on")},
        "eval_used": eval_used(evaluated, target), "passes": pass_entries(report or {}),
        "honest": {"within": sum(bool(v["within"]) for v in compared), "compared": len(compared),
                   "worst_delta": max((d for v in compared for d in (v["cosine_delta"], v["agreement_delta"])
                                       if d is not None), default=None)},
        "decisions": decisions_kept(evaluated), "task": task_figures((bench_row or {}).get("metric")),
        "speed": speed(rows, name),
    }


def add_chunks(rows: list, chunks: list | None, tolerance: float = TOLERANCE) -> list:
    """Beside each view row, the eval figures of disjoint eval chunks as large as the held-out set
    (``cosine_chunks``, ``agreement_chunks``): the spread a worst-of-8 figure has from the samples
    alone. ``in_chunk_range``: every held-out figure lies within [min − tolerance, max + tolerance]
    of its chunks' (None: nothing to compare)."""
    for row in rows:
        checks = []
        for key in ("cosine", "agreement"):
            values = [number(v.get(key)) for chunk in chunks or [] for v in chunk or [] if v["view"] == row["view"]]
            row[f"{key}_chunks"] = values = [x for x in values if x is not None]
            held = row[f"{key}_held"]
            if values and held is not None:
                checks.append(min(values) - tolerance - SLACK <= held <= max(values) + tolerance + SLACK)
        row["in_chunk_range"] = all(checks) if checks else None
    return rows


def control_check(fid: dict | None, views: list | None) -> dict:
    """The report vs the bench on the *same* held-out samples: both measure the same thing, so
    the largest |Δ| (``worst_delta``) says how much of the held-out/eval gap is the measuring."""
    rows = compare_views(fid["views"] if fid else [], views, tolerance=1e-4)
    deltas = [d for v in rows for d in (v["cosine_delta"], v["agreement_delta"]) if d is not None]
    return {"worst_delta": max(deltas) if deltas else None, "compared": len(deltas)}


# --- rendering (pure) -----------------------------------------------------------------------

def fmt(value, spec: str = ".4f", missing: str = "—") -> str:
    value = number(value) if not isinstance(value, bool) else value
    if value is None:
        return missing
    if isinstance(value, bool):
        return "yes" if value else "**no**"
    return format(value, spec) if math.isfinite(value) else str(value)


def yes_no(value) -> str:
    return "—" if value is None else ("yes" if value else "**no**")


SUMMARY_HEADER = ["model", "pipeline", "passes after fuse: used/allowed", "target met (report)",
                  "used held-out / eval", "binding (report)", "decision views ≥ 0.99 (eval)", "views within 0.01",
                  "same samples Δ", "task: score (original)", "detections kept", "latency × original (P10–P90)",
                  "× fuse", "tool s / MB"]
VIEW_HEADER = ["model", "pipeline", "view", "kind", "cos held-out", "cos eval", "Δcos (abs)", "agree held-out",
               "agree eval", "Δagree (abs)", "within 0.01?", "eval chunks: cos min–max", "agree min–max",
               "held-out in chunk range?"]


def _cell(text) -> str:
    return str(text).replace("|", "/")


def summary_cells(model: str, entry: dict) -> list:
    if entry.get("error"):
        return [model, entry["pipeline"], f"failed: {_cell(entry['error'])}"] + [""] * (len(SUMMARY_HEADER) - 3)
    s, rep = entry["summary"], entry["summary"]["report"] or {}
    task, sp, dec, honest = s["task"], s["speed"], s["decisions"], s["honest"]
    spread = sp["x_original_spread"]
    latency = fmt(sp["x_original"], ".2f") + ("×" if sp["x_original"] else "") + (
        f" ({spread[0]:.2f}–{spread[1]:.2f})" if spread else "")
    kept = (f"{task['kept_mean']:.1%} (worst {fmt(task.get('kept_worst'), '.0%')})" + (
        "" if task["kept_ok"] else " **< 95 %**")) if "kept_mean" in task else "—"
    decisions = yes_no(dec["ok"]) + (f": {'; '.join(dec['failing'])}" if dec["failing"] else "")
    tool = entry.get("tool") or {}
    met = yes_no(rep.get("pipeline_met", rep.get("met"))) if rep else "— (no lossy verdict)"
    score = f"{fmt(task.get('score'), '.3f')} ({fmt(task.get('score_original'), '.3f')})"
    return [model, entry["pipeline"], passes_text(s["passes"]), met,
            f"{fmt(rep.get('used'), '.3f')} / {fmt(s['eval_used'], '.3f')}", _cell(rep.get("binding", "—")),
            _cell(decisions), f"{honest['within']}/{honest['compared']} (worst Δ {fmt(honest['worst_delta'], '.4f')})",
            fmt((s.get("control") or {}).get("worst_delta"), ".1e"), f"{_cell(task.get('task', '—'))}: {score}",
            kept, latency, fmt(sp["x_fuse"], ".2f") + ("×" if sp["x_fuse"] else ""),
            f"{fmt(tool.get('wall_seconds'), '.0f')} / {fmt(tool.get('peak_rss_mb'), '.0f')}"]


def _span(values: list | None, spec: str) -> str:
    return f"{min(values):{spec}}–{max(values):{spec}}" if values else "—"


def view_cells(model: str, entry: dict) -> list:
    out = []
    for v in (entry.get("summary") or {}).get("views", []):
        out.append([model, entry["pipeline"], _cell(v["view"]), v["kind"] or "—", fmt(v["cosine_held"], ".5f"),
                    fmt(v["cosine_eval"], ".5f"), fmt(v["cosine_delta"], ".4f"), fmt(v["agreement_held"]),
                    fmt(v["agreement_eval"]), fmt(v["agreement_delta"]), yes_no(v["within"]),
                    _span(v.get("cosine_chunks"), ".5f"), _span(v.get("agreement_chunks"), ".4f"),
                    yes_no(v.get("in_chunk_range"))])
    return out


def _table(header: list, rows: list) -> list:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]


def markdown(results: dict) -> str:
    """The results file: the environment, the summary per model × pipeline, the views."""
    models = results["models"]
    state = "complete" if results.get("finished_utc") else "partial (the run was cut short or is still going)"
    lines = [f"# Fidelity honesty (issue 18) — {results['started_utc']}", "", f"`{results['command']}`", "",
             f"State: {state}. {results['calib']} calibration samples per model (the pipeline holds out one in four: "
             f"{results['calib'] // 4} judge the lossy passes), {results['eval']} evaluation samples (a separate "
             "stream of `inputs.py`) for the bench. Default target of each report; bench: ORT CPU, 1 intra-op "
             f"thread, optimizations on, {results['runs']} interleaved rounds ({results['warmup']} warm-up).", "",
             "Honesty: per view, the report's worst-sample cosine and decision agreement on the held-out "
             f"samples vs the bench's on the eval samples; within = both |Δ| ≤ {TOLERANCE}. Used = the fraction "
             "of the target's budget (≤ 1: met), held-out (report) and eval (same formula on the bench's views). "
             "× fuse = (× original) / (fuse × original), one bench run. Same samples Δ: the control — "
             "the bench's views of the written model on the report's own held-out samples vs the report "
             "(largest |Δ|; ≈ 0 means the two measure alike and any gap is the samples).", "",
             f"Versions: {', '.join(f'{k} {v}' for k, v in results['versions'].items() if v)}.",
             f"CPU: {results['cpu'].get('model')} ({results['cpu'].get('logical_cpus')} logical, shared).", "",
             "## Summary", ""]
    lines += _table(SUMMARY_HEADER, [summary_cells(m, e) for m, rec in models.items()
                                     for e in rec.get("pipelines", [])])
    lines += ["", "## Views: held-out (report) vs eval (bench)", ""]
    lines += _table(VIEW_HEADER, [c for m, rec in models.items() for e in rec.get("pipelines", [])
                                  for c in view_cells(m, e)])
    lines += ["", "## Per model", ""]
    for name, rec in models.items():
        if rec.get("skipped"):
            lines.append(f"- {name}: skipped: {rec['skipped']}")
            continue
        fuse = rec.get("fuse") or {}
        lines.append(f"- {name}: load before {rec['load_before']}, after {rec.get('load_after')}; {rec['seconds']} s; "
                     f"fuse × original {fmt(fuse.get('x_original'), '.2f')}"
                     + (f"; fuse failed: {_cell(fuse['error'])}" if fuse.get("error") else ""))
    return "\n".join(lines)


# --- running it ----------------------------------------------------------------------------

def _slug(pipeline: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in pipeline)


def _tool(row: dict) -> dict:
    return {k: row.get(k) for k in ("output", "error", "notes", "wall_seconds", "peak_rss_mb")}


def _read_report(dst: Path) -> dict | None:
    path = dst.with_suffix(".report.json")
    return json.loads(path.read_text()) if path.is_file() else None


def measure_model(name: str, args, work: Path) -> dict:
    """One model: the CLI runs, one bench of [original, fuse, pipelines…], the summaries."""
    from onnxslim_kit.bench import benchmark

    start = time.perf_counter()
    record, src, data, calib = suite_model(name, args, work)
    if src is None:
        return record
    runs = {}
    for pipeline in dict.fromkeys([FUSE, *args.pipelines]):
        dst = work / f"{name}.{_slug(pipeline)}.onnx"
        runs[pipeline] = (run_suite.run_pipeline(pipeline, src, dst, calib, args.tool_timeout), dst)
        run_suite.log(f"  {name} {pipeline}: {run_suite.status(runs[pipeline][0])}")
    produced = [p for p, (row, _) in runs.items() if row["output"]]
    rows = {}
    if produced:
        report = benchmark([src] + [runs[p][1] for p in produced], data.eval, names=["original", *produced],
                           threads=(1,), runs=args.runs, warmup=args.warmup, opt_level="all", metric=data.metric,
                           memory=False)
        rows = {row["name"]: row for row in report.rows}
        record["bench_settings"] = report.settings
    held = held_out_samples(data.calib)
    control = {p: same_samples(src, runs[p][1], held) for p in args.pipelines if runs[p][0]["output"]}
    size = len(held) or len(data.eval)
    chunks = {p: [same_samples(src, runs[p][1], data.eval[i:i + size]) for i in range(0, len(data.eval) - size + 1,
                                                                                       size)] for p in control}
    fuse_row = rows.get(FUSE) or {}
    record["fuse"] = {"x_original": fuse_row.get("latency_ratio_vs_first"), "error": runs[FUSE][0]["error"]}
    record["pipelines"] = []
    for pipeline in args.pipelines:
        tool, dst = runs[pipeline]
        entry = {"pipeline": pipeline, "tool": _tool(tool), "error": tool["error"] or (rows.get(pipeline) or {}).get(
            "error")}
        if not entry["error"]:
            entry["summary"] = summarize(_read_report(dst), rows.get(pipeline), rows, pipeline)
            entry["summary"]["control"] = control_check(entry["summary"]["fidelity"], control.get(pipeline))
            add_chunks(entry["summary"]["views"], chunks.get(pipeline))
            entry["bench"] = {k: rows[pipeline].get(k) for k in ("views", "metric", "latency_ms",
                                                               "latency_ratio_vs_first", "latency_ratio_spread",
                                                               "nodes", "size_bytes", "drift")}
        record["pipelines"].append(entry)
    record["load_after"] = [round(x, 2) for x in os.getloadavg()]
    record["seconds"] = round(time.perf_counter() - start, 1)
    return record


def suite_model(name: str, args, work: Path) -> tuple:
    """``(record, model path, inputs.build data, calibration .npz)`` of a suite model with
    ``args.calib`` / ``args.eval`` samples; the record starts with the load average. A model
    that cannot be had: ``(record with "skipped", None, None, None)``."""
    record = {"model": name, "load_before": [round(x, 2) for x in os.getloadavg()]}
    try:
        src = inputs.model_path(name)
    except Exception as exc:  # noqa: BLE001 - a model that cannot be had is a skipped row
        record["skipped"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        return record, None, None, None
    data = inputs.build(name, n_calib=args.calib, n_eval=args.eval, path=src)
    calib = run_suite.save_calib(data.calib, work / f"{name}.calib.npz")
    record.update(source=run_suite.source(name), calib_samples=len(data.calib), eval_samples=len(data.eval))
    return record, src, data, calib


def held_out_samples(calib: list) -> list:
    """The calibration samples the pipeline held out (its own rule, :func:`fidelity.context.held_out`)."""
    from onnxslim_kit.fidelity.context import held_out

    return [sample for i, sample in enumerate(calib) if held_out(i)]


def same_samples(src: Path, out: Path, samples: list) -> list | None:
    """The bench's views of ``out`` on the report's own held-out samples (the control)."""
    from onnxslim_kit.bench import benchmark

    if not samples:
        return None
    rows = benchmark([src, out], samples, names=["original", "out"], threads=(1,), runs=1, warmup=0,
                     memory=False).rows
    return rows[1].get("views")


def json_default(value):
    if isinstance(value, (np.integer, np.floating, np.bool_)):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return str(value)


def _finite(value):
    """JSON without NaN/Infinity tokens: non-finite floats as strings."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def write(results: dict, folder: Path, stem: str) -> tuple:
    folder.mkdir(parents=True, exist_ok=True)
    md, js = folder / f"{stem}.md", folder / f"{stem}.json"
    md.write_text(markdown(results) + "\n")
    js.write_text(json.dumps(_finite(json.loads(json.dumps(results, default=json_default))), indent=1) + "\n")
    return md, js


def main(argv: list | None = None) -> int:
    given = sys.argv[1:] if argv is None else argv
    args = parse_args(given)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in models if m not in inputs.BUILDERS]
    if unknown:
        print(f"unknown model(s) {', '.join(unknown)}; models: {', '.join(inputs.MODELS)}", file=sys.stderr)
        return 2
    started = datetime.now(timezone.utc)
    results = {"command": "python benchmarks/measure_fidelity.py " + " ".join(shlex.quote(a) for a in given),
               "started_utc": started.isoformat(timespec="minutes"), "finished_utc": None,
               "calib": args.calib, "eval": args.eval, "runs": args.runs, "warmup": args.warmup,
               "pipelines": args.pipelines, "tolerance": TOLERANCE, "floor": FLOOR, "kept_floor": KEPT_FLOOR,
               "versions": suite_report.versions(), "cpu": suite_report.cpu_info(), "git": suite_report.git_state(),
               "models": {}}
    stem = args.name or f"fidelity-{started.strftime('%Y-%m-%d')}"
    with tempfile.TemporaryDirectory(prefix="fidelity-") as tmp:
        for name in models:
            run_suite.log(f"{name}")
            try:
                results["models"][name] = measure_model(name, args, Path(tmp))
            except Exception as exc:  # noqa: BLE001 - one model's failure is its row; the others still run
                results["models"][name] = {"skipped": f"failed: {type(exc).__name__}: {exc}"[:400]}
                run_suite.log(f"  {name}: {results['models'][name]['skipped']}")
            write(results, args.out, stem)  # partial results after every model
    results["finished_utc"] = datetime.now(timezone.utc).isoformat(timespec="minutes")
    md, js = write(results, args.out, stem)
    run_suite.log(f"wrote {md} and {js}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
