"""Numba device functions of block quantization: the element and scale maths.

The data layout and the arithmetic (float32 throughout, fixed operation order) are the contract
that every backend reproduces bit for bit (the readable statement is
:mod:`dynamiq.kernels.reference.blocks`):

* The input is processed in *blocks*: a super-group when scales are hierarchical, else a group.
  Blocks are independent, so kernels run in parallel over blocks. A partial last block is read as
  if zero-padded.
* A group of ``G`` elements with ``b``-bit codes occupies ``G*b/8`` bytes of the code stream,
  codes packed LSB-first (element ``i``'s code starts at bit ``i*b`` of its group).
* Group scale codes are little-endian ``sbytes``-byte words; super-group scale codes likewise.
* Normalised magnitude ``a = |x| * (1 / norm)``; decoded value
  ``sign * elem_table[mag] * s`` with ``s = scale_table[code]`` (flat) or
  ``s = S * scale_table[code]``, ``S = super_table[super_code]`` (hierarchical).
* A block containing NaN/Inf gets its top-level scale set to the scale format's NaN code, so the
  whole block decodes to NaN: non-finite input is never silently made finite.

The kernels themselves are generated per :class:`~dynamiq.kernels.abi.KernelSpec` from the
template :mod:`dynamiq.kernels.numba._blocks` (see :mod:`dynamiq.kernels.numba.blocks`); each
piece of maths is one device function below.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from dynamiq.kernels.abi import FLT_MAX, KIND_FP32, KIND_TABLE, Rounding
from dynamiq.kernels.numba.rng import hash_u32, stratum, stratum_pow2, uniform

__all__ = [
    "FLT_MAX", "KIND_FP32", "KIND_TABLE", "absmax", "chain_bracket", "decode_scale",
    "draw_uniform", "element_code", "element_value", "encode_scale", "encode_scale_bucket",
    "float_bracket", "float_nearest", "level_value", "load_word", "lut_bracket",
    "round_bracket", "round_index", "search_bracket", "store_word", "uniform",
]

# plain ints, which Numba compiles as constants
NEAREST = int(Rounding.NEAREST)
STOCHASTIC = int(Rounding.STOCHASTIC)
UP = int(Rounding.UP)
DOWN = int(Rounding.DOWN)
CORRELATED = int(Rounding.CORRELATED)


@nb.njit(inline="always", cache=True)
def round_bracket(a, lo, tab, nfin, mode, u):
    """Round ``a >= 0`` given ``lo`` (uint32), the last table index with ``tab[lo] <= a`` (or 0).

    ``mode`` is NEAREST (ties to the even index), STOCHASTIC (up with probability
    ``(a-lo)/(hi-lo)``, decided by ``u * (hi - lo) < a - lo`` with the uniform ``u``), UP or
    DOWN. Values beyond the last finite entry (including +inf) saturate to it; values below
    ``tab[0]`` give 0. Branch-free, with 32-bit unsigned indices (cheaper gathers), so that
    element loops vectorise.
    """
    hi = min(lo + np.uint32(1), np.uint32(nfin - 1))
    vlo = tab[lo]
    vhi = tab[hi]
    if mode == NEAREST:
        dlo = a - vlo
        dhi = vhi - a
        up = (dhi < dlo) | ((dhi == dlo) & ((lo & np.uint32(1)) == np.uint32(1)))
    elif mode == STOCHASTIC:
        up = u * (vhi - vlo) < a - vlo
    elif mode == UP:
        up = vlo < a
    else:
        up = False
    return lo + np.uint32(up & (lo < hi))


@nb.njit(inline="always", cache=True)
def search_bracket(a, tab, nfin, logp):
    """Binary search: last index ``lo < nfin`` with ``tab[lo] <= a`` (0 if none).

    ``tab`` holds ``nfin`` finite ascending values padded with +inf to ``2**logp + 1`` entries.
    A loop of ``logp`` steps without branches: with a literal ``logp`` LLVM unrolls it, so a
    loop over many values that calls it vectorises (one gather per step).
    """
    lo = np.uint32(0)
    for d in range(logp):
        step = np.uint32((1 << logp) >> (d + 1))
        lo = lo + step if tab[lo + step] <= a else lo
    return min(lo, np.uint32(nfin - 1))


@nb.njit(inline="always", cache=True)
def lut_bracket(a, lut, lshift, lkey0, llen, tab, nfin):
    """Bucket lookup equal to :func:`search_bracket` for ``a >= 0``, in O(1).

    The float32 bit pattern of ``a`` shifted right by ``lshift`` is a monotone bucket key; the
    host-built ``lut`` gives, per bucket, the last table index at or below the bucket start, and
    buckets are fine enough to hold at most one table value, so one compare finishes the job.
    """
    k = np.int64(np.float32(a).view(np.uint32) >> np.uint32(lshift)) - lkey0
    k = np.uint32(min(max(k, 0), llen - 1))
    lo = np.uint32(lut[k])
    return min(lo + np.uint32(tab[lo + np.uint32(1)] <= a), np.uint32(nfin - 1))


@nb.njit(inline="always", cache=True)
def round_index(a, tab, nfin, logp, mode, u):
    """Index of the table entry that ``a >= 0`` rounds to (binary search + rounding)."""
    return round_bracket(a, search_bracket(a, tab, nfin, logp), tab, nfin, mode, u)


@nb.njit(inline="always", cache=True)
def draw_uniform(mode, k0, k1, p0, p1, rank, world, gidx, pow2=False):
    """The uniform used to round element ``gidx``: independent, or stratified across ranks.

    CORRELATED: ``u = (π(rank) + γ) / world`` where ``π`` is a per-element random permutation
    of the ranks drawn from the *shared* key ``(p0, p1)`` (the same on every rank, see
    :func:`dynamiq.rng.stratum`) and ``γ`` comes from the rank's own key ``(k0, k1)``: each
    rank's ``u`` is uniform on [0, 1), and for every element exactly one rank falls in each
    stratum ``[k/world, (k+1)/world)``.

    ``pow2`` (a literal) asserts that ``world`` is a power of two, which makes the stratum's
    computation loop-free (:func:`~dynamiq.kernels.numba.rng.stratum_pow2`).
    """
    g = uniform(k0, k1, gidx)
    if mode != CORRELATED:
        return g
    if pow2:
        slot = stratum_pow2(hash_u32(p0, p1, gidx), rank, world)
        # dividing by a power of two is multiplying by its exact inverse (no quotient here is
        # small enough to be subnormal), which costs a fraction of a vector division
        return (np.float32(slot) + g) * (np.float32(1.0) / np.float32(world))
    slot = stratum(hash_u32(p0, p1, gidx), rank, world)
    return (np.float32(slot) + g) / np.float32(world)


@nb.njit(inline="always", cache=True)
def chain_bracket(a, tab, nmag):
    """``(lo, tab[lo], tab[lo + 1])`` for ``a >= 0`` by comparing with every level.

    Equal to :func:`lut_bracket` (``lo`` counts the levels ``1 .. nmag-1`` at or below ``a``;
    the padding above the finite levels is +inf and never counts). For small tables
    (``nmag`` a compile-time constant, at most 16) the unrolled compares and selects are
    cheaper than the gathers of a table lookup and keep the element loop vectorisable.
    """
    lo = np.uint32(0)
    vlo = tab[0]
    vhi = tab[1]
    for m in range(1, nmag):
        # both loads unconditional: loop-invariant in the caller's element loop, so LLVM
        # hoists them (a load inside the conditional would become a masked gather)
        here = tab[m]
        above = tab[m + 1]
        ge = a >= here
        # kept 32-bit: Numba types a sum of two uint32 as 64-bit, and the loop's vector lanes
        # follow the widest type
        lo = np.uint32(lo + np.uint32(ge))
        vlo = here if ge else vlo
        vhi = above if ge else vhi
    return lo, vlo, vhi


@nb.njit(cache=True)
def float_bracket(a, mant, bias):
    """``(lo, tab[lo], tab[lo + 1])`` for ``a >= 0`` on a minifloat grid with subnormals.

    ``mant`` mantissa bits and exponent ``bias`` (literals): level ``(e << mant) | m`` is
    ``m * 2**(1-bias-mant)`` for ``e == 0`` and ``(1 + m / 2**mant) * 2**(e-bias)`` otherwise.
    The floor on the grid is the float32 bit pattern with the low mantissa bits cleared
    (normal range) or an exact power-of-two rescale and truncation (subnormal range); both
    are computed and one is selected, so the loop stays free of branches. Saturation at the
    last finite level is the caller's.
    """
    # 32-bit integer arithmetic throughout (a 64-bit intermediate doubles the vector work)
    bits = np.float32(a).view(np.uint32)
    drop = np.uint32(23 - mant)
    ex = np.uint32(bits >> np.uint32(23))
    # the grid's exponent e = ex - 127 + bias is >= 1 (normal) iff ex >= 128 - bias, and
    # 127 - bias >= mant >= 0 for every grid the kernels take
    normal = ex >= np.uint32(128 - bias)
    floor_bits = np.uint32((bits >> drop) << drop)
    lo_n = np.uint32(np.uint32(ex - np.uint32(127 - bias)) << np.uint32(mant)) | np.uint32(
        (bits >> drop) & np.uint32((1 << mant) - 1))
    vlo_n = floor_bits.view(np.float32)
    vhi_n = np.uint32(floor_bits + np.uint32(np.uint32(1) << drop)).view(np.float32)
    unit = np.float32(2.0 ** (1 - bias - mant))
    q = np.uint32(min(a * np.float32(2.0 ** (bias - 1 + mant)), np.float32(1 << mant)))
    vlo_s = np.float32(q) * unit
    vhi_s = np.float32(np.uint32(q + np.uint32(1))) * unit
    return (lo_n if normal else q, vlo_n if normal else vlo_s, vhi_n if normal else vhi_s)


@nb.njit(inline="always", cache=True)
def float_nearest(a, mant, bias):
    """Index of the level of a minifloat grid (as :func:`float_bracket`) nearest to ``a >= 0``,
    ties to the even index, before saturation at the last finite level (the caller's minimum).

    In the normal range the float32 pattern is rounded at the grid's last mantissa bit by an
    integer addition (half a unit less one, plus the kept index's parity, so that a tie carries
    exactly when that index is odd; a carry into the exponent is the next binade's first
    level), and the index is the rounded pattern shifted, less the exponent offset. In the
    subnormal range it is ``rint`` of the value in units of the grid's smallest step. Both are
    exact, so this is the bracket's nearest rounding in a third of the operations.
    """
    bits = np.float32(a).view(np.uint32)
    drop = 23 - mant
    # the index's parity is the pattern's bit `drop`, and also the exponent offset's parity
    # when the grid has no mantissa bits
    flip = (127 - bias) & 1 if mant == 0 else 0
    odd = np.uint32(np.uint32(np.uint32(bits >> np.uint32(drop)) & np.uint32(1)) ^ np.uint32(flip))
    r = np.uint32(np.uint32(bits + np.uint32((1 << (drop - 1)) - 1)) + odd)
    lo_n = np.uint32(np.uint32(r >> np.uint32(drop)) - np.uint32((127 - bias) << mant))
    q = np.uint32(np.rint(min(a * np.float32(2.0 ** (bias - 1 + mant)), np.float32(1 << mant))))
    normal = np.uint32(bits >> np.uint32(23)) >= np.uint32(128 - bias)
    return lo_n if normal else q


@nb.njit(inline="always", cache=True)
def element_code(y, u, etab, enfin, lut, lshift, lkey0, llen, mbits, family, mant, bias,
                 emode, midrise=False):
    """Sign-magnitude code (uint32) of the normalised value ``y = (x * pre) * inv``.

    ``|y|`` equals ``|x * pre| * inv`` bit for bit (float32 products are sign-symmetric), so
    the group's normalisation can be applied in the pass that computes the scales.
    ``family`` (a literal, see :func:`dynamiq.kernels.tables.element_family`) picks how the
    levels are searched: 1 minifloat arithmetic, 2 integer levels, 3 compares against every
    level (small tables), 0 the bucket lookup (any table). All give the table search's bits;
    the first three keep the element loop free of gathers. ``u`` is the element's uniform
    (:func:`draw_uniform`; unused when rounding to nearest), drawn by the caller in a loop of
    its own.

    ``midrise`` (a literal): the table has no zero level. A negative ``y`` then rounds with
    ``1 - u``, so that rounding up means towards +inf for every sign (what lets a dithered
    decoder subtract the dither of a code whose sign the rounding flipped), and a magnitude
    below the first level rounds between ``-etab[0]`` and ``etab[0]``: the magnitude code is
    0 either way, and the sign flips when it rounds to the far side.
    """
    sign = np.float32(y).view(np.uint32) >> np.uint32(31)
    if midrise and emode != NEAREST:
        u = np.float32(1.0) - u if sign != 0 else u
    a = abs(y)
    if family == 0:
        # every branch's integers are uint32: Numba unifies a variable's type over all its
        # assignments (the pruned branches' too), and one uint64 widens every vector lane
        lo = np.uint32(lut_bracket(a, lut, lshift, lkey0, llen, etab, enfin))
        m = np.uint32(round_bracket(a, lo, etab, enfin,
                                    NEAREST if emode == NEAREST else STOCHASTIC, u))
    else:
        top = np.uint32(enfin - 1)
        vtop = etab[enfin - 1]
        if family == 1 and emode == NEAREST:
            # a level no less than vtop's index codes the top level (see below)
            lo = float_nearest(a, mant, bias)
            vlo = vhi = np.float32(0.0)
        elif family == 1:
            lo, vlo, vhi = float_bracket(a, mant, bias)
        elif family == 2:
            lo = np.uint32(min(a, vtop))
            vlo = np.float32(lo)
            vhi = np.float32(np.uint32(lo + np.uint32(1)))
        else:
            lo, vlo, vhi = chain_bracket(a, etab, 1 << mbits)
        # Saturation: every family's floor index reaches the top level exactly when a does,
        # and a value at or above it codes the top level whichever way it rounds, so the
        # rounding may use the unclamped bracket and clamp the index last (a minimum of two
        # uint32, which keeps the vector lanes 32-bit where compares and selects of Numba's
        # integers do not).
        if family == 1 and emode == NEAREST:
            up = False
        elif emode == NEAREST:
            dlo = a - vlo
            dhi = vhi - a
            up = (dhi < dlo) | ((dhi == dlo) & np.bool_(lo & np.uint32(1)))
        else:
            up = u * (vhi - vlo) < a - vlo
        m = min(np.uint32(lo + np.uint32(up)), top)
    if midrise and emode != NEAREST:
        # below the first level every bracket above gives code 0 (never "up"); round across
        # zero instead: the far side -etab[0] when u * 2 etab[0] >= a + etab[0]
        t0 = etab[0]
        cross = (a < t0) & (u * (t0 + t0) >= a + t0)
        sign = np.uint32(sign ^ np.uint32(cross))
    return np.uint32(np.uint32(m) | np.uint32(sign << np.uint32(mbits)))


@nb.njit(inline="always", cache=True)
def level_value(mag, edec, family, mant, bias, mbits):
    """Magnitude level ``edec[mag]`` of the magnitude code ``mag`` (uint32).

    ``family``, ``mant``, ``bias``, ``mbits`` (literals, :func:`element_code`) give it without
    a per-element table load where the grid allows, which keeps decode loops vectorised (LLVM
    does not turn table loads into gathers on every target, and a scalar load per element
    costs several times the arithmetic):

    * a minifloat level (family 1) is its code placed in a float32 bit pattern (exponent
      field ``e``, mantissa bits on top) times ``2**(127 - bias)``, exact for the subnormal
      codes too (the pattern is then a float32 subnormal with the same mantissa);
    * an integer level (family 2) is the code itself;
    * a small table (family 3: ``2**mbits`` entries, at most
      :data:`~dynamiq.kernels.tables.CHAIN_LEVELS`) is read through a chain of selects, one
      per entry, each between a table entry and the previous select: the loads are
      unconditional and loop-invariant, so LLVM hoists them out of the element loop and the
      chain runs in vector lanes. Every code, the non-finite ones included, gets its table
      value.

    Families 1 and 2 hold for the finite codes only: those at or beyond the finite count must
    be decoded from the table.
    """
    if family == 3:
        v = edec[0]
        for m in range(1, 1 << mbits):
            # loaded unconditionally: a load in the select's branch would be a masked gather
            here = edec[m]
            v = here if mag >= np.uint32(m) else v
        return v
    if family == 1:
        pattern = np.uint32(mag << np.uint32(23 - mant)).view(np.float32)
        # 127 - bias lies in [mant, 150]: one factor of at most 2**127, a second when needed
        hi = min(127 - bias, 127)
        v = pattern * np.float32(2.0 ** hi)
        if hi < 127 - bias:
            v = v * np.float32(2.0 ** (127 - bias - hi))
        return v
    if family == 2:
        return np.float32(mag)
    return edec[mag]


@nb.njit(inline="always", cache=True)
def element_value(c, edec, mbits, s, dither, kap, u, midrise=False, family=0, mant=0, bias=0):
    """Decoded value of element code ``c`` under group scale ``s``.

    With ``dither``, the magnitude is ``edec[mag] + kap * (u - 1/2)`` where ``u`` is the uniform
    the encoder rounded this element with (subtractive dithering): the correction has mean zero
    whatever the level, so the value stays unbiased, and it cancels most of the rounding noise
    (error variance ``E[Δ²]/6 - kap E[Δ]/6 + kap²/12`` instead of ``E[Δ²]/6`` for the level
    gaps ``Δ``; ``kap = E[Δ]`` halves it for uniform levels).

    ``midrise`` (a literal, :func:`element_code`): a negative code's dither uses ``1 - u``, so
    the correction is ``kap * (u - 1/2)`` on the signed value, whichever way the sign went.

    ``family``, ``mant``, ``bias`` (literals): how :func:`level_value` finds the level; with
    family 1 or 2 the code's magnitude must be below the table's finite count (the caller
    decodes the others through the table).

    A finite level times a finite scale saturates at ``±FLT_MAX`` instead of overflowing: the
    scale of a group near float32's top, rounded up, would otherwise turn its largest element
    into Inf. A NaN scale (a flagged group) stays NaN.
    """
    # every integer kept 32-bit: Numba types the result of two uint32 as 64-bit, and the
    # loop's vector lanes follow the widest type
    cu = np.uint32(c)
    neg = np.uint32(np.uint32(cu >> np.uint32(mbits)) & np.uint32(1))
    m = level_value(np.uint32(cu & np.uint32((1 << mbits) - 1)), edec, family, mant, bias,
                    mbits)
    if dither:
        if midrise:
            u = np.float32(1.0) - u if neg != np.uint32(0) else u
        m = m + kap * (u - np.float32(0.5))
    # saturation on the bit pattern: an infinite product (and only that) becomes the largest
    # finite float32 of its sign, one below in the integer order; no compare of floats, so
    # element loops keep no branch and vectorise
    b = np.float32(m * s).view(np.uint32)
    inf = np.uint32(np.uint32(b & np.uint32(0x7FFFFFFF)) == np.uint32(0x7F800000))
    b = np.uint32(b - inf)
    # the sign by flipping the sign bit (what negation does, NaN included): no branch
    flip = np.uint32(neg << np.uint32(31))
    return np.uint32(b ^ flip).view(np.float32)


@nb.njit(inline="always", cache=True)
def store_word(buf, pos, nbytes, code):
    """Little-endian ``nbytes``-byte ``code`` at ``buf[pos:]`` (``pos``: uint64)."""
    c = np.uint64(code)
    for k in range(nbytes):
        buf[pos + np.uint64(k)] = np.uint8((c >> np.uint64(8 * k)) & np.uint64(0xFF))


@nb.njit(inline="always", cache=True)
def load_word(buf, pos, nbytes):
    """Inverse of :func:`store_word`."""
    c = np.uint64(0)
    for k in range(nbytes):
        c |= np.uint64(buf[pos + np.uint64(k)]) << np.uint64(8 * k)
    return c


@nb.njit(inline="always", cache=True)
def encode_scale(ratio, kind, tab, nfin, logp, mode, u):
    """Code of a non-negative scale ``ratio`` (FP32 kind: its raw bits)."""
    if kind == KIND_FP32:
        return np.uint64(np.float32(ratio).view(np.uint32))
    return np.uint64(round_index(ratio, tab, nfin, logp, mode, u))


@nb.njit(inline="always", cache=True)
def encode_scale_bucket(ratio, kind, tab, nfin, lut, lshift, lkey0, llen, mode, u):
    """:func:`encode_scale` through the table's bucket lookup: the same code, two loads
    instead of a binary search's chain of dependent ones."""
    if kind == KIND_FP32:
        return np.uint64(np.float32(ratio).view(np.uint32))
    lo = lut_bracket(ratio, lut, lshift, lkey0, llen, tab, nfin)
    return np.uint64(round_bracket(ratio, lo, tab, nfin, mode, u))


@nb.njit(inline="always", cache=True)
def decode_scale(code, kind, dec):
    if kind == KIND_FP32:
        return np.uint32(code).view(np.float32)
    return dec[code]


@nb.njit(inline="always", cache=True)
def absmax(src, start, count):
    """``(max |src[start:start+count]|, any non-finite)``.

    Computed on the bit patterns: those of non-negative floats order like unsigned integers,
    and an integer maximum is associative, so the loop vectorises (a float maximum or a sum
    test for non-finite values is a serial chain without fast-math). Exponent bits all ones
    (Inf or NaN) flag the group. ``start`` is a uint64 (unsigned indices spare Numba's
    negative-index wrap-around).
    """
    m = np.uint32(0)
    for i in range(count):
        # uint32 on both sides: Numba types the mask's result as 64-bit, which halves the lanes
        m = max(m, np.uint32(np.float32(src[start + np.uint64(i)]).view(np.uint32)
                             & np.uint32(0x7FFFFFFF)))
    return np.uint32(m).view(np.float32), m >= np.uint32(0x7F800000)
