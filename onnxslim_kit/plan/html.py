"""``--html``: the plan as one self-contained page (inline CSS, inline script, inline SVG plots).

Nothing is fetched: no CDN, no font, no image file; the charts are drawn in Python
(:mod:`.svg`). The page holds:

1. the table of candidates (the terminal table's columns, with the goal's measure: latency or
   peak; the script sorts it by a clicked header and, on a clicked row, highlights that
   candidate's marks in the plots);
2. the Pareto front: x = the goal's measure (latency ratio vs the original; peak memory under
   goal memory; budget used under goal size, where nothing is timed), y = size in KB; colour =
   share of the target's budget used (green 0 → red ≥ 1); the chosen candidate ringed; those
   on the front (over latency or peak, size and budget used) outlined; the original as a grey square (ratio 1, its size). Only
   feasible candidates with distinct bytes are data marks;
3. fidelity per output view of each lossy candidate (its last lossy pass's views on held-out
   samples): cosine and decision agreement, one chart each where present, with the target as a
   dashed line on the metric it names;
4. per-layer sensitivity, where the plan searched a per-layer mix (:mod:`.mix`): each
   MatMul/Gemm layer's loss at the outputs when it alone is dynamic int8, the layers the mix
   keeps float in another colour (the most sensitive ``SENSITIVITY_BARS`` layers);
5. size by op type of the original and of the chosen model (:func:`.profile.size_by_op`);
6. latency by op type before and after (:func:`.profile.op_latency`, ORT's profiler).

The script sets ``data-ready="1"`` on ``<body>`` when it has run (a headless browser test checks
that the scripts ran and that the console stayed clean).
"""

from __future__ import annotations

from html import escape

from . import svg
from .report import _binding, _latency, _mark, _peak, _state

CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222;max-width:1100px}
table{border-collapse:collapse;font-size:13px}th,td{padding:3px 8px;border-bottom:1px solid #ddd;text-align:left}
th{cursor:pointer;background:#f3f3f3}tr.chosen{font-weight:bold}tr.picked{background:#fff3c4}
.chart{display:block;margin:0.5em 0}.mark.picked{stroke:#000;stroke-width:3}section{margin-top:1.5em}
.note{color:#666;font-size:13px}
"""

SCRIPT = """
(function () {
  var table = document.getElementById("candidates");
  var heads = table.tHead.rows[0].cells;
  function key(cell) {
    var v = parseFloat(cell.getAttribute("data-sort"));
    return isNaN(v) ? cell.textContent : v;
  }
  Array.prototype.forEach.call(heads, function (th, col) {
    th.addEventListener("click", function () {
      var body = table.tBodies[0], rows = Array.prototype.slice.call(body.rows);
      var dir = th.getAttribute("data-dir") === "1" ? -1 : 1;
      th.setAttribute("data-dir", dir === 1 ? "1" : "-1");
      rows.sort(function (a, b) {
        var x = key(a.cells[col]), y = key(b.cells[col]);
        return (x > y ? 1 : x < y ? -1 : 0) * dir;
      });
      rows.forEach(function (r) { body.appendChild(r); });
    });
  });
  Array.prototype.forEach.call(table.tBodies[0].rows, function (row) {
    row.addEventListener("click", function () {
      var name = row.getAttribute("data-pipeline");
      document.querySelectorAll(".picked").forEach(function (e) { e.classList.remove("picked"); });
      row.classList.add("picked");
      document.querySelectorAll(".mark").forEach(function (m) {
        if (m.getAttribute("data-label") === name) { m.classList.add("picked"); }
      });
    });
  });
  document.body.setAttribute("data-ready", "1");
})();
"""



def _budget_colour(used: float | None) -> str:
    """Green (0) → yellow (0.5) → red (≥ 1) in HSL hue 120° → 0°."""
    t = 0.0 if used is None else min(max(used, 0.0), 1.0)
    return f"hsl({120 * (1 - t):.0f},70%,45%)"


def _cell(text: str, sort=None) -> str:
    attr = f' data-sort="{sort}"' if sort is not None else ""
    return f"<td{attr}>{escape(text)}</td>"


def _measure_column(result) -> tuple:
    """The goal's measured column: (header, text of a candidate, sort key), or None (goal size)."""
    goal = result.settings["goal"]
    if goal == "latency":
        return "latency ×orig [P10–P90]", _latency, lambda c: (c.timing or {}).get("ratio")
    if goal == "memory":
        return "session peak", _peak, lambda c: (c.memory or {}).get("peak_mb")
    return None


def _table(result) -> str:
    measure = _measure_column(result)
    columns = ("pipeline", "met", "binding (budget used)") + ((measure[0],) if measure else ()) + ("size", "")
    out = ['<table id="candidates"><thead><tr>' + "".join(f"<th>{escape(c)}</th>" for c in columns)
           + "</tr></thead><tbody>"]
    for c in result.candidates:
        cls = ' class="chosen"' if c is result.chosen else ""
        out.append(f'<tr{cls} data-pipeline="{escape(c.pipeline)}">' + _cell(c.display) + _cell(_state(c))
                   + _cell(_binding(c), c.used if c.used not in (None, float("inf")) else None)
                   + (_cell(measure[1](c), measure[2](c)) if measure else "")
                   + _cell(f"{c.size_bytes / 1024:.1f} KB" if c.size_bytes is not None else "—", c.size_bytes)
                   + _cell(_mark(c, result)) + "</tr>")
    out.append("</tbody></table>")
    return "\n".join(out)


def _front(result) -> str:
    goal = result.settings["goal"]
    feasible = [c for c in result.candidates if c.usable and c.same_as is None]
    measure = {"latency": ("latency ratio vs the original", lambda c: (c.timing or {}).get("ratio")),
               "memory": ("session peak (MB)", lambda c: (c.memory or {}).get("peak_mb")),
               "size": ("share of the target's budget used", lambda c: c.used)}[goal]
    points = [{"x": measure[1](c), "y": c.size_bytes / 1024, "label": c.display, "color": _budget_colour(c.used),
               "chosen": c is result.chosen, "front": c.pipeline in result.front}
              for c in feasible if measure[1](c) is not None]
    if not points:
        return '<p class="note">No feasible candidate was measured.</p>'
    x_original = {"latency": 1.0, "memory": result.reference.get("peak_mb"), "size": 0.0}[goal]
    if x_original is not None and result.reference.get("size_bytes"):
        points.append({"x": x_original, "y": result.reference["size_bytes"] / 1024, "label": "original",
                       "color": "#999", "reference": True})
    return (svg.scatter(points, measure[0], "size (KB)", "Pareto front")
            + '<p class="note">Colour: share of the target\'s budget used (green 0, red 1). Ringed: the chosen '
              'candidate. Outlined: on the Pareto front over the measure, size and budget used. Grey square: '
              'the original.</p>')


def _views(candidate) -> list:
    report = candidate.report
    last = next((p.fidelity for p in reversed(report.passes) if p.fidelity and not p.rolled_back), None) \
        if report is not None else None
    return (last or {}).get("views") or []


def _fidelity(result) -> str:
    from ..fidelity import Target

    target = Target.parse(result.settings["target"])
    charts = []
    for key, label, metric in (("cosine", "cosine vs the original", "cos"),
                               ("agreement", "decision agreement vs the original", "top1")):
        rows = [(f"{c.display} · {v['view']}", {key: float(v[key])})
                for c in result.candidates if c.error is None for v in _views(c)
                if isinstance(v.get(key), (int, float))]
        if not rows:
            continue
        reference = target.value if target.metric == metric else None
        low = min([v[key] for _, v in rows] + ([reference] if reference is not None else []))
        lo = max(0.0, low - max((1 - low) * 0.25, 0.002))  # room below the lowest bar
        charts.append(f"<h3>{escape(label)}</h3>" + svg.bars(rows, [(key, "#4a7bd0")], label,
                                                              f"fidelity: {label}", reference, lo, 1.0))
    if not charts:
        return '<p class="note">No lossy candidate: every output is unchanged up to rounding.</p>'
    return "\n".join(charts)


SENSITIVITY_BARS = 24


def _sensitivity(result) -> str:
    layers = (result.sensitivity or {}).get("layers") or []
    if not layers:
        return ('<p class="note">Not estimated: the per-layer estimate is made when the plan searches a '
                'per-layer mix (fuse,dynamic tried and missing the target).</p>')
    top = sorted(layers, key=lambda r: -r["loss"])[:SENSITIVITY_BARS]
    rows = [(r["layer"], {"float" if r["float"] else "dynamic": r["loss"]}) for r in top]
    chart = svg.bars(rows, [("float", "#c0392b"), ("dynamic", "#4a7bd0")], "loss at the outputs (1 − cosine)",
                     "per-layer sensitivity to dynamic int8")
    kept = sum(r["float"] for r in layers)
    return chart + (f'<p class="note">Each layer alone in dynamic int8, on fit calibration samples; the '
                    f'{min(len(layers), SENSITIVITY_BARS)} most sensitive of {len(layers)} shown. Red: '
                    f'kept float by the mix found ({kept} layers).</p>')


def _by_op(before: dict, after: dict, scale: float, unit: str, title: str, limit: int = 16) -> str:
    ops = sorted(set(before) | set(after), key=lambda op: -max(before.get(op, 0), after.get(op, 0)))[:limit]
    rows = [(op, {"original": before.get(op, 0) / scale, "chosen": after.get(op, 0) / scale}) for op in ops]
    return svg.bars(rows, [("original", "#999"), ("chosen", "#2c8a4b")], unit, title)


def page(result, original) -> str:
    """The page for ``result`` (:class:`onnxslim_kit.plan.PlanResult`); ``original``: the input's
    ModelProto (for size by op)."""
    from .profile import size_by_op

    s = result.settings
    size = _by_op(size_by_op(original), size_by_op(result.chosen.proto), 1024, "KB", "size by op")
    if result.profiles:
        before, after = result.profiles["original"], result.profiles["chosen"]
        latency = (_by_op(before["us_per_run"], after["us_per_run"], 1, "µs per run", "latency by op")
                   + f'<p class="note">ORT profiler, {before["runs"]} runs each after a warm-up; total '
                     f'{before["total_us"]:.1f} µs → {after["total_us"]:.1f} µs per run.</p>')
    else:
        latency = '<p class="note">Not profiled.</p>'
    summary = (f"goal {s['goal']}, target {s['target']}, {s['provider']} ×{s['threads']} threads; "
               f"chosen {result.chosen.display}; planned in {result.seconds:.1f} s")
    sections = [("Candidates", _table(result)), ("Pareto front", _front(result)),
                ("Fidelity per view (held-out samples)", _fidelity(result)),
                ("Per-layer sensitivity", _sensitivity(result)),
                (f"Size by op: original vs {result.chosen.display}", size),
                (f"Latency by op: original vs {result.chosen.display}", latency)]
    body = "\n".join(f"<section><h2>{escape(t)}</h2>\n{html}\n</section>" for t, html in sections)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>onnxslim_kit plan</title>'
            f"<style>{CSS}</style></head>\n<body><h1>onnxslim_kit plan</h1><p>{escape(summary)}</p>\n{body}\n"
            f"<script>{SCRIPT}</script></body></html>\n")
