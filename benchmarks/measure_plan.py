"""Issue 17's acceptance benchmark: ``plan`` against the fixed pipelines, on the suite's models.

    python benchmarks/measure_plan.py --models ppocr_cls_v2,orientation
    python benchmarks/measure_plan.py --models mtcnn_onet --no-size --name plan-2026-12-02-onet

Per model (samples from ``inputs.build(name, n_calib, n_eval)``, calibration and evaluation from
separate streams):

1. ``plan`` through our CLI in a measured child process, goal latency, default target, ``--calib``
   only (the plan judges on the calibration samples it holds out), with a fresh timing cache;
   the planning time is the plan's own ``seconds`` (its JSON), the trials are its optimize runs
   (candidates not skipped) and ``timed`` the candidates it benchmarked;
2. the same ``plan`` again with that timing cache: the bytes must be the same and ``timed`` 0;
3. the recipe replayed (``python -m onnxslim_kit MODEL --recipe R -o OUT``): the same bytes;
4. the fixed pipelines ``fuse``, ``fuse,int8``, ``fuse,dynamic``, ``fuse,fp16``, ``fuse,prune``,
   ``fuse,prune,int8`` (and ``fuse,cluster`` for goal size) through our CLI
   (``run_suite.run_pipeline``, the same calibration file, default target);
5. ONE :func:`onnxslim_kit.bench.benchmark` of [original, plan, fixed…] on the evaluation
   samples, interleaved (order rotated each round), 1 intra-op thread; the raw per-round times
   are kept (``bench.timed_rounds`` is wrapped to record them) so that any two models can be
   compared paired: ``ratio(a, b) = median_r t_a(r) / t_b(r)``, spread [P10, P90];
6. fidelity of each result on the evaluation samples, judged with our views as
   ``measure_fidelity.py`` does: ``used_eval = Target.used(losses of the bench's views)``,
   ``meets ⇔ used_eval ≤ 1``;
7. goal size (``--no-size`` skips it): ``plan --goal size``; its file vs the smallest file
   among the fixed pipelines and ``fuse,cluster`` that meet the target on the eval samples.

Acceptance (issue 17), per model: best = the fixed pipeline with the lowest ratio vs the original
among those that meet the target on eval (``fuse`` always does: lossless);
``ratio(plan, best) ≤ 1.03`` and ``ratio(plan, fuse) ≤ 1.03``; "≥ 5 % faster" ⇔
``ratio(plan, best) ≤ 0.95``, on at least half of the models. A plan whose own choice misses the
target on the eval samples is flagged (the plan judged it on its held-out calibration samples).

Timed parts run under ``flock /tmp/bench.lock`` (the plan runs, which time, and the bench).
Writes ``results/<name>.md`` and ``.json`` after every model (a run cut short keeps what it
measured), with the command, the versions and the load average before and after each model.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import shlex
import shutil
import sys
import tempfile
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

import anchors
import measure_fidelity
import run_suite
import suite_report

HERE = Path(__file__).resolve().parent
LOCK = "/tmp/bench.lock"
FIXED = ("fuse", "fuse,int8", "fuse,dynamic", "fuse,fp16", "fuse,prune", "fuse,prune,int8")
SIZE_EXTRA = ("fuse,cluster",)
SMALL = ("ppocr_cls_v2", "orientation", "mtcnn_pnet", "mtcnn_onet", "silero_vad", "minilm_l6")
CONV = ("ppocr_cls_v2", "orientation", "mtcnn_pnet", "mtcnn_onet", "ppocrv4_det", "ppocrv4_rec", "yolov8n_coco",
        "yolov8n_doclaynet", "picodet_layout", "ddddocr")
AT_LEAST_AS_FAST = 1.03
FASTER = 0.95


def parse_args(argv: list) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(SMALL), help=f"comma list (default: {','.join(SMALL)})")
    parser.add_argument("--calib", type=int, default=32, help="calibration samples (default 32: the plan holds out 8)")
    parser.add_argument("--eval", type=int, default=32, help="evaluation samples for the bench (default 32)")
    parser.add_argument("--runs", type=int, default=100, help="timed bench rounds (default 100)")
    parser.add_argument("--warmup", type=int, default=10, help="untimed bench rounds (default 10)")
    parser.add_argument("--plan-runs", type=int, default=50, help="the plan's own --runs (default 50)")
    parser.add_argument("--plan-warmup", type=int, default=5, help="the plan's own --warmup (default 5)")
    parser.add_argument("--no-size", action="store_true", help="skip goal size (plan --goal size, fuse,cluster)")
    parser.add_argument("--size-models", default=",".join(CONV),
                        help=f"the models goal size runs on (default the conv models: {','.join(CONV)})")
    parser.add_argument("--tool-timeout", type=float, default=3600.0, help="seconds per CLI run (default 3600)")
    parser.add_argument("--out", type=Path, default=HERE / "results", help="results folder")
    parser.add_argument("--name", help="file stem (default plan-<UTC date>)")
    parser.add_argument("--keep", type=Path, help="keep the models and reports in this folder")
    parser.add_argument("--render", type=Path, metavar="JSON",
                        help="only rewrite the .md (and .json) of an earlier run's JSON, with this version's summaries")
    return parser.parse_args(argv)


# --- the comparison (pure) ------------------------------------------------------------------

def paired(times: list, reference: list) -> dict | None:
    """``{ratio, spread}``: median and [P10, P90] of ``times[r] / reference[r]`` (None: no data)."""
    from onnxslim_kit.bench import paired_ratio

    if not times or not reference:
        return None
    ratio, spread = paired_ratio(times, reference)
    return None if ratio is None else {"ratio": ratio, "spread": spread}


def best_fixed(rows: dict, fixed: tuple, key: str = "meets_eval") -> str | None:
    """The fixed pipeline with the lowest ratio vs the original among those meeting the target
    (``key``: on the eval samples, or ``met_held_out``: by its own report; ties: the earlier in
    ``fixed``)."""
    meeting = [p for p in fixed if (rows.get(p) or {}).get(key) and rows[p].get("x_original") is not None]
    return min(meeting, key=lambda p: (rows[p]["x_original"], fixed.index(p))) if meeting else None


def same_files(files: dict) -> dict:
    """``{name: the first name with the same bytes}`` (itself when first): identical models are
    benchmarked once, and compare at exactly 1."""
    first, out = {}, {}
    for name, path in files.items():
        out[name] = first.setdefault(hashlib.sha256(Path(path).read_bytes()).hexdigest(), name)
    return out


def held_out_met(report: dict | None) -> bool | None:
    """A fixed pipeline's own verdict on its held-out samples (lossless: True)."""
    if report is None:
        return None
    fid = measure_fidelity.last_fidelity(report)
    if fid is None:
        return True
    met = fid.get("pipeline_met")
    return bool(fid.get("met") if met is None else met)


def smallest_fixed(rows: dict, fixed: tuple, key: str = "meets_eval") -> str | None:
    meeting = [p for p in fixed if (rows.get(p) or {}).get(key) and rows[p].get("size_bytes")]
    return min(meeting, key=lambda p: (rows[p]["size_bytes"], fixed.index(p))) if meeting else None


def acceptance(record: dict) -> dict:
    """Per-model verdicts: plan vs best fixed (≤ 1.03, ≤ 0.95 = ≥ 5 % faster), plan vs fuse (≤ 1.03),
    size vs the smallest fixed file, determinism."""
    vs_best, vs_fuse = record.get("plan_vs_best"), record.get("plan_vs_fuse")
    vs_held = record.get("plan_vs_best_held_out")
    out = {"as_fast_as_best_held_out": None if vs_held is None else vs_held["ratio"] <= AT_LEAST_AS_FAST,
           "faster_than_best_held_out_5pct": None if vs_held is None else vs_held["ratio"] <= FASTER,
           "as_fast_as_best": None if vs_best is None else vs_best["ratio"] <= AT_LEAST_AS_FAST,
           "faster_than_best_5pct": None if vs_best is None else vs_best["ratio"] <= FASTER,
           "not_slower_than_fuse": None if vs_fuse is None else vs_fuse["ratio"] <= AT_LEAST_AS_FAST,
           "plan_meets_eval": (record.get("rows", {}).get("plan") or {}).get("meets_eval"),
           "replay_identical": (record.get("replay") or {}).get("identical"),
           "rerun_identical": (record.get("rerun") or {}).get("identical"),
           "rerun_timed_nothing": None if not record.get("rerun") else record["rerun"].get("timed") == 0}
    size = record.get("size") or {}
    if size.get("plan_bytes") and size.get("smallest_bytes"):
        out["size_at_most_smallest"] = size["plan_bytes"] <= size["smallest_bytes"]
    return out


# --- rendering (pure) -----------------------------------------------------------------------

fmt = measure_fidelity.fmt


def _ratio_text(entry: dict | None) -> str:
    if not entry:
        return "—"
    spread = entry.get("spread")
    return f"{entry['ratio']:.3f}" + (f" ({spread[0]:.2f}–{spread[1]:.2f})" if spread else "")


def _short(pipeline: str | None) -> str:
    """A per-layer mix's pipeline is long: its exclude= list is counted, not printed."""
    if pipeline and "(exclude=" in pipeline and len(pipeline) > 60:
        head, _, rest = pipeline.partition("(exclude=")
        return f"{head}(exclude= {rest.rstrip(')').count(';') + 1} layers)"
    return str(pipeline)


def _yes(value) -> str:
    return measure_fidelity.yes_no(value)


def markdown(results: dict) -> str:
    models = results["models"]
    state = "complete" if results.get("finished_utc") else "partial (the run was cut short or is still going)"
    lines = [f"# `plan` vs the fixed pipelines (issue 17) — {results['started_utc']}", "", f"`{results['command']}`", "",
             f"State: {state}. {results['calib']} calibration samples per model (the plan and the fixed pipelines "
             f"hold out one in four), {results['eval']} evaluation samples (a separate stream of `inputs.py`) for the "
             f"bench and the eval fidelity. Default target. Bench: ORT CPU, 1 intra-op thread, {results['runs']} "
             f"interleaved rounds ({results['warmup']} warm-up), original + plan + fixed pipelines in one run; "
             "ratios are paired (median of per-round ratios, P10–P90). Meets (eval) = the target's budget used on the "
             "eval samples ≤ 1 (our views, as measure_fidelity.py).", "",
             *([f"Note: {results['note']}", ""] if results.get("note") else []),
             f"Versions: {', '.join(f'{k} {v}' for k, v in results['versions'].items() if v)}.",
             f"CPU: {results['cpu'].get('model')} ({results['cpu'].get('logical_cpus')} logical, shared).", "",
             "## Acceptance", "",
             "| model | plan chose | best fixed (held-out) | plan × it | best fixed (eval) | plan × it | plan × fuse "
             "| ≤ 1.03 × best (held-out / eval) | ≥ 5 % faster (held-out / eval) | ≤ 1.03 × fuse | plan meets (eval) "
             "| planning s (trials, timed) | rerun: same bytes, timed | replay same bytes "
             "| goal size: plan / smallest fixed meeting the target (KB) |",
             "|" + "---|" * 15]
    for name, rec in models.items():
        if rec.get("skipped") or rec.get("error"):
            lines.append(f"| {name} | {measure_fidelity._cell(rec.get('skipped') or rec.get('error'))} |" + " |" * 14)
            continue
        acc, plan_info, size = rec["acceptance"], rec.get("plan") or {}, rec.get("size") or {}
        rerun = rec.get("rerun") or {}
        size_text = "—"
        if size.get("plan_bytes"):
            size_text = (f"{size['plan_bytes'] / 1024:.1f} ({_short(size.get('plan_pipeline'))}, meets eval: "
                         f"{_yes(size.get('plan_meets_eval'))}) / held-out "
                         f"{fmt((size.get('smallest_held_out_bytes') or 0) / 1024, '.1f')} ({size.get('smallest_held_out')})"
                         f", eval {fmt((size.get('smallest_bytes') or 0) / 1024, '.1f')} ({size.get('smallest')})")
        lines.append(
            f"| {name} | {_short(plan_info.get('chosen'))} | {rec.get('best_fixed_held_out')} "
            f"| {_ratio_text(rec.get('plan_vs_best_held_out'))} | {rec.get('best_fixed')} | {_ratio_text(rec.get('plan_vs_best'))} "
            f"| {_ratio_text(rec.get('plan_vs_fuse'))} | {_yes(acc['as_fast_as_best_held_out'])} / {_yes(acc['as_fast_as_best'])} | "
            f"{_yes(acc['faster_than_best_held_out_5pct'])} / {_yes(acc['faster_than_best_5pct'])} "
            f"| {_yes(acc['not_slower_than_fuse'])} | {_yes(acc['plan_meets_eval'])} "
            f"| {fmt(plan_info.get('seconds'), '.0f')} ({plan_info.get('trials')}, {plan_info.get('timed')}) | "
            f"{_yes(rerun.get('identical'))}, {rerun.get('timed', '—')} | {_yes((rec.get('replay') or {}).get('identical'))} "
            f"| {size_text} |")
    done = [r for r in models.values() if r.get("acceptance")]
    faster = sum(bool(r["acceptance"]["faster_than_best_5pct"]) for r in done)
    faster_held = sum(bool(r["acceptance"]["faster_than_best_held_out_5pct"]) for r in done)
    lines += ["", f"≥ 5 % faster than the best fixed pipeline on {faster_held} of {len(done)} models by the "
                  f"pipelines' own held-out verdicts, on {faster} of {len(done)} by the eval samples "
                  f"(acceptance: at least half). A result with the same bytes as an earlier one is timed once "
                  f"(`= earlier`): it compares at exactly 1.", "", "## Every result on the evaluation samples", "",
              "| model | result | × original (P10–P90) | size KB | met (held-out, report) | used (eval) | meets (eval) "
              "| per view cosine (eval) | binding (report) | task: score (original) |", "|" + "---|" * 10]
    for name, rec in models.items():
        for label, row in (rec.get("rows") or {}).items():
            if row.get("error"):
                lines.append(f"| {name} | {label} | failed: {measure_fidelity._cell(row['error'])} |" + " |" * 5)
                continue
            task = row.get("task") or {}
            views = ", ".join(f"{v['view']} {fmt(v.get('cosine'), '.4f')}" for v in row.get("views") or [])
            twin = f" (= {row['same_as']})" if row.get("same_as") else ""
            lines.append(f"| {name} | {label}{twin} | {_ratio_text(row.get('paired'))} | {fmt((row.get('size_bytes') or 0) / 1024, '.1f')} "
                         f"| {_yes(row.get('met_held_out'))} | {fmt(row.get('used_eval'), '.3f')} | {_yes(row.get('meets_eval'))} "
                         f"| {measure_fidelity._cell(views or '—')} | "
                         f"{measure_fidelity._cell(row.get('binding') or '—')} | {measure_fidelity._cell(task.get('task', '—'))}: "
                         f"{fmt(task.get('score'), '.3f')} ({fmt(task.get('score_original'), '.3f')}) |")
    lines += ["", "## Per model", ""]
    for name, rec in models.items():
        if rec.get("skipped") or rec.get("error"):
            lines.append(f"- {name}: {rec.get('skipped') or rec.get('error')}")
            continue
        p = rec.get("plan") or {}
        lines.append(f"- {name}: load before {rec['load_before']}, after {rec.get('load_after')}; {rec['seconds']} s in all; "
                     f"plan wall {fmt(p.get('wall_seconds'), '.0f')} s (its own {fmt(p.get('seconds'), '.0f')} s), "
                     f"peak RSS {fmt(p.get('peak_rss_mb'), '.0f')} MB; plan's table:")
        lines += ["", "```", *(p.get("table") or "").splitlines(), "```", ""]
    return "\n".join(lines)


# --- running it ----------------------------------------------------------------------------

@contextmanager
def bench_lock():
    """``flock /tmp/bench.lock`` for the timed parts run in this process."""
    with open(LOCK, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def cli(args_list: list, timeout: float, locked: bool) -> dict:
    """``python -m onnxslim_kit ARGS`` in a measured child process (in a temporary folder, so the
    checkout's source tree never shadows the installed package); under the bench lock when timed."""
    cmd = [sys.executable, "-m", "onnxslim_kit", *map(str, args_list)]
    if locked:
        cmd = ["flock", LOCK, *cmd]
    workdir = tempfile.mkdtemp(prefix="slim-plan-")
    try:
        return anchors.measure(cmd, timeout=timeout, cwd=workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _failed(result: dict) -> str | None:
    if result["timed_out"]:
        return "timed out"
    if result["returncode"] != 0:
        return f"exit {result['returncode']}: {anchors.last_error_line(result['stderr'] or result['stdout'])}"
    return None


def run_plan(src: Path, calib: Path, work: Path, stem: str, args, goal: str = "latency",
             cache: Path | None = None) -> dict:
    """One plan run; ``{output, report, recipe, seconds, trials, timed, chosen, wall_seconds, …}``."""
    out, report, recipe = work / f"{stem}.onnx", work / f"{stem}.json", work / f"{stem}.recipe.json"
    cache = cache or work / f"{stem}.cache.json"
    cmd = ["plan", src, "--calib", calib, "--goal", goal, "-o", out, "--recipe", recipe, "--report", report,
           "--timing-cache", cache, "--runs", args.plan_runs, "--warmup", args.plan_warmup]
    result = cli(cmd, args.tool_timeout, locked=goal == "latency")
    info = {"command": "python -m onnxslim_kit " + shlex.join(map(str, cmd)), "wall_seconds": result["wall_seconds"],
            "peak_rss_mb": result["peak_rss_mb"], "error": _failed(result), "table": result["stdout"].strip()}
    if info["error"] is None:
        data = json.loads(report.read_text())
        chosen = next(c for c in data["candidates"] if c["pipeline"] == data["chosen"])
        info.update(output=str(out), recipe=str(recipe), cache=str(cache), chosen=data["chosen"],
                    seconds=data["seconds"], timed=data["timed"], cache_hits=data["cache_hits"],
                    trials=sum(1 for c in data["candidates"] if not c.get("skipped")),
                    size_bytes=chosen.get("size_bytes"), sha256=chosen.get("sha256"),
                    candidates=[{k: c.get(k) for k in ("pipeline", "met", "used", "size_bytes", "timing", "same_as",
                                                       "error", "optimize_seconds")} for c in data["candidates"]])
    return info


def same_bytes(a: str | Path | None, b: str | Path | None) -> bool | None:
    if not a or not b or not Path(a).is_file() or not Path(b).is_file():
        return None
    return Path(a).read_bytes() == Path(b).read_bytes()


def recording_bench(models: list, samples: list, names: list, args, metric) -> tuple:
    """``(rows by name, times by name)``: one interleaved benchmark, its raw per-round times kept."""
    from onnxslim_kit import bench

    recorded = []
    original = bench.timed_rounds

    def record(*a, **k):
        times = original(*a, **k)
        recorded.append(times)
        return times

    bench.timed_rounds = record
    try:
        with bench_lock():
            report = bench.benchmark(models, samples, names=names, threads=(1,), runs=args.runs, warmup=args.warmup,
                                     opt_level="all", metric=metric, memory=False)
    finally:
        bench.timed_rounds = original
    rows = {row["name"]: row for row in report.rows}
    active = [row["name"] for row in report.rows if not row.get("error")]
    times = dict(zip(active, recorded[0])) if recorded else {}
    return rows, times, report.settings


def result_row(bench_row: dict, times: dict, name: str, report: dict | None, target: str, size: int | None) -> dict:
    if bench_row.get("error"):
        return {"error": bench_row["error"]}
    views = bench_row.get("views")
    used = measure_fidelity.eval_used(views, target) if name != "original" else 0.0
    fid = measure_fidelity.last_fidelity(report or {})
    return {"x_original": bench_row.get("latency_ratio_vs_first"), "paired": paired(times.get(name), times.get("original")),
            "median_ms": (bench_row.get("latency_ms") or {}).get("median"), "size_bytes": size,
            "used_eval": used, "meets_eval": True if used is None and name in ("original", "fuse") else (
                None if used is None else used <= 1.0),
            "binding": None if fid is None else f"{fid.get('binding')} ({fmt(fid.get('used'), '.2f')})",
            "views": views, "task": measure_fidelity.task_figures(bench_row.get("metric"))}


def measure_model(name: str, args, work: Path) -> dict:
    start = time.perf_counter()
    record, src, data, calib = measure_fidelity.suite_model(name, args, work)
    if src is None:
        return record

    run_suite.log(f"{name}: plan (goal latency)")
    plan = record["plan"] = run_plan(src, calib, work, f"{name}.plan", args)
    if plan["error"]:
        record["error"] = f"plan failed: {plan['error']}"
        return record
    run_suite.log(f"{name}: plan chose {plan['chosen']} in {plan['seconds']:.0f} s; rerun with the cache")
    again = work / f"{name}.plan2.cache.json"
    shutil.copyfile(plan["cache"], again)  # the first run's cache, so the first stays as it was written
    rerun = run_plan(src, calib, work, f"{name}.plan2", args, cache=again)
    rerun["identical"] = same_bytes(plan["output"], rerun.get("output"))
    record["rerun"] = rerun
    run_suite.log(f"{name}: replay the recipe")
    replay_out = work / f"{name}.replay.onnx"
    replay = cli([src, "--recipe", plan["recipe"], "-o", replay_out, "-q"], args.tool_timeout, locked=False)
    record["replay"] = {"error": _failed(replay), "wall_seconds": replay["wall_seconds"],
                        "identical": same_bytes(plan["output"], replay_out)}

    sized = not args.no_size and name in {m.strip() for m in args.size_models.split(",")}
    fixed = FIXED + (SIZE_EXTRA if sized else ())
    runs = {}
    for pipeline in fixed:
        dst = work / f"{name}.{measure_fidelity._slug(pipeline)}.onnx"
        runs[pipeline] = (run_suite.run_pipeline(pipeline, src, dst, calib, args.tool_timeout), dst)
        run_suite.log(f"  {name} {pipeline}: {run_suite.status(runs[pipeline][0])}")
    produced = [p for p in fixed if runs[p][0]["output"]]
    files = {"original": src, "plan": Path(plan["output"]), **{p: runs[p][1] for p in produced}}
    twins = same_files(files)
    unique = [n for n in files if twins[n] == n]
    run_suite.log(f"{name}: bench of {len(unique)} distinct models ({len(files)} results)")
    rows, times, settings = recording_bench([files[n] for n in unique], data.eval, unique, args, data.metric)
    for n in files:  # a result with the bytes of an earlier one: its row and times are that one's
        rows.setdefault(n, rows[twins[n]])
        if twins[n] in times:
            times.setdefault(n, times[twins[n]])
    record["bench_settings"] = settings
    record["same_bytes_as"] = {n: t for n, t in twins.items() if t != n}
    target = "cos:0.99"
    reports = {p: measure_fidelity._read_report(runs[p][1]) for p in produced}
    plan_report = json.loads(Path(plan["recipe"]).read_text())
    record["rows"] = {"original": result_row(rows["original"], times, "original", None, target, src.stat().st_size),
                      "plan": result_row(rows["plan"], times, "plan", plan_report, target, plan["size_bytes"])}
    record["rows"]["plan"]["met_held_out"] = held_out_met(plan_report)
    for p in fixed:
        if p in produced:
            record["rows"][p] = result_row(rows[p], times, p, reports[p], target, runs[p][1].stat().st_size)
            record["rows"][p]["met_held_out"] = held_out_met(reports[p])
        else:
            record["rows"][p] = {"error": runs[p][0]["error"]}
    for row in record["rows"].values():
        row.pop("same_as", None)
    for n, t in record["same_bytes_as"].items():
        record["rows"][n]["same_as"] = t
    best = record["best_fixed"] = best_fixed(record["rows"], FIXED)
    record["plan_vs_best"] = paired(times.get("plan"), times.get(best)) if best else None
    held = record["best_fixed_held_out"] = best_fixed(record["rows"], FIXED, key="met_held_out")
    record["plan_vs_best_held_out"] = paired(times.get("plan"), times.get(held)) if held else None
    record["plan_vs_fuse"] = paired(times.get("plan"), times.get("fuse"))

    if sized:
        run_suite.log(f"{name}: plan (goal size)")
        size_plan = run_plan(src, calib, work, f"{name}.size", args, goal="size")
        smallest = smallest_fixed(record["rows"], fixed)
        held = smallest_fixed(record["rows"], fixed, key="met_held_out")
        record["size"] = {"plan_pipeline": size_plan.get("chosen"), "plan_bytes": size_plan.get("size_bytes"),
                          "plan_seconds": size_plan.get("seconds"), "error": size_plan.get("error"),
                          "smallest": smallest,
                          "smallest_bytes": record["rows"][smallest]["size_bytes"] if smallest else None,
                          "smallest_held_out": held,
                          "smallest_held_out_bytes": record["rows"][held]["size_bytes"] if held else None,
                          "plan_meets_eval": (record["rows"].get(size_plan.get("chosen")) or {}).get("meets_eval")}
    record["acceptance"] = acceptance(record)
    record["load_after"] = [round(x, 2) for x in os.getloadavg()]
    record["seconds"] = round(time.perf_counter() - start, 1)
    return record


def resummarize(results: dict) -> dict:
    """The summaries of each model recomputed from its rows (``--render``)."""
    for record in results["models"].values():
        rows = record.get("rows")
        if not rows:
            continue
        size = record.get("size")
        if size:
            fixed = tuple(p for p in FIXED + SIZE_EXTRA if p in rows)
            held = smallest_fixed(rows, fixed, key="met_held_out")
            size.update(smallest_held_out=held, smallest_held_out_bytes=rows[held]["size_bytes"] if held else None,
                        plan_meets_eval=(rows.get(size.get("plan_pipeline")) or {}).get("meets_eval"))
        record["acceptance"] = acceptance(record)
    return results


def write(results: dict, stem: Path) -> None:
    stem.with_suffix(".json").write_text(json.dumps(measure_fidelity._finite(results), indent=2,
                                                    default=measure_fidelity.json_default))
    stem.with_suffix(".md").write_text(markdown(results) + "\n")


def main(argv: list | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.render:
        write(resummarize(json.loads(args.render.read_text())), args.render.with_suffix(""))
        print(args.render.with_suffix(".md"))
        return 0
    started = datetime.now(timezone.utc)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / (args.name or f"plan-{started.date().isoformat()}")
    results = {"command": "python benchmarks/measure_plan.py " + shlex.join(sys.argv[1:] if argv is None else argv),
               "started_utc": started.isoformat(timespec="seconds"), "calib": args.calib, "eval": args.eval,
               "runs": args.runs, "warmup": args.warmup, "versions": suite_report.versions(), "cpu": suite_report.cpu_info(),
               "models": {}}
    work_ctx = tempfile.TemporaryDirectory(prefix="measure-plan-") if args.keep is None else None
    work_root = Path(work_ctx.name) if work_ctx else args.keep
    work_root.mkdir(parents=True, exist_ok=True)
    try:
        for name in [m.strip() for m in args.models.split(",") if m.strip()]:
            try:
                results["models"][name] = measure_model(name, args, work_root)
            except Exception as exc:  # noqa: BLE001 - one model failing is a row, the run goes on
                results["models"][name] = {"model": name, "error": f"{type(exc).__name__}: {exc}"}
            write(results, stem)
        results["finished_utc"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
        write(results, stem)
    finally:
        if work_ctx:
            work_ctx.cleanup()
    print(stem.with_suffix(".md"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
