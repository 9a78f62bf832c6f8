"""A dependency-free SVG chart: vNMSE (log scale) against bits per coordinate.

Benchmarks write their figures with it, so ``--plot`` works on a bare install.
"""

from __future__ import annotations

import math
from html import escape
from pathlib import Path

__all__ = ["scatter_plot"]

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
    out.append("</svg>")
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text("\n".join(out) + "\n")
    return p
