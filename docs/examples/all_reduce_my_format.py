"""All-reduce with a home-made number format across four local processes.

    python docs/examples/all_reduce_my_format.py

Each rank holds its own vector; the ranks sum them with the ``requant-e3m4`` pipeline of
``my_formats.py`` over gloo, and rank 0's result is compared with the exact sum.
"""

import my_formats  # noqa: F401  (registers e3m4, e3m4_hier and requant-e3m4 in every process)
import torch

import dynamiq
from dynamiq.collectives.launch import launch

N = 1 << 16


def data(rank: int) -> torch.Tensor:
    return torch.randn(N, generator=torch.Generator().manual_seed(rank))


def reduce(rank: int, world_size: int) -> tuple[torch.Tensor, float]:
    x = data(rank)
    stats = dynamiq.P2PStats()
    dynamiq.all_reduce(x, "requant-e3m4", stats=stats)  # in place: x is now the sum
    return x, stats.bits_per_coord


if __name__ == "__main__":  # the ranks import this file: launch only from the parent
    world = 4
    results = launch(reduce, world)
    exact = sum(data(r).double() for r in range(world))
    got = results[0][0]
    nmse = float(((got - exact) ** 2).sum() / (exact**2).sum())
    assert all(torch.equal(r[0], got) for r in results), "ranks disagree"
    print(f"{world} ranks agree bit for bit; NMSE against the exact sum {nmse:.2e}; "
          f"{results[0][1]:.2f} bits per coordinate sent by rank 0")
