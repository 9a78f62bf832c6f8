"""``dynamiq.all_reduce`` against ``torch.distributed.all_reduce``, over gloo on loopback.

Each world size is a fresh set of processes on this machine, started by
:func:`dynamiq.collectives.launch.launch`. For every tensor size all methods reduce the same
float32 input: torch's all-reduce in FP32 and of the input cast to BF16, and each dynamiq
pipeline. A time is the slowest rank's wall time of one call (ranks start together after a
barrier); every method is called once to warm up, then the methods take turns for ``repeat``
rounds (so a load that drifts during the run hits them alike); the best round counts, and the
median is reported too (steadier than the best on a machine shared with other work).

A lone call pays for the ranks' skew after the barrier and for waking every thread on the
way; a training step issues its buckets' all-reduces one after another, so that the next
call's first messages overlap the last one's stragglers. With ``burst`` > 0 each round also
times ``burst`` calls in a row per method (between one barrier and the last call's end, on
the slowest rank) and reports the time per call: the steady-state cost of a stream of calls.
On
loopback the wire is memory, so the ratios mostly measure the executor's overhead and the
codec's compute rather than the bandwidth a real network would save; the bits per coordinate
are what each rank actually sent. For dynamiq pipelines the best call's
:class:`~dynamiq.collectives.p2p.P2PStats` tell where rank 0's time went.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from dynamiq.bench.output import stderr_log, write_rows
from dynamiq.bench.timeplot import check_plot_path, plot_times
from dynamiq.collectives import api
from dynamiq.collectives.launch import launch

__all__ = ["BURST", "DEFAULT_PIPELINES", "TORCH_METHODS", "AllReduceRow", "measure_world",
           "methods_of", "numel_of", "rows_of", "run"]

#: The dynamiq pipelines compared by default (registered names).
DEFAULT_PIPELINES = ("passthrough-fp32", "bf16", "mxfp8", "dynamiq")
#: torch's own all-reduce of the float32 input, and of the input cast to bfloat16.
TORCH_METHODS = ("torch-fp32", "torch-bf16")

#: Seconds one tensor size may take in a world, per method (first calls compile kernels), on
#: loopback; a slow link adds its wire time.
SECONDS_PER_CASE = 300
#: Calls in a row timed per round by default (see the module).
BURST = 8


@dataclass
class AllReduceRow:
    """One method at one world size and tensor size.

    Attributes:
        world_size: Ranks.
        size_mb: float32 tensor size in MB (2**20 bytes).
        numel: Coordinates.
        method: ``torch-fp32``, ``torch-bf16`` or the pipeline name given.
        pipeline: The pipeline's spec string (``""`` for torch).
        seconds: Best slowest-rank wall time of one call.
        ratio: ``seconds`` over torch FP32's.
        median_seconds: Median over the rounds of the slowest-rank wall time.
        median_ratio: ``median_seconds`` over torch FP32's.
        codec_seconds, wire_seconds, wait_seconds, metadata_seconds: Rank 0's split of the
            best call (:class:`~dynamiq.collectives.p2p.P2PStats`; 0 for torch).
        bits_per_coord: Per rank, bits sent per coordinate (torch: what a ring all-reduce of
            its payload sends, ``2(n-1)/n`` times its width).
        max_abs_diff: Largest ``|result - torch FP32 result|`` on rank 0.
        burst_seconds: Best over the rounds of the time per call of ``burst`` calls in a row
            (0 when not measured).
        burst_ratio: ``burst_seconds`` over torch FP32's.
        burst_median_ratio: The median over the rounds of that time per call, over torch
            FP32's median.
    """

    world_size: int
    size_mb: float
    numel: int
    method: str
    pipeline: str
    seconds: float
    ratio: float = 0.0
    median_seconds: float = 0.0
    median_ratio: float = 0.0
    codec_seconds: float = 0.0
    wire_seconds: float = 0.0
    wait_seconds: float = 0.0
    metadata_seconds: float = 0.0
    bits_per_coord: list[float] = field(default_factory=list)
    max_abs_diff: float = 0.0
    burst_seconds: float = 0.0
    burst_ratio: float = 0.0
    burst_median_ratio: float = 0.0


def _slowest(seconds: float) -> float:
    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def _case(rank: int, numel: int, methods: Sequence[str], repeat: int,
          link: bool = False, burst: int = 0) -> dict[str, dict]:
    """Every method on one input: best time, the best call's stats, the result's deviation,
    and with ``burst`` > 0 the time per call of ``burst`` calls in a row (see the module).

    With ``link`` (inside a testbed rank) also this rank's link counters around every timed
    call: ``veth_tx_bytes`` is their mean over the calls, next to dynamiq's ``bytes_sent`` and
    ``metadata_bytes`` of one call. ``cpu_seconds`` is the mean CPU time of this process (all
    its threads, gloo's included) over the timed calls.
    """
    x = torch.randn(numel, generator=torch.Generator().manual_seed(rank))
    bufs = {m: torch.empty(numel, dtype=torch.bfloat16 if m == "torch-bf16" else torch.float32)
            for m in methods}
    stats = {m: api.P2PStats() for m in methods}
    tx = dict.fromkeys(methods, 0)
    cpu = dict.fromkeys(methods, 0.0)
    if link:
        from dynamiq.testbed.counters import interface_counters

    def reduce(m: str, t: torch.Tensor) -> None:
        if m in TORCH_METHODS:
            dist.all_reduce(t)
        else:
            api.all_reduce(t, m, stats=stats[m])

    def call(m: str) -> float:
        t = bufs[m]
        t.copy_(x)
        dist.barrier()
        before = interface_counters().tx_bytes if link else 0
        c0, t0 = time.process_time(), time.perf_counter()
        reduce(m, t)
        seconds = time.perf_counter() - t0
        cpu[m] += time.process_time() - c0
        slowest = _slowest(seconds)
        if link:  # every rank is done: what this rank sent has crossed its link
            tx[m] += interface_counters().tx_bytes - before
        return slowest

    def in_a_row(m: str) -> float:
        # each call sums the last one's result again: the values grow by the world size per
        # call, far from float32's range for the few calls of a burst
        t = bufs[m]
        t.copy_(x)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(burst):
            reduce(m, t)
        return _slowest(time.perf_counter() - t0) / burst

    best: dict[str, dict] = {m: {"seconds": float("inf")} for m in methods}
    rounds: dict[str, list[float]] = {m: [] for m in methods}
    for m in methods:
        call(m)  # warm-up: first-call costs (buffers, schedules, kernels) are not the steady state
        tx[m], cpu[m] = 0, 0.0
    for _ in range(repeat):
        for m in methods:
            s = call(m)
            rounds[m].append(s)
            if s < best[m]["seconds"]:
                st = stats[m]
                best[m] = {"seconds": s, "codec_seconds": st.codec_seconds,
                           "wire_seconds": st.wire_seconds, "wait_seconds": st.wait_seconds,
                           "metadata_seconds": st.metadata_seconds,
                           "bits_per_coord": st.bits_per_coord,
                           "bytes_sent": st.bytes_sent, "metadata_bytes": st.metadata_bytes}
    ref = bufs["torch-fp32"]
    ring = 2 * (dist.get_world_size() - 1) / dist.get_world_size()
    for m in methods:
        best[m]["median_seconds"] = statistics.median(rounds[m])
        if m in TORCH_METHODS:
            # what a ring all-reduce of the payload sends per coordinate, like dynamiq's count
            best[m]["bits_per_coord"] = ring * (16.0 if m == "torch-bf16" else 32.0)
            best[m]["bytes_sent"] = round(best[m]["bits_per_coord"] * numel / 8)
        best[m]["max_abs_diff"] = float((bufs[m].float() - ref).abs().max())
        best[m]["cpu_seconds"] = cpu[m] / repeat
        if link:
            best[m]["veth_tx_bytes"] = tx[m] / repeat
    if burst:  # after the deviations above: the bursts overwrite the results
        per_call: dict[str, list[float]] = {m: [] for m in methods}
        for _ in range(repeat):
            for m in methods:
                per_call[m].append(in_a_row(m))
        for m in methods:
            best[m]["burst_seconds"] = min(per_call[m])
            best[m]["burst_median_seconds"] = statistics.median(per_call[m])
    return best


def measure_world(rank: int, n: int, sizes_mb: tuple[float, ...], methods: tuple[str, ...],
                  repeat: int, link: bool = False, burst: int = 0) -> list[dict]:
    """One rank's measurements, one per tensor size (run in a launched process or a testbed
    rank; ``link``: read the rank's link counters; ``burst``: also time that many calls in a
    row; see :func:`_case`)."""
    return [_case(rank, numel_of(mb), methods, repeat, link, burst) for mb in sizes_mb]


def methods_of(pipelines: Sequence[str], repeat: int) -> tuple[tuple[str, ...], dict[str, str]]:
    """The methods timed (torch's two, then the pipelines) and each pipeline's spec string;
    checked here, not in n ranks.

    Raises:
        ValueError: ``repeat < 1``, or a pipeline that does not resolve.
    """
    from dynamiq.pipeline import get_pipeline

    if repeat < 1:
        raise ValueError("repeat must be >= 1")
    specs = {name: str(get_pipeline(name)) for name in pipelines if name not in TORCH_METHODS}
    return (*TORCH_METHODS, *(m for m in pipelines if m not in TORCH_METHODS)), specs


def numel_of(size_mb: float) -> int:
    """float32 coordinates in ``size_mb`` MB (2**20 bytes), at least 1."""
    return max(1, int(size_mb * 2**20 / 4))


def rows_of(n: int, sizes_mb: Sequence[float], methods: Sequence[str], specs: dict[str, str],
            per_rank: list[list[dict]], log: Callable[[str], None]) -> list[AllReduceRow]:
    """The rows of one world from what :func:`measure_world` returned on each rank (rank 0's times,
    every rank's bits), with a progress line per tensor size."""
    rows = []
    for mb, got in zip(sizes_mb, zip(*per_rank)):
        base = got[0]["torch-fp32"]
        for m in methods:
            r0 = got[0][m]
            burst = {}
            if "burst_seconds" in r0:
                burst = dict(
                    burst_seconds=r0["burst_seconds"],
                    burst_ratio=r0["burst_seconds"] / base["burst_seconds"],
                    burst_median_ratio=(r0["burst_median_seconds"]
                                        / base["burst_median_seconds"]))
            rows.append(AllReduceRow(
                world_size=n, size_mb=mb, numel=numel_of(mb), method=m,
                pipeline=specs.get(m, ""), seconds=r0["seconds"],
                ratio=r0["seconds"] / base["seconds"],
                median_seconds=r0["median_seconds"],
                median_ratio=r0["median_seconds"] / base["median_seconds"],
                codec_seconds=r0.get("codec_seconds", 0.0),
                wire_seconds=r0.get("wire_seconds", 0.0),
                wait_seconds=r0.get("wait_seconds", 0.0),
                metadata_seconds=r0.get("metadata_seconds", 0.0),
                bits_per_coord=[g[m]["bits_per_coord"] for g in got],
                max_abs_diff=r0["max_abs_diff"], **burst))
        log(f"  {mb:g} MB: " + ", ".join(f"{m} {got[0][m]['seconds'] * 1e3:.2f} ms"
                                         for m in methods))
    return rows


def _time_table(title: str, cases: list, by: dict, methods: Sequence[str], width: int,
                cell: Callable[[AllReduceRow], tuple[float, float, float]],
                out: Callable[[str], None]) -> None:
    out(f"\n{title}: best ms (ratio to torch-fp32's best | median over rounds to its median)")
    head = f"{'world':>5} {'MB':>6} " + " ".join(f"{m:>{width}}" for m in methods)
    out(head)
    out("-" * len(head))
    for n, mb in cases:
        cells = []
        for m in methods:
            seconds, ratio, median = cell(by[(n, mb, m)])
            text = f"{seconds * 1e3:.2f} ({ratio:.2f}x | {median:.2f}x)"
            cells.append(f"{text:>{width}}")
        out(f"{n:>5} {mb:>6g} " + " ".join(cells))


def _tables(rows: list[AllReduceRow], methods: Sequence[str], out: Callable[[str], None],
            burst: int = 0) -> None:
    cases = sorted({(r.world_size, r.size_mb) for r in rows})
    by = {(r.world_size, r.size_mb, r.method): r for r in rows}
    width = max(23, *(len(m) for m in methods))
    _time_table("time per call", cases, by, methods, width,
                lambda r: (r.seconds, r.ratio, r.median_ratio), out)
    if burst:
        _time_table(f"time per call, {burst} calls in a row", cases, by, methods, width,
                    lambda r: (r.burst_seconds, r.burst_ratio, r.burst_median_ratio), out)
    pipes = [m for m in methods if m not in TORCH_METHODS]
    if not pipes:
        return
    out("\ndynamiq time split on rank 0, ms (best call): codec / wire / wait / metadata, and "
        "the rest of the total (local statistics, transforms, bookkeeping, rank skew)")
    head = (f"{'world':>5} {'MB':>6} {'pipeline':<{width}} {'total':>8} {'codec':>8} "
            f"{'wire':>8} {'wait':>8} {'meta':>8} {'other':>8} {'bits/coord':>11} "
            f"{'max |diff|':>10}")
    out(head)
    out("-" * len(head))
    for n, mb in cases:
        for m in pipes:
            r = by[(n, mb, m)]
            bits = r.bits_per_coord
            bits_txt = (f"{min(bits):.2f}" if max(bits) == min(bits)
                        else f"{min(bits):.2f}-{max(bits):.2f}")
            split = (r.codec_seconds, r.wire_seconds, r.wait_seconds, r.metadata_seconds)
            cells = " ".join(f"{v * 1e3:>8.2f}" for v in (*split, r.seconds - sum(split)))
            out(f"{n:>5} {mb:>6g} {m:<{width}} {r.seconds * 1e3:>8.2f} {cells} "
                f"{bits_txt:>11} {r.max_abs_diff:>10.3g}")


def run(
    world_sizes: Sequence[int] = (2, 4),
    sizes_mb: Sequence[float] = (4, 16, 64),
    pipelines: Sequence[str] = DEFAULT_PIPELINES,
    repeat: int = 3,
    *,
    burst: int = BURST,
    json_path: str | None = None,
    plot_path: str | None = None,
    out: Callable[[str], None] = print,
    log: Callable[[str], None] | None = None,
) -> list[AllReduceRow]:
    """Time torch's and dynamiq's all-reduce on loopback gloo worlds, side by side.

    Args:
        world_sizes: Numbers of processes, one spawned world each.
        sizes_mb: float32 tensor sizes in MB (2**20 bytes).
        pipelines: Registered pipeline names or spec strings of ``dynamiq.all_reduce``.
        repeat: Timed rounds after one warm-up; the best time of each method is kept.
        burst: Per round, also time this many calls in a row (0: not).
        json_path: Also write the rows to this JSON file.
        plot_path: Also plot time against size here, one panel per world size (``.svg`` or
            ``.png``; needs matplotlib).
        out: Where the tables go.
        log: Where progress lines go (default: standard error).

    Returns:
        One row per world size, tensor size and method (torch FP32, torch BF16, then the
        pipelines in the order given).
    """
    if log is None:
        log = stderr_log
    methods, specs = methods_of(pipelines, repeat)
    if burst < 0:
        raise ValueError("burst must be >= 0")
    if plot_path:
        check_plot_path(plot_path)
    cores = os.cpu_count() or 1
    rows: list[AllReduceRow] = []
    log(f"all-reduce benchmark on loopback gloo: {', '.join(methods)}; best of {repeat}")
    for n in world_sizes:
        threads = max(1, cores // n)
        log(f"world size {n}: spawning {n} processes ({threads} thread(s) each)")
        per_rank = launch(measure_world, n, (tuple(sizes_mb), methods, repeat, False, burst),
                          timeout=SECONDS_PER_CASE * len(sizes_mb) * len(methods),
                          group_timeout=600,
                          # read by numba when a process imports it
                          env={"NUMBA_NUM_THREADS": str(threads)}, num_threads=threads)
        rows += rows_of(n, sizes_mb, methods, specs, per_rank, log)
    _tables(rows, methods, out, burst)
    if json_path:
        write_rows(rows, json_path, log)
    if plot_path:
        log(f"wrote {plot_times(rows, plot_path)}")
    return rows
