"""Triton device functions of block-scaled quantization: one per piece of maths.

Each function here mirrors the function of the same name in :mod:`dynamiq.kernels.numba.elements`
and computes the same float32 values with the same operations in the same order, on whole tiles
(tensors) instead of one element at a time. Compile-time choices (rounding mode, scale kind, code
width) are ``tl.constexpr`` arguments; format tables are runtime pointers, so a newly registered
format needs no kernel code.

Exactness on a GPU. Numba's CPU arithmetic is IEEE-754 binary32 with round-to-nearest-even and
gradual underflow, no fused multiply-add (Numba does not contract ``a*b + c``) and no flush to
zero. The Triton code keeps to operations that NVIDIA GPUs perform with the same rounding:

* every division goes through :func:`div_rn` (``tl.math.div_rn`` → PTX ``div.rn.f32``: IEEE,
  subnormals kept). Triton's ``/`` on float32 lowers to the approximate ``div.full.f32``
  (up to 2 ulp off), which would change scales and hence codes;
* ``+``, ``-``, ``*`` are ``add/sub/mul.rn.f32`` (subnormals kept: Triton sets no flush-to-zero
  for plain arithmetic). A multiply feeding an add or subtract may be contracted into one FMA
  (one rounding instead of two), and such chains exist: ``|v| * inv - tab[lo]`` and
  ``tab[hi] - |v| * inv`` when an element is rounded. Every launcher therefore passes
  ``enable_fp_fusion=False`` (LLVM contracts nothing, ptxas runs with ``--fmad=false``). With
  fusion on, the rounding differences ``a - tab[lo]`` could each be off by up to half an ulp of
  ``a``, enough to flip a tie or a stochastic decision, i.e. one code step. The other chains are
  harmless: in ``out + edec[c] * s`` (decode with ``accumulate``) and ``acc + edec[c] * s``
  (recompress) the product passes through :func:`flip_sign` (an integer xor) before the add, and
  the correlated uniform's ``(h >> 8) * 2**-24`` is exact;
* no libdevice function is used: libdevice's ``__nv_f*_rn`` flush subnormals to zero under
  Triton's default ``enable_reflect_ftz``, and the interpreter cannot run libdevice anyway.
  ``tl.math.div_rn`` is the compatibility shim: a core op (also ``tl.div_rn`` in recent
  Triton) that the interpreter runs as numpy's float32 divide, so the same code runs in both;
* comparisons, ``fabs``, bit casts, integer maths (uint32 wrap-around) and min/max of finite
  values are exact everywhere.

The one remaining difference does not affect codes or finite values: NaN *payloads*. A GPU
produces the canonical NaN ``0x7FFFFFFF`` where x86 propagates an operand's NaN (``0x7FC00000``
from the format tables) or its default NaN ``0xFFC00000``, so decoded NaNs (groups or blocks
flagged non-finite, or NaNs already in ``acc``/``out``) may differ in payload and sign bits on a
GPU, never in position. Codes never depend on a NaN's bits (a NaN group is coded as zeros; a NaN
magnitude in a kept group falls in the last lookup bucket whatever its payload), so payload bytes
are identical. Under the interpreter (numpy on x86) even the NaN bits agree with Numba.
"""

from __future__ import annotations

import triton
import triton.language as tl

from dynamiq.kernels import abi
from dynamiq.kernels.abi import Rounding
from dynamiq.kernels.triton.jit.rng import hash_u32, stratum, uniform

__all__ = [
    "CORRELATED",
    "DOWN",
    "KIND_FP32",
    "KIND_TABLE",
    "NEAREST",
    "STOCHASTIC",
    "UP",
    "absmax",
    "decode_scale",
    "div_rn",
    "draw_uniform",
    "element_code",
    "element_value",
    "encode_scale",
    "flip_sign",
    "lut_bracket",
    "pack_codes",
    "round_bracket",
    "round_index",
    "search_bracket",
    "unpack_codes",
]

# rounding modes and scale kinds of the kernel ABI
NEAREST = tl.constexpr(int(Rounding.NEAREST))
STOCHASTIC = tl.constexpr(int(Rounding.STOCHASTIC))
UP = tl.constexpr(int(Rounding.UP))
DOWN = tl.constexpr(int(Rounding.DOWN))
CORRELATED = tl.constexpr(int(Rounding.CORRELATED))
KIND_TABLE = tl.constexpr(abi.KIND_TABLE)
KIND_FP32 = tl.constexpr(abi.KIND_FP32)



@triton.jit
def div_rn(a, b):
    """float32 ``a / b`` correctly rounded (IEEE), as Numba computes it; never approximate.

    ``tl.math.div_rn`` is a core Triton op (``arith.divf`` with IEEE rounding → PTX
    ``div.rn.f32``), not a libdevice call, so it also runs under the interpreter (as numpy's
    float32 divide) and never flushes denormals.
    """
    return tl.math.div_rn(a, b)


@triton.jit
def flip_sign(v, neg):
    """``-v`` where ``neg`` is true, as an exact sign-bit flip (also of zeros and NaNs)."""
    bits = v.to(tl.uint32, bitcast=True)
    flip = tl.where(neg, tl.full((), 0x80000000, tl.uint32), tl.full((), 0, tl.uint32))
    return (bits ^ flip).to(tl.float32, bitcast=True)


@triton.jit
def round_bracket(a, lo, tab, nfin, MODE: tl.constexpr, u):
    """Round ``a >= 0`` given its bracket ``lo`` (last index with ``tab[lo] <= a``, or 0).

    Equivalent to numba ``round_bracket``: NEAREST (ties to the even index), STOCHASTIC (up when
    ``u * (hi - lo) < a - lo``), UP or DOWN; saturates at ``tab[nfin - 1]``.

    Args:
        a: float32 tensor. lo: int32 tensor of the same shape. tab: float32 table pointer.
        nfin: Number of finite table entries. MODE: rounding mode. u: float32 uniforms (or 0).

    Returns:
        int32 table indices.
    """
    hi = tl.minimum(lo + 1, nfin - 1)
    vlo = tl.load(tab + lo)
    vhi = tl.load(tab + hi)
    if MODE == NEAREST:
        dlo = a - vlo
        dhi = vhi - a
        up = (dhi < dlo) | ((dhi == dlo) & ((lo & 1) == 1))
    elif MODE == STOCHASTIC:
        up = u * (vhi - vlo) < a - vlo
    elif MODE == UP:
        up = vlo < a
    else:
        up = tl.zeros(a.shape, tl.int1)
    return lo + (up & (lo < hi)).to(tl.int32)


@triton.jit
def search_bracket(a, tab, nfin, logp):
    """Binary search: last index ``lo < nfin`` with ``tab[lo] <= a`` (0 if none).

    ``tab`` holds ``nfin`` ascending finite values padded with +inf to ``2**logp + 1`` entries.
    Equivalent to numba ``search_bracket``.
    """
    lo = tl.zeros(a.shape, tl.int32)
    for i in range(logp):
        step = (1 << (logp - 1 - i))
        probe = tl.load(tab + lo + step)
        lo = tl.where(probe <= a, lo + step, lo)
    return tl.minimum(lo, nfin - 1)


@triton.jit
def lut_bracket(a, lut, lshift, lkey0, llen, tab, nfin):
    """O(1) bracket of ``a >= 0`` through the bucket table; equivalent to numba ``lut_bracket``.

    The bucket key is the float32 bit pattern of ``a`` shifted right by ``lshift`` (below
    ``2**25``, so int32 holds it), minus ``lkey0``, clamped to the table.
    """
    k = (a.to(tl.uint32, bitcast=True) >> lshift.to(tl.uint32)).to(tl.int32) - lkey0
    k = tl.minimum(tl.maximum(k, 0), llen - 1)
    lo = tl.load(lut + k)
    nxt = tl.load(tab + lo + 1)
    return tl.minimum(lo + (nxt <= a).to(tl.int32), nfin - 1)


@triton.jit
def round_index(a, tab, nfin, logp, MODE: tl.constexpr, u):
    """Index of the table entry that ``a >= 0`` rounds to (binary search + rounding)."""
    return round_bracket(a, search_bracket(a, tab, nfin, logp), tab, nfin, MODE, u)


@triton.jit
def draw_uniform(MODE: tl.constexpr, k0, k1, p0, p1, rank, world, gidx):
    """The uniform that rounds element ``gidx``; equivalent to numba ``draw_uniform``.

    CORRELATED: ``(π(rank) + g) / world`` with ``π`` the per-element permutation of the ranks
    drawn from the shared key ``(p0, p1)`` (:func:`~dynamiq.kernels.triton.jit.rng.stratum`) and
    ``g`` from the rank's key ``(k0, k1)``. ``k*``, ``p*``, ``rank`` and ``world`` are
    ``tl.uint32`` scalars, ``gidx`` an int64 tensor.
    """
    g = uniform(k0, k1, gidx)
    if MODE == CORRELATED:
        slot = stratum(hash_u32(p0, p1, gidx), rank, world)
        g = div_rn(slot.to(tl.float32) + g, world.to(tl.float32))
    return g


@triton.jit
def element_code(v, inv, etab, enfin, lut, lshift, lkey0, llen, MBITS: tl.constexpr,
                 EMODE: tl.constexpr, k0, k1, p0, p1, rank, world, gidx,
                 MIDRISE: tl.constexpr):
    """Sign-magnitude codes (uint32) of ``v`` normalised by ``inv``; numba ``element_code``.

    Args:
        v: float32 tile, already multiplied by the group's lift ``pre``.
        inv: float32 normaliser broadcastable to ``v``.
        etab, lut: element search table (float32) and bucket table (int32) pointers.
        enfin, lshift, lkey0, llen: their int32 sizes and bucket parameters.
        MBITS, EMODE: magnitude bits and element rounding mode.
        k0, k1, p0, p1, rank, world: uint32 random keys and stratification.
        gidx: int64 global element indices, ``v``'s shape.
        MIDRISE: the table has no zero level (numba ``element_code``: a negative value rounds
            with ``1 - u``, and below the first level the rounding crosses zero).

    Returns:
        uint32 codes, ``v``'s shape.
    """
    a = tl.abs(v) * inv
    sign = v.to(tl.uint32, bitcast=True) >> 31
    if EMODE == NEAREST:
        u = tl.zeros(a.shape, tl.float32)
    else:
        u = draw_uniform(EMODE, k0, k1, p0, p1, rank, world, gidx)
        if MIDRISE:
            u = tl.where(sign != 0, 1.0 - u, u)
    lo = lut_bracket(a, lut, lshift, lkey0, llen, etab, enfin)
    if EMODE == NEAREST:
        m = round_bracket(a, lo, etab, enfin, NEAREST, u)
    else:
        m = round_bracket(a, lo, etab, enfin, STOCHASTIC, u)
        if MIDRISE:
            t0 = tl.load(etab)
            cross = (a < t0) & (u * (t0 + t0) >= a + t0)
            sign = sign ^ cross.to(tl.uint32)
    return m.to(tl.uint32) | (sign << MBITS)


@triton.jit
def element_value(c, edec, MBITS: tl.constexpr, s, DITHER: tl.constexpr, kap, u,
                  MIDRISE: tl.constexpr):
    """Decoded float32 values of element codes ``c`` (uint32) under scales ``s`` (broadcast).

    Equivalent to numba ``element_value``: the magnitude ``edec[c & mask]`` (plus
    ``kap * (u - 1/2)`` with ``DITHER``, ``u`` the encoder's uniforms), times ``s``, negated when
    the sign bit is set; finite products saturate at ``±FLT_MAX``, NaN stays NaN. ``MIDRISE``:
    a negative code's dither uses ``1 - u``.
    """
    mag = (c & ((1 << MBITS) - 1)).to(tl.int32)
    m = tl.load(edec + mag)
    if DITHER:
        if MIDRISE:
            u = tl.where(((c >> MBITS) & 1) != 0, 1.0 - u, u)
        m = m + kap * (u - 0.5)
    v = m * s
    v = tl.where(v > 3.4028234663852886e38, 3.4028234663852886e38, v)
    v = tl.where(v < -3.4028234663852886e38, -3.4028234663852886e38, v)
    return flip_sign(v, ((c >> MBITS) & 1) != 0)


@triton.jit
def encode_scale(ratio, KIND: tl.constexpr, tab, nfin, logp, MODE: tl.constexpr, u):
    """uint32 code of a non-negative scale ``ratio`` (FP32 kind: its raw bits)."""
    if KIND == KIND_FP32:
        code = ratio.to(tl.uint32, bitcast=True)
    else:
        code = round_index(ratio, tab, nfin, logp, MODE, u).to(tl.uint32)
    return code


@triton.jit
def decode_scale(code, KIND: tl.constexpr, dec):
    """float32 value of scale codes ``code`` (uint32); numba ``decode_scale``."""
    if KIND == KIND_FP32:
        s = code.to(tl.float32, bitcast=True)
    else:
        s = tl.load(dec + code.to(tl.int32))
    return s


@triton.jit
def absmax(x, AXIS: tl.constexpr):
    """``(max |x| along AXIS, any non-finite along AXIS)``; numba ``absmax``.

    The maximum is only meaningful where the flag is false (all finite), which is the only case
    the kernels use it, so the GPU's NaN-ignoring ``max`` and numpy's NaN-propagating one agree.
    """
    ax = tl.abs(x)
    amax = tl.max(ax, axis=AXIS)
    nonfin = (x != x) | (ax > 3.4028234663852886e38)  # NaN, or beyond the largest float32
    bad = tl.max(nonfin.to(tl.int32), axis=AXIS) != 0
    return amax, bad


@triton.jit
def store_word(buf, pos, NBYTES: tl.constexpr, code, mask):
    """Store ``code`` (uint32) as ``NBYTES`` little-endian bytes at ``buf + pos``."""
    for k in tl.static_range(NBYTES):
        tl.store(buf + pos + k, ((code >> (8 * k)) & 0xFF).to(tl.uint8), mask=mask)


@triton.jit
def load_word(buf, pos, NBYTES: tl.constexpr, mask):
    """Load an ``NBYTES``-byte little-endian word at ``buf + pos`` as uint32."""
    code = tl.load(buf + pos, mask=mask, other=0).to(tl.uint32)
    for k in tl.static_range(1, NBYTES):
        code = code | (tl.load(buf + pos + k, mask=mask, other=0).to(tl.uint32) << (8 * k))
    return code


@triton.jit
def pack_codes(c, buf, base, valid, limit, NCHUNK: tl.constexpr, E: tl.constexpr,
               L: tl.constexpr, BITS: tl.constexpr):
    """Store ``BITS``-bit codes LSB-first: code ``i`` starts at bit ``i * BITS`` of ``buf + base``.

    The tile ``c`` (uint32, ``NCHUNK * E`` codes) is cut into chunks of ``E = 8 / gcd(BITS, 8)``
    codes, which fill exactly ``L = BITS / gcd(BITS, 8)`` bytes; byte ``p`` of every chunk
    collects the bits of the codes that overlap it (shifts are compile-time per ``(p, t)``).
    ``valid`` (bool, ``NCHUNK``) masks the stores of chunks outside the data, and no byte at or
    past ``buf + limit`` is written (a bit stream whose last chunk is cut short).
    """
    cc = tl.reshape(c, (NCHUNK, E))
    t = tl.arange(0, E)[None, :]
    row = tl.arange(0, NCHUNK)
    for p in tl.static_range(L):
        sh = t * BITS - 8 * p  # bit of byte p where code t starts
        hit = (sh < 8) & (sh + BITS > 0)
        left = cc << tl.minimum(tl.maximum(sh, 0), 31).to(tl.uint32)
        right = cc >> tl.minimum(tl.maximum(-sh, 0), 31).to(tl.uint32)
        part = tl.where(hit, tl.where(sh >= 0, left, right) & 0xFF, 0)
        byte = tl.sum(part, axis=1)  # the parts have disjoint bits: sum == or
        pos = base + row * L + p
        tl.store(buf + pos, byte.to(tl.uint8), mask=valid & (pos < limit))


@triton.jit
def unpack_codes(buf, base, valid, limit, NCHUNK: tl.constexpr, E: tl.constexpr,
                 L: tl.constexpr, BITS: tl.constexpr):
    """Inverse of :func:`pack_codes`: the ``NCHUNK * E`` codes (uint32) stored at ``buf + base``
    (bytes of invalid chunks, or at or past ``buf + limit``, read as 0)."""
    t = tl.arange(0, E)[None, :]
    row = tl.arange(0, NCHUNK)
    c = tl.zeros((NCHUNK, E), tl.uint32)
    for p in tl.static_range(L):
        pos = base + row * L + p
        byte = tl.load(buf + pos, mask=valid & (pos < limit), other=0).to(tl.uint32)[:, None]
        sh = t * BITS - 8 * p
        hit = (sh < 8) & (sh + BITS > 0)
        left = byte >> tl.minimum(tl.maximum(sh, 0), 31).to(tl.uint32)
        right = byte << tl.minimum(tl.maximum(-sh, 0), 31).to(tl.uint32)
        c = c | tl.where(hit, tl.where(sh >= 0, left, right), 0)
    return tl.reshape(c & ((1 << BITS) - 1), (NCHUNK * E,))
