"""Benchmark rows as a terminal table or Markdown (one row per model, provider and threads).

Columns: latency median / p90 / p99 (ms), ``×first`` = paired median latency ratio against the
group's first model (see :mod:`onnxslim_kit.bench`), items/s, session creation (s), peak memory
added by the session (MB), size raw and compressed, parameters, estimated MACs, nodes, and the
drift of the outputs against the first model (worst output: lowest cosine, largest max-abs,
lowest top-1 agreement).
"""

from __future__ import annotations

from .report import _size

HEADER = ("model", "provider", "thr", "median ms", "p90 ms", "p99 ms", "×first", "items/s", "session s",
          "peak MB", "size", "compressed", "params", "MACs", "nodes", "drift vs first")


def _num(value, fmt: str) -> str:
    return "—" if value is None else format(value, fmt)


def _count(n) -> str:
    if n is None:
        return "—"
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f}{unit}"
    return str(n)


def drift_cell(drift: dict | None, first: bool) -> str:
    if first:
        return "reference"
    if not drift:
        return "—"
    values = list(drift.values())
    if any(d is None for d in values):
        return "outputs do not match the first model's"
    cos = min(d["cosine"] for d in values)
    text = f"cos {cos:.6f}, abs {max(d['max_abs'] for d in values):.1e}"
    top1 = [d["top1"] for d in values if d.get("top1") is not None]
    if top1:
        text += f", top1 {min(top1) * 100:.1f}%"
    if any(d.get("nonfinite_mismatch") for d in values):
        text += ", NaN/Inf differ"
    return text


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
        str(row.get("nodes", "—")), drift_cell(row.get("drift"), first),
    )


def render(rows: list, markdown: bool = False) -> str:
    body, seen, notes = [], set(), []
    for row in rows:
        group = (row["provider"], row["threads"])
        body.append(cells(row, first=group not in seen))
        seen.add(group)
        if row.get("error"):
            notes.append(f"{row['name']} ({row['provider']}, {row['threads']} threads): {row['error']}")
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
