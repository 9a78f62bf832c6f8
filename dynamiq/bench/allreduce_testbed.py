"""``dynamiq bench allreduce --testbed``: the all-reduce benchmark of
:mod:`dynamiq.bench.allreduce` across a bandwidth-limited network, with the bytes each link
really carried.

For every link rate (and world size) a :class:`~dynamiq.testbed.Testbed` is built: every rank a
process in its own network namespace, its link to a bridge shaped with ``tc`` to the rate both
ways. The ranks run exactly the measurement of the loopback benchmark (torch's gloo all-reduce
in FP32 and of the input cast to BF16, what DDP's ``bf16_compress_hook`` does, then each dynamiq
pipeline; one warm-up call each, then ``repeat`` rounds taking turns), and also read their
link's byte counters around every timed call. A row adds to the loopback row: the ratios to
torch's BF16 all-reduce and to the ``bf16`` pipeline, dynamiq's own count of the bytes each rank
sent (payload and metadata; for torch what a ring all-reduce of the payload sends), the bytes
each rank's veth sent per call (headers, gloo's framing, the metadata all-reduce, the barrier
and the timing all-reduce included) and their ratio to that count, and the time the rate alone
imposes on rank 0's bytes.

The links are shaped, the CPUs are not: every rank still computes on this machine's cores, so
at high rates the codecs' compute shows in the time split (``codec``), not on the link.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

from dynamiq.bench.allreduce import (
    SECONDS_PER_CASE,
    TORCH_METHODS,
    AllReduceRow,
    measure_world,
    methods_of,
    numel_of,
    rows_of,
)
from dynamiq.bench.output import stderr_log, write_rows
from dynamiq.bench.progress import progress_bar
from dynamiq.bench.timeplot import check_plot_path, plot_times
from dynamiq.testbed import LinkShape, Testbed, TestbedUnavailable, unavailable_reason

__all__ = ["TESTBED_PIPELINES", "TESTBED_SIZES_MB", "NetworkRow", "run_testbed"]

#: The dynamiq pipelines compared on the testbed by default (registered names).
TESTBED_PIPELINES = ("bf16", "mxfp8", "thc", "omnireduce", "dynamiq")
#: Default tensor sizes on the testbed, MB (an FP32 call of 256 MB takes about 30 s at
#: 100 Mbit/s on 4 ranks: ask for it explicitly).
TESTBED_SIZES_MB = (1.0, 16.0, 64.0)


@dataclass
class NetworkRow(AllReduceRow):
    """One method at one link rate, world size and tensor size (see :class:`AllReduceRow`).

    Attributes:
        rate: Every link's rate as ``tc`` writes it (``"100mbit"``).
        rate_bps: The rate in bits per second.
        bf16_ratio: ``seconds`` over torch BF16's best.
        median_bf16_ratio: ``median_seconds`` over torch BF16's median.
        pipeline_bf16_ratio: ``seconds`` over the ``bf16`` pipeline's best (0 when that
            pipeline was not run).
        bytes_sent: Per rank, the payload bytes dynamiq counted for one call
            (:class:`~dynamiq.collectives.p2p.P2PStats`; torch: a ring all-reduce's).
        metadata_bytes: Per rank, the bytes dynamiq all-reduced before the exchange (0 for
            torch).
        veth_tx_bytes: Per rank, bytes its veth sent per timed call (mean over the rounds).
        veth_ratio: Per rank, ``veth_tx_bytes / bytes_sent``.
        wire_bits_per_coord: Per rank, ``8 * veth_tx_bytes / numel``.
        link_seconds: The time rank 0's veth bytes take at the rate alone.
        cpu_seconds: Per rank, the CPU time its process used per timed call (mean over the
            rounds; every thread, gloo's included).
        cores: CPUs of this machine, which every rank shares.
        cpu_bound_seconds: ``sum(cpu_seconds)`` over ``min(cores, world_size)``: the time
            the ranks' compute takes alone when it spreads over the cores perfectly; near
            ``seconds``, the CPUs and not the link set the time.
        load_average: The machine's 1-minute load average as the world started (other work
            on the same cores shows here).
    """

    rate: str = ""
    rate_bps: int = 0
    bf16_ratio: float = 0.0
    median_bf16_ratio: float = 0.0
    pipeline_bf16_ratio: float = 0.0
    bytes_sent: list[int] = field(default_factory=list)
    metadata_bytes: list[int] = field(default_factory=list)
    veth_tx_bytes: list[float] = field(default_factory=list)
    veth_ratio: list[float] = field(default_factory=list)
    wire_bits_per_coord: list[float] = field(default_factory=list)
    link_seconds: float = 0.0
    cpu_seconds: list[float] = field(default_factory=list)
    cores: int = 0
    cpu_bound_seconds: float = 0.0
    load_average: float = 0.0


def _fp32_wire_seconds(n: int, size_mb: float, bps: int) -> float:
    """A ring all-reduce of ``size_mb`` MB of float32 over links of ``bps``."""
    return 2 * (n - 1) / n * numel_of(size_mb) * 32 / bps


def _network_rows(shape: LinkShape, n: int, sizes_mb: Sequence[float], methods: Sequence[str],
                  specs: dict[str, str], per_rank: list[list[dict]], load: float,
                  log: Callable[[str], None]) -> list[NetworkRow]:
    rows = []
    cores = os.cpu_count() or 1
    cases = list(zip(*per_rank))  # per tensor size, every rank's measurements
    for i, row in enumerate(rows_of(n, sizes_mb, methods, specs, per_rank, log)):
        got, m = cases[i // len(methods)], row.method
        tb, pb = got[0]["torch-bf16"], got[0].get("bf16")
        r0 = got[0][m]
        sent = [int(g[m]["bytes_sent"]) for g in got]
        veth = [float(g[m]["veth_tx_bytes"]) for g in got]
        cpu = [float(g[m]["cpu_seconds"]) for g in got]
        rows.append(NetworkRow(
            **asdict(row), rate=shape.rate, rate_bps=shape.bits_per_second,
            bf16_ratio=r0["seconds"] / tb["seconds"],
            median_bf16_ratio=r0["median_seconds"] / tb["median_seconds"],
            pipeline_bf16_ratio=r0["seconds"] / pb["seconds"] if pb else 0.0,
            bytes_sent=sent, metadata_bytes=[int(g[m].get("metadata_bytes", 0)) for g in got],
            veth_tx_bytes=veth,
            veth_ratio=[v / s if s else float("nan") for v, s in zip(veth, sent)],
            wire_bits_per_coord=[8 * v / row.numel for v in veth],
            link_seconds=veth[0] * 8 / shape.bits_per_second,
            cpu_seconds=cpu, cores=cores, cpu_bound_seconds=sum(cpu) / min(cores, n),
            load_average=load))
    return rows


def _span(values: Sequence[float], fmt: str) -> str:
    lo, hi = min(values), max(values)
    return format(lo, fmt) if format(lo, fmt) == format(hi, fmt) else \
        f"{format(lo, fmt)}-{format(hi, fmt)}"


def _tables(rows: list[NetworkRow], out: Callable[[str], None]) -> None:
    width = max(10, *(len(r.method) for r in rows))
    out("\ntime per call across the testbed: best and median ms, ratios of the best to torch "
        "FP32's, torch BF16's and the bf16 pipeline's; bits per coordinate each rank sent by "
        "dynamiq's count and on its veth; veth bytes over dynamiq's; the time rank 0's veth "
        "bytes take at the rate")
    head = (f"{'rate':>8} {'world':>5} {'MB':>5} {'method':<{width}} {'best':>9} {'median':>9} "
            f"{'/fp32':>6} {'/tbf16':>6} {'/bf16':>6} {'bits':>11} {'veth bits':>11} "
            f"{'veth/count':>11} {'link ms':>9}")
    out(head)
    out("-" * len(head))
    for r in rows:
        out(f"{r.rate:>8} {r.world_size:>5} {r.size_mb:>5g} {r.method:<{width}} "
            f"{r.seconds * 1e3:>9.1f} {r.median_seconds * 1e3:>9.1f} {r.ratio:>6.3f} "
            f"{r.bf16_ratio:>6.3f} "
            f"{(f'{r.pipeline_bf16_ratio:.3f}' if r.pipeline_bf16_ratio else '-'):>6} "
            f"{_span(r.bits_per_coord, '.2f'):>11} {_span(r.wire_bits_per_coord, '.2f'):>11} "
            f"{_span(r.veth_ratio, '.3f'):>11} {r.link_seconds * 1e3:>9.1f}")
    out("\nwhere rank 0's best call went, ms: dynamiq's codec / wire / wait / metadata, the "
        "rest (statistics, transforms, bookkeeping, rank skew), the link time at the rate, and "
        "the CPU time of all ranks per call over the machine's cores (the time the compute "
        "alone takes when the ranks have the cores to themselves)")
    head = (f"{'rate':>8} {'world':>5} {'MB':>5} {'method':<{width}} {'total':>9} "
            f"{'codec':>9} {'wire':>9} {'wait':>9} {'meta':>9} {'other':>9} {'link':>9} "
            f"{'cpu/cores':>9}")
    out(head)
    out("-" * len(head))
    for r in rows:
        split = (r.codec_seconds, r.wire_seconds, r.wait_seconds, r.metadata_seconds)
        cells = " ".join(f"{v * 1e3:>9.1f}" for v in (*split, r.seconds - sum(split)))
        if r.method in TORCH_METHODS:  # no split: one call into gloo
            cells = " ".join(f"{'-':>9}" for _ in range(5))
        out(f"{r.rate:>8} {r.world_size:>5} {r.size_mb:>5g} {r.method:<{width}} "
            f"{r.seconds * 1e3:>9.1f} {cells} {r.link_seconds * 1e3:>9.1f} "
            f"{r.cpu_bound_seconds * 1e3:>9.1f}")
    lines = []
    for r in rows:
        if r.method in TORCH_METHODS or r.method == "bf16" or not r.pipeline_bf16_ratio:
            continue
        lines.append(f"  {r.rate} {r.world_size} ranks {r.size_mb:g} MB: {r.method} "
                     f"{1 / r.pipeline_bf16_ratio:.2f}x the "
                     f"speed of bf16, {1 / r.bf16_ratio:.2f}x torch-bf16's, "
                     f"{1 / r.ratio:.2f}x torch-fp32's")
    if lines:
        out("\nspeed-ups (best times):")
        for line in lines:
            out(line)


def run_testbed(
    rates: Sequence[str] = ("100mbit", "1gbit"),
    world_sizes: Sequence[int] = (4,),
    sizes_mb: Sequence[float] = TESTBED_SIZES_MB,
    pipelines: Sequence[str] = TESTBED_PIPELINES,
    repeat: int = 2,
    *,
    json_path: str | None = None,
    plot_path: str | None = None,
    prefix: str = "dynamiq",
    out: Callable[[str], None] = print,
    log: Callable[[str], None] | None = None,
) -> list[NetworkRow]:
    """Time torch's and dynamiq's all-reduce across a testbed at each link rate.

    Args:
        rates: Link rates (``"100mbit"``, ``"1gbit"``); one testbed each, per world size.
        world_sizes: Ranks of each testbed.
        sizes_mb: float32 tensor sizes in MB (2**20 bytes).
        pipelines: Registered pipeline names or spec strings of ``dynamiq.all_reduce``.
        repeat: Timed rounds after one warm-up.
        json_path: Also write the rows to this JSON file.
        plot_path: Also plot time against size here (``.svg`` or ``.png``; needs matplotlib).
        prefix: The testbeds' namespace prefix.
        out: Where the tables go.
        log: Where progress lines go (default: standard error).

    Returns:
        One row per rate, world size, tensor size and method.

    Raises:
        TestbedUnavailable: not root, or ``ip``/``tc`` missing (checked before anything runs).
        ValueError: a bad rate, pipeline, repeat or plot path (also before anything runs).
    """
    if log is None:
        log = stderr_log
    shapes = [LinkShape(r) for r in rates]
    methods, specs = methods_of(pipelines, repeat)
    if plot_path:
        check_plot_path(plot_path)
    reason = unavailable_reason()
    if reason is not None:
        raise TestbedUnavailable(reason)
    cores = os.cpu_count() or 1
    rows: list[NetworkRow] = []
    log(f"all-reduce benchmark across a network testbed: {', '.join(methods)}; best of "
        f"{repeat}")
    bar = progress_bar(len(shapes) * len(world_sizes), "testbeds", unit="testbed")
    for shape in shapes:
        for n in world_sizes:
            bar.set_postfix_str(f"{shape.rate}, {n} ranks")
            threads = max(1, cores // n)
            wire = [_fp32_wire_seconds(n, mb, shape.bits_per_second) for mb in sizes_mb]
            # every call at most an FP32 one on the wire, twice over, plus the compute
            timeout = (SECONDS_PER_CASE * len(sizes_mb) * len(methods)
                       + 2 * (repeat + 1) * len(methods) * sum(wire))
            load = os.getloadavg()[0]
            with Testbed(n, shape, prefix=prefix) as bed:
                log(f"{shape.rate}, world size {n}: testbed {bed.id}, {n} ranks "
                    f"({threads} thread(s) each; load average {load:.2f} on {cores} cores)")
                per_rank = bed.run(measure_world, (tuple(sizes_mb), methods, repeat, True),
                                   timeout=timeout, group_timeout=600 + 4 * max(wire),
                                   env={"NUMBA_NUM_THREADS": str(threads),
                                        "OMP_NUM_THREADS": str(threads)},
                                   num_threads=threads)
            rows += _network_rows(shape, n, sizes_mb, methods, specs, per_rank, load, log)
            bar.update()
    bar.close()
    _tables(rows, out)
    if json_path:
        write_rows(rows, json_path, log)
    if plot_path:
        log(f"wrote {plot_times(rows, plot_path)}")
    return rows
