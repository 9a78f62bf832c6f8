"""The ring all-reduce."""

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

__all__ = ["Ring"]


@TOPOLOGIES.register("ring")
@dataclass(frozen=True)
class Ring(Topology):
    """Ring all-reduce: n chunks of weight 1/n, chunk ``c`` owned by rank ``c``.

    Reduce step ``s`` (``0 <= s < n - 1``): rank ``r`` sends chunk ``(r - s - 1) mod n`` to
    ``(r + 1) mod n``, so chunk ``c`` starts at rank ``c + 1`` and travels ``c+1 -> c+2 -> ... ->
    c``, the owner receiving it last (a chain of depth ``n - 1``). Gather step ``n - 1 + s``: rank
    ``r`` forwards chunk ``(r - s) mod n`` to ``(r + 1) mod n``. Any ``n >= 1``; each rank sends
    ``2(n - 1)`` chunks, i.e. ``2(n - 1)/n`` of the vector.
    """

    def _build(self, world_size: int) -> Schedule:
        n = world_size
        transfers = [
            Transfer(s, r, (r + 1) % n, (r - s - 1) % n, "reduce")
            for s in range(n - 1)
            for r in range(n)
        ]
        transfers += [
            Transfer(n - 1 + s, r, (r + 1) % n, (r - s) % n, "gather")
            for s in range(n - 1)
            for r in range(n)
        ]
        parents = tuple(tuple(-1 if r == c else (r + 1) % n for r in range(n)) for c in range(n))
        return one_chunk_per_rank(n, parents, transfers, self.spec())

    def chunking(self, world_size: int) -> Chunking:
        """See :meth:`Topology.chunking`: chunk ``c`` owned by rank ``c``, equal weights."""
        self.check_world_size(world_size)
        return one_chunk_per_rank_chunking(world_size)

    def step_arrays(self, world_size: int) -> Iterator[StepArrays]:
        """See :meth:`Topology.step_arrays` (the closed form of :meth:`_build`)."""
        self.check_world_size(world_size)
        n = world_size
        r = np.arange(n, dtype=np.int64)
        for s in range(n - 1):
            yield StepArrays(s, "reduce", r, (r + 1) % n, (r - s - 1) % n)
        for s in range(n - 1):
            yield StepArrays(n - 1 + s, "gather", r, (r + 1) % n, (r - s) % n)
