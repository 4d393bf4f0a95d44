"""Benchmark rows as a terminal table or Markdown (one row per model, provider and threads).

Columns: latency median / p90 / p99 (ms), ``×first`` = paired median latency ratio against the
group's first model (see :mod:`onnxslim_kit.bench`), items/s, session creation (s), peak memory
added by the session (MB), size raw and compressed, parameters, estimated MACs, nodes, and the
drift of the outputs against the first model (worst output: lowest cosine, largest max-abs,
lowest top-1 agreement). ``int8 MACs``: the share of the MACs that ORT's optimized graph runs in
int8 kernels (:mod:`onnxslim_kit.executed`); a note under the table lists, per model, the
DequantizeLinear nodes ORT left and the ops they feed.
"""

from __future__ import annotations

from .executed import percent
from .report import _size

HEADER = ("model", "provider", "thr", "median ms", "p90 ms", "p99 ms", "×first", "items/s", "session s",
          "peak MB", "size", "compressed", "params", "MACs", "int8 MACs", "nodes", "drift vs first")


def _num(value, fmt: str) -> str:
    return "—" if value is None else format(value, fmt)


def _count(n) -> str:
    if n is None:
        return "—"
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f}{unit}"
    return str(n)


def drift_cell(drift: dict | None, first: bool, views: list | None = None) -> str:
    """The worst output view's cosine (with its name when the model has several views) and the
    worst decision agreement — a top-1 only where an output decides (Softmax / Sigmoid / integer)."""
    if first:
        return "reference"
    if not drift:
        return "—"
    values = list(drift.values())
    if any(d is None for d in values):
        return "outputs do not match the first model's"
    text = f"cos {min(d['cosine'] for d in values):.6f}, abs {max(d['max_abs'] for d in values):.1e}"
    if views:
        floats = [v for v in views if isinstance(v.get("cosine"), float)]
        if floats:
            worst = min(floats, key=lambda v: v["cosine"])
            name = f" {worst['view']}" if len(views) > 1 else ""
            text = f"cos {worst['cosine']:.6f}{name}, abs {max(d['max_abs'] for d in values):.1e}"
        decisions = [v for v in views if "agreement" in v]
        if decisions:
            worst = min(decisions, key=lambda v: v["agreement"])
            text += f", agree {worst['agreement'] * 100:.1f}% {worst['view']}"
    if any(d.get("nonfinite_mismatch") for d in values):
        text += ", NaN/Inf differ"
    return text


def int8_cell(summary: dict | None) -> str:
    """The share of MACs ORT runs in int8 kernels, with the count of compute ops left unknown."""
    if not summary or summary.get("error") or summary.get("int8_mac_share") is None:
        return "—"
    text = percent(summary["int8_mac_share"])
    return text + (f" ({summary['macs_unresolved']} ops unknown)" if summary.get("macs_unresolved") else "")


def executed_note(summary: dict | None) -> str | None:
    """``ORT left DequantizeLinear → HardSigmoid ×27, Conv ×2 (float compute 2 of 54)`` or None."""
    if not summary or summary.get("error") or not summary.get("unfused_by_op"):
        return None
    left = ", ".join(f"{op} ×{n}" for op, n in sorted(summary["unfused_by_op"].items(), key=lambda kv: -kv[1]))
    n_float, n_int8 = sum(summary["float_ops"].values()), sum(summary["int8_ops"].values())
    return f"ORT left DequantizeLinear → {left} (float compute {n_float} of {n_float + n_int8})"


def cells(row: dict, first: bool) -> tuple:
    lat = row.get("latency_ms") or {}
    macs = _count(row.get("macs"))
    if row.get("macs_unresolved_nodes"):
        macs = f"≥{macs} ({row['macs_unresolved_nodes']} ops unknown)"
    return (
        row["name"], row["provider"], str(row["threads"]),
        "FAILED" if row.get("error") else _num(lat.get("median"), ".3f"),
        _num(lat.get("p90"), ".3f"), _num(lat.get("p99"), ".3f"),
        _num(row.get("latency_ratio_vs_first"), ".3f"), _num(row.get("throughput_per_s"), ".1f"),
        _num(row.get("session_seconds"), ".3f"), _num(row.get("peak_memory_mb"), ".1f"),
        _size(row["size_bytes"]), _size(row["size_compressed_bytes"]), _count(row.get("params")), macs,
        int8_cell(row.get("executed")), str(row.get("nodes", "—")),
        drift_cell(row.get("drift"), first, row.get("views")),
    )


def render(rows: list, markdown: bool = False) -> str:
    body, seen, notes, noted = [], set(), [], set()
    for row in rows:
        group = (row["provider"], row["threads"])
        body.append(cells(row, first=group not in seen))
        seen.add(group)
        if row.get("error"):
            notes.append(f"{row['name']} ({row['provider']}, {row['threads']} threads): {row['error']}")
        note = executed_note(row.get("executed"))
        if note and (row["name"], row["provider"]) not in noted:  # once per model and provider
            noted.add((row["name"], row["provider"]))
            notes.append(f"{row['name']} ({row['provider']}): {note}")
        if row.get("metric"):
            metric = ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in row["metric"].items())
            notes.append(f"{row['name']} ({row['provider']}, {row['threads']} threads) metric: {metric}")
    if markdown:
        lines = ["| " + " | ".join(HEADER) + " |", "|" + "|".join("---" for _ in HEADER) + "|"]
        lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in body]
        return "\n".join(lines + ([""] + [f"- {n}" for n in notes] if notes else []))
    widths = [max(len(r[i]) for r in [HEADER, *body]) for i in range(len(HEADER))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [HEADER, *body]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines + notes)
