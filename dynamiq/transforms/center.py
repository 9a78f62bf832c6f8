"""Mean-centering through the metadata phase (docs/method.rst, step 2).

Every rank subtracts the global per-super-group mean ``μ_j = (Σ_i S_ij) / (n · c_j)`` (``S_ij``
rank ``i``'s sum over super-group ``j`` of ``c_j`` coordinates) before the reduction, so the
*summed* super-group has mean zero and its range is spent on the spread, not the offset; after
the reduction ``n · μ_j`` is added back. All ranks obtain the same ``μ_j`` from the metadata
phase, so nothing else travels.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from dynamiq.metadata import SUPER_GROUP
from dynamiq.transforms.base import TRANSFORMS, Transform

__all__ = ["REMOVED_ENERGY", "Center"]


#: Name, in the adjusted statistics, of the energy ``S_j² / c_j`` that centering takes out of
#: every super-group's sum (it travels nowhere: every rank derives it from the global sums).
REMOVED_ENERGY = "center.removed_energy"


def _counts(length: int) -> torch.Tensor:
    """Coordinates per super-group (the last one may be partial), float64."""
    groups = -(-length // SUPER_GROUP)
    c = torch.full((groups,), float(SUPER_GROUP), dtype=torch.float64)
    c[-1] = length - (groups - 1) * SUPER_GROUP
    return c


def _add_per_group(y: torch.Tensor, v: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``out = y + v_j`` on super-group ``j`` (float32 additions; ``out`` may be ``y``).

    The whole super-groups are one broadcast over a ``[groups, SUPER_GROUP]`` view, so no
    per-coordinate copy of ``v`` is made; a partial last group is added apart.
    """
    n = y.numel()
    whole = n // SUPER_GROUP
    if whole:
        k = whole * SUPER_GROUP
        torch.add(y[:k].view(whole, SUPER_GROUP), v[:whole, None],
                  out=out[:k].view(whole, SUPER_GROUP))
    if whole * SUPER_GROUP < n:
        torch.add(y[whole * SUPER_GROUP:], v[whole], out=out[whole * SUPER_GROUP:])
    return out


@TRANSFORMS.register("center")
@dataclass(frozen=True)
class Center(Transform):
    """Subtract the global per-super-group mean before the sum; add ``n`` times it after.

    It needs a metadata statistic of the super-group sums, so in a pipeline it comes after every
    data-independent transform (e.g. ``rht+center+...``). The codecs then see adjusted
    statistics: the sums are 0 and ``sumsq`` is that of the centered vectors
    (:meth:`adjust_statistics`).

    Args:
        statistic: ``"sum8"`` (8 bits per super-group and rank: the mean is only subtracted and
            added back, so its precision does not matter for correctness, and 1/16 relative is
            plenty to remove it; the default, shared with ``dynamiq``'s default metadata) or
            ``"sum"`` (BF16, the paper's; pair it with ``dynamiq(metadata=bf16)``).
    """

    statistic: str = "sum8"

    def __post_init__(self) -> None:
        if self.statistic not in ("sum", "sum8"):
            raise ValueError(f"statistic must be 'sum' or 'sum8', got {self.statistic!r}")

    @property
    def statistics(self) -> tuple[str, ...]:  # type: ignore[override]
        """The metadata statistic this transform needs."""
        return (self.statistic,)

    def padded_length(self, n: int) -> int:
        """Return ``n`` (no padding)."""
        return n

    def _mean(self, stats: Mapping[str, torch.Tensor] | None, world_size: int, length: int
              ) -> torch.Tensor:
        name = self.statistic
        if stats is None or name not in stats:
            raise ValueError(f"center needs the metadata statistic {name!r} (run it in a "
                             "pipeline)")
        s = stats[name]
        if s.numel() != -(-length // SUPER_GROUP):
            raise ValueError(f"{name!r} has {s.numel()} super-groups, the vector {length} values")
        return (s / (world_size * _counts(length))).float()

    def forward(self, x: torch.Tensor, *, step: int = 0,
                stats: Mapping[str, torch.Tensor] | None = None, world_size: int = 1
                ) -> torch.Tensor:
        """``x − μ`` per super-group, in place when possible.

        Args:
            x: float32 ``[length]``, this rank's vector.
            step: Unused (centering is deterministic).
            stats: Global statistics with ``"sum"`` (float64 ``[ceil(length/256)]``).
            world_size: Number of ranks ``n``.

        Returns:
            float32 ``[length]``: ``x − μ_j`` on super-group ``j`` (float32 subtraction).
        """
        mu = self._mean(stats, world_size, x.numel()).to(x.device)
        return _add_per_group(x, -mu, x)

    def inverse(self, y: torch.Tensor, n: int, *, step: int = 0,
                stats: Mapping[str, torch.Tensor] | None = None, world_size: int = 1
                ) -> torch.Tensor:
        """Add ``n · μ_j`` back to the reduced sum, in place (float32 addition, ``n · μ_j``
        exact-ish: one float32 product per super-group).

        Args:
            y: float32 ``[length]``, the reduced sum of the centered vectors (overwritten: the
                executors' accumulator, which then holds the result without a copy).
            n: Length to keep (``y`` is returned whole when ``n >= len(y)``).
            step: Unused.
            stats: The statistics given to :meth:`forward`.
            world_size: Number of ranks.
        """
        length = y.numel()
        mu = self._mean(stats, world_size, length).to(y.device)
        return _add_per_group(y, mu * float(world_size), y)[:n]

    def adjust_statistics(self, stats: Mapping[str, torch.Tensor], world_size: int,
                          length: int) -> dict[str, torch.Tensor]:
        """Statistics of the centered vectors, from those of the raw ones.

        With ``S_j`` the global sum, ``F_j`` the global sum of squares and ``c_j`` the
        coordinates of super-group ``j``: ``Σ_i Σ (x − μ_j)² = F_j − S_j² / (n c_j)`` and the
        centered sums are zero. Statistics of other kinds pass through unchanged.
        """
        out = dict(stats)
        s = stats[self.statistic]
        if "sumsq" in stats:
            out["sumsq"] = (stats["sumsq"] - s * s / (world_size * _counts(length))).clamp_min(0)
        for name in ("sum", "sum8"):  # the centered vectors sum to zero, whichever measures it
            if name in stats:
                out[name] = torch.zeros_like(stats[name])
        # the energy of the sum's per-super-group means, restored exactly after the all-reduce:
        # part of the sum, never of what is coded (an error model's denominator needs it)
        out[REMOVED_ENERGY] = s * s / _counts(length)
        return out
