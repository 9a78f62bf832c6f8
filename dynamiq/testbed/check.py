"""``dynamiq testbed check``: build a testbed, all-reduce across it, compare the bytes its links
counted with dynamiq's own count, tear it down.

Each rank reduces the same pseudo-random vector with each pipeline: one call to warm up (kernels,
buffers, the call fingerprint), then one measured call between two barriers, reading its link's
counters (:func:`~dynamiq.testbed.interface_counters`) around it. A row reports, per pipeline
and rank, the payload bytes :class:`~dynamiq.collectives.p2p.P2PStats` counted, the bytes the
rank's veth sent and received in that interval, the call's time and the rate it implies on the
wire, and whether the bytes lie within :func:`~dynamiq.testbed.counters.wire_bounds`.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from dynamiq.collectives import api
from dynamiq.testbed.bed import Testbed
from dynamiq.testbed.counters import interface_counters, wire_bounds
from dynamiq.testbed.netns import list_namespaces
from dynamiq.testbed.shape import LinkShape

__all__ = ["CheckRow", "measure", "run_check"]


@dataclass
class CheckRow:
    """One pipeline on one rank of a checked testbed.

    Attributes:
        pipeline: The pipeline as given.
        rank, world_size: The rank and the number of ranks.
        numel: Coordinates reduced.
        bytes_sent, bytes_received: Payload bytes dynamiq counted (``P2PStats``).
        metadata_bytes: Bytes dynamiq all-reduced before the exchange (``P2PStats``).
        tx_bytes, rx_bytes, tx_packets, rx_packets: What the rank's veth counted in the
            interval of the measured call.
        low, high: :func:`~dynamiq.testbed.counters.wire_bounds` of ``tx_bytes``.
        seconds: The measured call's wall time on this rank.
        wire_mbit_s: ``tx_bytes`` over ``seconds``, in Mbit/s.
        digest: A hash of the result (equal on every rank when they agree).
    """

    pipeline: str
    rank: int
    world_size: int
    numel: int
    bytes_sent: int
    bytes_received: int
    metadata_bytes: int
    tx_bytes: int
    rx_bytes: int
    tx_packets: int
    rx_packets: int
    low: int
    high: int
    seconds: float
    wire_mbit_s: float
    digest: str

    @property
    def within_bounds(self) -> bool:
        """Whether ``low <= tx_bytes <= high``."""
        return self.low <= self.tx_bytes <= self.high


def measure(rank: int, world_size: int, pipelines: Sequence[str], numel: int,
            seed: int = 0) -> list[CheckRow]:
    """One rank's measurement of every pipeline (run inside a testbed rank).

    Args:
        rank, world_size: As :meth:`Testbed.run` passes them.
        pipelines: Pipelines of :func:`dynamiq.all_reduce`.
        numel: Coordinates of the vector.
        seed: Seeds rank ``r``'s vector with ``seed + r``.

    Returns:
        One row per pipeline.
    """
    x = torch.randn(numel, generator=torch.Generator().manual_seed(seed + rank))
    rows = []
    for pipe in pipelines:
        api.all_reduce(x.clone(), pipe)  # warm-up
        t = x.clone()
        stats = api.P2PStats()
        dist.barrier()
        before = interface_counters()
        t0 = time.perf_counter()
        api.all_reduce(t, pipe, stats=stats)
        seconds = time.perf_counter() - t0
        dist.barrier()  # the peers have what this rank sent: it has left the link
        d = interface_counters() - before
        low, high = wire_bounds(stats.bytes_sent, stats.bytes_received,
                                2 * stats.metadata_bytes)
        rows.append(CheckRow(
            pipe, rank, world_size, numel, stats.bytes_sent, stats.bytes_received,
            stats.metadata_bytes, d.tx_bytes, d.rx_bytes, d.tx_packets, d.rx_packets, low, high,
            seconds, d.tx_bytes * 8 / seconds / 1e6,
            hashlib.sha256(t.numpy().tobytes()).hexdigest()[:16]))
    return rows


def run_check(
    world_size: int = 2,
    shape: LinkShape | str = "100mbit",
    numel: int = 1 << 20,
    pipelines: Sequence[str] = ("requant-dq4", "passthrough-fp32"),
    *,
    prefix: str = "dynamiq",
    gso: bool = True,
    timeout: float = 600.0,
    out: Callable[[str], None] = print,
) -> list[CheckRow]:
    """Build a testbed, measure every pipeline on it (see :func:`measure`), print a table,
    tear the testbed down and check that nothing of it is left.

    Args:
        world_size: Ranks.
        shape: Every rank's link.
        numel: Coordinates all-reduced.
        pipelines: Pipelines of :func:`dynamiq.all_reduce`.
        prefix: The testbed's name prefix.
        gso: Whether the links carry GSO packets (see :class:`Testbed`).
        timeout: Seconds for the ranks' run.
        out: Where the lines go.

    Returns:
        One row per pipeline and rank.

    Raises:
        TestbedUnavailable: not root, or ``ip``/``tc`` missing.
        TestbedError: a namespace was left behind.
    """
    bed = Testbed(world_size, shape, prefix=prefix, gso=gso)
    with bed:
        if bed.cleaned:
            out(f"removed {len(bed.cleaned)} stale namespace(s): {', '.join(bed.cleaned)}")
        out(f"testbed {bed.id}: {world_size} ranks in namespaces {bed.namespaces[0]} .. "
            f"{bed.namespaces[-1]}, links {bed.shape.describe()} (tbf on each rank's "
            f"{bed.ifname} and on its switch port; "
            f"{'GSO packets' if gso else 'one segment per frame'})")
        per_rank = bed.run(measure, (tuple(pipelines), numel), timeout=timeout,
                           env={"NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"},
                           num_threads=1)
    left = [n for n in list_namespaces() if n.startswith(f"{bed.id}-")]
    rows = [row for pipe_rows in zip(*per_rank) for row in pipe_rows]
    head = (f"{'pipeline':<20} {'rank':>4} {'dynamiq B':>11} {'meta B':>9} {'veth tx B':>11} "
            f"{'overhead':>8} {'bound':>6} {'seconds':>8} {'Mbit/s':>8}")
    out(head)
    out("-" * len(head))
    for r in rows:
        over = r.tx_bytes / r.bytes_sent - 1 if r.bytes_sent else float("nan")
        out(f"{r.pipeline:<20} {r.rank:>4} {r.bytes_sent:>11,} {r.metadata_bytes:>9,} "
            f"{r.tx_bytes:>11,} "
            f"{over:>+8.1%} {'ok' if r.within_bounds else 'OUT':>6} {r.seconds:>8.3f} "
            f"{r.wire_mbit_s:>8.1f}")
    for pipe in pipelines:
        digests = {r.digest for r in rows if r.pipeline == pipe}
        out(f"{pipe}: results {'agree on every rank' if len(digests) == 1 else 'DIFFER'}")
    out(f"link rate {bed.shape.bits_per_second / 1e6:g} Mbit/s; overhead: veth tx over "
        f"dynamiq's payload bytes; bound: payload <= veth tx <= payload + 66 B per segment sent "
        f"and per segment received + 2 x metadata + 16 KiB")
    out(f"torn down: {'nothing left' if not left else 'LEFT ' + ', '.join(left)}")
    return rows
