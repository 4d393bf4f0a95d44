"""Print the README's performance tables from a results JSON written by run_suite.py.

    python benchmarks/readme_tables.py benchmarks/results/2026-11-29-s4.json

Two tables: graph size after the lossless simplifiers (nodes, and whether outputs held), and
latency / fidelity of every variant (paired median latency ratio vs the original, ORT
optimizations on, 1 thread; task score agreement with the original). Nothing is typed by
hand: the README quotes this script's output.
"""

from __future__ import annotations

import json
import sys

LOSSLESS = ["ours:fuse", "onnxslim", "onnxsim", "onnxoptimizer"]


def _rows(model: dict) -> dict:
    return {row["variant"]: row for row in model["rows"]}


def _cell_nodes(row: dict | None) -> str:
    if row is None or row.get("nodes") is None:
        return "failed" if row else "—"
    return str(row["nodes"])


def _cell_speed(row: dict | None) -> str:
    if row is None:
        return "—"
    if row.get("ratio_all") is None:
        return "failed"
    agree = (row.get("metric") or {}).get("agreement")
    text = f"{row['ratio_all']:.2f}×"
    return text + (f" · {agree:.2f}" if agree is not None else "")


def tables(results: dict) -> str:
    models = results["models"]
    variants = [r["variant"] for r in models[0]["rows"] if r["variant"] != "original"]
    out = [f"From `{results['command']}` ({results['started_utc'][:10]}, "
           f"{results['machine']['logical_cpus']} CPUs, ONNX Runtime {results['versions']['onnxruntime']}).", ""]
    out.append("Nodes after each lossless simplifier (fewer is better):")
    out.append("")
    out.append("| model | original | " + " | ".join(LOSSLESS) + " |")
    out.append("|---|---:|" + "---:|" * len(LOSSLESS))
    for model in models:
        rows = _rows(model)
        cells = [_cell_nodes(rows.get("original"))] + [_cell_nodes(rows.get(v)) for v in LOSSLESS]
        out.append(f"| {model['model']} | " + " | ".join(cells) + " |")
    out.append("")
    out.append("Latency vs the original (paired median ratio, < 1 is faster) · agreement with the original's "
               "task decisions on held-out samples:")
    out.append("")
    out.append("| model | " + " | ".join(variants) + " |")
    out.append("|---|" + "---|" * len(variants))
    for model in models:
        rows = _rows(model)
        out.append(f"| {model['model']} | " + " | ".join(_cell_speed(rows.get(v)) for v in variants) + " |")
    return "\n".join(out)


def main(argv: list) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("results", help="a results JSON of run_suite.py, e.g. benchmarks/results/2026-11-29-s4.json")
    args = parser.parse_args(argv)
    with open(args.results) as fh:
        print(tables(json.load(fh)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
