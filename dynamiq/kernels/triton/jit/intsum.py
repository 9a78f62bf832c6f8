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
           "intsum_recompress_kernel", "intsum_round_kernel"]

@triton.jit
def int_code(v, step, shift, HALF: tl.constexpr, k0, k1, index):
    """Offset-binary code (uint32) of the stochastic rounding of ``v / step + shift``; numba
    ``_int_code``.

    0 for non-finite ``v``; saturates at ``±(HALF - 1)``; else ``floor(t) + (u < t - floor(t))``
    with ``t = v / step + shift`` and ``u`` the uniform of the coordinate's global ``index``.
    """
    lim = HALF - 1
    t = div_rn(v, step) + shift
    inside = (t < lim) & (t > -lim)  # then |t| < 2**23: the int32 conversions are exact
    tc = tl.where(inside, t, 0.0)
    ti = tc.to(tl.int32)  # truncates towards zero
    fi = ti - (ti.to(tl.float32) > tc).to(tl.int32)  # floor(t)
    frac = tc - fi.to(tl.float32)
    w = fi + (uniform(k0, k1, index) < frac).to(tl.int32)
    code = tl.where(t >= lim, lim + HALF, tl.where(t <= -lim, HALF - lim, w + HALF))
    return tl.where(is_finite(v), code, 0).to(tl.uint32)


@triton.jit
def int_value(code, step, shift, HALF: tl.constexpr):
    """``(float32(code - HALF) - shift) * step``, NaN for code 0; numba ``_int_value``."""
    w = ((code.to(tl.int32) - HALF).to(tl.float32) - shift) * step
    return tl.where(code == 0, float("nan"), w)


@triton.jit
def _int_consts(fconst, rand):
    """``fconst = [step, shift_in, shift_out]``, ``rand = [k0, k1, offset]``."""
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
    shift = tl.load(fconst + 2)
    c = tl.where(m, int_code(v, step, shift, 1 << (BITS - 1), k0, k1, offset + i), 0)
    pack_codes(c, out, tl.program_id(0).to(tl.int64) * (TILE * BITS // 8),
               stream_chunks(n, TILE, E), nbytes, TILE // E, E, L, BITS)


@triton.jit
def intsum_decode_kernel(data, n, nbytes, out, fconst, BITS: tl.constexpr,
                         ACCUMULATE: tl.constexpr, TILE: tl.constexpr, E: tl.constexpr,
                         L: tl.constexpr):
    """``out (=|+=) float32(w) * step``; numba ``intsum_decode``."""
    step = tl.load(fconst + 0)
    shift = tl.load(fconst + 1)
    i, m = tile(n, TILE)
    c = unpack_codes(data, tl.program_id(0).to(tl.int64) * (TILE * BITS // 8),
                     stream_chunks(n, TILE, E), nbytes, TILE // E, E, L, BITS)
    v = int_value(c, step, shift, 1 << (BITS - 1))
    if ACCUMULATE:
        v = tl.load(out + i, mask=m, other=0.0) + v
    tl.store(out + i, v, mask=m)


@triton.jit
def intsum_recompress_kernel(data, acc, n, nbytes, out, fconst, rand, BITS: tl.constexpr,
                             WRITEBACK: tl.constexpr, TILE: tl.constexpr, E: tl.constexpr,
                             L: tl.constexpr):
    """Code ``acc + decode(data)`` into ``out``; numba ``intsum_recompress``."""
    step, k0, k1, offset = _int_consts(fconst, rand)
    shift_in = tl.load(fconst + 1)
    shift_out = tl.load(fconst + 2)
    i, m = tile(n, TILE)
    base = tl.program_id(0).to(tl.int64) * (TILE * BITS // 8)
    valid = stream_chunks(n, TILE, E)
    c = unpack_codes(data, base, valid, nbytes, TILE // E, E, L, BITS)
    v = tl.load(acc + i, mask=m, other=0.0) + int_value(c, step, shift_in, 1 << (BITS - 1))
    new = tl.where(m, int_code(v, step, shift_out, 1 << (BITS - 1), k0, k1, offset + i), 0)
    pack_codes(new, out, base, valid, nbytes, TILE // E, E, L, BITS)
    if WRITEBACK == 1:
        tl.store(acc + i, v, mask=m)
    elif WRITEBACK == 2:
        tl.store(acc + i, int_value(new, step, shift_out, 1 << (BITS - 1)), mask=m)


@triton.jit
def intsum_round_kernel(x, n, out, lower, upper, g, fconst, rand, TILE: tl.constexpr):
    """THC's rounding onto a level table; numba ``_round_levels``.

    ``u = clamp(x / step + g/2, 0, g)`` rounds to the level ``upper[j]`` with probability
    ``(u - lower[j]) / (upper[j] - lower[j])`` (``j = min(floor(u), g - 1)``), else to
    ``lower[j]``; level ``c`` is stored as ``float32(2c - g) * (step / 2)``, NaN for a
    non-finite ``x``.
    """
    step, k0, k1, offset = _int_consts(fconst, rand)
    i, m = tile(n, TILE)
    v = tl.load(x + i, mask=m, other=0.0)
    top = g.to(tl.float32)
    u = div_rn(v, step) + 0.5 * top
    u = tl.minimum(tl.maximum(u, 0.0), top)
    ok = is_finite(v)
    uc = tl.where(ok, u, 0.0)
    j = tl.minimum(uc.to(tl.int32), g - 1)  # u >= 0: truncation is floor
    a = tl.load(lower + j, mask=m, other=0)
    b = tl.load(upper + j, mask=m, other=1)
    p = div_rn(uc - a.to(tl.float32), (b - a).to(tl.float32))
    c = tl.where(uniform(k0, k1, offset + i) < p, b, a)
    res = (2 * c - g).to(tl.float32) * (0.5 * step)
    tl.store(out + i, tl.where(ok, res, float("nan")), mask=m)

