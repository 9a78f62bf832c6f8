"""Dependency-free SVG charts: vNMSE (log scale) against bits per coordinate, panels of lines
on log-log axes (e.g. all-reduce time against tensor size, one panel per link rate), and lines
on linear axes (e.g. loss against time).

Benchmarks write their figures with it, so ``--plot`` works on a bare install.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from html import escape
from pathlib import Path

__all__ = ["line_chart", "line_panels", "scatter_plot"]

_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf")


def scatter_plot(series: dict[str, list[tuple[float, float]]], path: str | Path, *,
                 title: str = "", xlabel: str = "bits per coordinate",
                 ylabel: str = "vNMSE") -> Path:
    """Write points (joined by lines within a series) on a log-y axis to an SVG file.

    Args:
        series: label → ``[(x, y), ...]``; points with ``y <= 0`` or non-finite are skipped.
        path: Output file (``.svg``).
        title, xlabel, ylabel: Text.

    Returns:
        The path written.
    """
    pts = [(x, y) for s in series.values() for x, y in s if y > 0 and math.isfinite(y)]
    if not pts:
        raise ValueError("nothing to plot: no positive finite values")
    w, h, left, right, top, bottom = 720, 440, 70, 170, 40, 50
    xs = [p[0] for p in pts]
    ly = [math.log10(p[1]) for p in pts]
    x0, x1 = min(xs), max(xs)
    if x1 - x0 < 1e-9:
        x0, x1 = x0 - 1, x1 + 1
    y0, y1 = math.floor(min(ly)), math.ceil(max(ly))
    if y1 == y0:
        y1 += 1
    pw, ph = w - left - right, h - top - bottom

    def px(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * pw

    def py(y: float) -> float:
        return top + (y1 - math.log10(y)) / (y1 - y0) * ph

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
           'font-family="sans-serif" font-size="12">',
           f'<rect width="{w}" height="{h}" fill="white"/>',
           f'<text x="{w / 2}" y="20" text-anchor="middle" font-size="14">{escape(title)}</text>']
    for e in range(y0, y1 + 1):
        y = top + (y1 - e) / (y1 - y0) * ph
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + pw}" y2="{y:.1f}" '
                   'stroke="#ddd"/>')
        out.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">1e{e}</text>')
    for k in range(6):
        xv = x0 + (x1 - x0) * k / 5
        x = px(xv)
        out.append(f'<line x1="{x:.1f}" y1="{top + ph}" x2="{x:.1f}" y2="{top + ph + 4}" '
                   'stroke="black"/>')
        out.append(f'<text x="{x:.1f}" y="{top + ph + 18}" text-anchor="middle">{xv:.3g}</text>')
    out.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" '
               'stroke="black"/>')
    out.append(f'<text x="{left + pw / 2}" y="{h - 10}" text-anchor="middle">'
               f'{escape(xlabel)}</text>')
    out.append(f'<text x="16" y="{top + ph / 2}" text-anchor="middle" '
               f'transform="rotate(-90 16 {top + ph / 2})">{escape(ylabel)}</text>')
    for i, (label, s) in enumerate(series.items()):
        c = _COLORS[i % len(_COLORS)]
        good = sorted((x, y) for x, y in s if y > 0 and math.isfinite(y))
        if len(good) > 1:
            d = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in good)
            out.append(f'<polyline points="{d}" fill="none" stroke="{c}" stroke-width="2"/>')
        for x, y in good:
            out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="4" fill="{c}"/>')
        ly_ = top + 14 + 18 * i
        out.append(f'<circle cx="{left + pw + 16}" cy="{ly_ - 4}" r="4" fill="{c}"/>')
        out.append(f'<text x="{left + pw + 26}" y="{ly_}">{escape(label)}</text>')
    return _write(out, path)


def _ticks(lo: float, hi: float) -> list[float]:
    """Powers of ten within ``[lo, hi]`` (log10 values), with 2 and 5 between them when the
    range is short."""
    out = []
    for e in range(math.floor(lo), math.ceil(hi) + 1):
        for m in ((1,) if hi - lo > 3 else (1, 2, 5)):
            v = math.log10(m) + e
            if lo - 1e-9 <= v <= hi + 1e-9:
                out.append(v)
    return out


def _tick_label(v: float) -> str:
    x = 10**v
    return f"{x:.3g}" if 1e-3 <= x < 1e5 else f"{x:.0e}"


def line_panels(panels: dict[str, dict[str, list[tuple[float, float]]]], path: str | Path, *,
                title: str = "", xlabel: str = "", ylabel: str = "",
                dashed: Collection[str] = ()) -> Path:
    """Write side-by-side panels of lines on log-log axes (one y range for all) to an SVG file.

    Args:
        panels: panel title → (series label → ``[(x, y), ...]``); points with a non-positive
            or non-finite coordinate are skipped. A label has the same colour in every panel.
        path: Output file (``.svg``).
        title, xlabel, ylabel: Text.
        dashed: Labels whose lines are dashed (e.g. the references).

    The x axis is marked at every x of the points when there are at most 8 of them, else at
    powers of ten.

    Returns:
        The path written.
    """
    pts = [(x, y) for s in panels.values() for ps in s.values() for x, y in ps
           if x > 0 and y > 0 and math.isfinite(x) and math.isfinite(y)]
    if not pts:
        raise ValueError("nothing to plot: no positive finite values")
    labels = list(dict.fromkeys(lab for s in panels.values() for lab in s))
    color = {lab: _COLORS[i % len(_COLORS)] for i, lab in enumerate(labels)}
    pw, ph, left, gap, right, top, bottom = 300, 300, 70, 30, 160, 50, 50
    w = left + len(panels) * pw + (len(panels) - 1) * gap + right
    h = top + ph + bottom
    lx = [math.log10(p[0]) for p in pts]
    ly = [math.log10(p[1]) for p in pts]
    x0, x1 = min(lx) - 0.1, max(lx) + 0.1
    xs = sorted({round(v, 9) for v in lx})
    xticks = xs if len(xs) <= 8 else _ticks(x0, x1)
    y0, y1 = math.floor(min(ly) * 2) / 2, math.ceil(max(ly) * 2) / 2
    if y1 - y0 < 1e-9:
        y1 += 0.5

    def py(y: float) -> float:
        return top + (y1 - math.log10(y)) / (y1 - y0) * ph

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
           'font-family="sans-serif" font-size="12">',
           f'<rect width="{w}" height="{h}" fill="white"/>',
           f'<text x="{w / 2}" y="20" text-anchor="middle" font-size="14">{escape(title)}</text>',
           f'<text x="16" y="{top + ph / 2}" text-anchor="middle" '
           f'transform="rotate(-90 16 {top + ph / 2})">{escape(ylabel)}</text>']
    for k, (name, series) in enumerate(panels.items()):
        left_k = left + k * (pw + gap)

        def px(x: float, left_k: float = left_k) -> float:
            return left_k + (math.log10(x) - x0) / (x1 - x0) * pw

        out.append(f'<text x="{left_k + pw / 2}" y="{top - 8}" text-anchor="middle">'
                   f'{escape(name)}</text>')
        for v in _ticks(y0, y1):
            y = top + (y1 - v) / (y1 - y0) * ph
            out.append(f'<line x1="{left_k}" y1="{y:.1f}" x2="{left_k + pw}" y2="{y:.1f}" '
                       'stroke="#ddd"/>')
            if k == 0:
                out.append(f'<text x="{left_k - 6}" y="{y + 4:.1f}" text-anchor="end">'
                           f'{_tick_label(v)}</text>')
        for v in xticks:
            x = left_k + (v - x0) / (x1 - x0) * pw
            out.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{top + ph}" '
                       'stroke="#eee"/>')
            out.append(f'<text x="{x:.1f}" y="{top + ph + 16}" text-anchor="middle">'
                       f'{_tick_label(v)}</text>')
        out.append(f'<rect x="{left_k}" y="{top}" width="{pw}" height="{ph}" fill="none" '
                   'stroke="black"/>')
        out.append(f'<text x="{left_k + pw / 2}" y="{h - 12}" text-anchor="middle">'
                   f'{escape(xlabel)}</text>')
        for lab, s in series.items():
            good = sorted((x, y) for x, y in s
                          if x > 0 and y > 0 and math.isfinite(x) and math.isfinite(y))
            if len(good) > 1:
                d = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in good)
                dash = ' stroke-dasharray="6 4"' if lab in dashed else ""
                out.append(f'<polyline points="{d}" fill="none" stroke="{color[lab]}" '
                           f'stroke-width="2"{dash}/>')
            for x, y in good:
                out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3.5" '
                           f'fill="{color[lab]}"/>')
    legend_x = left + len(panels) * (pw + gap) - gap + 16
    for i, lab in enumerate(labels):
        y = top + 14 + 18 * i
        out.append(f'<circle cx="{legend_x}" cy="{y - 4}" r="4" fill="{color[lab]}"/>')
        out.append(f'<text x="{legend_x + 10}" y="{y}">{escape(lab)}</text>')
    return _write(out, path)


def _linear_ticks(lo: float, hi: float, count: int = 6) -> list[float]:
    """Round tick values covering ``[lo, hi]``."""
    span = hi - lo
    raw = span / max(1, count - 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step) * step
    out, k = [], 0
    while first + k * step <= hi + 1e-9 * span:
        out.append(first + k * step)
        k += 1
    return out


def line_chart(panels: list[dict], path: str | Path, *, title: str = "") -> Path:
    """Write side-by-side panels of lines on linear axes to an SVG file.

    Args:
        panels: Each a dict with ``series`` (label → ``[(x, y), ...]``; non-finite points
            are skipped), ``xlabel``, ``ylabel`` and optionally ``title``, ``hline`` (a
            ``(y, label)`` drawn dashed across the panel, e.g. a target) and ``ylim`` (a
            ``(low, high)`` range of the y axis; lines beyond it are clipped).
        path: Output file (``.svg``).
        title: Text above the panels.

    Returns:
        The path written.
    """
    pw, ph, left, gap, top, bottom, legend = 380, 300, 60, 80, 50, 50, 140
    w = left + len(panels) * (pw + gap) - gap + legend
    h = top + ph + bottom
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
           'font-family="sans-serif" font-size="12">',
           f'<rect width="{w}" height="{h}" fill="white"/>',
           f'<text x="{w / 2}" y="18" text-anchor="middle" font-size="14">{escape(title)}</text>']
    labels: list[str] = []
    for i, panel in enumerate(panels):
        ox = left + i * (pw + gap)
        series = {k: [(x, y) for x, y in v if math.isfinite(x) and math.isfinite(y)]
                  for k, v in panel["series"].items()}
        hline = panel.get("hline")
        pts = [p for s in series.values() for p in s]
        if not pts:
            raise ValueError("nothing to plot: no finite values")
        xs = [p[0] for p in pts]
        ys = [p[1] for p in pts] + ([hline[0]] if hline else [])
        x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
        if panel.get("ylim"):
            y0, y1 = panel["ylim"]
        if x1 - x0 < 1e-12:
            x0, x1 = x0 - 1, x1 + 1
        if y1 - y0 < 1e-12:
            y0, y1 = y0 - 1, y1 + 1

        def px(x: float, _x0=x0, _x1=x1, _ox=ox) -> float:
            return _ox + (x - _x0) / (_x1 - _x0) * pw

        def py(y: float, _y0=y0, _y1=y1) -> float:
            return top + (_y1 - y) / (_y1 - _y0) * ph

        for t in _linear_ticks(y0, y1):
            out.append(f'<line x1="{ox}" y1="{py(t):.1f}" x2="{ox + pw}" y2="{py(t):.1f}" '
                       'stroke="#ddd"/>')
            out.append(f'<text x="{ox - 6}" y="{py(t) + 4:.1f}" text-anchor="end">{t:.4g}</text>')
        for t in _linear_ticks(x0, x1):
            out.append(f'<line x1="{px(t):.1f}" y1="{top + ph}" x2="{px(t):.1f}" '
                       f'y2="{top + ph + 4}" stroke="black"/>')
            out.append(f'<text x="{px(t):.1f}" y="{top + ph + 18}" text-anchor="middle">'
                       f'{t:.4g}</text>')
        out.append(f'<rect x="{ox}" y="{top}" width="{pw}" height="{ph}" fill="none" '
                   'stroke="black"/>')
        out.append(f'<text x="{ox + pw / 2}" y="{top - 8}" text-anchor="middle">'
                   f'{escape(panel.get("title", ""))}</text>')
        out.append(f'<text x="{ox + pw / 2}" y="{h - 10}" text-anchor="middle">'
                   f'{escape(panel["xlabel"])}</text>')
        yl = top + ph / 2
        out.append(f'<text x="{ox - 44}" y="{yl}" text-anchor="middle" '
                   f'transform="rotate(-90 {ox - 44} {yl})">{escape(panel["ylabel"])}</text>')
        if hline:
            out.append(f'<line x1="{ox}" y1="{py(hline[0]):.1f}" x2="{ox + pw}" '
                       f'y2="{py(hline[0]):.1f}" stroke="black" stroke-dasharray="5,4"/>')
            out.append(f'<text x="{ox + pw - 4}" y="{py(hline[0]) - 4:.1f}" '
                       f'text-anchor="end">{escape(hline[1])}</text>')
        out.append(f'<clipPath id="panel{i}"><rect x="{ox}" y="{top}" width="{pw}" '
                   f'height="{ph}"/></clipPath>')
        for label, s in series.items():
            if label not in labels:
                labels.append(label)
            c = _COLORS[labels.index(label) % len(_COLORS)]
            good = sorted(s)
            if len(good) > 1:
                d = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in good)
                out.append(f'<polyline points="{d}" fill="none" stroke="{c}" '
                           f'stroke-width="1.5" clip-path="url(#panel{i})"/>')
            for x, y in good[-1:]:
                out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{c}" '
                           f'clip-path="url(#panel{i})"/>')
    lx = left + len(panels) * (pw + gap) - gap + 16
    for i, label in enumerate(labels):
        c = _COLORS[i % len(_COLORS)]
        y = top + 14 + 18 * i
        out.append(f'<line x1="{lx}" y1="{y - 4}" x2="{lx + 16}" y2="{y - 4}" stroke="{c}" '
                   'stroke-width="2"/>')
        out.append(f'<text x="{lx + 22}" y="{y}">{escape(label)}</text>')
    return _write(out, path)


def _write(out: list[str], path: str | Path) -> Path:
    """Close the SVG elements ``out`` and write them to ``path`` (folders created)."""
    out.append("</svg>")
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text("\n".join(out) + "\n")
    return p
