"""Inline SVG charts for the plan's HTML page: a scatter plot and horizontal bar charts.

No library, no network: each chart is one ``<svg>`` string. Every value is mapped to pixels by a
linear scale over the data's range [lo, hi], widened by 5 % each side (a single value v gets
[v − 1, v + 1] when v = 0, else [v·0.95, v·1.05] before widening)::

    x_px = left + (v − lo) / (hi − lo) · width          y_px = top + (1 − (v − lo) / (hi − lo)) · height

Ticks: the step is the power of ten 10^⌊log₁₀(span / 4)⌋ times 1, 2 or 5, the smallest of those
giving at most 6 ticks; ticks are the multiples of the step inside [lo, hi]. Every data mark
(``circle`` or ``rect``) has class ``mark`` and a ``<title>`` (the browser's tooltip) naming it,
so a test can count the marks and a reader can hover them. Text is XML-escaped.
"""

from __future__ import annotations

import math
from html import escape

WIDTH, HEIGHT = 640, 300
PAD = {"left": 64, "right": 16, "top": 16, "bottom": 44}


def extent(values: list) -> tuple:
    """[lo, hi] of ``values`` widened by 5 % of the span each side (module docstring)."""
    lo, hi = min(values), max(values)
    if hi == lo:
        lo, hi = (lo - 1, hi + 1) if lo == 0 else (min(lo * 0.95, lo * 1.05), max(hi * 0.95, hi * 1.05))
    margin = (hi - lo) * 0.05
    return lo - margin, hi + margin


def ticks(lo: float, hi: float) -> list:
    """Round ticks inside [lo, hi] (module docstring)."""
    span = hi - lo
    if not span > 0:
        return [lo]
    base = 10 ** math.floor(math.log10(span / 4))
    step = next(base * m for m in (1, 2, 5, 10) if span / (base * m) <= 6)
    first = math.ceil(lo / step)
    return [round(k * step, 12) for k in range(first, int(math.floor(hi / step)) + 1)]


def _fmt(v: float) -> str:
    return f"{v:.4g}"


def _scale(lo: float, hi: float, start: float, length: float, flip: bool = False):
    def to_px(v: float) -> float:
        t = (v - lo) / (hi - lo)
        return start + ((1 - t) if flip else t) * length
    return to_px


def _open(title: str, width: int, height: int) -> list:
    return [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}">']


def scatter(points: list, x_label: str, y_label: str, title: str) -> str:
    """``points``: dicts with ``x``, ``y``, ``label``, ``color`` and optionally ``chosen`` (drawn as
    a ring), ``front`` (outlined: the front is over more axes than the two drawn, so it is not
    joined by a line) and ``reference`` (a grey square, not a data mark: the original)."""
    w, h = WIDTH - PAD["left"] - PAD["right"], HEIGHT - PAD["top"] - PAD["bottom"]
    xlo, xhi = extent([p["x"] for p in points])
    ylo, yhi = extent([p["y"] for p in points])
    fx = _scale(xlo, xhi, PAD["left"], w)
    fy = _scale(ylo, yhi, PAD["top"], h, flip=True)
    out = _open(title, WIDTH, HEIGHT)
    out += _axes(fx, fy, (xlo, xhi), (ylo, yhi), x_label, y_label)
    for p in points:
        cx, cy = fx(p["x"]), fy(p["y"])
        name = escape(p["label"])
        if p.get("reference"):
            out.append(f'<rect x="{cx - 5:.1f}" y="{cy - 5:.1f}" width="10" height="10" fill="#999">'
                       f'<title>{name}</title></rect>'
                       f'<text x="{cx + 9:.1f}" y="{cy + 4:.1f}" font-size="11">{name}</text>')
            continue
        if p.get("chosen"):
            out.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="10" fill="none" stroke="#000" stroke-width="2"/>')
        edge = ' stroke="#222" stroke-width="1.5"' if p.get("front") else ""
        out.append(f'<circle class="mark" data-label="{name}" cx="{cx:.1f}" cy="{cy:.1f}" r="6" '
                   f'fill="{p["color"]}"{edge}><title>{name}: {escape(x_label)} {_fmt(p["x"])}, '
                   f'{escape(y_label)} {_fmt(p["y"])}</title></circle>')
        right = cx > PAD["left"] + 0.7 * w  # labels near the right edge run leftwards
        out.append(f'<text x="{cx - 9 if right else cx + 9:.1f}" y="{cy - 8:.1f}" font-size="11" '
                   f'text-anchor="{"end" if right else "start"}">{name}</text>')
    out.append("</svg>")
    return "\n".join(out)


def _axes(fx, fy, xr: tuple, yr: tuple, x_label: str, y_label: str) -> list:
    x0, x1, y0, y1 = fx(xr[0]), fx(xr[1]), fy(yr[0]), fy(yr[1])
    out = [f'<line x1="{x0:.1f}" y1="{y0:.1f}" x2="{x1:.1f}" y2="{y0:.1f}" stroke="#333"/>',
           f'<line x1="{x0:.1f}" y1="{y0:.1f}" x2="{x0:.1f}" y2="{y1:.1f}" stroke="#333"/>']
    for t in ticks(*xr):
        out.append(f'<text x="{fx(t):.1f}" y="{y0 + 14:.1f}" font-size="10" text-anchor="middle">{_fmt(t)}</text>')
    for t in ticks(*yr):
        out.append(f'<text x="{x0 - 4:.1f}" y="{fy(t) + 3:.1f}" font-size="10" text-anchor="end">{_fmt(t)}</text>')
    out.append(f'<text x="{(x0 + x1) / 2:.1f}" y="{y0 + 32:.1f}" font-size="12" text-anchor="middle">'
               f'{escape(x_label)}</text>')
    out.append(f'<text transform="translate(14 {(y0 + y1) / 2:.1f}) rotate(-90)" font-size="12" '
               f'text-anchor="middle">{escape(y_label)}</text>')
    return out


def bars(rows: list, series: list, x_label: str, title: str, reference: float | None = None,
         lo: float | None = None, hi: float | None = None) -> str:
    """Grouped horizontal bars: ``rows`` = [(label, {series name: value or None})], one bar per
    series that has a value; ``series`` = [(name, colour)]. ``reference``: a dashed vertical
    line (the target). ``lo``/``hi`` fix the scale (default: the data's extent, from 0 when
    every value is ≥ 0)."""
    values = [v for _, vals in rows for v in vals.values() if v is not None]
    values += [reference] if reference is not None else []
    if not values:
        values = [0.0, 1.0]
    dlo, dhi = extent(values)
    lo = lo if lo is not None else (0.0 if min(values) >= 0 else dlo)
    hi = hi if hi is not None else dhi
    bar_h, gap, label_w = 10, 8, 220
    per_row = bar_h * len(series) + gap
    height = PAD["top"] + per_row * max(len(rows), 1) + PAD["bottom"]
    w = WIDTH - label_w - PAD["right"]
    fx = _scale(lo, hi, label_w, w)
    out = _open(title, WIDTH, height)
    y = PAD["top"]
    for label, vals in rows:
        out.append(f'<text x="{label_w - 6}" y="{y + per_row / 2:.1f}" font-size="11" text-anchor="end">'
                   f'{escape(label if len(label) <= 34 else label[:33] + "…")}</text>')
        for k, (name, color) in enumerate(series):
            v = vals.get(name)
            if v is None:
                continue
            x_end = fx(min(max(v, lo), hi))
            out.append(f'<rect class="mark" x="{label_w}" y="{y + k * bar_h:.1f}" width="{max(x_end - label_w, 1):.1f}" '
                       f'height="{bar_h - 1}" fill="{color}"><title>{escape(label)} — {escape(name)}: '
                       f'{_fmt(v)}</title></rect>')
        y += per_row
    base = PAD["top"] + per_row * max(len(rows), 1)
    out.append(f'<line x1="{label_w}" y1="{base}" x2="{label_w + w}" y2="{base}" stroke="#333"/>')
    for t in ticks(lo, hi):
        out.append(f'<text x="{fx(t):.1f}" y="{base + 14}" font-size="10" text-anchor="middle">{_fmt(t)}</text>')
    if reference is not None and lo <= reference <= hi:
        out.append(f'<line class="reference" x1="{fx(reference):.1f}" y1="{PAD["top"] - 4}" x2="{fx(reference):.1f}" '
                   f'y2="{base}" stroke="#c00" stroke-dasharray="5 3"/>')
    out.append(f'<text x="{label_w + w / 2:.1f}" y="{base + 32}" font-size="12" text-anchor="middle">'
               f'{escape(x_label)}</text>')
    legend_x = label_w
    for name, color in series:
        out.append(f'<rect x="{legend_x}" y="2" width="10" height="10" fill="{color}"/>'
                   f'<text x="{legend_x + 14}" y="11" font-size="11">{escape(name)}</text>')
        legend_x += 20 + 7 * len(name)
    out.append("</svg>")
    return "\n".join(out)
