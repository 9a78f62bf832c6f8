"""The figure of ``dynamiq train``: validation loss against training wall-clock and against
steps, one line per method, with the target dashed."""

from __future__ import annotations

from pathlib import Path

from dynamiq.bench.plots import line_chart

__all__ = ["plot"]


def _zoom(curves: dict[str, dict], target: float | None) -> tuple[float, float] | None:
    """A y range that shows the end of training: from just below the lowest loss to the
    highest loss after the first fifth of the steps (the first steps' losses are far above)."""
    vals = [p for c in curves.values() for p in c["val"]]
    if len(vals) < 4:
        return None
    last = max(p[0] for p in vals)
    late = [p[2] for p in vals if p[0] >= last / 5] or [p[2] for p in vals]
    low = min([p[2] for p in vals] + ([target] if target is not None else []))
    high = max(late)
    pad = 0.05 * (high - low) if high > low else 0.1
    return low - pad, high + pad


def plot(curves: dict[str, dict], path: str | Path, target: float | None = None,
         title: str = "") -> Path:
    """Plot validation loss against training wall-clock and against steps, one line per
    method; the y axis shows the losses after the first fifth of the steps.

    Args:
        curves: Per method, ``{"val": [[step, seconds, loss], ...], ...}`` (what
            :func:`dynamiq.bench.train.run` returns under ``curves``).
        path: ``.svg`` or ``.png``.
        target: A loss drawn dashed across both panels.
        title: Text above the panels (e.g. the network).

    Returns:
        The path written.

    Raises:
        ValueError: no finite loss, a bad suffix, or no matplotlib.
    """
    by_time = {m: [(p[1], p[2]) for p in c["val"]] for m, c in curves.items()}
    by_step = {m: [(p[0], p[2]) for p in c["val"]] for m, c in curves.items()}
    common = {"ylabel": "validation loss (nats/byte)", "ylim": _zoom(curves, target),
              "hline": (target, "target") if target is not None else None}
    return line_chart([
        {"series": by_time, "xlabel": "training wall-clock (s)", "title": "loss against time",
         **common},
        {"series": by_step, "xlabel": "step", "title": "loss against steps", **common},
    ], path, title=title)
