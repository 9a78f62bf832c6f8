"""Triton device code of the metadata phase's block statistics (launcher:
:mod:`dynamiq.kernels.triton.stats`)."""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["stats_kernel"]


@triton.jit
def stats_kernel(y, n, nblocks, out, OP: tl.constexpr, SG: tl.constexpr, NSG: tl.constexpr):
    """One statistic of ``NSG`` blocks of ``SG`` coordinates per program into ``out[nblocks]``.

    ``OP``: 0 sum, 1 sum of squares, 2 maximum magnitude, 3 sum of squares about the mean.
    """
    g = tl.program_id(0).to(tl.int64) * NSG + tl.arange(0, NSG)
    idx = g[:, None] * SG + tl.arange(0, SG)[None, :]
    v = tl.load(y + idx, mask=idx < n, other=0.0).to(tl.float64)
    if OP == 0:
        r = tl.sum(v, axis=1)
    elif OP == 1:
        r = tl.sum(v * v, axis=1)
    elif OP == 3:
        # about the block's mean, the zero padding included
        c = v - (tl.sum(v, axis=1) / SG)[:, None]
        r = tl.sum(c * c, axis=1)
    else:
        r = tl.max(tl.abs(v), axis=1)
        has_nan = tl.max((v != v).to(tl.int32), axis=1) != 0
        # the sum of a block with a NaN is NaN on every device, whatever its max does
        r = tl.where(has_nan, tl.sum(v, axis=1), r)
    tl.store(out + g, r, mask=g < nblocks)
