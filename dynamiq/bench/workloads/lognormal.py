"""``lognormal``: the synthetic stand-in for a large model's gradients.

The vector is cut into *super-groups* of 256 coordinates. Super-group ``j`` has a norm ``M_j``
drawn from a two-component log-normal mixture (natural log; weights 0.79 / 0.21, log-means
-3.99 / -16.41, log-standard-deviations 1.22 / 4.63), shared by all workers: it models how
gradient magnitude varies across a model's layers and rows. Worker ``i``'s coordinates in
super-group ``j`` are iid ``N(0, M_j**2 / 256)``, so each worker's super-group has expected
squared norm ``M_j**2`` and the workers' noise is independent.

Streaming rule: coordinates are produced in fixed blocks of :data:`BLOCK` (2**16) coordinates,
i.e. 256 super-groups. Block ``b``'s norms come from a generator seeded by
``(workload seed, run seed, point, b)`` and worker ``r``'s noise in that block from one seeded by
``(workload seed, run seed, point, r, b)``. A slice ``[start, stop)`` is cut from the blocks it
overlaps, so any way of slicing a vector yields the same coordinates, and ``M_j`` never depends
on the rank or the world size. This lets a benchmark stream one worker at a time for world
sizes whose ``[world_size, d]`` matrix would not fit in memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from dynamiq.bench.workloads.base import WORKLOADS, Progress, Workload, mix_seed

__all__ = ["BLOCK", "GROUP", "MIXTURE", "LogNormal"]

#: Coordinates per super-group.
GROUP = 256
#: Coordinates per generation block (a multiple of :data:`GROUP`).
BLOCK = 1 << 16
#: ``(weight, log-mean, log-sd)`` of each mixture component (natural log of the norm).
MIXTURE = ((0.79, -3.99, 1.22), (0.21, -16.41, 4.63))

_NORM_TAG = 0x6E6F726D  # separates the norm stream from the rank streams


@dataclass(frozen=True)
class LogNormal(Workload):
    """Synthetic per-worker gradients with log-normal-mixture super-group norms.

    Attributes:
        d: Vector length (any positive integer; the last super-group may be partial).
        seed: Workload seed, combined with the ``seed`` of :meth:`gradients` / :meth:`rank_vector`.
        points: Draws returned by default (``point`` indexes independent draws).
    """

    d: int = 1 << 22
    seed: int = 0
    points: tuple[int, ...] = (0,)

    name = "lognormal"
    cacheable = False  # generating is about as fast as reading from disk

    def _select_points(self, points: int | None) -> tuple[int, ...]:
        # Draws are free, so any number of them may be asked for.
        return self.default_points() if points is None else tuple(range(int(points)))

    def _block_norms(self, block: int, seed: int, point: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(mix_seed(self.seed, seed, point, _NORM_TAG, block))
        u = torch.rand(BLOCK // GROUP, generator=g, dtype=torch.float64)
        z = torch.randn(BLOCK // GROUP, generator=g, dtype=torch.float64)
        (w0, mu0, sd0), (_, mu1, sd1) = MIXTURE
        first = u < w0
        log_m = torch.where(first, mu0 + sd0 * z, mu1 + sd1 * z)
        return torch.exp(log_m)

    def group_norms(
        self, start: int = 0, stop: int | None = None, *, seed: int = 0, point: int = 0
    ) -> torch.Tensor:
        """Super-group norms ``M_j`` for super-groups ``j`` in ``[start, stop)``.

        Returns:
            float64 ``[stop - start]`` (``stop`` defaults to the number of super-groups).
        """
        n_groups = -(-self.d // GROUP)
        stop = n_groups if stop is None else stop
        if not 0 <= start <= stop <= n_groups:
            raise ValueError(f"super-group range [{start}, {stop}) outside [0, {n_groups})")
        per = BLOCK // GROUP
        parts = [self._block_norms(b, seed, point) for b in range(start // per, -(-stop // per))]
        if not parts:
            return torch.empty(0, dtype=torch.float64)
        allm = torch.cat(parts)
        off = (start // per) * per
        return allm[start - off : stop - off]

    def rank_vector(
        self,
        rank: int,
        start: int = 0,
        stop: int | None = None,
        *,
        world_size: int,
        seed: int = 0,
        point: int = 0,
    ) -> torch.Tensor:
        """Coordinates ``[start, stop)`` of worker ``rank``'s gradient, generated on demand.

        Args:
            rank: Worker index, ``0 <= rank < world_size``.
            start: First coordinate.
            stop: One past the last coordinate (``d`` when ``None``).
            world_size: Number of workers (only validates ``rank``; a worker's vector does not
                depend on how many others there are).
            seed: Run seed.
            point: Index of the draw.

        Returns:
            float32 ``[stop - start]``; equal to the same range of any other slicing.
        """
        stop = self.d if stop is None else stop
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside [0, {world_size})")
        if not 0 <= start <= stop <= self.d:
            raise ValueError(f"coordinate range [{start}, {stop}) outside [0, {self.d})")
        out = torch.empty(stop - start, dtype=torch.float32)
        b = start // BLOCK
        while b * BLOCK < stop:
            lo, hi = b * BLOCK, (b + 1) * BLOCK
            g = torch.Generator().manual_seed(mix_seed(self.seed, seed, point, rank, b))
            noise = torch.randn(BLOCK, generator=g, dtype=torch.float32)
            scale = (self._block_norms(b, seed, point) / math.sqrt(GROUP)).float()
            vals = (noise.view(-1, GROUP) * scale[:, None]).view(-1)
            a, e = max(lo, start), min(hi, stop)
            out[a - start : e - start] = vals[a - lo : e - lo]
            b += 1
        return out

    def sample(self, world_size: int, *, seed: int = 0, point: int = 0) -> torch.Tensor:
        """All workers' vectors of one draw.

        Returns:
            float32 ``[world_size, d]``.
        """
        out = torch.empty(world_size, self.d, dtype=torch.float32)
        for r in range(world_size):
            out[r] = self.rank_vector(r, world_size=world_size, seed=seed, point=point)
        return out

    def _compute(
        self, world_size: int, points: tuple[int, ...], *, seed: int, progress: Progress
    ) -> dict[int, torch.Tensor]:
        out = {}
        for p in points:
            progress(f"lognormal: drawing {world_size} x {self.d:,} (point {p})")
            out[p] = self.sample(world_size, seed=seed, point=p)
        return out


WORKLOADS.register("lognormal", LogNormal())
