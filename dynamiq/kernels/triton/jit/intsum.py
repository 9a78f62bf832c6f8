"""Triton kernels of integer-sum codes: twins of :mod:`dynamiq.kernels.numba.intsum`.

``floor`` is computed exactly through a truncating int32 conversion (the argument is below
``2**23`` in magnitude there), not through a math-library call.
"""

from __future__ import annotations

import triton
import triton.language as tl

from dynamiq.kernels.triton.jit.elements import div_rn, pack_codes, unpack_codes
from dynamiq.kernels.triton.jit.rng import uniform
from dynamiq.kernels.triton.jit.streams import is_finite, stream_chunks, tile

__all__ = ["int_code", "int_value", "intsum_decode_kernel", "intsum_encode_kernel",
           "intsum_recompress_kernel"]

@triton.jit
def int_code(v, step, HALF: tl.constexpr, k0, k1, index):
    """Offset-binary code (uint32) of the stochastic rounding of ``v / step``; numba ``_int_code``.

    0 for non-finite ``v``; saturates at ``±(HALF - 1)``; else ``floor(t) + (u < t - floor(t))``
    with ``t = v / step`` and ``u`` the uniform of the coordinate's global ``index``.
    """
    lim = HALF - 1
    t = div_rn(v, step)
    inside = (t < lim) & (t > -lim)  # then |t| < 2**23: the int32 conversions are exact
    tc = tl.where(inside, t, 0.0)
    ti = tc.to(tl.int32)  # truncates towards zero
    fi = ti - (ti.to(tl.float32) > tc).to(tl.int32)  # floor(t)
    frac = tc - fi.to(tl.float32)
    w = fi + (uniform(k0, k1, index) < frac).to(tl.int32)
    code = tl.where(t >= lim, lim + HALF, tl.where(t <= -lim, HALF - lim, w + HALF))
    return tl.where(is_finite(v), code, 0).to(tl.uint32)


@triton.jit
def int_value(code, step, HALF: tl.constexpr):
    """``float32(code - HALF) * step``, NaN for code 0; numba ``_int_value``."""
    w = (code.to(tl.int32) - HALF).to(tl.float32) * step
    return tl.where(code == 0, float("nan"), w)


@triton.jit
def _int_consts(fconst, rand):
    step = tl.load(fconst + 0)
    k0 = tl.load(rand + 0).to(tl.uint32)
    k1 = tl.load(rand + 1).to(tl.uint32)
    offset = tl.load(rand + 2)
    return step, k0, k1, offset


@triton.jit
def intsum_encode_kernel(x, n, nbytes, out, fconst, rand, BITS: tl.constexpr,
                         TILE: tl.constexpr, E: tl.constexpr, L: tl.constexpr):
    """Pack the stochastically rounded integers of ``x / step``; numba ``intsum_encode``."""
    step, k0, k1, offset = _int_consts(fconst, rand)
    i, m = tile(n, TILE)
    v = tl.load(x + i, mask=m, other=0.0)
    c = tl.where(m, int_code(v, step, 1 << (BITS - 1), k0, k1, offset + i), 0)
    pack_codes(c, out, tl.program_id(0).to(tl.int64) * (TILE * BITS // 8),
               stream_chunks(n, TILE, E), nbytes, TILE // E, E, L, BITS)


@triton.jit
def intsum_decode_kernel(data, n, nbytes, out, fconst, BITS: tl.constexpr,
                         ACCUMULATE: tl.constexpr, TILE: tl.constexpr, E: tl.constexpr,
                         L: tl.constexpr):
    """``out (=|+=) float32(w) * step``; numba ``intsum_decode``."""
    step = tl.load(fconst + 0)
    i, m = tile(n, TILE)
    c = unpack_codes(data, tl.program_id(0).to(tl.int64) * (TILE * BITS // 8),
                     stream_chunks(n, TILE, E), nbytes, TILE // E, E, L, BITS)
    v = int_value(c, step, 1 << (BITS - 1))
    if ACCUMULATE:
        v = tl.load(out + i, mask=m, other=0.0) + v
    tl.store(out + i, v, mask=m)


@triton.jit
def intsum_recompress_kernel(data, acc, n, nbytes, out, fconst, rand, BITS: tl.constexpr,
                             WRITEBACK: tl.constexpr, TILE: tl.constexpr, E: tl.constexpr,
                             L: tl.constexpr):
    """Code ``acc + decode(data)`` into ``out``; numba ``intsum_recompress``."""
    step, k0, k1, offset = _int_consts(fconst, rand)
    i, m = tile(n, TILE)
    base = tl.program_id(0).to(tl.int64) * (TILE * BITS // 8)
    valid = stream_chunks(n, TILE, E)
    c = unpack_codes(data, base, valid, nbytes, TILE // E, E, L, BITS)
    v = tl.load(acc + i, mask=m, other=0.0) + int_value(c, step, 1 << (BITS - 1))
    new = tl.where(m, int_code(v, step, 1 << (BITS - 1), k0, k1, offset + i), 0)
    pack_codes(new, out, base, valid, nbytes, TILE // E, E, L, BITS)
    if WRITEBACK == 1:
        tl.store(acc + i, v, mask=m)
    elif WRITEBACK == 2:
        tl.store(acc + i, int_value(new, step, 1 << (BITS - 1)), mask=m)


