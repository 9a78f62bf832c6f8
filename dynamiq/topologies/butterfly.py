"""The butterfly all-reduce: recursive halving, then recursive doubling."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from dynamiq.topologies.arrays import Chunking, StepArrays
from dynamiq.topologies.base import (
    TOPOLOGIES,
    Topology,
    one_chunk_per_rank,
    one_chunk_per_rank_chunking,
)
from dynamiq.topologies.schedule import Schedule, Transfer

__all__ = ["Butterfly"]


@TOPOLOGIES.register("butterfly")
@dataclass(frozen=True)
class Butterfly(Topology):
    """Recursive halving reduce-scatter, then recursive doubling all-gather (Rabenseifner).

    Needs ``n = 2**m`` ranks (other sizes raise ``ValueError`` pointing at ``ring`` and
    ``hierarchical``). n chunks of weight 1/n, chunk ``c`` owned by rank ``c``. Before reduce step
    ``k`` (``0 <= k < m``) rank ``r`` holds partial sums of the ``2h`` chunks that agree with ``r``
    on the bits above ``h = n >> (k + 1)``; it sends the half its partner ``r XOR h`` keeps (the
    ``h`` chunks whose ``h`` bit matches the partner's), all in one message. Gather step ``m + j``
    mirrors it: rank ``r`` sends the ``2**j`` final chunks it holds to ``r XOR 2**j``.

    Per chunk ``c`` the aggregation tree sends rank ``r``'s partial sum to ``r XOR b``, ``b`` the
    highest bit in which ``r`` and ``c`` differ: a binomial tree of depth ``m``. Each rank sends
    ``n - 1`` chunks per phase, the same ``2(n - 1)/n`` of the vector as the ring, in ``2m``
    instead of ``2(n - 1)`` steps.
    """

    def check_world_size(self, world_size: int) -> None:
        """See :meth:`Topology.check_world_size`; additionally requires a power of two."""
        super().check_world_size(world_size)
        if world_size & (world_size - 1):
            raise ValueError(
                f"butterfly needs a power-of-two world size, got {world_size}; use 'ring', or "
                "'hierarchical(ranks_per_node=...,outer=butterfly)' with a power-of-two node count"
            )

    def _build(self, world_size: int) -> Schedule:
        n = world_size
        m = n.bit_length() - 1
        transfers = []
        for k in range(m):
            h = n >> (k + 1)
            for r in range(n):
                partner = r ^ h
                first = (r & ~(2 * h - 1)) | (partner & h)
                transfers += [Transfer(k, r, partner, c, "reduce") for c in range(first, first + h)]
        for j in range(m):
            h = 1 << j
            for r in range(n):
                first = r & ~(h - 1)
                transfers += [
                    Transfer(m + j, r, r ^ h, c, "gather") for c in range(first, first + h)
                ]
        parents = tuple(
            tuple(-1 if r == c else r ^ (1 << ((r ^ c).bit_length() - 1)) for r in range(n))
            for c in range(n)
        )
        return one_chunk_per_rank(n, parents, transfers, self.spec())

    def chunking(self, world_size: int) -> Chunking:
        """See :meth:`Topology.chunking`: chunk ``c`` owned by rank ``c``, equal weights."""
        self.check_world_size(world_size)
        return one_chunk_per_rank_chunking(world_size)

    def step_arrays(self, world_size: int) -> Iterator[StepArrays]:
        """See :meth:`Topology.step_arrays` (the closed form of :meth:`_build`)."""
        self.check_world_size(world_size)
        n = world_size
        m = n.bit_length() - 1
        r = np.arange(n, dtype=np.int64)
        for k in range(m):
            h = n >> (k + 1)
            partner = r ^ h
            first = (r & ~(2 * h - 1)) | (partner & h)
            span = np.arange(h, dtype=np.int64)
            yield StepArrays(k, "reduce", np.repeat(r, h), np.repeat(partner, h),
                             (first[:, None] + span).reshape(-1))
        for j in range(m):
            h = 1 << j
            first = r & ~(h - 1)
            span = np.arange(h, dtype=np.int64)
            yield StepArrays(m + j, "gather", np.repeat(r, h), np.repeat(r ^ h, h),
                             (first[:, None] + span).reshape(-1))
