"""How close ``passthrough-fp32`` comes to the cheapest all-reduce built on torch's
point-to-point calls, and how both compare with gloo's own all-reduce.

``dynamiq.all_reduce`` moves its messages with ``torch.distributed`` sends and receives (the
calls NCCL also offers). gloo's native all-reduce does not: it runs its ring inside gloo, with
no Python and no per-message work handle. This script times, on the same ranks and inputs,

* ``torch``: ``torch.distributed.all_reduce`` (gloo's ring),
* ``p2p-ring``: the leanest ring all-reduce over torch's ``send``/``recv`` that the same calls
  allow (reduce-scatter then all-gather, one message per step, each chunk reduced in place as
  soon as it arrives; nothing else), and ``p2p-ring-xS``: the same with every message cut
  into ``S`` pieces,
* ``passthrough-fp32``: dynamiq's executor with the lossless pipeline,

taking turns for ``--rounds`` rounds, and prints each method's best and median time of the
slowest rank, their ratios to ``torch``, and the mean CPU time per call of a rank's process
(gloo's threads included). ``p2p-ring`` is the floor for any executor built on these calls:
``passthrough-fp32`` can approach it, not go below it.

    python benchmarks/p2p_floor.py --world-sizes 2,4 --size-mb 4 --rounds 20
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist

from dynamiq.collectives import api
from dynamiq.collectives.launch import launch


def p2p_ring(t: torch.Tensor, scratch: torch.Tensor, pieces: int = 1) -> None:
    """Sum ``t`` (float32, length divisible by ``world * pieces``) in place over the world
    with a ring of point-to-point messages: ``2 (world - 1)`` steps of ``pieces`` messages."""
    rank, world = dist.get_rank(), dist.get_world_size()
    pg = dist.group.WORLD
    chunks = t.view(world, pieces, -1)
    inbox = scratch.view(pieces, -1)
    right, left = (rank + 1) % world, (rank - 1) % world
    sent = []
    for s in range(world - 1):  # reduce-scatter: chunk (rank - s - 1) gains one more rank
        out, into = (rank - s) % world, (rank - s - 1) % world
        recvs = [pg.recv([inbox[k]], left, 0) for k in range(pieces)]
        sent += [pg.send([chunks[out, k]], right, 0) for k in range(pieces)]
        for k in range(pieces):
            recvs[k].wait()
            chunks[into, k].add_(inbox[k])
    for s in range(world - 1):  # all-gather: the summed chunks travel on unchanged
        out, into = (rank + 1 - s) % world, (rank - s) % world
        recvs = [pg.recv([chunks[into, k]], left, 0) for k in range(pieces)]
        sent += [pg.send([chunks[out, k]], right, 0) for k in range(pieces)]
        for work in recvs:
            work.wait()
    for work in sent:
        work.wait()


def _rank(rank: int, world: int, numel: int, rounds: int, pieces: tuple[int, ...]) -> dict:
    torch.set_num_threads(1)
    x = torch.randn(numel, generator=torch.Generator().manual_seed(rank))
    t = torch.empty(numel)
    scratch = torch.empty(numel // world)
    methods = {"torch": lambda: dist.all_reduce(t),
               "p2p-ring": lambda: p2p_ring(t, scratch),
               **{f"p2p-ring-x{s}": (lambda s=s: p2p_ring(t, scratch, s)) for s in pieces},
               "passthrough-fp32": lambda: api.all_reduce(t, "passthrough-fp32")}
    times = {m: [] for m in methods}
    cpu = dict.fromkeys(methods, 0.0)
    results = {}
    for r in range(rounds + 1):
        for m, f in methods.items():
            t.copy_(x)
            dist.barrier()
            c0, t0 = time.process_time(), time.perf_counter()
            f()
            wall = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
            c1 = time.process_time() - c0
            dist.all_reduce(wall, op=dist.ReduceOp.MAX)
            if r:  # round 0 warms up (buffers, schedules, connections)
                times[m].append(float(wall))
                cpu[m] += c1
            results[m] = t.clone()
    ref = results["torch"]
    return {m: {"best": min(v), "median": statistics.median(v), "cpu": cpu[m] / rounds,
                "max_abs_diff": float((results[m] - ref).abs().max())}
            for m, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world-sizes", default="2,4")
    ap.add_argument("--size-mb", type=float, default=4.0)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--pieces", default="4,16", help="message cuts of the p2p-ring variants")
    a = ap.parse_args()
    pieces = tuple(int(s) for s in a.pieces.split(",") if s)
    for world in (int(w) for w in a.world_sizes.split(",")):
        unit = world * max((1, *pieces)) * 64
        numel = max(unit, int(a.size_mb * 2**20 / 4) // unit * unit)
        got = launch(_rank, world, (numel, a.rounds, pieces), timeout=600, num_threads=1)
        ref = got[0]["torch"]
        print(f"world {world}, {numel * 4 / 2**20:.2f} MB, {a.rounds} rounds: best ms "
              f"(ratio to torch) | median ms (ratio) | CPU ms per call, rank 0 | max |diff|")
        for m, r in got[0].items():
            print(f"  {m:18s} {r['best'] * 1e3:7.2f} ({r['best'] / ref['best']:.2f}x) | "
                  f"{r['median'] * 1e3:7.2f} ({r['median'] / ref['median']:.2f}x) | "
                  f"{r['cpu'] * 1e3:6.2f} | {r['max_abs_diff']:.2e}")


if __name__ == "__main__":
    main()
