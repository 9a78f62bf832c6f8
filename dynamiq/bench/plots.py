"""The benchmarks' and the documentation's figures, drawn with matplotlib (the ``bench`` extra).

* :func:`scatter_plot`: vNMSE (log scale) against bits per coordinate, one line per method;
* :func:`line_panels`: panels of lines on log-log axes (all-reduce time against tensor size,
  one panel per link rate);
* :func:`line_chart`: panels of lines on linear axes (loss against time and against steps);
* :func:`schedule_diagram`: a topology's all-reduce schedule, ranks against steps.

Each writes an ``.svg`` or a ``.png`` by the path's suffix. Figures are built with the object
API (:class:`matplotlib.figure.Figure`), never through pyplot, so drawing opens no window and
keeps no global figure state. SVG output is deterministic (fixed ids, no date), so regenerated
figures only change when the data does.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dynamiq.topologies import Topology, get_topology

if TYPE_CHECKING:  # matplotlib is optional: imported lazily where a figure is drawn
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["SUFFIXES", "check_plot_path", "line_chart", "line_panels", "scatter_plot",
           "schedule_diagram"]

#: The file types the functions write.
SUFFIXES: tuple[str, ...] = (".svg", ".png")

_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf")
_PHASE_STYLE = {"reduce": ("#1f77b4", "reduce-scatter"), "gather": ("#ff7f0e", "all-gather")}
_LEVEL_DASH = {"intra": "-", "inter": (0, (5, 3))}

# A fixed hash salt makes the SVG ids (clip paths, glyphs) the same on every run; text kept as
# text keeps files small, searchable and identical across machines' font caches.
_RC = {"svg.hashsalt": "dynamiq", "svg.fonttype": "none", "font.size": 9}
# rc_context edits matplotlib's process-wide rcParams: one figure at a time, so that a thread
# never reads another's half-restored settings.
_LOCK = threading.Lock()
_DPI = 150


def check_plot_path(path: str | Path) -> Path:
    """Refuse, before anything runs, a figure path the functions here could not write.

    Args:
        path: The figure's file.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.

    Raises:
        ValueError: the suffix is neither ``.svg`` nor ``.png``, or matplotlib is not
            installed.
    """
    p = Path(path)
    if p.suffix.lower() not in SUFFIXES:
        raise ValueError(f"plot {str(path)!r}: write .svg or .png")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ValueError(f"plot {str(path)!r}: figures need matplotlib "
                         "(pip install 'dynamiq[bench]')") from None
    return p


@contextmanager
def _figure(path: str | Path, size: tuple[float, float], title: str) -> Iterator[Figure]:
    """A figure to draw on; on leaving, titled and written to ``path`` (folders created).

    Args:
        path: ``.svg`` or ``.png``.
        size: Width and height in inches.
        title: The figure's title (none when empty).

    Yields:
        The figure, with constrained layout (so that a legend placed ``outside`` fits).
    """
    p = check_plot_path(path)
    import matplotlib
    from matplotlib.figure import Figure

    with _LOCK, matplotlib.rc_context(_RC):
        fig = Figure(figsize=size, layout="constrained")
        yield fig
        if title:
            fig.suptitle(title)
        p.parent.mkdir(parents=True, exist_ok=True)
        svg = p.suffix.lower() == ".svg"
        fig.savefig(p, dpi=_DPI, facecolor="white", metadata={"Date": None} if svg else None)


def _legend(fig: Figure, handles: Sequence[Any], **kw: Any) -> None:
    """One legend for the whole figure, at its right outside the axes."""
    if handles:
        fig.legend(handles=list(handles), loc="outside right upper", frameon=False, **kw)


def _finite(pts: Sequence[tuple[float, float]], positive_x: bool = False,
            positive_y: bool = False) -> list[tuple[float, float]]:
    """The points with finite (and, where asked, positive) coordinates, sorted by x."""
    return sorted((x, y) for x, y in pts
                  if math.isfinite(x) and math.isfinite(y)
                  and (x > 0 or not positive_x) and (y > 0 or not positive_y))


def _colors(labels: Sequence[str]) -> dict[str, str]:
    """A colour per label, in order of first appearance (the same in every panel)."""
    return {lab: _COLORS[i % len(_COLORS)] for i, lab in enumerate(dict.fromkeys(labels))}


def scatter_plot(series: dict[str, list[tuple[float, float]]], path: str | Path, *,
                 title: str = "", xlabel: str = "bits per coordinate",
                 ylabel: str = "vNMSE") -> Path:
    """Plot points, joined by lines within a series, on a log-y axis.

    Args:
        series: label → ``[(x, y), ...]``; points with ``y <= 0`` or a non-finite
            coordinate are skipped.
        path: Output file, ``.svg`` or ``.png``.
        title: Text above the axes.
        xlabel: The x axis' label.
        ylabel: The y axis' label.

    Returns:
        The path written.

    Raises:
        ValueError: no point is left to plot, a bad suffix, or no matplotlib.
    """
    good = {lab: _finite(s, positive_y=True) for lab, s in series.items()}
    if not any(good.values()):
        raise ValueError("nothing to plot: no positive finite values")
    color = _colors(list(good))
    with _figure(path, (7.5, 4.4), title) as fig:
        ax = fig.add_subplot()
        for lab, pts in good.items():
            if pts:
                ax.plot(*zip(*pts), marker="o", ms=4, lw=1.8, color=color[lab], label=lab)
        ax.set(yscale="log", xlabel=xlabel, ylabel=ylabel)
        _mark_log(ax.yaxis, *ax.get_ylim())
        ax.grid(True, which="major", alpha=0.35)
        _legend(fig, ax.get_lines())
    return Path(path)


def line_panels(panels: dict[str, dict[str, list[tuple[float, float]]]], path: str | Path, *,
                title: str = "", xlabel: str = "", ylabel: str = "",
                dashed: Collection[str] = ()) -> Path:
    """Plot side-by-side panels of lines on log-log axes that share one y range.

    The x axis is marked at every x of the points when there are at most 8 of them, else at
    powers of ten.

    Args:
        panels: panel title → (series label → ``[(x, y), ...]``); points with a non-positive
            or non-finite coordinate are skipped. A label has the same colour in every panel.
        path: Output file, ``.svg`` or ``.png``.
        title: Text above the panels.
        xlabel: Every panel's x axis label.
        ylabel: The (shared) y axis label.
        dashed: Labels whose lines are dashed (e.g. the references).

    Returns:
        The path written.

    Raises:
        ValueError: no point is left to plot, a bad suffix, or no matplotlib.
    """
    good = {name: {lab: _finite(s, positive_x=True, positive_y=True) for lab, s in ser.items()}
            for name, ser in panels.items()}
    if not any(pts for ser in good.values() for pts in ser.values()):
        raise ValueError("nothing to plot: no positive finite values")
    color = _colors([lab for ser in good.values() for lab in ser])
    xs = sorted({x for ser in good.values() for pts in ser.values() for x, _ in pts})
    with _figure(path, (3.6 * len(good) + 1.8, 3.9), title) as fig:
        axes = fig.subplots(1, len(good), sharex=True, sharey=True, squeeze=False)[0]
        handles: dict[str, Any] = {}
        for ax, (name, ser) in zip(axes, good.items()):
            for lab, pts in ser.items():
                if pts:
                    (handles[lab],) = ax.plot(*zip(*pts), marker="o", ms=3.5, lw=1.8,
                                              color=color[lab], label=lab,
                                              ls="--" if lab in dashed else "-")
            ax.set(xscale="log", yscale="log", title=name, xlabel=xlabel)
            ax.grid(True, which="major", alpha=0.35)
        # the axes are shared: marking the first marks them all
        if len(xs) <= 8:
            _mark_x(axes[0], xs)
        else:
            _mark_log(axes[0].xaxis, *axes[0].get_xlim())
        _mark_log(axes[0].yaxis, *axes[0].get_ylim())
        axes[0].set_ylabel(ylabel)
        _legend(fig, [handles[lab] for lab in color if lab in handles])
    return Path(path)


def _mark_x(ax: Axes, xs: Sequence[float]) -> None:
    """Mark a log x axis at exactly ``xs`` (the measured sizes read better than decades)."""
    from matplotlib.ticker import NullLocator

    ax.set_xticks(xs, [f"{x:g}" for x in xs])
    ax.xaxis.set_minor_locator(NullLocator())


def _tick_label(x: float) -> str:
    return f"{x:.3g}" if 1e-3 <= x < 1e5 else f"{x:.0e}"


def _mark_log(axis: Any, lo: float, hi: float) -> None:
    """Mark a log axis over ``[lo, hi]`` at powers of ten, with 2 and 5 between them over
    short ranges, labelled as plain numbers (matplotlib's own minor labels read ``2×10⁰``)."""
    from matplotlib.ticker import NullFormatter

    a, b = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    for mult in ((1,) if b - a > 3 else (1, 2, 5), range(1, 10)):
        ticks = [m * 10.0**e for e in range(a, b + 1) for m in mult if lo <= m * 10.0**e <= hi]
        if len(ticks) >= 2:
            axis.set_ticks(ticks, [_tick_label(t) for t in ticks])
            axis.set_minor_formatter(NullFormatter())
            return


def line_chart(panels: list[dict], path: str | Path, *, title: str = "") -> Path:
    """Plot side-by-side panels of lines on linear axes.

    Each line has a dot at its last point. A label has the same colour in every panel.

    Args:
        panels: Each a dict with ``series`` (label → ``[(x, y), ...]``; non-finite points
            are skipped), ``xlabel``, ``ylabel`` and optionally ``title``, ``hline`` (a
            ``(y, label)`` drawn dashed across the panel, e.g. a target) and ``ylim`` (a
            ``(low, high)`` range of the y axis; lines beyond it are clipped).
        path: Output file, ``.svg`` or ``.png``.
        title: Text above the panels.

    Returns:
        The path written.

    Raises:
        ValueError: no panels, a panel without a finite point, a bad suffix, or no
            matplotlib.
    """
    goods = [{lab: _finite(s) for lab, s in p["series"].items()} for p in panels]
    if not goods or not all(any(g.values()) for g in goods):
        raise ValueError("nothing to plot: no finite values")
    color = _colors([lab for g in goods for lab in g])
    with _figure(path, (4.4 * len(panels) + 1.6, 3.9), title) as fig:
        axes = fig.subplots(1, len(panels), squeeze=False)[0]
        handles: dict[str, Any] = {}
        for ax, panel, good in zip(axes, panels, goods):
            for lab, pts in good.items():
                if pts:
                    (handles[lab],) = ax.plot(*zip(*pts), lw=1.5, color=color[lab], label=lab)
                    ax.plot(*pts[-1], "o", ms=4, color=color[lab])
            if panel.get("hline"):
                y, text = panel["hline"]
                ax.axhline(y, color="black", lw=0.9, ls=(0, (5, 4)))
                # in axes x (right edge) and data y: the label stays at the line, inside
                ax.annotate(text, (1, y), xycoords=("axes fraction", "data"),
                            xytext=(-4, 3), textcoords="offset points", ha="right")
            if panel.get("ylim"):
                ax.set_ylim(*panel["ylim"])
            ax.set(title=panel.get("title", ""), xlabel=panel["xlabel"],
                   ylabel=panel["ylabel"])
            ax.grid(True, alpha=0.35)
        _legend(fig, [handles[lab] for lab in color if lab in handles])
    return Path(path)


def _chunks_label(chunks: Sequence[int]) -> str:
    """Chunk numbers as short text: runs of consecutive numbers as ``a–b``."""
    runs: list[list[int]] = []
    for c in sorted(chunks):
        if runs and c == runs[-1][1] + 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return "c" + ",".join(f"{a}" if a == b else f"{a}–{b}" for a, b in runs)


def schedule_diagram(topology: Topology | str, world_size: int, path: str | Path, *,
                     title: str | None = None) -> Path:
    """Draw a topology's all-reduce schedule: ranks as rows, steps as columns.

    Each message of a step (the transfers with the same sender and receiver) is an arrow from
    its sender's row to its receiver's, coloured by phase (reduce-scatter or all-gather) and
    labelled at its tail, on the sender's row, with the chunks it carries (``c4–7``: chunks 4
    to 7). In schedules with link levels (:class:`~dynamiq.topologies.Hierarchical`)
    inter-node messages are dashed, and a topology with a ``ranks_per_node`` field has its
    nodes shaded.

    Args:
        topology: A topology or its spec string, e.g. ``"ring"``, ``"butterfly"`` or
            ``"hierarchical(ranks_per_node=2)"``.
        world_size: Ranks.
        path: Output file, ``.svg`` or ``.png``.
        title: Text above the diagram (default: the spec, the ranks and the steps).

    Returns:
        The path written.

    Raises:
        ValueError: the topology cannot serve ``world_size`` ranks, a bad suffix, or no
            matplotlib.
    """
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    topo = get_topology(topology)
    sched = topo.schedule(world_size)
    n, steps = sched.world_size, sched.steps()
    # (step, src, dst, phase, level) -> chunks: one arrow per message and phase
    messages: dict[tuple[int, int, int, str, str], list[int]] = {}
    for i, t in enumerate(sched.transfers):
        level = sched.levels[i] if sched.levels else ""
        messages.setdefault((t.step, t.src, t.dst, t.phase, level), []).append(t.chunk)
    if title is None:
        title = f"{sched.name} all-reduce: {n} ranks, {steps} steps"
    with _figure(path, (1.25 * steps + 2.6, 0.55 * n + 1.5), title) as fig:
        ax = fig.add_subplot()
        per_node = getattr(topo, "ranks_per_node", None)
        if isinstance(per_node, int) and 1 < per_node < n:
            for node in range(0, n // per_node, 2):
                ax.axhspan(node * per_node - 0.5, (node + 1) * per_node - 0.5,
                           color="#f0f0f0", zorder=0)
        for r in range(n):
            ax.axhline(r, color="#c8c8c8", lw=0.8, zorder=1)
        for s in range(steps + 1):
            ax.axvline(s, color="#e0e0e0", lw=0.8, zorder=1)
        for (step, src, dst, phase, level), chunks in messages.items():
            color = _PHASE_STYLE[phase][0]
            tail, head = (step + 0.2, src), (step + 0.9, dst)
            ax.annotate("", head, tail, zorder=3, arrowprops=dict(
                arrowstyle="-|>", color=color, lw=1.4, shrinkA=0, shrinkB=0,
                mutation_scale=10, linestyle=_LEVEL_DASH.get(level, "-")))
            # on the sender's row, over the arrow's tail: a rank sends one message per step
            # (single port), so labels never overlap, where along the arrows they would cross
            ax.text(*tail, _chunks_label(chunks), ha="center", va="center", fontsize=7,
                    color=color, zorder=4,
                    bbox=dict(boxstyle="round,pad=0.2", fc="white", ec=color, lw=0.6))
        ax.set_xlim(0, steps)
        ax.set_ylim(n - 0.5, -0.5)  # rank 0 on top
        ax.set_xticks([s + 0.5 for s in range(steps)], [str(s) for s in range(steps)])
        ax.set_yticks(range(n), [f"rank {r}" for r in range(n)])
        ax.tick_params(length=0)
        ax.set_xlabel("step")
        for side in ax.spines.values():
            side.set_visible(False)
        phases = dict.fromkeys(t.phase for t in sched.transfers)
        handles: list[Any] = [Patch(color=_PHASE_STYLE[p][0], label=_PHASE_STYLE[p][1])
                              for p in phases]
        handles += [Line2D([], [], color="#555555", ls=_LEVEL_DASH.get(lv, "-"),
                           label=f"{lv} link") for lv in dict.fromkeys(sched.levels)]
        if isinstance(per_node, int) and 1 < per_node < n:
            handles.append(Patch(color="#f0f0f0", label=f"node of {per_node} ranks"))
        _legend(fig, handles, title="c: chunks sent")
    return Path(path)
