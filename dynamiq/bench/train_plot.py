"""The figure of ``dynamiq train``: validation loss against training wall-clock and against
steps, one line per method, with the target dashed."""

from __future__ import annotations

from pathlib import Path

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
    """Validation loss against training wall-clock and against steps, one line per method:
    a PNG through matplotlib (when installed) for a ``.png`` path, else an SVG. The y axis
    shows the losses after the first fifth of the steps."""
    path = Path(path)
    by_time = {m: [(p[1], p[2]) for p in c["val"]] for m, c in curves.items()}
    by_step = {m: [(p[0], p[2]) for p in c["val"]] for m, c in curves.items()}
    hline = (target, "target") if target is not None else None
    ylim = _zoom(curves, target)
    if path.suffix.lower() == ".png":
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError as e:
            raise RuntimeError("a PNG plot needs matplotlib (pip install matplotlib); or give "
                               "a .svg path") from e
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for ax, data, xl in ((axes[0], by_time, "training wall-clock (s)"),
                             (axes[1], by_step, "step")):
            for m, pts in data.items():
                ax.plot([p[0] for p in pts], [p[1] for p in pts], label=m)
            if target is not None:
                ax.axhline(target, ls="--", c="k", lw=0.8, label="target")
            if ylim is not None:
                ax.set_ylim(*ylim)
            ax.set_xlabel(xl)
            ax.set_ylabel("validation loss (nats/byte)")
        axes[0].legend()
        fig.suptitle(title)
        fig.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=120)
        plt.close(fig)
        return path
    from dynamiq.bench.svg import line_chart

    return line_chart([
        {"series": by_time, "xlabel": "training wall-clock (s)",
         "ylabel": "validation loss (nats/byte)", "title": "loss against time", "hline": hline,
         "ylim": ylim},
        {"series": by_step, "xlabel": "step", "ylabel": "validation loss (nats/byte)",
         "title": "loss against steps", "hline": hline, "ylim": ylim},
    ], path, title=title)
