"""Launcher of the Triton block statistics of the metadata phase.

Twin of :meth:`dynamiq.kernels.backend.Backend.block_statistics` (torch on the CPU): the vector
is read as zero-padded to whole blocks, widened to float64 and reduced per block. The rounding
to the wire format is not done here: the metadata phase applies the same rounding to every
backend's values.

Agreement with the torch version:

* ``absmax`` is exact (a maximum does not depend on order); a block holding a NaN gives NaN, as
  ``torch.amax`` does.
* ``sum`` and ``sumsq`` add in float64 in a different order (a tree here, torch's vectorised
  accumulation there). Every float32 value and every square of one is exact in float64, so only
  the ``m - 1`` additions of a block of ``m`` coordinates round; for any order the float64 result
  is within ``(m - 1) * 2**-53 * sum(|terms|)`` (first order) of the exact sum, so the two
  float64 values differ by at most ``2 * (m - 1) * 2**-53 * sum(|x_i|)`` (``sum``) or
  ``2 * (m - 1) * 2**-53 * sum(x_i**2)`` (``sumsq``), about ``5.7e-14`` of the sum of
  magnitudes for ``m = 256`` (:func:`~dynamiq.kernels.backend.stats_tolerance`, which also
  bounds ``csumsq``). After rounding to BF16 (8 significant
  bits) the values are equal unless that float64 interval straddles a BF16 rounding boundary, in
  which case they are neighbouring BF16 values. NaN and ±Inf propagate identically.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dynamiq.kernels.abi import STAT_OPS, TILE
from dynamiq.kernels.blockstats import stats_tolerance
from dynamiq.kernels.triton.common import check_device, check_tensor, launch
from dynamiq.kernels.triton.jit.stats import stats_kernel

__all__ = ["block_statistics", "stats_tolerance"]


def block_statistics(y: torch.Tensor, ops: Sequence[tuple[str, int]]
                     ) -> dict[tuple[str, int], torch.Tensor]:
    """See :meth:`dynamiq.kernels.backend.Backend.block_statistics` (values returned on the
    CPU; see the module notes for how the sums may differ from torch's)."""
    check_tensor(y, "y", torch.float32, None)
    check_device(y.device)
    n = y.numel()
    out = {}
    for op, block in ops:
        if op not in STAT_OPS:
            raise ValueError(f"the Triton statistics kernel computes {STAT_OPS}, not {op!r}")
        nblocks = -(-n // block)
        r = torch.empty(nblocks, dtype=torch.float64, device=y.device)
        if nblocks:
            nsg = max(1, TILE // block)
            launch(stats_kernel, (-(-nblocks // nsg),), y.device, y, n, nblocks, r,
                   OP=STAT_OPS.index(op), SG=block, NSG=nsg)
        out[(op, block)] = r.cpu()
    return out
