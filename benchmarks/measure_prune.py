"""Structured pruning on real models: the accuracy / speed trade-off, ours vs onnxsim.

    python benchmarks/measure_prune.py                               # all conv models, ratios 0.1…0.5
    python benchmarks/measure_prune.py --models orientation --ratios 0.3 --prune "cost=latency"

Per model (calibration and evaluation samples from ``inputs.py``, as ``run_suite.py`` makes
them — the two sets come from different random streams):

1. ``fuse`` (lossless) runs once; its output is the **reference** of every row below;
2. for every ratio ``r`` of ``--ratios``: our ``prune(ratio=r, …)`` on the fused model, fed the
   *calibration* samples only (importance and re-fit), and onnxsim 0.8.1's
   ``onnxsim.pruning.apply_structured_pruning(fused, sparsity=r)`` (L2 filter norms, its own
   producer→consumer chains) at the same ratio;
3. :func:`onnxslim_kit.bench.benchmark` runs the fused model and every variant together on the
   held-out *evaluation* samples, interleaved round by round, 1 intra-op thread, ORT graph
   optimizations ``all``: ``latency ratio`` = median over rounds of t_variant / t_fuse (paired
   within a round), ``cosine`` = worst output cosine over samples and outputs, ``agreement``
   = the task decisions (``tasks.py``) that match the fused model's;
4. ``meets`` = latency ratio ≤ 1/1.3 and (cosine ≥ 0.99 or agreement ≥ 0.98) — the acceptance
   of issue 5.

Writes ``results/prune-<date>.md`` and ``.json``. Latencies on a shared 2-core machine are noisy;
the machine's load average is recorded before and after each model.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import inputs
import numpy as np
import onnx
import suite_report

HERE = Path(__file__).resolve().parent
CONV_MODELS = ["orientation", "ppocr_cls_v2", "ppocrv4_rec", "mtcnn_onet", "ppocrv4_det"]
TARGET_SPEEDUP = 1.3
STEP_OUTPUTS = {"ppocrv4_rec": "softmax_11.tmp_0"}  # per-time-step top-1 (see with_step_top1)


def parse_args(argv: list) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(CONV_MODELS), help="comma list")
    parser.add_argument("--ratios", default="0.1,0.2,0.3,0.4,0.5", help="comma list of pruning ratios")
    parser.add_argument("--prune", default="", help='extra prune options, e.g. "cost=latency,criterion=obs"')
    parser.add_argument("--no-onnxsim", action="store_true", help="skip onnxsim's structured pruning")
    parser.add_argument("--calib", type=int, default=16, help="calibration samples (default 16)")
    parser.add_argument("--eval", type=int, default=16, help="evaluation samples (default 16)")
    parser.add_argument("--runs", type=int, default=20, help="timed rounds (default 20)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed rounds (default 2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--name", help="results file stem (default prune-<UTC date>)")
    parser.add_argument("--render", type=Path, help="only re-render the .md of this saved results .json")
    parser.add_argument("--compare", type=Path, nargs="+", metavar="JSON",
                        help="only write a before → after table: the first results .json is 'before', the others "
                             "'after' (to --out/--name)")
    return parser.parse_args(argv)


def prune_options(ratio: float, extra: str) -> dict:
    options = {"ratio": str(ratio)}
    for item in filter(None, (p.strip() for p in extra.split(","))):
        key, _, value = item.partition("=")
        options[key.strip()] = value.strip()
    return options


def ours(fused, feed, options: dict) -> tuple:
    """(pruned proto or None, row) — our prune pass, in process, on the calibration feed."""
    from onnxslim_kit.pipeline import PassSpec, run_pipeline

    start = time.perf_counter()
    try:
        out, report = run_pipeline(fused, [PassSpec("prune", options)], feed, verify=False)
        onnx.checker.check_model(out, full_check=True)
    except Exception as exc:  # noqa: BLE001 - a failure is a row, not a crash
        return None, {"error": f"{type(exc).__name__}: {exc}"[:300]}
    entry = report.passes[-1]
    row = {"seconds": round(time.perf_counter() - start, 1), "units_pruned": entry.metrics.get("units_pruned"),
           "skipped": dict(entry.skipped)}
    return out, row


def onnxsim_pruned(fused, ratio: float) -> tuple:
    from onnxsim.pruning import apply_structured_pruning

    start = time.perf_counter()
    try:
        out = apply_structured_pruning(onnx.ModelProto.FromString(fused.SerializeToString()), sparsity=ratio)
        onnx.checker.check_model(out)
    except Exception as exc:  # noqa: BLE001
        return None, {"error": f"{type(exc).__name__}: {exc}"[:300]}
    return out, {"seconds": round(time.perf_counter() - start, 1)}


def worst_cosine(drift: dict | None):
    values = [d["cosine"] for d in (drift or {}).values() if d and d.get("cosine") is not None]
    return min(values) if values else None


def summarise(row: dict, bench_row: dict) -> dict:
    metric = bench_row.get("metric") or {}
    row.update({
        "params": bench_row.get("params"), "macs": bench_row.get("macs"),
        "latency_ms": (bench_row.get("latency_ms") or {}).get("median"),
        "latency_ratio": bench_row.get("latency_ratio_vs_first"),
        "latency_ratio_spread": bench_row.get("latency_ratio_spread"),
        "cosine": worst_cosine(bench_row.get("drift")),
        "task": metric.get("task"), "score": metric.get("score"), "agreement": metric.get("agreement"),
        "step_top1": metric.get("step_top1"), "cosine_by_label": metric.get("cosine_by_label"),
        "error": row.get("error") or bench_row.get("error"),
    })
    ratio, cos, agr = row["latency_ratio"], row["cosine"], row["agreement"]
    row["meets"] = bool(ratio is not None and ratio <= 1 / TARGET_SPEEDUP
                        and ((cos is not None and cos >= 0.99) or (agr is not None and agr >= 0.98)))
    return row


def with_step_top1(metric, output: str | None):
    """``metric`` plus ``step_top1``: the share of (sample, time step) positions of ``output`` whose
    argmax equals the fused model's — per-character top-1 of a CTC recognizer, next to its
    whole-string agreement (a string counts as wrong when one of its ~40 steps changes)."""
    if metric is None or output is None:
        return metric

    def hook(reference, outputs):
        values = dict(metric(reference, outputs))
        same = [np.argmax(np.asarray(r[output]), -1) == np.argmax(np.asarray(o[output]), -1)
                for r, o in zip(reference, outputs) if output in r and output in o]
        if same:
            values["step_top1"] = float(np.mean(np.concatenate([s.ravel() for s in same])))
        return values
    return hook


def with_label_cosine(metric, labels):
    """``metric`` plus ``cosine_by_label``: {label: {output: worst cosine over the samples of that label}}
    when the evaluation samples carry integer class labels (e.g. MTCNN-O: its box and landmark outputs
    are used only on faces, label 1)."""
    from onnxslim_kit.metrics import cosine

    if metric is None or not labels or not all(isinstance(label, int) for label in labels):
        return metric

    def hook(reference, outputs):
        values = dict(metric(reference, outputs))
        by_label: dict = {}
        for label, r, o in zip(labels, reference, outputs):
            for key in r:
                if key in o and np.asarray(r[key]).dtype.kind == "f":
                    cell = by_label.setdefault(str(label), {})
                    cell[key] = min(cell.get(key, 1.0), cosine(r[key], o[key]))
        values["cosine_by_label"] = {k: {o: round(c, 4) for o, c in v.items()} for k, v in by_label.items()}
        return values
    return hook


def run_model(name: str, args) -> dict:
    from onnxslim_kit.bench import benchmark
    from onnxslim_kit.calibration import CalibrationFeed, input_specs
    from onnxslim_kit.model import load_proto
    from onnxslim_kit.pipeline import PassSpec, run_pipeline

    record = {"model": name, "load_before": os.getloadavg()}
    path = inputs.model_path(name)
    data = inputs.build(name, n_calib=args.calib, n_eval=args.eval, seed=args.seed, path=path)
    proto = load_proto(path)
    feed = CalibrationFeed(input_specs(proto), data.calib)
    fused, _ = run_pipeline(proto, [PassSpec("fuse", {})], feed, verify=False)
    metric = with_label_cosine(with_step_top1(data.metric, STEP_OUTPUTS.get(name)), data.labels)
    models, rows = [fused], [{"variant": "fuse", "ratio": 0.0}]
    for ratio in args.ratio_list:
        options = prune_options(ratio, args.prune)
        out, row = ours(fused, feed, options)
        label = "ours: prune(" + ",".join(f"{k}={v}" for k, v in options.items()) + ")"
        rows.append({"variant": label, "ratio": ratio, **row})
        log(f"{name}: {label} {row}")
        if out is not None:
            models.append(out)
            rows[-1]["index"] = len(models) - 1
        if not args.no_onnxsim:
            out, row = onnxsim_pruned(fused, ratio)
            rows.append({"variant": f"onnxsim: apply_structured_pruning(sparsity={ratio})", "ratio": ratio, **row})
            log(f"{name}: onnxsim {ratio} {row}")
            if out is not None:
                models.append(out)
                rows[-1]["index"] = len(models) - 1
    rows[0]["index"] = 0
    start = time.perf_counter()
    report = benchmark(models, data.eval, names=[str(i) for i in range(len(models))], runs=args.runs,
                       warmup=args.warmup, opt_level="all", metric=metric, memory=False)
    record["bench_seconds"] = round(time.perf_counter() - start, 1)
    for row in rows:
        if "index" in row:
            summarise(row, report.rows[row.pop("index")])
    record.update(rows=rows, load_after=os.getloadavg(), settings=report.settings)
    return record


def _cell(value, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def markdown(results: dict) -> str:
    lines = [f"# prune: accuracy / speed trade-off ({results['date_utc']})", "",
             f"Command: `{results['command']}`", "",
             ("Reference of every row: the model after `fuse` (lossless). Latency ratio = median over "
              "interleaved rounds of t / t_fuse, ORT CPU, 1 intra-op thread, graph optimizations `all`; "
              "cosine = worst output cosine over the held-out evaluation samples; agreement = task "
              "decisions equal to the fused model's. `meets` = ratio ≤ 1/1.3 and (cosine ≥ 0.99 or "
              "agreement ≥ 0.98). `step top-1` (text recognizer only): share of time steps whose argmax (the "
              "character) equals the fused model's, over all evaluation samples. The machine is shared (2 cores, other jobs running): latency numbers "
              "are noisy, the spread column is [P10, P90] of the per-round ratios."), "",
             f"Versions: {json.dumps(results['versions'])}", ""]
    for record in results["models"]:
        lines += [f"## {record['model']}", "",
                  (f"load average before / after: {record['load_before'][0]:.1f} / {record['load_after'][0]:.1f}; "
                   f"benchmark took {record['bench_seconds']} s"), "",
                  ("| variant | params | MACs | MACs vs fuse | latency ms | ratio vs fuse | spread | worst cosine | "
                   "task | agreement | step top-1 | score | took s | meets |"),
                  "|---|---:|---:|---:|---:|---:|---|---:|---|---:|---:|---:|---:|:-:|"]
        base_macs = record["rows"][0].get("macs")
        for row in record["rows"]:
            if row.get("error"):
                lines.append(f"| {row['variant']} | error: {row['error']} |||||||||||||")
                continue
            spread = row.get("latency_ratio_spread")
            lines.append(
                f"| {row['variant']} | {_cell(row.get('params'), ',')} | {_cell(row.get('macs'), ',')} | "
                f"{_cell(row['macs'] / base_macs if row.get('macs') and base_macs else None, '.3f')} | "
                f"{_cell(row.get('latency_ms'), '.2f')} | {_cell(row.get('latency_ratio'), '.3f')} | "
                f"{'—' if not spread else '[' + ', '.join(f'{s:.2f}' for s in spread) + ']'} | "
                f"{_cell(row.get('cosine'), '.4f')} | {row.get('task') or '—'} | {_cell(row.get('agreement'), '.3f')} | "
                f"{_cell(row.get('step_top1'), '.4f')} | {_cell(row.get('score'), '.3f')} | {_cell(row.get('seconds'), '')} | "
                f"{'yes' if row.get('meets') else ''} |")
        labelled = [r for r in record["rows"] if r.get("cosine_by_label")]
        if labelled:
            lines += ["", "Worst output cosine per evaluation label (label: output=cosine):", ""]
            lines += [f"- {r['variant']}: " + "; ".join(
                f"label {label}: " + ", ".join(f"{o}={c:.4f}" for o, c in outs.items())
                for label, outs in sorted(r["cosine_by_label"].items())) for r in labelled if r["ratio"]]
        lines.append("")
    return "\n".join(lines + summary(results))


def summary(results: dict) -> list:
    """Per model and tool: the fastest row that keeps fidelity (cosine ≥ 0.99 or agreement ≥ 0.98)."""
    lines = ["## Summary: fastest variant that keeps fidelity (cosine ≥ 0.99 or agreement ≥ 0.98)", "",
             "| model | tool | variant | MACs vs fuse | latency ratio vs fuse | worst cosine | agreement |",
             "|---|---|---|---:|---:|---:|---:|"]
    for record in results["models"]:
        base_macs = record["rows"][0].get("macs")
        for tool in ("ours", "onnxsim"):
            ok = [r for r in record["rows"] if r["variant"].startswith(tool) and not r.get("error")
                  and ((r.get("cosine") or 0) >= 0.99 or (r.get("agreement") or 0) >= 0.98)]
            if not any(r["variant"].startswith(tool) for r in record["rows"]):
                continue
            if not ok:
                lines.append(f"| {record['model']} | {tool} | none keeps fidelity |||||")
                continue
            best = min(ok, key=lambda r: (r.get("macs") or float("inf")))
            lines.append(f"| {record['model']} | {tool} | {best['variant']} | "
                         f"{_cell(best['macs'] / base_macs if best.get('macs') and base_macs else None, '.3f')} | "
                         f"{_cell(best.get('latency_ratio'), '.3f')} | {_cell(best.get('cosine'), '.4f')} | "
                         f"{_cell(best.get('agreement'), '.3f')} |")
    return lines + ["", "Chosen by MACs (deterministic) rather than by the noisy latency ratio.", ""]


def _our_rows(record: dict) -> dict:
    return {row["ratio"]: row for row in record["rows"] if row["variant"].startswith("ours")}


def _speedup(row: dict):
    ratio = row.get("latency_ratio")
    return 1 / ratio if ratio else None


def compare(paths: list, command: str) -> str:
    """Per model and ratio: our rows of the first results file ('before') next to the others ('after')."""
    before = {r["model"]: r for r in json.loads(paths[0].read_text())["models"]}
    lines = ["# prune: before → after", "", f"Command: `python benchmarks/measure_prune.py {command}`", "",
             f"Before: `{paths[0].name}`; after: " + ", ".join(f"`{p.name}`" for p in paths[1:]) + ".", "",
             ("Each cell is before → after. speed-up = 1 / (median paired latency ratio vs `fuse`), ORT CPU, "
              "1 thread; its run-to-run noise on this shared machine is large (see the spread columns of the "
              "source files); MACs vs fuse is exact. cosine = worst output cosine, agreement = task decisions "
              "equal to the fused model's, both on held-out evaluation samples; step top-1 (recognizer): share of "
              "time steps with the fused model's argmax."), ""]
    for path in paths[1:]:
        results = json.loads(path.read_text())
        for record in results["models"]:
            old = _our_rows(before.get(record["model"], {"rows": []}))
            new = _our_rows(record)
            sim = {row["ratio"]: row for row in record["rows"] if row["variant"].startswith("onnxsim")}
            variant = next(iter(new.values()))["variant"] if new else ""
            options = ",".join(o for o in variant.partition("(")[2].rstrip(")").split(",") if not o.startswith("ratio="))
            lines += [f"## {record['model']}", "",
                      f"after: `{results['command']}` (prune options besides ratio: {options or 'defaults'}); "
                      f"load average {record['load_before'][0]:.1f} / {record['load_after'][0]:.1f}", "",
                      ("| ratio | MACs vs fuse | speed-up vs fuse | worst cosine | agreement | step top-1 | tool s | meets | "
                       "onnxsim same ratio, same run: speed-up / cosine / agreement |"),
                      "|---:|---|---|---|---|---|---|---|---|"]
            base_new, base_old = record["rows"][0].get("macs"), before.get(record["model"], {"rows": [{}]})["rows"][0].get("macs")
            for ratio in sorted(new):
                a, b = old.get(ratio, {}), new[ratio]

                def pair(key, spec, fa=a, fb=b, fn=None):
                    va, vb = (fn(fa), fn(fb)) if fn else (fa.get(key), fb.get(key))
                    return f"{_cell(va, spec)} → {_cell(vb, spec)}"

                def macs(row, base):
                    return row["macs"] / base if row.get("macs") and base else None

                lines.append(
                    f"| {ratio} | {_cell(macs(a, base_old), '.3f')} → {_cell(macs(b, base_new), '.3f')} | "
                    f"{pair(None, '.2f', fn=_speedup)}× | {pair('cosine', '.4f')} | {pair('agreement', '.3f')} | "
                    f"{pair('step_top1', '.4f')} | {pair('seconds', '')} | "
                    f"{'yes' if a.get('meets') else 'no'} → {'yes' if b.get('meets') else 'no'} | "
                    f"{_cell(_speedup(sim.get(ratio, {})), '.2f')}× / {_cell(sim.get(ratio, {}).get('cosine'), '.4f')} / "
                    f"{_cell(sim.get(ratio, {}).get('agreement'), '.3f')} |")
            lines.append("")
    return "\n".join(lines)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def main(argv: list | None = None) -> int:
    given = sys.argv[1:] if argv is None else argv
    args = parse_args(given)
    if args.render:  # re-render the markdown of a saved run
        args.render.with_suffix(".md").write_text(markdown(json.loads(args.render.read_text())))
        return 0
    if args.compare:
        stem = args.name or "prune-compare"
        (args.out / f"{stem}.md").write_text(compare(args.compare, " ".join(shlex.quote(a) for a in given)))
        log(f"wrote {args.out / stem}.md")
        return 0
    args.ratio_list = [float(r) for r in args.ratios.split(",") if r.strip()]
    started = datetime.now(timezone.utc)
    records = []
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        records.append(run_model(name, args))
    results = {"date_utc": started.isoformat(timespec="seconds"),
               "command": "python benchmarks/measure_prune.py " + " ".join(shlex.quote(a) for a in given),
               "versions": suite_report.versions(), "models": records}
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.name or f"prune-{started.strftime('%Y-%m-%d')}"
    (args.out / f"{stem}.md").write_text(markdown(results))
    (args.out / f"{stem}.json").write_text(json.dumps(results, indent=1, default=_plain))
    log(f"wrote {args.out / stem}.md")
    return 0


def _plain(value):
    if isinstance(value, np.generic):
        return value.item()
    return str(value)


if __name__ == "__main__":
    sys.exit(main())
