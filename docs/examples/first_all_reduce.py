"""A first compressed all-reduce: four local processes sum their vectors with DynamiQ.

    python docs/examples/first_all_reduce.py

Every rank draws its own vector, the ranks all-reduce them in place with the default
``dynamiq`` pipeline (a ring, a budget of 5 bits per coordinate), and the result is compared
with the exact sum and with what a BF16 all-reduce would cost.
"""

import torch

import dynamiq
from dynamiq.collectives.launch import launch

N = 1 << 18


def data(rank: int) -> torch.Tensor:
    return torch.randn(N, generator=torch.Generator().manual_seed(rank))


def reduce(rank: int, world_size: int, pipeline: str) -> tuple[torch.Tensor, float]:
    x = data(rank)
    stats = dynamiq.P2PStats()
    dynamiq.all_reduce(x, pipeline, stats=stats)  # torch.distributed.all_reduce, compressed
    return x, stats.bytes_sent


if __name__ == "__main__":  # the ranks import this file: launch only from the parent
    world = 4
    exact = sum(data(r).double() for r in range(world))
    sent = {}
    for pipeline in ("passthrough-bf16", "dynamiq"):
        results = launch(reduce, world, (pipeline,))
        got = results[0][0]
        assert all(torch.equal(r[0], got) for r in results), "ranks disagree"
        nmse = float(((got - exact) ** 2).sum() / (exact**2).sum())
        sent[pipeline] = results[0][1]
        print(f"{pipeline:<17} rank 0 sent {sent[pipeline] / 1e3:7.1f} kB, "
              f"NMSE {nmse:.2e}, every rank holds the same bits")
    print(f"dynamiq sends {sent['passthrough-bf16'] / sent['dynamiq']:.1f}x less than BF16")
