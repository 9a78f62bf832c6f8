"""Numba kernels of shared-scale minifloat codes (the MX-style partial-sum codec).

One ``mbits + 1``-bit code per coordinate in an LSB-first bit stream
(:mod:`dynamiq.kernels.numba.packing`). The value of code ``c`` in a block of scale ``s`` is
``dec[c] * s`` (one float32 multiply); a value ``v`` is coded as the nearest of the decoded levels
``tab[j] * s`` (ties to the even magnitude code), saturating at the largest; non-finite ``v``
(or a non-finite scale) gives ``nan_code``. Each kernel is one serial pass (decode, add, encode
and pack fused), so the float32 arithmetic and its order are fixed here.

``mode`` arguments: decoders ``0`` write (``out = dec``), ``1`` accumulate (``out += dec``);
the fused recompress takes a :class:`~dynamiq.kernels.abi.Writeback` value.
"""

from __future__ import annotations

import numba as nb
import numpy as np
import torch

from dynamiq.kernels.abi import SharedScaleCode, Writeback
from dynamiq.kernels.numba.packing import flush_codes, put_code, take_code

__all__ = ["decode", "encode", "recompress"]


@nb.njit(inline="always", cache=True)
def _bracket(t, tab, nfin, lut, lshift, lkey0):
    """Last index ``j`` with ``tab[j] <= t`` (``t >= 0``), in O(1) with the bucket lookup of
    :func:`dynamiq.kernels.tables.bucket_lut`: buckets hold at most one table value, so the
    bucket's entry plus one compare settles it."""
    k = np.int64(np.float32(t).view(np.uint32) >> np.uint32(lshift)) - lkey0
    k = min(max(k, 0), lut.size - 1)
    lo = np.int64(lut[k])
    return min(lo + np.int64(tab[lo + 1] <= t), nfin - 1)


@nb.njit(inline="always", cache=True)
def _nearest_code(v, s, tab, nfin, lut, lshift, lkey0, mbits, nan_code):
    """Sign-magnitude code of the decoded level ``tab[j] * s`` nearest to ``v``.

    Written with selects rather than branches where the outcome is data-dependent (which
    neighbour is nearer, the sign): mispredicted branches cost more than the arithmetic.
    """
    a = abs(v)
    lo = _bracket(a / s, tab, nfin, lut, lshift, lkey0)
    # a / s may be off by one rounding (scales that are not powers of two): settle the bracket
    # on the decoded levels themselves (never taken for power-of-two scales)
    while lo > 0 and tab[lo] * s > a:
        lo -= 1
    while lo < nfin - 1 and tab[lo + 1] * s <= a:
        lo += 1
    hi = min(lo + 1, nfin - 1)
    d1 = np.float64(a) - np.float64(tab[lo] * s)  # exact in float64
    d2 = np.float64(tab[hi] * s) - np.float64(a)
    # nearer neighbour, ties to the even magnitude code; at the top (hi == lo) d2 <= 0 <= d1
    # and the min() saturates
    up = np.int64(d2 < d1) | (np.int64(d2 == d1) & (lo & 1))
    mag = min(lo + up, nfin - 1)
    # never -0: formats without a NaN code use that pattern for NaN
    neg = np.int64(v < 0) & np.int64(mag != 0)
    code = mag | (neg << mbits)
    if np.isfinite(v) and np.isfinite(s):
        return code
    return np.int64(nan_code)


@nb.njit(cache=True)
def _encode(x, scales, block, tab, nfin, lut, lshift, lkey0, mbits, nan_code, out):
    bits = mbits + 1
    n = x.size
    wacc, wn, pos = np.uint64(0), 0, 0
    for j in range((n + block - 1) // block):
        s = scales[j]
        for i in range(j * block, min(n, (j + 1) * block)):
            code = _nearest_code(x[i], s, tab, nfin, lut, lshift, lkey0, mbits, nan_code)
            wacc, wn, pos = put_code(out, wacc, wn, pos, code, bits)
    flush_codes(out, wacc, wn, pos)


@nb.njit(cache=True)
def _decode(data, scales, block, dec, bits, out, mode):
    mask = np.uint64((1 << bits) - 1)
    n = out.size
    racc, rn, pos = np.uint64(0), 0, 0
    for j in range((n + block - 1) // block):
        s = scales[j]
        for i in range(j * block, min(n, (j + 1) * block)):
            code, racc, rn, pos = take_code(data, racc, rn, pos, bits, mask)
            val = dec[code] * s
            if mode == 1:
                out[i] = out[i] + val
            else:
                out[i] = val


@nb.njit(cache=True)
def _recompress(data, acc, scales, block, tab, nfin, lut, lshift, lkey0, mbits, nan_code, dec,
                out, mode):
    bits = mbits + 1
    mask = np.uint64((1 << bits) - 1)
    n = acc.size
    racc, rn, rpos = np.uint64(0), 0, 0
    wacc, wn, wpos = np.uint64(0), 0, 0
    for j in range((n + block - 1) // block):
        s = scales[j]
        for i in range(j * block, min(n, (j + 1) * block)):
            code, racc, rn, rpos = take_code(data, racc, rn, rpos, bits, mask)
            v = acc[i] + dec[code] * s
            new = _nearest_code(v, s, tab, nfin, lut, lshift, lkey0, mbits, nan_code)
            if mode == 1:
                acc[i] = v
            elif mode == 2:
                acc[i] = dec[new] * s
            wacc, wn, wpos = put_code(out, wacc, wn, wpos, new, bits)
    flush_codes(out, wacc, wn, wpos)


def _tables(code: SharedScaleCode) -> tuple:
    t = code.tables
    return t.search, t.nfin, t.lut, t.lshift, t.lkey0


def encode(code: SharedScaleCode, x: torch.Tensor, scales: torch.Tensor, block: int,
           out: torch.Tensor) -> None:
    """See :meth:`dynamiq.kernels.backend.Backend.shared_encode`."""
    _encode(x.numpy(), scales.numpy(), block, *_tables(code), code.mbits, code.nan_code,
            out.numpy())


def decode(code: SharedScaleCode, data: torch.Tensor, scales: torch.Tensor, block: int,
           out: torch.Tensor, accumulate: bool) -> None:
    """See :meth:`dynamiq.kernels.backend.Backend.shared_decode`."""
    _decode(data.numpy(), scales.numpy(), block, code.dec, code.bits, out.numpy(),
            1 if accumulate else 0)


def recompress(code: SharedScaleCode, data: torch.Tensor, acc: torch.Tensor,
               scales: torch.Tensor, block: int, writeback: Writeback, out: torch.Tensor) -> None:
    """See :meth:`dynamiq.kernels.backend.Backend.shared_recompress`."""
    _recompress(data.numpy(), acc.numpy(), scales.numpy(), block, *_tables(code), code.mbits,
                code.nan_code, code.dec, out.numpy(), int(writeback))
