"""The metadata phase: per-super-group statistics that components need before the main sum.

A component (codec or transform) lists the statistics it needs in its ``statistics``
attribute, e.g. ``("sum", "sumsq")`` for mean-centering and variance-driven bit allocation. The
executor computes them on every rank's (transformed) vector, per super-group of
:data:`SUPER_GROUP` coordinates, and combines them across ranks in one small exchange before the
main all-reduce (a sum for additive statistics, a max for ``absmax``), so every rank sees the
same global values; they reach the codecs through :class:`~dynamiq.codecs.HopContext`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from dynamiq.registry import Registry

__all__ = ["STATISTICS", "SUPER_GROUP", "Statistic", "combine", "local_statistics"]

#: Coordinates per super-group over which statistics are taken.
SUPER_GROUP = 256


@dataclass(frozen=True)
class Statistic:
    """A per-super-group statistic and how ranks' values combine.

    Attributes:
        reduce: ``"sum"`` or ``"max"`` across ranks.
        local: float64 ``[groups, SUPER_GROUP]`` → float64 ``[groups]`` on one rank.
    """

    reduce: str
    local: Callable[[torch.Tensor], torch.Tensor]


STATISTICS: Registry[Statistic] = Registry("statistic")
STATISTICS.register("sum", Statistic("sum", lambda g: g.sum(1)))
STATISTICS.register("sumsq", Statistic("sum", lambda g: (g * g).sum(1)))
STATISTICS.register("absmax", Statistic("max", lambda g: g.abs().amax(1)))


def local_statistics(names: Iterable[str], y: torch.Tensor) -> torch.Tensor:
    """This rank's statistics: float64 ``[len(names), ceil(len(y) / SUPER_GROUP)]``.

    ``y`` (float32, 1-D) is zero-padded to whole super-groups; sums are taken in float64.
    """
    names = list(names)
    groups = -(-y.numel() // SUPER_GROUP)
    g = torch.zeros(groups * SUPER_GROUP, dtype=torch.float64)
    g[: y.numel()] = y
    g = g.view(groups, SUPER_GROUP)
    return torch.stack([STATISTICS[n].local(g) for n in names]) if names else g[:0, 0]


def combine(names: Iterable[str], per_rank: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Global statistics from every rank's :func:`local_statistics` (ranks in order)."""
    out = {}
    for i, name in enumerate(names):
        rows = [t[i] for t in per_rank]
        if STATISTICS[name].reduce == "max":
            out[name] = torch.stack(rows).amax(0)
        else:
            acc = rows[0].clone()
            for r in rows[1:]:
                acc += r
            out[name] = acc
    return out
