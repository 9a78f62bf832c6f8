"""``dynamiq bench nmse``: vNMSE and measured bits per coordinate of every method on real gradients.

Every method is a registered pipeline run by the in-process simulator (the same per-rank logic
as the distributed executor, bit for bit) on the same cached per-worker gradients
(:mod:`dynamiq.bench.workloads`). For each method the error is averaged over the workload's
training points, as the paper averages vNMSE over training. Per method, codec state (DynamiQ's
warm start, the MX auto-scale factor, OmniReduce's ``k``) is carried from point to point as in
training, after one unmeasured call on the first point so that adaptive baselines start tuned.

Bits per coordinate are measured: the bytes every virtual rank put on the wire plus the metadata
phase's BF16 values, normalised as docs/method.rst counts ``b̄``
(:attr:`dynamiq.SimulationResult.bits`).
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dynamiq.bench.ablation import ABLATION, ABLATION_SIDE
from dynamiq.bench.accuracy import bias_ratio, bits_to_match, target_pipeline, vnmse_at
from dynamiq.bench.output import stderr_log, write_rows
from dynamiq.bench.plots import check_plot_path, scatter_plot
from dynamiq.codecs import DynamiQ
from dynamiq.collectives.simulator import simulate
from dynamiq.pipeline import Pipeline, get_pipeline

__all__ = [
    "ABLATION",
    "ABLATION_SIDE",
    "DEFAULT_METHODS",
    "MXFP8_BITS",
    "SWEEP_BITS",
    "Row",
    "evaluate",
    "method_pipeline",
    "plot_rows",
    "run",
    "target_value",
]

#: Methods compared by default (registered pipeline names).
DEFAULT_METHODS = ("dynamiq", "dynamiq-paper", "bf16", "mxfp8", "mxfp6", "mxfp4", "nvfp4",
                   "thc", "omnireduce")

#: MXFP8's bits per coordinate (E4M3 elements under an E8M0 scale per 32).
MXFP8_BITS = 8.5
#: Budgets of the sweep (bits per coordinate); the last is MXFP8's.
SWEEP_BITS = (3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 8.5)


@dataclass
class Row:
    """One measured method on one workload.

    Attributes:
        workload: Workload name.
        method: The label (registered name or the spec given).
        pipeline: Canonical pipeline string that ran.
        topology: Topology spec.
        world_size: Number of ranks.
        bits_per_coord: Measured ``b̄`` (mean over points).
        vnmse: Mean vNMSE over the training points.
        vnmse_points: vNMSE per point.
        points: The training steps.
        kind: ``"methods"``, ``"ablation"``, ``"sweep"``, ``"target"`` (the accuracy-targeted
            mode; ``bits_per_coord`` is the budget it chose) or ``"match"`` (derived from the
            sweep: ``bits_per_coord`` the budget at which DynamiQ reaches the reference's
            vNMSE, ``vnmse`` that reference's; ``method`` says which).
        unbiased: Whether the pipeline's estimate is unbiased by construction.
        seconds: Simulation time (all points).
        target: The vNMSE target (or reference name) of a ``"target"`` row.
        bias: With ``--bias K``: vNMSE of the mean of K independent calls relative to
            vNMSE/K (1 for an unbiased method, see :func:`~dynamiq.bench.accuracy.bias_ratio`).
    """

    workload: str
    method: str
    pipeline: str
    topology: str
    world_size: int
    bits_per_coord: float
    vnmse: float
    vnmse_points: list[float] = field(default_factory=list)
    points: list[int] = field(default_factory=list)
    kind: str = "methods"
    unbiased: bool = False
    seconds: float = 0.0
    target: float | str | None = None
    bias: float | None = None


def method_pipeline(method: str | Pipeline, topology: str | None = None,
                    bits: float | None = None) -> Pipeline:
    """The pipeline of ``method`` (registered name or spec), on ``topology``, with DynamiQ
    codecs set to ``bits`` (other codecs keep their own budgets)."""
    p = get_pipeline(method)
    changes: dict = {}
    if topology is not None:
        changes["topology"] = topology
    if bits is not None and isinstance(p.codec, DynamiQ) and p.codec.variable:
        changes["codec"] = dataclasses.replace(p.codec, bits=float(bits))
    return dataclasses.replace(p, **changes) if changes else p


def evaluate(pipeline: Pipeline, sets: Sequence, *, warmup: int = 1, backend: str = "auto"
             ) -> tuple[list[float], list[float], float]:
    """Simulate ``pipeline`` on every gradient set in order, carrying codec state.

    Args:
        pipeline: The pipeline.
        sets: :class:`~dynamiq.bench.workloads.GradientSet` objects (``grads`` float32
            ``[n, d]``).
        warmup: Unmeasured calls on the first set before measuring.
        backend: Kernel backend of the simulation (every backend gives the same bits).

    Returns:
        ``(vnmse per set, bits per set, seconds)``.
    """
    state: dict = {}
    call = 0
    t0 = time.perf_counter()
    for _ in range(warmup):
        simulate(pipeline, sets[0].grads, call=call, state=state, track_hops=False,
                 backend=backend)
        call += 1
    vn, bits = [], []
    for gs in sets:
        r = simulate(pipeline, gs.grads, call=call, state=state, track_hops=False,
                     backend=backend)
        call += 1
        vn.append(r.vnmse)
        bits.append(r.bits)
    return vn, bits, time.perf_counter() - t0


def _row(workload: str, label: str, p: Pipeline, sets: Sequence, kind: str,
         log: Callable[[str], None], backend: str) -> Row:
    vn, bits, secs = evaluate(p, sets, backend=backend)
    row = Row(workload, label, str(p), p.topology.spec(), sets[0].grads.shape[0],
              sum(bits) / len(bits), sum(vn) / len(vn), vn, [g.point for g in sets], kind,
              p.unbiased, secs)
    log(f"  {label:<34} {row.bits_per_coord:7.3f} bits  vNMSE {row.vnmse:.4g}  ({secs:.1f}s)")
    return row


def _fmt_table(rows: list[Row], reference: float | None) -> str:
    with_bias = any(r.bias is not None for r in rows)
    with_target = any(r.target is not None for r in rows)
    head = f"{'method':<34} {'topology':<10} {'bits/coord':>10} {'vNMSE':>11} {'vs MXFP8':>9}  bias"
    head += "      mean-of-K" * with_bias + "   vs target" * with_target
    lines = [head, "-" * len(head)]
    for r in rows:
        ratio = (f"{reference / r.vnmse:8.2f}x" if reference and r.vnmse > 0 else f"{'':>9}")
        line = (f"{r.method:<34} {r.topology:<10} {r.bits_per_coord:10.3f} "
                f"{r.vnmse:11.4g} {ratio}  {'unbiased' if r.unbiased else 'biased  '}")
        if with_bias:
            line += f"  {r.bias:11.3g}" if r.bias is not None else " " * 13
        if with_target and r.target is not None:
            goal = target_value(r.target, reference)
            line += f"  {r.vnmse / goal:9.2f}x" if goal else ""
        lines.append(line)
    return "\n".join(lines)


def target_value(target: float | str | None, reference: float | None) -> float | None:
    """The vNMSE a target aimed at: its number, or for ``"mxfp8"`` the measured vNMSE of the
    ``mxfp8`` row on the same gradients (``reference``); ``None`` for no or another target."""
    if isinstance(target, str):
        return reference if target.strip().lower() == "mxfp8" else None
    return target


#: How much the correlated-rounding step of the ablation may raise vNMSE and still count as
#: neutral: with unbiased roundings it cannot lower a ring's error (module doc), and two
#: measurements of the same error differ by sampling noise of about this size.
NEUTRAL = 0.01


def _ablation_ok(rows: list[Row]) -> bool:
    """Every step lowers vNMSE, except correlated rounding, which must not raise it."""
    for a, b in itertools.pairwise(rows):
        limit = a.vnmse * (1 + NEUTRAL) if "correlated" in b.method else a.vnmse
        if not (b.vnmse < limit or ("correlated" in b.method and b.vnmse <= limit)):
            return False
    return True


def _monotone(values: list[float]) -> bool:
    return all(b < a for a, b in itertools.pairwise(values))


def run(
    workload: str = "gpt-stdlib",
    *,
    world_size: int = 8,
    topology: str = "ring",
    methods: Sequence[str] = DEFAULT_METHODS,
    bits: float = 5.0,
    ablation: bool = False,
    sweep: bool = False,
    targets: Sequence[float | str] = (),
    bias: int = 0,
    points: int | None = None,
    json_path: str | None = None,
    plot_path: str | None = None,
    cache_dir: str | None = None,
    backend: str = "auto",
    out: Callable[[str], None] = print,
    log: Callable[[str], None] | None = None,
) -> list[Row]:
    """Measure the methods (and optionally the ablation and budget sweep); print tables.

    Args:
        workload: Registered workload name or spec (e.g. ``"lognormal(d=65536)"``).
        world_size: Ranks ``n``.
        topology: Topology spec for every method.
        methods: Registered pipeline names or specs.
        bits: Budget of DynamiQ methods (bits/coordinate, metadata included).
        ablation: Also run :data:`ABLATION`.
        sweep: Also run DynamiQ (the first DynamiQ method in ``methods``, else ``dynamiq``) at
            :data:`SWEEP_BITS`, and derive from it the budget at which it matches MXFP8's
            vNMSE (when ``mxfp8`` is among the methods) and its vNMSE at MXFP8's 8.5 bits.
        targets: Also run that DynamiQ method in its accuracy-targeted mode at each target (a
            vNMSE, or ``"mxfp8"``), reporting the budget it chose and the measured vNMSE
            against the target.
        bias: With ``K >= 2``, measure every method's bias ratio over ``K`` independent calls
            (:func:`~dynamiq.bench.accuracy.bias_ratio`); 0 skips it.
        points: Training points to use (default: the workload's).
        json_path: Write every row as JSON here.
        plot_path: Write a chart of vNMSE against bits here (``.svg`` or ``.png``).
        cache_dir: Gradient cache folder.
        backend: Kernel backend of the simulations: ``"auto"`` (Numba on CPU), or
            ``"reference"``, which compiles nothing and gives the same bits (slower on large
            inputs; quicker for a few calls of many codings).
        out: Where tables go.
        log: Progress lines (default: standard error).

    Returns:
        All rows.
    """
    from dynamiq.bench.workloads import get_workload
    from dynamiq.kernels import resolve_backend

    if plot_path:
        check_plot_path(plot_path)  # before the measurements, not after them
    resolve_backend(backend, "cpu")  # a bad name fails before the gradients are computed
    if log is None:
        log = stderr_log
    wl = get_workload(workload)
    name = getattr(wl, "name", None) or str(workload)
    log(f"{name}: gradients of {world_size} workers")
    kw = {} if points is None else {"points": points}
    sets = wl.gradients(world_size, cache_dir=cache_dir, progress=log, **kw)
    d = sets[0].grads.shape[1]
    log(f"{name}: {len(sets)} points x {world_size} workers x {d} coordinates")
    rows: list[Row] = []
    for m in methods:
        rows.append(_row(name, m, method_pipeline(m, topology, bits), sets, "methods", log,
                         backend))
    ref = next((r.vnmse for r in rows if r.method == "mxfp8"), None)
    base = next((m for m in methods if isinstance(get_pipeline(m).codec, DynamiQ)
                 and get_pipeline(m).codec.variable), "dynamiq")
    if bias:
        for r in rows:
            r.bias = bias_ratio(method_pipeline(r.method, topology, bits), sets, bias,
                                backend=backend)
            log(f"  {r.method:<34} mean of {bias} calls: {r.bias:.3g} x vNMSE/{bias}")
    out(f"\n{name}, n={world_size}, {topology}, {d} coordinates, "
        f"{len(sets)} training points (steps {', '.join(str(g.point) for g in sets)})")
    out(_fmt_table(rows, ref))
    if bias:
        out(f"mean-of-K: vNMSE of the mean of {bias} independent calls / (vNMSE / {bias}); "
            "1 for an unbiased method")
    if ablation:
        abl = [_row(name, label, method_pipeline(spec + f"@{topology}", None, bits), sets,
                    "ablation", log, backend) for label, spec in ABLATION + ABLATION_SIDE]
        if bias:
            for r in abl:
                r.bias = bias_ratio(method_pipeline(r.pipeline), sets, bias, backend=backend)
        rows += abl
        out(f"\nablation ({topology}, {bits:g} bits/coordinate)")
        out(_fmt_table(abl, ref))
        ok = _ablation_ok(abl[:len(ABLATION)])
        out(f"every step lowers vNMSE (correlated rounding: neutral within {NEUTRAL:.0%} on a "
            f"ring): {'yes' if ok else 'NO'}")
    if sweep:
        sw = [_row(name, f"{base} @ {b:g} bits", method_pipeline(base, topology, b), sets,
                   "sweep", log, backend) for b in SWEEP_BITS]
        rows += sw
        out(f"\nbudget sweep ({base}, {topology})")
        out(_fmt_table(sw, ref))
        ok = _monotone([r.vnmse for r in sw])
        out(f"vNMSE falls with every added bit: {'yes' if ok else 'NO'}")
        rows += _match_rows(name, base, sw, rows, topology, world_size, out)
    if targets:
        tp = [_target_row(name, base, t, method_pipeline(base, topology), sets, log, backend)
              for t in targets]
        rows += tp
        out(f"\naccuracy-targeted budgets ({base}, {topology}): the budget each call chose "
            "(mean) and the measured vNMSE against the target")
        out(_fmt_table(tp, ref))
    if json_path:
        write_rows(rows, json_path, log)
    if plot_path:
        log(f"wrote {plot_rows(rows, plot_path, title=f'{name}, n={world_size}, {topology}')}")
    return rows


def _match_rows(name: str, base: str, sweep: list[Row], rows: list[Row], topology: str,
                world_size: int, out: Callable[[str], None]) -> list[Row]:
    """The sweep's budget-to-accuracy view: bits to match MXFP8, vNMSE at its 8.5 bits."""
    pts = [(r.bits_per_coord, r.vnmse) for r in sweep]
    mx = next((r for r in rows if r.method == "mxfp8" and r.kind == "methods"), None)
    derived = []
    # the sweep's last budget is MXFP8's: its row is the answer even where the codec's widest
    # options cost less than the budget (it then spends what they cost)
    last = sweep[-1]
    at = last.vnmse if SWEEP_BITS[-1] == MXFP8_BITS else vnmse_at(pts, MXFP8_BITS)
    if at is not None:
        derived.append(Row(name, f"{base} at {MXFP8_BITS:g} bits", "", topology, world_size,
                           MXFP8_BITS, at, kind="match", unbiased=sweep[0].unbiased))
    if mx is not None:
        need = bits_to_match(pts, mx.vnmse)
        gain = f"; {mx.vnmse / at:.2f}x lower vNMSE at {MXFP8_BITS:g} bits" if at else ""
        out(f"{base} matches MXFP8's vNMSE {mx.vnmse:.4g} at "
            + (f"{need:.2f} bits/coordinate" if need is not None else
               "no budget of the sweep") + gain)
        if need is not None:
            derived.append(Row(name, f"{base} bits to match mxfp8", "", topology, world_size,
                               need, mx.vnmse, kind="match", unbiased=sweep[0].unbiased))
    return derived


def _target_row(name: str, base: str, target: float | str, p: Pipeline, sets: Sequence,
                log: Callable[[str], None], backend: str) -> Row:
    row = _row(name, f"{base}(target={target})", target_pipeline(p, target), sets, "target",
               log, backend)
    row.target = target
    return row


def plot_rows(rows: Sequence[Row], path: str | Path, *, title: str = "") -> Path:
    """Plot vNMSE against bits per coordinate: a line per method, one for the budget sweep and
    the point where the sweep matches MXFP8 (the ablation's and targets' rows are left out).

    Args:
        rows: What :func:`run` returned (or read back from its JSON).
        path: ``.svg`` or ``.png``.
        title: Text above the chart.

    Returns:
        The path written.

    Raises:
        ValueError: no row with a positive vNMSE, a bad suffix, or no matplotlib.
    """
    # the sweep first, so that the methods' points are drawn over its line (DynamiQ's own
    # point lies on it)
    series: dict[str, list[tuple[float, float]]] = {}
    if any(r.kind == "sweep" for r in rows):
        series["DynamiQ sweep"] = []
    for r in rows:
        if r.kind in ("methods", "sweep"):
            key = r.method if r.kind == "methods" else "DynamiQ sweep"
            series.setdefault(key, []).append((r.bits_per_coord, r.vnmse))
        elif r.kind == "match" and "to match" in r.method:
            series["DynamiQ matching MXFP8"] = [(r.bits_per_coord, r.vnmse)]
    return scatter_plot(series, path, title=title)
