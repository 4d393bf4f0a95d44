"""What a run did, as numbers: per-pass statistics, a terminal table, and JSON.

``model_stats`` counts nodes by op type (subgraphs included), parameters (elements of all
initializers and Constant-node tensors) and the serialized size in bytes.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field

import numpy as np
import onnx

from .model import model_size_bytes, proto_graphs


def _elements(tensor: onnx.TensorProto) -> int:
    return int(np.prod(tensor.dims)) if len(tensor.dims) else 1


def model_stats(proto: onnx.ModelProto) -> dict:
    ops, params = Counter(), 0
    for graph in proto_graphs(proto.graph):
        params += sum(_elements(t) for t in graph.initializer)
        for node in graph.node:
            ops[node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"] += 1
            if node.op_type == "Constant":
                params += sum(_elements(a.t) for a in node.attribute if a.type == onnx.AttributeProto.TENSOR)
    return {
        "nodes": sum(ops.values()),
        "ops": dict(sorted(ops.items())),
        "params": params,
        "bytes": model_size_bytes(proto),  # weights left in external data files included
    }


@dataclass
class PassReport:
    name: str
    options: dict
    lossless: bool
    modified: bool
    rewrites: dict
    skipped: dict
    notes: list
    metrics: dict
    seconds: float
    before: dict
    after: dict = field(default_factory=dict)
    verification: dict | None = None
    rolled_back: bool = False
    fidelity: dict | None = None  # lossy: views, the binding one, the budget used / allowed

    def finish(self, after: dict) -> "PassReport":
        self.after = after
        return self


@dataclass
class Report:
    passes: list = field(default_factory=list)
    before: dict = field(default_factory=dict)
    after: dict = field(default_factory=dict)
    load_notes: list = field(default_factory=list)
    original_check: str | None = None
    verified_on: str = "calibration samples"
    input_path: str | None = None
    output_path: str | None = None
    # what a replay (``--recipe``) needs: see :mod:`.recipe`
    tool: dict = field(default_factory=dict)  # versions: onnxslim_kit, onnx, onnxruntime, ...
    argv: list | None = None  # the command line, when run from it
    input_sha256: str | None = None
    seed: int = 0
    pass_list: list = field(default_factory=list)  # [{"name", "options"}] resolved, defaults filled in
    exclude: str | None = None
    rtol: float = 1e-4
    atol: dict = field(default_factory=dict)
    settings: dict = field(default_factory=dict)  # input shapes, fixed inputs, sample counts, verify
    sources: dict = field(default_factory=dict)  # calib / eval: what was given
    target: str = "cos:0.99"  # the pipeline's fidelity target
    metric: str | None = None  # the user metric binding it (module:function), if any
    views: list = field(default_factory=list)  # the output views that judged the lossy passes

    @property
    def ok(self) -> bool:
        return not any(p.rolled_back for p in self.passes)

    def to_dict(self) -> dict:
        data = asdict(self)
        data["ok"] = self.ok
        # option values as written (a parse hook's value, e.g. a selector, by its canonical text)
        for entry, original in zip(data["passes"], self.passes):
            entry["options"] = json_value(original.options)
        data["pass_list"] = json_value(self.pass_list)
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, default=_json_default)

    def table(self) -> str:
        return render_table(self)


def json_value(value):
    """``value`` with everything JSON cannot hold as itself written as ``str(value)`` (option
    values a parse hook made: their text form is what the hook reads back)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (np.integer, np.floating)):
        return value.item()
    if isinstance(value, dict):
        return {str(k): json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_value(v) for v in value]
    return str(value)


def _json_default(value):
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    return str(value)


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _verification_cell(entry: PassReport) -> str:
    v = entry.verification
    if not entry.modified:
        return "unchanged"
    if v is None:
        return "not verified"
    outs = v.get("outputs") or {}
    against = " vs the pass before" if v.get("against") == "previous" else ""
    if entry.rolled_back:
        return f"ROLLED BACK{against}: {v.get('message') or _drift_text(outs)}"
    if v["status"] == "unverified":
        return "checker only (ORT cannot run original)"
    if entry.fidelity:
        return f"{v['status']}: {_fidelity_text(entry.fidelity)}"
    return f"{v['status']}{against}: {_drift_text(outs)}"


def _fidelity_text(fid: dict) -> str:
    used = fid["used"]
    spent = "∞" if used == float("inf") or used == "inf" else f"{used:.0%}"
    held = "" if fid.get("met") else ", MISSED"
    share = "" if fid.get("allowed", 1.0) >= 1.0 else f" (its share {fid['allowed']:.0%})"
    return f"{fid['binding']}, {spent} of the {fid['target']} budget{share}{held}"


def _view_text(view: dict) -> str:
    parts = []
    if "cosine" in view:
        parts.append(f"cos {view['cosine']:.6f}" if isinstance(view["cosine"], float) else f"cos {view['cosine']}")
    if "agreement" in view:
        parts.append(f"agree {view['agreement'] * 100:.1f}%")
    if "margin_shift" in view and "min_margin" in view:
        parts.append(f"margins closed by ≤ {view['margin_shift']:.2g} nats, closest {view['min_margin']:.2g}")
    where = f" on the {view['masked_by']} positions" if view.get("masked_by") else ""
    return f"{view['view']}{where} {' '.join(parts)} (worst sample {view['worst_sample']})"


def _drift_text(outs: dict) -> str:
    if not outs:
        return ""
    rel = max(d["max_rel"] for d in outs.values())
    cos = min(d["cosine"] for d in outs.values())
    return f"rel {rel:.1e}, cos {cos:.6f}"  # a top-1 only where an output decides: the fidelity views


def _op_changes(before: dict, after: dict, limit: int = 6) -> str:
    ops = set(before["ops"]) | set(after["ops"])
    changes = []
    for op in sorted(ops):
        b, a = before["ops"].get(op, 0), after["ops"].get(op, 0)
        if a != b:
            changes.append((abs(a - b), f"{op} {b}→{a}"))
    changes.sort(key=lambda c: -c[0])
    text = ", ".join(c[1] for c in changes[:limit])
    return text + (", …" if len(changes) > limit else "")


def _summary_rows(report: Report) -> list:
    rows = [("pass", "nodes", "params", "size", "time", "verification")]
    b = report.before
    rows.append(("(input)", str(b.get("nodes", "")), f"{b.get('params', 0):,}", _size(b.get("bytes", 0)), "", ""))
    for p in report.passes:
        rows.append((
            p.name,
            f"{p.before['nodes']}→{p.after['nodes']}",
            f"{p.after['params']:,}",
            _size(p.after["bytes"]),
            f"{p.seconds:.2f}s",
            _verification_cell(p),
        ))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines


def _pass_details(p: PassReport) -> list:
    details = []
    if p.rewrites:
        details.append("rewrites: " + ", ".join(f"{k} ×{v}" for k, v in sorted(p.rewrites.items())))
    if p.skipped:
        details.append("skipped: " + ", ".join(f"{k} ×{v}" for k, v in sorted(p.skipped.items())))
    ops = _op_changes(p.before, p.after)
    if ops:
        details.append("ops: " + ops)
    details.extend(p.notes)
    if p.fidelity:
        details.append(f"views on {p.fidelity['samples']} {p.fidelity.get('judged_on') or 'samples'}: "
                       + "; ".join(_view_text(v) for v in p.fidelity["views"]))
    if p.modified and (p.verification or {}).get("status") == "unverified":
        details.append(f"not verified, only the onnx checker ran: {p.verification['message']}")
    return [f"{p.name}:"] + [f"  {d}" for d in details] if details else []


def _closing_notes(report: Report) -> list:
    lines = []
    lossy = [p.name for p in report.passes if p.modified and not p.lossless]
    if lossy and report.verified_on == "calibration samples":
        lines.append(f"note: drift of {', '.join(lossy)} measured on the calibration samples the passes saw; "
                     "pass --eval for held-out samples")
    elif lossy and report.verified_on == "generated random samples":
        lines.append(f"note: {', '.join(lossy)} calibrated and verified on generated random inputs, which say "
                     "little about accuracy on real data (top-1 of a classifier least of all); "
                     "pass --calib and --eval with real samples")
    last = next((p.fidelity for p in reversed(report.passes) if p.fidelity and not p.rolled_back), None)
    if last is not None and last.get("pipeline_met") is False:
        lines.append(f"warning: the pipeline's target {report.target} is missed: {last['binding']}")
    lines.extend(f"load: {note}" for note in report.load_notes)
    if report.original_check:
        lines.append(f"note: the original model fails the onnx checker ({report.original_check})")
    return lines


def render_table(report: Report) -> str:
    lines = _summary_rows(report)
    for p in report.passes:
        lines.extend(_pass_details(p))
    lines.extend(_closing_notes(report))
    return "\n".join(lines)
