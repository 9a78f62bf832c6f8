"""Numba kernels of two baseline partial-sum codecs: shared-scale minifloats and integer sums.

Both codecs put one ``b``-bit code per coordinate on the wire, packed into a little-endian bit
stream: code ``i`` occupies bits ``[i*b, (i+1)*b)`` of the message, bit ``j`` of the stream being
bit ``j % 8`` of byte ``j // 8``; the last byte is zero-padded. A chunk of ``n`` coordinates
therefore takes ``ceil(n * b / 8)`` bytes, and chunks that start on a multiple of 8 coordinates
concatenate to the message of their union.

Each kernel is one serial pass over the chunk (decode, add, encode and pack fused), so the
float32 arithmetic and its order are fixed here:

* shared scale (:mod:`dynamiq.codecs.shared_scale`): value of code ``c`` in a block of scale
  ``s`` is ``dec[c] * s`` (one float32 multiply); a value ``v`` is coded as the nearest of the
  decoded levels ``tab[j] * s`` (ties to the even magnitude code), saturating at the largest;
  ``tab``, ``lut``, ``lshift``, ``lkey0`` are the element format's
  :class:`~dynamiq.kernels.tables.FormatTables` (``search``, ``lut``, ``lshift``, ``lkey0``);
  non-finite ``v`` (or a non-finite scale) gives ``nan_code``;
* integer sums (:mod:`dynamiq.codecs.intsum`): code ``u`` is the offset-binary integer
  ``w = u - 2**(b-1)``, decoded as ``float32(w) * step``; ``u = 0`` is NaN. A value is coded by
  ``t = v / step`` (float32), ``w = floor(t) + (r < t - floor(t))`` with ``r`` the uniform
  of :func:`dynamiq.kernels.numba.rng.uniform` at the coordinate's global index, clamped to
  ``±(2**(b-1) - 1)``.

``mode`` arguments: decoders ``0`` write (``out = dec``), ``1`` accumulate (``out += dec``);
fused recompress ``0`` leaves ``acc`` alone, ``1`` writes the float32 sum, ``2`` the decoded
value of the new code.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from dynamiq.kernels.numba.rng import uniform

__all__ = [
    "intsum_decode",
    "intsum_encode",
    "intsum_recompress",
    "shared_decode",
    "shared_encode",
    "shared_recompress",
]


# ---- shared-scale minifloats --------------------------------------------------------------------
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
def shared_encode(x, scales, block, tab, nfin, lut, lshift, lkey0, mbits, nan_code, out):
    """Pack the codes of float32 ``x``; block ``j`` (``block`` coordinates) has ``scales[j]``."""
    bits = mbits + 1
    n = x.size
    wacc = np.uint64(0)
    wn = 0
    pos = 0
    for j in range((n + block - 1) // block):
        s = scales[j]
        for i in range(j * block, min(n, (j + 1) * block)):
            code = _nearest_code(x[i], s, tab, nfin, lut, lshift, lkey0, mbits, nan_code)
            wacc |= np.uint64(code) << np.uint64(wn)
            wn += bits
            while wn >= 8:
                out[pos] = np.uint8(wacc & np.uint64(0xFF))
                wacc >>= np.uint64(8)
                wn -= 8
                pos += 1
    if wn > 0:
        out[pos] = np.uint8(wacc & np.uint64(0xFF))


@nb.njit(cache=True)
def shared_decode(data, scales, block, dec, bits, out, mode):
    """``out (=|+=) dec[code] * scale`` for every coordinate of ``out``."""
    mask = np.uint64((1 << bits) - 1)
    n = out.size
    racc = np.uint64(0)
    rn = 0
    pos = 0
    for j in range((n + block - 1) // block):
        s = scales[j]
        for i in range(j * block, min(n, (j + 1) * block)):
            while rn < bits:
                racc |= np.uint64(data[pos]) << np.uint64(rn)
                pos += 1
                rn += 8
            code = racc & mask
            racc >>= np.uint64(bits)
            rn -= bits
            val = dec[code] * s
            if mode == 1:
                out[i] = out[i] + val
            else:
                out[i] = val


@nb.njit(cache=True)
def shared_recompress(data, acc, scales, block, tab, nfin, lut, lshift, lkey0, mbits,
                      nan_code, dec, out, mode):
    """Code ``acc + decode(data)`` into ``out`` in one pass (see the module doc for ``mode``)."""
    bits = mbits + 1
    mask = np.uint64((1 << bits) - 1)
    n = acc.size
    racc = np.uint64(0)
    rn = 0
    rpos = 0
    wacc = np.uint64(0)
    wn = 0
    wpos = 0
    for j in range((n + block - 1) // block):
        s = scales[j]
        for i in range(j * block, min(n, (j + 1) * block)):
            while rn < bits:
                racc |= np.uint64(data[rpos]) << np.uint64(rn)
                rpos += 1
                rn += 8
            code = racc & mask
            racc >>= np.uint64(bits)
            rn -= bits
            v = acc[i] + dec[code] * s
            new = _nearest_code(v, s, tab, nfin, lut, lshift, lkey0, mbits, nan_code)
            if mode == 1:
                acc[i] = v
            elif mode == 2:
                acc[i] = dec[new] * s
            wacc |= np.uint64(new) << np.uint64(wn)
            wn += bits
            while wn >= 8:
                out[wpos] = np.uint8(wacc & np.uint64(0xFF))
                wacc >>= np.uint64(8)
                wn -= 8
                wpos += 1
    if wn > 0:
        out[wpos] = np.uint8(wacc & np.uint64(0xFF))


# ---- integer sums -------------------------------------------------------------------------------
@nb.njit(inline="always", cache=True)
def _int_code(v, step, half, k0, k1, index):
    """Offset-binary code of the stochastic rounding of ``v / step`` to an integer."""
    if not np.isfinite(v):
        return np.int64(0)
    lim = half - 1
    t = v / step
    if t >= np.float32(lim):
        return np.int64(lim + half)
    if t <= np.float32(-lim):
        return np.int64(half - lim)
    f = np.floor(t)
    # exact unless -1 < t < 0, where t + 1 rounds to float32 (2**-24 at most: the resolution
    # of the uniform anyway)
    frac = t - f
    w = np.int64(f)
    if uniform(k0, k1, index) < frac:
        w += 1
    return w + half


@nb.njit(inline="always", cache=True)
def _int_value(code, step, half):
    if code == 0:
        return np.float32(np.nan)
    return np.float32(np.int64(code) - half) * step


@nb.njit(cache=True)
def intsum_encode(x, step, bits, k0, k1, offset, out):
    """Pack the stochastically rounded integers of ``x / step`` (global indices from ``offset``)."""
    half = np.int64(1) << np.int64(bits - 1)
    wacc = np.uint64(0)
    wn = 0
    pos = 0
    for i in range(x.size):
        code = _int_code(x[i], step, half, k0, k1, offset + i)
        wacc |= np.uint64(code) << np.uint64(wn)
        wn += bits
        while wn >= 8:
            out[pos] = np.uint8(wacc & np.uint64(0xFF))
            wacc >>= np.uint64(8)
            wn -= 8
            pos += 1
    if wn > 0:
        out[pos] = np.uint8(wacc & np.uint64(0xFF))


@nb.njit(cache=True)
def intsum_decode(data, step, bits, out, mode):
    """``out (=|+=) float32(w) * step`` for every coordinate of ``out``."""
    half = np.int64(1) << np.int64(bits - 1)
    mask = np.uint64((1 << bits) - 1)
    racc = np.uint64(0)
    rn = 0
    pos = 0
    for i in range(out.size):
        while rn < bits:
            racc |= np.uint64(data[pos]) << np.uint64(rn)
            pos += 1
            rn += 8
        code = np.int64(racc & mask)
        racc >>= np.uint64(bits)
        rn -= bits
        val = _int_value(code, step, half)
        if mode == 1:
            out[i] = out[i] + val
        else:
            out[i] = val


@nb.njit(cache=True)
def intsum_recompress(data, acc, step, bits, k0, k1, offset, out, mode):
    """Code ``acc + decode(data)`` into ``out`` in one pass (see the module doc for ``mode``)."""
    half = np.int64(1) << np.int64(bits - 1)
    mask = np.uint64((1 << bits) - 1)
    racc = np.uint64(0)
    rn = 0
    rpos = 0
    wacc = np.uint64(0)
    wn = 0
    wpos = 0
    for i in range(acc.size):
        while rn < bits:
            racc |= np.uint64(data[rpos]) << np.uint64(rn)
            rpos += 1
            rn += 8
        code = np.int64(racc & mask)
        racc >>= np.uint64(bits)
        rn -= bits
        v = acc[i] + _int_value(code, step, half)
        new = _int_code(v, step, half, k0, k1, offset + i)
        if mode == 1:
            acc[i] = v
        elif mode == 2:
            acc[i] = _int_value(new, step, half)
        wacc |= np.uint64(new) << np.uint64(wn)
        wn += bits
        while wn >= 8:
            out[wpos] = np.uint8(wacc & np.uint64(0xFF))
            wacc >>= np.uint64(8)
            wn -= 8
            wpos += 1
    if wn > 0:
        out[wpos] = np.uint8(wacc & np.uint64(0xFF))
