"""Triton kernels of shared-scale minifloat codes: twins of
:mod:`dynamiq.kernels.numba.shared_scale`.

:func:`nearest_code`: the nearest decoded level ``tab[j] * s`` to ``v``, ties to the even
magnitude code, bracket found on ``|v| / s`` and then settled on the decoded levels themselves
(data-dependent loops, as Numba's ``while``), distances compared in float64.
"""

from __future__ import annotations

import triton
import triton.language as tl

from dynamiq.kernels.triton.jit.elements import div_rn, lut_bracket, pack_codes, unpack_codes
from dynamiq.kernels.triton.jit.streams import is_finite, stream_chunks, tile

__all__ = ["nearest_code", "shared_decode_kernel", "shared_encode_kernel",
           "shared_recompress_kernel"]

@triton.jit
def _shared_consts(iconst):
    nfin = tl.load(iconst + 0).to(tl.int32)
    lshift = tl.load(iconst + 1).to(tl.int32)
    lkey0 = tl.load(iconst + 2).to(tl.int32)
    llen = tl.load(iconst + 3).to(tl.int32)
    nan_code = tl.load(iconst + 4).to(tl.uint32)
    return nfin, lshift, lkey0, llen, nan_code


@triton.jit
def nearest_code(v, s, tab, nfin, lut, lshift, lkey0, llen, nan_code, MBITS: tl.constexpr):
    """Sign-magnitude code (uint32) of the level ``tab[j] * s`` nearest to ``v``.

    Equivalent to numba ``_nearest_code``: bracket of ``|v| / s`` through the bucket table,
    moved down while ``tab[lo] * s > |v|`` and up while ``tab[lo + 1] * s <= |v|``; the nearer
    neighbour by float64 distances, ties to the even magnitude code, saturating; never ``-0``;
    ``nan_code`` when ``v`` or ``s`` is not finite.
    """
    a = tl.abs(v)
    lo = lut_bracket(div_rn(a, s), lut, lshift, lkey0, llen, tab, nfin)
    todo = (lo > 0) & (tl.load(tab + lo) * s > a)
    while tl.max(todo.to(tl.int32)) > 0:
        lo = tl.where(todo, lo - 1, lo)
        todo = todo & (lo > 0) & (tl.load(tab + lo) * s > a)
    todo = (lo < nfin - 1) & (tl.load(tab + lo + 1) * s <= a)
    while tl.max(todo.to(tl.int32)) > 0:
        lo = tl.where(todo, lo + 1, lo)
        todo = todo & (lo < nfin - 1) & (tl.load(tab + lo + 1) * s <= a)
    hi = tl.minimum(lo + 1, nfin - 1)
    a64 = a.to(tl.float64)
    d1 = a64 - (tl.load(tab + lo) * s).to(tl.float64)  # exact in float64
    d2 = (tl.load(tab + hi) * s).to(tl.float64) - a64
    up = (d2 < d1) | ((d2 == d1) & ((lo & 1) == 1))
    mag = tl.minimum(lo + up.to(tl.int32), nfin - 1)
    neg = (v < 0) & (mag != 0)
    code = mag.to(tl.uint32) | (neg.to(tl.uint32) << MBITS)
    return tl.where(is_finite(v) & is_finite(s), code, nan_code)


@triton.jit
def _shared_value(code, dec, s):
    """``dec[code] * s`` (one float32 multiply)."""
    return tl.load(dec + code.to(tl.int32)) * s


@triton.jit
def shared_encode_kernel(x, n, nbytes, scales, out, tab, lut, iconst, BLOCK: tl.constexpr,
                         MBITS: tl.constexpr, TILE: tl.constexpr, E: tl.constexpr,
                         L: tl.constexpr):
    """Pack the codes of float32 ``x[n]``; coordinate ``i`` has scale ``scales[i // BLOCK]``."""
    nfin, lshift, lkey0, llen, nan_code = _shared_consts(iconst)
    i, m = tile(n, TILE)
    v = tl.load(x + i, mask=m, other=0.0)
    s = tl.load(scales + i // BLOCK, mask=m, other=1.0)
    c = tl.where(m, nearest_code(v, s, tab, nfin, lut, lshift, lkey0, llen, nan_code, MBITS), 0)
    pack_codes(c, out, tl.program_id(0).to(tl.int64) * (TILE * (MBITS + 1) // 8),
               stream_chunks(n, TILE, E), nbytes, TILE // E, E, L, MBITS + 1)


@triton.jit
def shared_decode_kernel(data, n, nbytes, scales, out, dec, BLOCK: tl.constexpr,
                         MBITS: tl.constexpr, ACCUMULATE: tl.constexpr, TILE: tl.constexpr,
                         E: tl.constexpr, L: tl.constexpr):
    """``out (=|+=) dec[code] * scale``; numba ``shared_decode``."""
    i, m = tile(n, TILE)
    c = unpack_codes(data, tl.program_id(0).to(tl.int64) * (TILE * (MBITS + 1) // 8),
                     stream_chunks(n, TILE, E), nbytes, TILE // E, E, L, MBITS + 1)
    s = tl.load(scales + i // BLOCK, mask=m, other=1.0)
    v = _shared_value(c, dec, s)
    if ACCUMULATE:
        v = tl.load(out + i, mask=m, other=0.0) + v
    tl.store(out + i, v, mask=m)


@triton.jit
def shared_recompress_kernel(data, acc, n, nbytes, scales, out, tab, lut, dec, iconst,
                             BLOCK: tl.constexpr, MBITS: tl.constexpr,
                             WRITEBACK: tl.constexpr, TILE: tl.constexpr, E: tl.constexpr,
                             L: tl.constexpr):
    """Code ``acc + decode(data)`` into ``out``; numba ``shared_recompress``.

    ``WRITEBACK``: 0 leaves ``acc``, 1 stores the float32 sum, 2 the decoded new code.
    """
    nfin, lshift, lkey0, llen, nan_code = _shared_consts(iconst)
    i, m = tile(n, TILE)
    base = tl.program_id(0).to(tl.int64) * (TILE * (MBITS + 1) // 8)
    valid = stream_chunks(n, TILE, E)
    c = unpack_codes(data, base, valid, nbytes, TILE // E, E, L, MBITS + 1)
    s = tl.load(scales + i // BLOCK, mask=m, other=1.0)
    v = tl.load(acc + i, mask=m, other=0.0) + _shared_value(c, dec, s)
    new = tl.where(m, nearest_code(v, s, tab, nfin, lut, lshift, lkey0, llen, nan_code, MBITS),
                   0)
    pack_codes(new, out, base, valid, nbytes, TILE // E, E, L, MBITS + 1)
    if WRITEBACK == 1:
        tl.store(acc + i, v, mask=m)
    elif WRITEBACK == 2:
        tl.store(acc + i, _shared_value(new, dec, s), mask=m)


