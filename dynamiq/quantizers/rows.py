"""Blocks coded in place: the ``rows`` argument of :class:`~dynamiq.BlockQuantizer`'s calls.

With ``rows``, a quantizer codes some blocks of a longer vector, in a given order, where they
lie (a DynamiQ segment is the super-groups of one width, spread over the chunk); only the last
of them may be the vector's partial last block. The rows are checked here, on the host, before
any kernel indexes with them unchecked.
"""

from __future__ import annotations

import torch

__all__ = ["rows_length"]


def rows_length(rows: torch.Tensor, block: int, total: int, device: torch.device) -> int:
    """Coordinates coded when the blocks ``rows`` of a ``total``-long vector are.

    Args:
        rows: int64 ``[k]`` block indices (blocks of ``block`` coordinates), ``k >= 1``.
        block: Coordinates per block.
        total: Length of the vector the rows index.
        device: The vector's device (the rows must be on it).

    Returns:
        ``k * block``, less the missing part of the vector's partial last block when that is
        the last row.

    Raises:
        ValueError: rows that are not a non-empty 1-D int64 tensor on ``device``, lie outside
            the vector, or name its partial last block anywhere but last.
    """
    if (not isinstance(rows, torch.Tensor) or rows.dtype != torch.int64 or rows.dim() != 1
            or rows.numel() == 0 or not rows.is_contiguous()):
        raise ValueError("rows must be a non-empty contiguous 1-D int64 tensor")
    if rows.device != device:
        raise ValueError(f"rows are on {rows.device}, the data on {device}")
    # checked on the host (a segment has a few rows per thousand coordinates): the kernels
    # index with them unchecked
    r = rows.cpu().numpy()
    last = (total - 1) // block  # the array's last block, partial unless total % block == 0
    lo, hi = int(r.min()), int(r.max())
    if lo < 0 or hi > last:
        raise ValueError(f"rows must be block indices in [0, {last}], got [{lo}, {hi}]")
    partial = total % block
    if partial and r.size > 1 and bool((r[:-1] == last).any()):
        raise ValueError("only the last of the rows may be the array's partial last block")
    n = r.size * block
    return n - block + partial if partial and int(r[-1]) == last else n
