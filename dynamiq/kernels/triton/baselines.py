"""Triton kernels of the baseline codecs and of the element-wise hops: bit-exact with the CPU path.

Twins of :mod:`dynamiq.kernels.numba.baselines` (shared-scale minifloats, integer sums) and of
the torch operations that the CPU path of the uncompressed / sparse codecs and DynamiQ's width
reordering run. Same layouts, same float32 operations in the same order; every hop is one
kernel. Compile-time parameters (code width, magnitude bits, block size, wire format, rounding
of the write-back) are ``tl.constexpr``; format tables are runtime tensors, so a newly
registered format needs no kernel code. The arithmetic contract of
:mod:`dynamiq.kernels.triton.codec` holds here too (``div_rn`` for every division, no FMA
contraction: launches pass ``enable_fp_fusion=False``, no libdevice), and with it its one
caveat: on a GPU, NaNs produced by arithmetic carry the canonical payload, so decoded NaN
*bits* may differ from x86's (never their positions, never the message bytes).

A program handles a tile of ``TILE`` consecutive coordinates (a multiple of 8, hence of every
code chunk ``E = 8 / gcd(bits, 8)``), so tiles start on whole bytes of the packed bit streams;
the stream's last byte is cut short through the ``limit`` of
:func:`~dynamiq.kernels.triton.codec.pack_codes`.

* **Shared scale** (:func:`nearest_code`): the nearest decoded level ``tab[j] * s`` to ``v``,
  ties to the even magnitude code, bracket found on ``|v| / s`` and then settled on the decoded
  levels themselves (data-dependent loops, as Numba's ``while``), distances compared in float64.
* **Integer sums** (:func:`int_code`, :func:`int_value`): ``floor`` is computed exactly through a
  truncating int32 conversion (the argument is below ``2**23`` in magnitude there), not through
  a math-library call.
* **Wire** kernels: FP32 or BF16 values of (a block selection of) the coordinates. BF16 is
  round-to-nearest-even on the bits, as torch converts; the NaN pattern torch writes is a
  runtime argument (``nan16``: a constant such as ``0xFFFF`` from the vectorised x86 path or
  ``0x7FC0`` from the scalar one, or ``-1`` for "keep the payload, quietened"), probed once per
  device by the launcher, so the bytes equal torch's on the same device.
* **Row permutation**: DynamiQ's gather of super-groups by width and the inverse scatter
  (copy or ``out + value``), with the zero padding of the chunk's partial last super-group.
"""

from __future__ import annotations

import triton
import triton.language as tl

from dynamiq.kernels.triton.codec import div_rn, lut_bracket, pack_codes, unpack_codes
from dynamiq.kernels.triton.rng import uniform

__all__ = [
    "bf16_bits",
    "bf16_value",
    "gather_rows_kernel",
    "int_code",
    "int_value",
    "intsum_decode_kernel",
    "intsum_encode_kernel",
    "intsum_recompress_kernel",
    "is_finite",
    "nearest_code",
    "scatter_rows_kernel",
    "shared_decode_kernel",
    "shared_encode_kernel",
    "shared_recompress_kernel",
    "wire_decode_kernel",
    "wire_encode_kernel",
    "wire_recompress_kernel",
]

_FMAX = tl.constexpr(3.4028234663852886e38)  # the largest float32


@triton.jit
def is_finite(v):
    """``np.isfinite`` of a float32 tensor (exact comparisons only)."""
    return (v == v) & (tl.abs(v) <= _FMAX)


@triton.jit
def _tile(n, TILE: tl.constexpr):
    """This program's coordinates (int64) and their validity."""
    i = tl.program_id(0).to(tl.int64) * TILE + tl.arange(0, TILE)
    return i, i < n


@triton.jit
def _stream_chunks(n, TILE: tl.constexpr, E: tl.constexpr):
    """Validity (bool ``[TILE / E]``) of this program's chunks of ``E`` codes: those that
    start inside the ``n`` coordinates."""
    c0 = tl.program_id(0).to(tl.int64) * (TILE // E)
    return (c0 + tl.arange(0, TILE // E)) * E < n


# ---- shared-scale minifloats --------------------------------------------------------------------
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
    i, m = _tile(n, TILE)
    v = tl.load(x + i, mask=m, other=0.0)
    s = tl.load(scales + i // BLOCK, mask=m, other=1.0)
    c = tl.where(m, nearest_code(v, s, tab, nfin, lut, lshift, lkey0, llen, nan_code, MBITS), 0)
    pack_codes(c, out, tl.program_id(0).to(tl.int64) * (TILE * (MBITS + 1) // 8),
               _stream_chunks(n, TILE, E), nbytes, TILE // E, E, L, MBITS + 1)


@triton.jit
def shared_decode_kernel(data, n, nbytes, scales, out, dec, BLOCK: tl.constexpr,
                         MBITS: tl.constexpr, ACCUMULATE: tl.constexpr, TILE: tl.constexpr,
                         E: tl.constexpr, L: tl.constexpr):
    """``out (=|+=) dec[code] * scale``; numba ``shared_decode``."""
    i, m = _tile(n, TILE)
    c = unpack_codes(data, tl.program_id(0).to(tl.int64) * (TILE * (MBITS + 1) // 8),
                     _stream_chunks(n, TILE, E), nbytes, TILE // E, E, L, MBITS + 1)
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
    i, m = _tile(n, TILE)
    base = tl.program_id(0).to(tl.int64) * (TILE * (MBITS + 1) // 8)
    valid = _stream_chunks(n, TILE, E)
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


# ---- integer sums -------------------------------------------------------------------------------
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
    i, m = _tile(n, TILE)
    v = tl.load(x + i, mask=m, other=0.0)
    c = tl.where(m, int_code(v, step, 1 << (BITS - 1), k0, k1, offset + i), 0)
    pack_codes(c, out, tl.program_id(0).to(tl.int64) * (TILE * BITS // 8),
               _stream_chunks(n, TILE, E), nbytes, TILE // E, E, L, BITS)


@triton.jit
def intsum_decode_kernel(data, n, nbytes, out, fconst, BITS: tl.constexpr,
                         ACCUMULATE: tl.constexpr, TILE: tl.constexpr, E: tl.constexpr,
                         L: tl.constexpr):
    """``out (=|+=) float32(w) * step``; numba ``intsum_decode``."""
    step = tl.load(fconst + 0)
    i, m = _tile(n, TILE)
    c = unpack_codes(data, tl.program_id(0).to(tl.int64) * (TILE * BITS // 8),
                     _stream_chunks(n, TILE, E), nbytes, TILE // E, E, L, BITS)
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
    i, m = _tile(n, TILE)
    base = tl.program_id(0).to(tl.int64) * (TILE * BITS // 8)
    valid = _stream_chunks(n, TILE, E)
    c = unpack_codes(data, base, valid, nbytes, TILE // E, E, L, BITS)
    v = tl.load(acc + i, mask=m, other=0.0) + int_value(c, step, 1 << (BITS - 1))
    new = tl.where(m, int_code(v, step, 1 << (BITS - 1), k0, k1, offset + i), 0)
    pack_codes(new, out, base, valid, nbytes, TILE // E, E, L, BITS)
    if WRITEBACK == 1:
        tl.store(acc + i, v, mask=m)
    elif WRITEBACK == 2:
        tl.store(acc + i, int_value(new, step, 1 << (BITS - 1)), mask=m)


# ---- wire values: FP32 / BF16 of a block selection ---------------------------------------------
@triton.jit
def bf16_bits(v, nan16):
    """BF16 bit pattern (int32 in ``[0, 65535]``) of float32 ``v``, round to nearest even.

    NaN becomes ``nan16``, or (``nan16 < 0``) its own top half with the quiet bit set.
    """
    b = v.to(tl.uint32, bitcast=True)
    r = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).to(tl.int32)
    keep = ((b >> 16) | 0x40).to(tl.int32)
    return tl.where(v != v, tl.where(nan16 < 0, keep, nan16), r)


@triton.jit
def bf16_value(h):
    """float32 value of BF16 bit patterns ``h`` (any integer type; exact)."""
    return ((h.to(tl.int32) & 0xFFFF).to(tl.uint32) << 16).to(tl.float32, bitcast=True)


@triton.jit
def _wire_pos(i, m, bpos, SELECT: tl.constexpr, SB: tl.constexpr):
    """Wire index of coordinate ``i`` and whether it travels: ``i`` itself, or, with a
    selection of blocks of ``SB``, ``bpos[i // SB] + i % SB`` (``bpos < 0``: not selected)."""
    if SELECT:
        b = tl.load(bpos + i // SB, mask=m, other=-1)
        return b + i % SB, m & (b >= 0)
    else:
        return i, m


@triton.jit
def _wire_load(wire, p, sel, BF16: tl.constexpr):
    """float32 values of the wire entries ``p`` (0 where not ``sel``)."""
    if BF16:
        v = bf16_value(tl.load(wire + p, mask=sel, other=0))
    else:
        v = tl.load(wire + p, mask=sel, other=0.0)
    return tl.where(sel, v, 0.0)


@triton.jit
def _wire_store(wire, p, sel, v, nan16, BF16: tl.constexpr):
    """Store float32 ``v`` into the wire entries ``p`` where ``sel``; returns what was stored,
    as float32 (the decoded value)."""
    if BF16:
        h = bf16_bits(v, nan16)
        tl.store(wire + p, h.to(tl.int16), mask=sel)
        d = bf16_value(h)
    else:
        tl.store(wire + p, v, mask=sel)
        d = v
    return d


@triton.jit
def wire_encode_kernel(x, n, wire, bpos, nan16, BF16: tl.constexpr, SELECT: tl.constexpr,
                       SB: tl.constexpr, TILE: tl.constexpr):
    """``wire[p(i)] = cast(x[i])`` for the travelling coordinates."""
    i, m = _tile(n, TILE)
    p, sel = _wire_pos(i, m, bpos, SELECT, SB)
    _wire_store(wire, p, sel, tl.load(x + i, mask=m, other=0.0), nan16, BF16)


@triton.jit
def wire_decode_kernel(wire, n, out, bpos, BF16: tl.constexpr, SELECT: tl.constexpr,
                       SB: tl.constexpr, ACCUMULATE: tl.constexpr, TILE: tl.constexpr):
    """``out[i] (=|+=) value(wire[p(i)])``, 0 for coordinates that do not travel."""
    i, m = _tile(n, TILE)
    p, sel = _wire_pos(i, m, bpos, SELECT, SB)
    v = _wire_load(wire, p, sel, BF16)
    if ACCUMULATE:
        v = tl.load(out + i, mask=m, other=0.0) + v
    tl.store(out + i, v, mask=m)


@triton.jit
def wire_recompress_kernel(wire, acc, n, out, bpos, nan16, BF16: tl.constexpr,
                           SELECT: tl.constexpr, SB: tl.constexpr, WRITEBACK: tl.constexpr,
                           TILE: tl.constexpr):
    """``out = cast(acc + value(wire))`` on the travelling coordinates.

    ``WRITEBACK``: 0 leaves ``acc``; 1 stores ``acc + value`` (``acc + 0`` where nothing
    travels); 2 stores the decoded outgoing value (0 where nothing travels).
    """
    i, m = _tile(n, TILE)
    p, sel = _wire_pos(i, m, bpos, SELECT, SB)
    t = tl.load(acc + i, mask=m, other=0.0) + _wire_load(wire, p, sel, BF16)
    d = _wire_store(out, p, sel, t, nan16, BF16)
    if WRITEBACK == 1:
        tl.store(acc + i, t, mask=m)
    elif WRITEBACK == 2:
        tl.store(acc + i, tl.where(sel, d, 0.0), mask=m)


# ---- row permutation (DynamiQ's reorder by width) -----------------------------------------------
@triton.jit
def gather_rows_kernel(x, n, order, rows, g, ROW: tl.constexpr, RPP: tl.constexpr):
    """``g[k * ROW + j] = x[order[k] * ROW + j]`` (0 past ``n``) for ``RPP`` rows per program."""
    k = tl.program_id(0).to(tl.int64) * RPP + tl.arange(0, RPP)
    km = k < rows
    src = tl.load(order + k, mask=km, other=0).to(tl.int64)
    j = tl.arange(0, ROW)[None, :]
    si = src[:, None] * ROW + j
    v = tl.load(x + si, mask=km[:, None] & (si < n), other=0.0)
    tl.store(g + k[:, None] * ROW + j, v, mask=km[:, None])


@triton.jit
def scatter_rows_kernel(g, n, order, rows, out, ROW: tl.constexpr, RPP: tl.constexpr,
                        ADD: tl.constexpr):
    """``out[order[k] * ROW + j] (=|+=) g[k * ROW + j]`` for destinations below ``n``."""
    k = tl.program_id(0).to(tl.int64) * RPP + tl.arange(0, RPP)
    km = k < rows
    dst = tl.load(order + k, mask=km, other=0).to(tl.int64)
    j = tl.arange(0, ROW)[None, :]
    di = dst[:, None] * ROW + j
    dm = km[:, None] & (di < n)
    v = tl.load(g + k[:, None] * ROW + j, mask=dm, other=0.0)
    if ADD:
        v = tl.load(out + di, mask=dm, other=0.0) + v
    tl.store(out + di, v, mask=dm)
