"""The all-reduce benchmarks' figure: time per call against tensor size, one line per method,
one panel per link rate (or ``loopback``) and world size.

SVG by the dependency-free :mod:`dynamiq.bench.svg`; PNG with matplotlib (the ``bench`` extra).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

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
        ValueError: the suffix is neither ``.svg`` nor ``.png``, or PNG without matplotlib.
    """
    p = Path(path)
    check_plot_path(p)
    panels: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for r in rows:
        where = getattr(r, "rate", "") or "loopback"
        panel = panels.setdefault(f"{where}, {r.world_size} ranks", {})
        panel.setdefault(r.method, []).append((r.size_mb, r.seconds))
    title = "all-reduce time per call (best)"
    if p.suffix.lower() == ".svg":
        from dynamiq.bench.svg import line_panels

        return line_panels(panels, p, title=title, xlabel="tensor size, MB (float32)",
                           ylabel="seconds per call", dashed=_TORCH)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullLocator

    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels) + 1.5, 4.2),
                             sharey=True, squeeze=False)
    for ax, (name, series) in zip(axes[0], panels.items()):
        for label, pts in series.items():
            xs, ys = zip(*sorted(pts))
            ax.plot(xs, ys, marker="o", label=label, ls="--" if label in _TORCH else "-")
        ax.set(xscale="log", yscale="log", title=name, xlabel="tensor size, MB (float32)")
        sizes = sorted({x for pts in series.values() for x, _ in pts})
        if len(sizes) <= 8:
            ax.set_xticks(sizes, [f"{x:g}" for x in sizes])
            ax.xaxis.set_minor_locator(NullLocator())
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("seconds per call")
    axes[0][-1].legend(loc="upper left", bbox_to_anchor=(1.02, 1), fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    p.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(p, dpi=120)
    plt.close(fig)
    return p


def check_plot_path(path: str | Path) -> None:
    """Refuse, before anything runs, a plot that :func:`plot_times` could not write.

    Raises:
        ValueError: the suffix is neither ``.svg`` nor ``.png``, or PNG without matplotlib.
    """
    suffix = Path(path).suffix.lower()
    if suffix not in (".svg", ".png"):
        raise ValueError(f"plot {str(path)!r}: write .svg or .png")
    if suffix == ".png":
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise ValueError(f"plot {str(path)!r}: PNG needs matplotlib (pip install "
                             f"'dynamiq[bench]'); .svg needs nothing") from None


