"""``dynamiq.all_reduce`` against ``torch.distributed.all_reduce``, over gloo on loopback.

Each world size is a fresh set of processes on this machine, started by
:func:`dynamiq.collectives.launch.launch`. For every tensor size both collectives reduce the
same float32 input; a time is the slowest rank's wall time of one call (ranks start together
after a barrier), and the reported time is the best over ``repeat`` calls after one warm-up. On
loopback the wire is memory, so the ratio mostly measures the executor's overhead (and, for
compressing pipelines, the codec's compute) rather than the bandwidth a real network would
save; the bits per coordinate are what each rank actually sent.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from dynamiq.collectives import api
from dynamiq.collectives.launch import launch

__all__ = ["run"]

#: Seconds one tensor size may take in a world (the whole world gets this per size).
_SECONDS_PER_SIZE = 900


def _slowest(seconds: float) -> float:
    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def _time(fn: Callable[[], None], reset: Callable[[], None], repeat: int) -> float:
    reset()
    fn()  # warm-up: first-call costs (buffers, schedules, kernels) are not the steady state
    best = float("inf")
    for _ in range(repeat):
        reset()
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        best = min(best, _slowest(time.perf_counter() - t0))
    return best


def _measure(rank: int, numel: int, pipeline: str, repeat: int) -> dict:
    x = torch.randn(numel, generator=torch.Generator().manual_seed(rank))
    ref, ours = torch.empty_like(x), torch.empty_like(x)
    stats = api.P2PStats()  # the latest call's
    torch_s = _time(lambda: dist.all_reduce(ref), lambda: ref.copy_(x), repeat)
    ours_s = _time(lambda: api.all_reduce(ours, pipeline, stats=stats), lambda: ours.copy_(x),
                   repeat)
    return {"torch_s": torch_s, "dynamiq_s": ours_s,
            "bits_per_coord": stats.bits_per_coord,
            "max_abs_diff": float((ours - ref).abs().max()),
            "max_abs_ref": float(ref.abs().max())}


def _worker(rank: int, n: int, sizes_mb: tuple[float, ...], pipeline: str,
            repeat: int) -> list[dict]:
    """One rank's measurements, one per tensor size (run in a launched process)."""
    items = []
    for mb in sizes_mb:
        numel = max(1, int(mb * 2**20 / 4))
        item = {"world_size": n, "rank": rank, "size_mb": mb, "numel": numel}
        item.update(_measure(rank, numel, pipeline, repeat))
        items.append(item)
    return items


def _row(r: dict) -> str:
    bits = r["bits_per_coord"]
    bits_txt = f"{min(bits):.2f}" if max(bits) == min(bits) else f"{min(bits):.2f}-{max(bits):.2f}"
    return (f"{r['world_size']:>5} {r['size_mb']:>8g} {r['torch_s'] * 1e3:>10.2f} "
            f"{r['dynamiq_s'] * 1e3:>11.2f} {r['overhead']:>9.2f}x {bits_txt:>12} "
            f"{r['max_abs_diff']:>11.3g}")


_HEADER = (f"{'world':>5} {'MB':>8} {'torch ms':>10} {'dynamiq ms':>11} {'overhead':>10} "
           f"{'bits/coord':>12} {'max |diff|':>11}")


def run(
    world_sizes: tuple[int, ...] = (2, 4),
    sizes_mb: tuple[float, ...] = (1, 4, 16, 64),
    pipeline: str = "passthrough-fp32",
    repeat: int = 3,
    log: Callable[[str], None] = print,
) -> dict:
    """Time ``dynamiq.all_reduce`` and ``torch.distributed.all_reduce`` on loopback gloo worlds.

    Args:
        world_sizes: Numbers of processes, one spawned world each.
        sizes_mb: float32 tensor sizes in MB (2**20 bytes).
        pipeline: Registered pipeline name or spec string.
        repeat: Timed calls per collective and size (after one warm-up); the best is kept.
        log: Where progress lines and the table go.

    Returns:
        JSON-serialisable ``{"pipeline", "repeat", "results": [...]}``; one result per world
        size and tensor size with ``torch_s``, ``dynamiq_s``, ``overhead`` (their ratio),
        ``bits_per_coord`` (per rank, from the bytes actually sent) and ``max_abs_diff``
        between the two results (rank 0).
    """
    from dynamiq.pipeline import get_pipeline

    spec = str(get_pipeline(pipeline))  # fail here, not in n processes
    if repeat < 1:
        raise ValueError("repeat must be >= 1")
    cores = os.cpu_count() or 1
    results = []
    log(f"all-reduce benchmark: {spec} vs torch.distributed (gloo, loopback), best of {repeat}")
    for n in world_sizes:
        threads = max(1, cores // n)
        log(f"world size {n}: spawning {n} processes ({threads} thread(s) each)")
        per_rank = launch(_worker, n, (tuple(sizes_mb), pipeline, repeat),
                          timeout=_SECONDS_PER_SIZE * max(1, len(sizes_mb)), group_timeout=600,
                          # read by numba when a process imports it
                          env={"NUMBA_NUM_THREADS": str(threads)}, num_threads=threads)
        for got in zip(*per_rank):
            r0 = got[0]
            res = {
                "world_size": n, "size_mb": r0["size_mb"], "numel": r0["numel"],
                "torch_s": r0["torch_s"], "dynamiq_s": r0["dynamiq_s"],
                "overhead": r0["dynamiq_s"] / r0["torch_s"],
                "bits_per_coord": [d["bits_per_coord"] for d in got],
                "max_abs_diff": r0["max_abs_diff"], "max_abs_ref": r0["max_abs_ref"],
            }
            results.append(res)
            log(f"  {r0['size_mb']:g} MB: torch {res['torch_s'] * 1e3:.2f} ms, dynamiq "
                f"{res['dynamiq_s'] * 1e3:.2f} ms ({res['overhead']:.2f}x)")
    log(_HEADER)
    for r in results:
        log(_row(r))
    return {"pipeline": spec, "repeat": repeat, "results": results}
