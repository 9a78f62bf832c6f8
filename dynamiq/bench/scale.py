"""``dynamiq bench scale``: the synthetic large-scale model as the number of ranks grows.

The paper's synthetic model (docs/method.rst): super-group norms from a two-component
log-normal mixture, coordinates ``N(0, M²/256)`` independently per rank
(:class:`~dynamiq.bench.workloads.LogNormal`). DynamiQ at several budgets (widths 2–8 and 16:
BF16 is the top width at large scale, as in the paper's simulation) against MXFP8 and BF16, on
ring and butterfly. Every run is :func:`~dynamiq.collectives.batched.simulate_batched`, which
processes a schedule step at once (the same bits as the per-message simulator).

Memory stays bounded by streaming: the vector is reduced slice by slice (every rank's slice is
generated on demand), each slice one simulated all-reduce with its own metadata phase and width
allocation; squared errors and norms are summed over slices, so the reported vNMSE is that of
the whole vector. Allocating per slice instead of over the whole vector changes nothing in
distribution here, as the super-groups are independent and identically distributed. A slice
holds whole super-groups for every rank where ``d`` allows (``256·n`` coordinates or more);
beyond that (4096 ranks and ``d = 2^18``: 64 coordinates per rank) the whole vector is one
slice, and a method whose blocks are larger than a rank's share leaves some ranks' chunks
empty (DynamiQ's 256-coordinate super-groups fill 1024 of 4096 chunks; MXFP8's 32-coordinate
blocks fill all), while every chunk still travels the full ring.
"""

from __future__ import annotations

import argparse
import dataclasses
import resource
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from dynamiq.bench.output import stderr_log, write_rows
from dynamiq.bench.plots import check_plot_path, scatter_plot
from dynamiq.bench.progress import progress_bar, quiet
from dynamiq.collectives.batched import simulate_batched
from dynamiq.pipeline import Pipeline

__all__ = ["OptionsError", "ScaleRow", "add_arguments", "run", "run_from_args", "scale_pipelines"]


@dataclass
class ScaleRow:
    """One method at one world size and topology.

    Attributes:
        method: Label.
        pipeline: Canonical pipeline string (on the row's topology).
        topology: Topology spec.
        world_size: Ranks.
        d: Coordinates per rank.
        bits_per_coord: Measured ``b̄`` (metadata included).
        vnmse: ``Σ‖Ŝ−S‖² / Σ‖S‖²`` over all slices.
        seconds: Simulation time.
        peak_memory_gb: The process's peak resident memory when the row was done (GiB).
    """

    method: str
    pipeline: str
    topology: str
    world_size: int
    d: int
    bits_per_coord: float
    vnmse: float
    seconds: float
    peak_memory_gb: float = 0.0


def peak_memory_gb() -> float:
    """This process's peak resident memory so far, in GiB."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**30 if sys.platform == "darwin" else peak / 2**20


class OptionsError(ValueError):
    """DynamiQ options that the codec does not take (:func:`scale_pipelines`)."""


def scale_pipelines(budgets: Sequence[float], topology: str,
                    options: str = "") -> list[tuple[str, Pipeline]]:
    """DynamiQ at each budget, then MXFP8 and BF16, on ``topology``.

    ``options``: more arguments of the DynamiQ codec, as in its spec string (e.g.
    ``"midrise=False,super_scale=bf16"``); a name or value it does not take raises
    :class:`OptionsError`.
    """
    from dynamiq.pipeline import get_pipeline

    extra = options.strip().strip(",")
    extra = f",{extra}" if extra else ""
    out = []
    for b in budgets:
        spec = f"center+dynamiq(bits={float(b)},widths=(2,3,4,5,6,7,8,16){extra})@{topology}"
        try:
            out.append((f"dynamiq {b:g}b", Pipeline.parse(spec)))
        except (TypeError, ValueError) as e:
            raise OptionsError(f"bad DynamiQ options {options!r}: {e}") from e
    mx = get_pipeline("mxfp8")
    out.append(("mxfp8", dataclasses.replace(mx, topology=topology)))
    out.append(("bf16", Pipeline.parse(f"passthrough(wire=bf16)@{topology}")))
    return out


def run(
    world_sizes: Sequence[int] = (8, 64, 512),
    topologies: Sequence[str] = ("ring", "butterfly"),
    budgets: Sequence[float] = (5.0, 6.0, 8.5),
    *,
    d: int = 1 << 20,
    slice_coords: int | None = None,
    seed: int = 0,
    options: str = "",
    json_path: str | None = None,
    plot_path: str | None = None,
    out: Callable[[str], None] = print,
    log: Callable[[str], None] | None = None,
) -> list[ScaleRow]:
    """Measure vNMSE and bits of DynamiQ and MXFP8 for each world size and topology.

    Args:
        world_sizes: Ranks (butterfly needs powers of two).
        topologies: Topology specs.
        budgets: DynamiQ budgets in bits/coordinate.
        d: Coordinates per rank.
        slice_coords: Coordinates per streamed slice (default ``max(2^16, 256·n)``, rounded
            to a multiple of ``256·n`` so every rank owns whole super-groups; at most ``d``).
        seed: Seed of the synthetic gradients.
        options: More arguments of the DynamiQ codec (:func:`scale_pipelines`), to measure a
            variant of its coding at scale.
        json_path, plot_path: Optional outputs (the plot ``.svg`` or ``.png``).
        out: Where the table goes.
        log: Progress lines (default: standard error).

    Returns:
        The rows.
    """
    from dynamiq.bench.workloads import get_workload

    if plot_path:
        check_plot_path(plot_path)  # before the measurements, not after them
    for topo in topologies:  # a bad option fails here, not after the first world size
        scale_pipelines(budgets, topo, options)
    if log is None:
        log = stderr_log
    model = get_workload("lognormal")
    rows: list[ScaleRow] = []
    for n in world_sizes:
        unit = 256 * n
        sl = slice_coords or max(1 << 16, unit)
        sl = min(d, max(unit, sl // unit * unit))
        for topo in topologies:
            methods = scale_pipelines(budgets, topo, options)
            err = {m: 0.0 for m, _ in methods}
            bits = {m: 0.0 for m, _ in methods}
            secs = {m: 0.0 for m, _ in methods}
            peak = {m: 0.0 for m, _ in methods}
            norm = 0.0
            states: dict[str, dict] = {m: {} for m, _ in methods}
            nslices = -(-d // sl)
            t_all = time.perf_counter()
            bar = progress_bar(nslices, f"n={n} {topo}", unit="slice")
            for k in range(nslices):
                a, b = k * sl, min(d, (k + 1) * sl)
                x = torch.empty(n, b - a)
                for r in range(n):
                    x[r] = model.rank_vector(r, a, b, world_size=n, seed=seed)
                exact = None
                for i, (m, p) in enumerate(methods):
                    # the simulation overwrites its input: a copy for all but the last method
                    y = x if i == len(methods) - 1 else x.clone()
                    t0 = time.perf_counter()
                    res = simulate_batched(p, y, call=k, state=states[m], inplace=True)
                    secs[m] += time.perf_counter() - t0
                    del y
                    if exact is None:
                        exact = float((res.exact**2).sum())
                        norm += exact
                    err[m] += res.vnmse * exact
                    bits[m] += res.bits * (b - a)
                    peak[m] = peak_memory_gb()
                del x
                bar.update()
                if quiet(bar):
                    log(f"  n={n} {topo}: slice {k + 1}/{nslices} "
                        f"({time.perf_counter() - t_all:.0f}s)")
            bar.close()
            for m, p in methods:
                rows.append(ScaleRow(m, str(p), topo, n, d, bits[m] / d,
                                     err[m] / norm if norm else 0.0, secs[m], peak[m]))
                log(f"  n={n} {topo} {m}: vNMSE {rows[-1].vnmse:.4g} "
                    f"bits {rows[-1].bits_per_coord:.3f} ({secs[m]:.1f} s)")
    head = (f"{'n':>6} {'topology':<10} {'method':<14} {'bits/coord':>10} {'vNMSE':>11} "
            f"{'seconds':>8} {'peak GiB':>8}")
    out(f"\nsynthetic log-normal model, {d} coordinates per rank")
    out(head)
    out("-" * len(head))
    for r in rows:
        out(f"{r.world_size:>6} {r.topology:<10} {r.method:<14} {r.bits_per_coord:10.3f} "
            f"{r.vnmse:11.4g} {r.seconds:8.1f} {r.peak_memory_gb:8.2f}")
    if json_path:
        write_rows(rows, json_path, log)
    if plot_path:
        series: dict[str, list[tuple[float, float]]] = {}
        for r in rows:
            series.setdefault(f"{r.method} {r.topology}", []).append((r.world_size, r.vnmse))
        scatter_plot(series, plot_path, title="synthetic model: vNMSE against ranks",
                     xlabel="ranks n")
        log(f"wrote {plot_path}")
    return rows


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``dynamiq bench scale``."""
    p.add_argument("--world-sizes", default="8,64,512")
    p.add_argument("--topologies", default="ring,butterfly")
    p.add_argument("--bits", default="5,6,8.5", help="DynamiQ budgets")
    p.add_argument("--d", type=int, default=1 << 20,
                   help="coordinates per rank (streamed in slices)")
    p.add_argument("--slice", type=int, default=None,
                   help="coordinates per slice (default: 256 per rank, at least 2^16)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--options", default="",
                   help="more DynamiQ codec arguments, e.g. 'midrise=False,super_scale=bf16'")
    p.add_argument("--json", help="write the rows to this JSON file")
    p.add_argument("--plot", help="write an SVG chart here")


def run_from_args(args: argparse.Namespace) -> int:
    """``dynamiq bench scale``: :func:`run` with the options of :func:`add_arguments`; exit
    code 2, with the reason on standard error, when ``--options`` names a DynamiQ argument
    that does not exist or a value it does not take."""
    try:
        # run checks the options before it measures anything
        run(world_sizes=tuple(int(v) for v in args.world_sizes.split(",")),
            topologies=tuple(args.topologies.split(",")),
            budgets=tuple(float(v) for v in args.bits.split(",")), d=args.d,
            slice_coords=args.slice, seed=args.seed, options=args.options,
            json_path=args.json, plot_path=args.plot)
    except OptionsError as e:
        print(f"dynamiq bench scale: {e}", file=sys.stderr)
        return 2
    return 0
