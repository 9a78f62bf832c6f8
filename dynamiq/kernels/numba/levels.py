"""Numba device functions that place a magnitude among a format's levels, and read a level.

The searches return the bracket of a non-negative magnitude ``a`` in a format's ascending
level table (the last level at or below ``a``, and the one above), or its rounded index; each
element *family* of :func:`dynamiq.kernels.tables.element_family` has a search that gives the
table search's bits without table gathers where the levels allow it (minifloat and integer
grids by arithmetic, small tables by compares and selects in vector registers), and
:func:`level_value` reads a level the same way. :mod:`dynamiq.kernels.numba.elements` codes
and decodes elements with them.
"""

from __future__ import annotations

import numba as nb
import numpy as np

import dynamiq.kernels.numba.stamps  # noqa: F401  (the cache of its functions: see there)
from dynamiq.kernels.abi import Rounding

__all__ = [
    "chain_bracket", "float_bracket", "float_nearest", "halving_bracket8", "halving_bracket16",
    "halving_levels", "level_value", "lut_bracket", "lut_finish", "lut_key", "round_between",
    "round_bracket", "round_grid", "round_index", "search_bracket", "select_tree", "tree_levels",
]

# plain ints, which Numba compiles as constants
NEAREST = int(Rounding.NEAREST)
STOCHASTIC = int(Rounding.STOCHASTIC)
UP = int(Rounding.UP)


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
    return round_between(a, lo, hi, tab[lo], tab[hi], mode, u)


@nb.njit(inline="always", cache=True)
def round_between(a, lo, hi, vlo, vhi, mode, u):
    """:func:`round_bracket` given the bracket's indices ``lo <= hi`` (uint32) and its levels
    ``vlo``, ``vhi``: the rounded index."""
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
def round_grid(a, k, mode, u):
    """:func:`round_bracket` of ``a >= 0`` (or NaN) in the table of levels ``float32(i) /
    float32(k)``, ``i = 0 .. k`` (:func:`dynamiq.kernels.tables.uniform_grid`), by arithmetic:
    the same index without a table load, so a loop over many values vectorises.

    ``a * k`` truncated is the bracket's floor index up to the rounding of that product; one
    compare with each neighbouring level, computed as the table computes it, corrects it. NaN
    and values at or beyond the top level give the top index, as the table search does.
    """
    kf = np.float32(k)
    top = np.uint32(k)
    t = a * kf
    # NaN and +inf fail the compare and saturate, as in the bucket lookup
    lo = np.uint32(t) if t < kf else top
    lo = lo - np.uint32((np.float32(lo) / kf > a) & (lo > np.uint32(0)))
    lo = lo + np.uint32((lo < top) & (np.float32(lo + np.uint32(1)) / kf <= a))
    hi = min(lo + np.uint32(1), top)
    return round_between(a, lo, hi, np.float32(lo) / kf, np.float32(hi) / kf, mode, u)


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
    return lut_finish(a, lut_key(a, lshift, lkey0, llen), lut, tab, nfin)


@nb.njit(inline="always", cache=True)
def lut_finish(a, key, lut, tab, nfin):
    """:func:`lut_bracket` of ``a >= 0`` whose bucket ``key`` (:func:`lut_key`) is known: the
    bucket's floor index, and one compare with the level above it (uint32)."""
    lo = np.uint32(lut[key])
    return min(np.uint32(lo + np.uint32(tab[lo + np.uint32(1)] <= a)), np.uint32(nfin - 1))


@nb.njit(inline="always", cache=True)
def lut_key(a, lshift, lkey0, llen):
    """The bucket of ``a >= 0`` in :func:`lut_bracket`'s table (uint32): its float32 bit
    pattern shifted right by ``lshift``, less ``lkey0``, clamped to ``[0, llen)``.

    Unsigned 32-bit throughout (the maximum before the subtraction keeps it from wrapping), so
    a loop of keys vectorises with 32-bit lanes.
    """
    key = np.uint32(np.float32(a).view(np.uint32) >> np.uint32(lshift))
    k0 = np.uint32(lkey0)
    return min(np.uint32(max(key, k0) - k0), np.uint32(llen - 1))


@nb.njit(inline="always", cache=True)
def round_index(a, tab, nfin, logp, mode, u):
    """Index of the table entry that ``a >= 0`` rounds to (binary search + rounding)."""
    return round_bracket(a, search_bracket(a, tab, nfin, logp), tab, nfin, mode, u)


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


@nb.njit(inline="always", cache=True)
def halving_bracket9(a, lo, c0, c1, c2, c3, c4, c5, c6, c7, c8):
    """The last three steps of :func:`halving_bracket8`: the bracket of ``a`` among the nine
    ascending values ``c0 .. c8`` (eight levels and the one above), ``lo`` the index of
    ``c0`` (its low three bits zero)."""
    up = a >= c4
    d0 = c4 if up else c0
    d1 = c5 if up else c1
    d2 = c6 if up else c2
    d3 = c7 if up else c3
    d4 = c8 if up else c4
    lo = np.uint32(lo | np.uint32(np.uint32(up) << np.uint32(2)))
    up = a >= d2
    e0 = d2 if up else d0
    e1 = d3 if up else d1
    e2 = d4 if up else d2
    lo = np.uint32(lo | np.uint32(np.uint32(up) << np.uint32(1)))
    up = a >= e1
    return (np.uint32(lo | np.uint32(up)), e1 if up else e0, e2 if up else e1)


@nb.njit(inline="always", cache=True)
def halving_levels(tab, mbits):
    """The table entries that :func:`halving_bracket8` or :func:`halving_bracket16` reads for
    ``mbits`` 3 or 4 (a literal): ``2**mbits + 1`` of them, as a tuple of 17 whatever
    ``mbits`` is (the rest repeat the last entry read; for other widths, ``tab[0]`` only).

    Loaded by the caller *before* its element loop: loads inside the loop that feed selects
    are sunk into the selects' branches, merged into one load of a selected address and
    vectorised as gathers, which costs more than the search saves. One length for every width
    gives :func:`~dynamiq.kernels.numba.elements.element_code` one argument type, so every
    branch of it types for every width (it is compiled on its own, where the branches of the
    other widths are not pruned before typing).
    """
    if mbits == 3:
        t8 = tab[8]
        return (tab[0], tab[1], tab[2], tab[3], tab[4], tab[5], tab[6], tab[7], t8,
                t8, t8, t8, t8, t8, t8, t8, t8)
    if mbits == 4:
        return (tab[0], tab[1], tab[2], tab[3], tab[4], tab[5], tab[6], tab[7], tab[8],
                tab[9], tab[10], tab[11], tab[12], tab[13], tab[14], tab[15], tab[16])
    t0 = tab[0]
    return (t0, t0, t0, t0, t0, t0, t0, t0, t0, t0, t0, t0, t0, t0, t0, t0, t0)


@nb.njit(inline="always", cache=True)
def halving_bracket8(a, t):
    """:func:`chain_bracket` of an 8-level table by binary search in registers.

    ``t`` holds the table's first 9 entries (and more, :func:`halving_levels`). Each step
    compares ``a`` with the middle of the levels still in play and keeps the half it lies in,
    moving values with selects: ``log2(n)`` compares and ``n + log2(n) - 1`` selects for
    ``n`` levels, where the chain takes ``n - 1`` compares, ``2 (n - 1)`` selects and a
    count. The same bracket: the levels ascend strictly and the padding above them is +inf, so
    the last level at or below ``a`` is found either way (for ``a = +inf`` both give the top
    index, for NaN both give 0).
    """
    return halving_bracket9(a, np.uint32(0), t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7],
                            t[8])


@nb.njit(inline="always", cache=True)
def halving_bracket16(a, t):
    """:func:`halving_bracket8` of a 16-level table (``t``: its first 17 entries,
    :func:`halving_levels`)."""
    up = a >= t[8]
    return halving_bracket9(
        a, np.uint32(np.uint32(up) << np.uint32(3)),
        t[8] if up else t[0], t[9] if up else t[1], t[10] if up else t[2],
        t[11] if up else t[3], t[12] if up else t[4], t[13] if up else t[5],
        t[14] if up else t[6], t[15] if up else t[7], t[16] if up else t[8])


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

    Equivalent to ``float_nearest_with(a, *float_nearest_consts(mant, bias))``.
    """
    drop, flip, half, offset, scale, top, normal_ex = float_nearest_consts(mant, bias)
    return float_nearest_with(a, drop, flip, half, offset, scale, top, normal_ex)


@nb.njit(inline="always", cache=True)
def float_nearest_consts(mant, bias):
    """The constants of :func:`float_nearest` on the grid of ``mant`` mantissa bits and exponent
    ``bias``: computed once before a loop when the grid is a runtime value (literals fold)."""
    drop = 23 - mant
    # the index's parity is the pattern's bit `drop`, and also the exponent offset's parity
    # when the grid has no mantissa bits
    flip = (127 - bias) & 1 if mant == 0 else 0
    return (np.uint32(drop), np.uint32(flip), np.uint32((1 << (drop - 1)) - 1),
            np.uint32((127 - bias) << mant), np.float32(2.0 ** (bias - 1 + mant)),
            np.float32(1 << mant), np.uint32(128 - bias))


@nb.njit(inline="always", cache=True)
def float_nearest_with(a, drop, flip, half, offset, scale, top, normal_ex):
    """:func:`float_nearest` of ``a >= 0`` given :func:`float_nearest_consts`."""
    bits = np.float32(a).view(np.uint32)
    odd = np.uint32(np.uint32(np.uint32(bits >> drop) & np.uint32(1)) ^ flip)
    r = np.uint32(np.uint32(bits + half) + odd)
    lo_n = np.uint32(np.uint32(r >> drop) - offset)
    q = np.uint32(np.rint(min(a * scale, top)))
    normal = np.uint32(bits >> np.uint32(23)) >= normal_ex
    return lo_n if normal else q


@nb.njit(forceinline=True, cache=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def tree_levels(tab, mbits):
    """The entries of ``tab`` that :func:`select_tree` reads for ``mbits`` (a literal): a tuple
    of 16, ``tab[k]`` for ``k < 2**mbits`` and the last of those after (any ``mbits``; above 4,
    the first 16 entries).

    Loaded by the caller before its element loop, like :func:`halving_levels`: loads that
    feed selects inside the loop are merged into one load of a selected address and
    vectorised as gathers.
    """
    top = (1 << mbits) - 1
    return (tab[0], tab[min(1, top)], tab[min(2, top)], tab[min(3, top)], tab[min(4, top)],
            tab[min(5, top)], tab[min(6, top)], tab[min(7, top)], tab[min(8, top)],
            tab[min(9, top)], tab[min(10, top)], tab[min(11, top)], tab[min(12, top)],
            tab[min(13, top)], tab[min(14, top)], tab[min(15, top)])


@nb.njit(forceinline=True, cache=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def select_tree(mag, t):
    """``t[mag]`` for a magnitude code ``mag < 16`` (uint32) and the 16 entries ``t`` of
    :func:`tree_levels`, without a load.

    Each bit of ``mag``, lowest first, halves the entries still in play with one select per
    pair: 15 selects and 4 bit tests, where a chain of selects against every entry takes 15
    selects and 15 compares. Entries past a smaller table repeat its last one, so LLVM folds
    their selects, and the tests of the bits that the caller's mask clears.
    """
    b = np.uint32(mag & np.uint32(1)) != np.uint32(0)
    p0, p1 = (t[1] if b else t[0]), (t[3] if b else t[2])
    p2, p3 = (t[5] if b else t[4]), (t[7] if b else t[6])
    p4, p5 = (t[9] if b else t[8]), (t[11] if b else t[10])
    p6, p7 = (t[13] if b else t[12]), (t[15] if b else t[14])
    b = np.uint32(mag & np.uint32(2)) != np.uint32(0)
    q0, q1, q2, q3 = (p1 if b else p0), (p3 if b else p2), (p5 if b else p4), (p7 if b else p6)
    b = np.uint32(mag & np.uint32(4)) != np.uint32(0)
    r0, r1 = (q1 if b else q0), (q3 if b else q2)
    return r1 if np.uint32(mag & np.uint32(8)) != np.uint32(0) else r0


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
      :data:`~dynamiq.kernels.tables.CHAIN_LEVELS`) is read through a tree of selects
      (:func:`select_tree`; a kernel loads the entries before its element loop,
      :func:`tree_levels`, and the selects run in vector lanes). Every code, the non-finite
      ones included, gets its table value.

    Families 1 and 2 hold for the finite codes only: those at or beyond the finite count must
    be decoded from the table.
    """
    if family == 3:
        return select_tree(mag, tree_levels(edec, mbits))
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
