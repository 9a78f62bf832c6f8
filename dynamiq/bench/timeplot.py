"""The all-reduce benchmarks' figure: time per call against tensor size, one line per method,
one panel per link rate (or ``loopback``) and world size.

Drawn by :func:`dynamiq.bench.plots.line_panels` (matplotlib, the ``bench`` extra), as SVG or
PNG.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from dynamiq.bench.plots import check_plot_path, line_panels

__all__ = ["check_plot_path", "plot_times"]

#: torch's own all-reduce, drawn dashed (the references).
_TORCH = ("torch-fp32", "torch-bf16")


def plot_times(rows: Sequence, path: str | Path) -> Path:
    """Plot the best time per call of benchmark rows against their tensor size.

    Args:
        rows: :class:`~dynamiq.bench.allreduce.AllReduceRow` (or its testbed subclass, whose
            ``rate`` names the panel).
        path: ``.svg`` or ``.png``.

    Returns:
        The path written.

    Raises:
        ValueError: the suffix is neither ``.svg`` nor ``.png``, matplotlib is not installed,
            or no row has a positive time.
    """
    panels: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for r in rows:
        where = getattr(r, "rate", "") or "loopback"
        panel = panels.setdefault(f"{where}, {r.world_size} ranks", {})
        panel.setdefault(r.method, []).append((r.size_mb, r.seconds))
    return line_panels(panels, path, title="all-reduce time per call (best)",
                       xlabel="tensor size, MB (float32)", ylabel="seconds per call",
                       dashed=_TORCH)
