"""``dynamiq.all_reduce`` against ``torch.distributed.all_reduce``, over gloo on loopback.

Each world size is a fresh set of spawned processes on this machine. For every tensor size both
collectives reduce the same float32 input; a time is the slowest rank's wall time of one call
(ranks start together after a barrier), and the reported time is the best over ``repeat``
calls after one warm-up. On loopback the wire is memory, so the ratio mostly measures the
executor's overhead (and, for compressing pipelines, the codec's compute) rather than the
bandwidth a real network would save; the bits per coordinate are what each rank actually sent.
"""

from __future__ import annotations

import datetime
import os
import queue as queue_mod
import socket
import time
import traceback
from collections.abc import Callable

import torch

__all__ = ["run"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _slowest(seconds: float) -> float:
    import torch.distributed as dist

    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def _time(fn: Callable[[], None], reset: Callable[[], None], repeat: int) -> float:
    import torch.distributed as dist

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
    import torch.distributed as dist

    from dynamiq.collectives import api, p2p

    x = torch.randn(numel, generator=torch.Generator().manual_seed(rank))
    ref, ours = torch.empty_like(x), torch.empty_like(x)
    torch_s = _time(lambda: dist.all_reduce(ref), lambda: ref.copy_(x), repeat)
    ours_s = _time(lambda: api.all_reduce(ours, pipeline), lambda: ours.copy_(x), repeat)
    stats = p2p.last_stats
    return {"torch_s": torch_s, "dynamiq_s": ours_s,
            "bits_per_coord": stats.bits_per_coord if stats else 0.0,
            "max_abs_diff": float((ours - ref).abs().max()),
            "max_abs_ref": float(ref.abs().max())}


def _worker(rank: int, n: int, port: int, sizes_mb: tuple[float, ...], pipeline: str,
            repeat: int, threads: int, out) -> None:
    import torch.distributed as dist

    torch.set_num_threads(threads)
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=n, timeout=datetime.timedelta(seconds=600))
        for mb in sizes_mb:
            numel = max(1, int(mb * 2**20 / 4))
            item = {"world_size": n, "rank": rank, "size_mb": mb, "numel": numel}
            item.update(_measure(rank, numel, pipeline, repeat))
            out.put(("size", item))
        dist.destroy_process_group()
    except Exception:
        out.put(("error", {"rank": rank, "traceback": traceback.format_exc()}))


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
    import torch.multiprocessing as mp

    from dynamiq.pipeline import get_pipeline

    spec = str(get_pipeline(pipeline))  # fail here, not in n processes
    if repeat < 1:
        raise ValueError("repeat must be >= 1")
    ctx = mp.get_context("spawn")
    cores = os.cpu_count() or 1
    results = []
    log(f"all-reduce benchmark: {spec} vs torch.distributed (gloo, loopback), best of {repeat}")
    for n in world_sizes:
        threads = max(1, cores // n)
        log(f"world size {n}: spawning {n} processes ({threads} thread(s) each)")
        out = ctx.Queue()
        saved = os.environ.get("NUMBA_NUM_THREADS")
        os.environ["NUMBA_NUM_THREADS"] = str(threads)  # read by numba when a child imports it
        try:
            port = _free_port()
            procs = [ctx.Process(target=_worker,
                                 args=(r, n, port, tuple(sizes_mb), pipeline, repeat, threads, out))
                     for r in range(n)]
            for pr in procs:
                pr.start()
        finally:
            if saved is None:
                os.environ.pop("NUMBA_NUM_THREADS", None)
            else:
                os.environ["NUMBA_NUM_THREADS"] = saved
        per_size: dict[float, list[dict]] = {}
        try:
            while len(per_size) < len(sizes_mb) or any(len(v) < n for v in per_size.values()):
                try:
                    kind, item = out.get(timeout=900)
                except queue_mod.Empty:
                    raise RuntimeError(f"world size {n}: no progress for 900 s; exit codes "
                                       f"{[pr.exitcode for pr in procs]}") from None
                if kind == "error":
                    raise RuntimeError(f"world size {n}, rank {item['rank']} failed:\n"
                                       f"{item['traceback']}")
                got = per_size.setdefault(item["size_mb"], [])
                got.append(item)
                if len(got) == n:
                    got.sort(key=lambda d: d["rank"])
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
        finally:
            for pr in procs:
                pr.join(timeout=60)
                if pr.is_alive():
                    pr.kill()
    log(_HEADER)
    for r in results:
        log(_row(r))
    return {"pipeline": spec, "repeat": repeat, "results": results}
