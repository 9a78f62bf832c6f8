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
piece of maths is one device function below, or in :mod:`dynamiq.kernels.numba.levels` (where
a magnitude lies among a format's levels, and what a level is).
"""

from __future__ import annotations

import numba as nb
import numpy as np

import dynamiq.kernels.numba.stamps  # noqa: F401  (the cache of its functions: see there)
from dynamiq.kernels.abi import FLT_MAX, KIND_FP32, KIND_TABLE, Rounding
from dynamiq.kernels.numba.levels import (
    NEAREST,
    STOCHASTIC,
    UP,
    chain_bracket,
    float_bracket,
    float_nearest,
    halving_bracket8,
    halving_bracket16,
    halving_levels,
    level_value,
    lut_bracket,
    lut_finish,
    lut_key,
    round_bracket,
    round_index,
)
from dynamiq.kernels.numba.rng import (
    stratum,
    stratum_pow2,
    stratum_steps,
    weyl_hash,
    weyl_state,
    weyl_uniform,
)

__all__ = [
    "CORRELATED", "FLT_MAX", "KIND_FP32", "KIND_TABLE", "NEAREST", "STOCHASTIC", "UP", "absmax",
    "decode_scale", "draw_uniform", "draw_weyl", "element_code", "element_value", "encode_scale",
    "encode_scale_bucket", "halving_levels", "level_to_value", "load_word", "lut_finish",
    "lut_key", "round_code", "store_word", "stratified", "walked",
]

# plain ints, which Numba compiles as constants
CORRELATED = int(Rounding.CORRELATED)


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
    w, c = weyl_state(k0, k1, gidx)
    wp, cp = weyl_state(p0, p1, gidx)
    return draw_weyl(mode, w, c, wp, cp, rank, world, pow2)


@nb.njit(inline="always", cache=True)
def draw_weyl(mode, w, c, wp, cp, rank, world, pow2=False):
    """:func:`draw_uniform` of the element whose stream states are ``(w, c)`` under the
    rank's key and ``(wp, cp)`` under the shared one
    (:func:`~dynamiq.kernels.numba.rng.weyl_state`): what a loop over consecutive elements
    draws, advancing both states."""
    g = weyl_uniform(w, c)
    if mode != CORRELATED:
        return g
    return stratified(g, weyl_hash(wp, cp), rank, world, pow2)


@nb.njit(inline="always", cache=True)
def stratified(g, h, rank, world, pow2=False):
    """The correlated uniform ``(π(rank) + g) / world`` of :func:`draw_uniform` from the
    rank's own uniform ``g`` and the element's shared hash ``h``: what a kernel that rounds
    for two ranks at once (a hop decodes the sender's rounding and encodes its own) computes
    from one hash of the shared key."""
    if pow2:
        slot = stratum_pow2(h, rank, world)
        # dividing by a power of two is multiplying by its exact inverse (no quotient here is
        # small enough to be subnormal), which costs a fraction of a vector division
        return (np.float32(slot) + g) * (np.float32(1.0) / np.float32(world))
    slot = stratum(h, rank, world)
    return (np.float32(slot) + g) / np.float32(world)


@nb.njit(inline="always", cache=True)
def walked(g, h, rank, world, m, s, steps):
    """:func:`draw_uniform` of correlated rounding over any world from the rank's own uniform
    ``g`` and the shared hash ``h`` (see :func:`stratified`), its stratum's cycle walk cut at
    ``steps`` (a literal, :func:`~dynamiq.kernels.numba.rng.stratum_steps`; ``m``, ``s``:
    :func:`~dynamiq.kernels.numba.rng.stratum_params`): the same uniform, or -1 for the rare
    element whose walk is longer (the caller draws it again with :func:`draw_uniform`)."""
    slot, done = stratum_steps(h, rank, world, m, s, steps)
    u = (np.float32(slot) + g) / np.float32(world)
    return u if done else np.float32(-1.0)


@nb.njit(forceinline=True, cache=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def element_code(y, u, etab, enfin, lut, lshift, lkey0, llen, mbits, family, mant, bias,
                 emode, midrise, levels):
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
    # Compiled on its own (once per combination of the literal arguments the kernels pass,
    # and cached on disk) and inlined by LLVM, whose constant folding then drops the other
    # families' branches: inlined into Numba's IR instead, the whole function was deep-copied
    # at each call site of each kernel, a fifth of a cold compile.
    a = abs(y)
    top = np.uint32(enfin - 1)
    if family == 0:
        lo = np.uint32(lut_bracket(a, lut, lshift, lkey0, llen, etab, enfin))
        vlo = etab[lo]
        vhi = etab[min(np.uint32(lo + np.uint32(1)), top)]
    elif family == 1 and emode == NEAREST:
        # a level no less than vtop's index codes the top level (see round_code)
        lo = float_nearest(a, mant, bias)
        vlo = vhi = np.float32(0.0)
    elif family == 1:
        lo, vlo, vhi = float_bracket(a, mant, bias)
    elif family == 2:
        lo = np.uint32(min(a, etab[enfin - 1]))
        vlo = np.float32(lo)
        vhi = np.float32(np.uint32(lo + np.uint32(1)))
    elif mbits == 3:
        lo, vlo, vhi = halving_bracket8(a, levels)
    elif mbits == 4:
        lo, vlo, vhi = halving_bracket16(a, levels)
    else:
        lo, vlo, vhi = chain_bracket(a, etab, 1 << mbits)
    return round_code(y, u, lo, vlo, vhi, top, etab[0], mbits, emode, midrise,
                      family == 1 and emode == NEAREST)


@nb.njit(forceinline=True, cache=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def round_code(y, u, lo, vlo, vhi, top, t0, mbits, emode, midrise, rounded):
    """:func:`element_code` of ``y`` whose magnitude's bracket is known: ``lo`` (uint32) the
    floor index among the levels, ``vlo``/``vhi`` its level and the next (``vhi`` may be
    anything when ``lo`` is the top index ``top``), ``t0`` the first level.

    ``rounded`` (a literal): ``lo`` is already the nearest index. The rounding (nearest, ties
    to the even index; stochastic, up with probability ``(|y| - vlo) / (vhi - vlo)``), the
    saturation, the mid-rise crossing of zero and the sign, without a load: a kernel that
    finds the brackets by table loads does so in a loop of its own and codes here in a loop
    that vectorises.
    """
    sign = np.float32(y).view(np.uint32) >> np.uint32(31)
    if midrise and emode != NEAREST:
        u = np.float32(1.0) - u if sign != 0 else u
    a = abs(y)
    # Saturation: every family's floor index reaches the top level exactly when a does, and
    # a value at or above it codes the top level whichever way it rounds, so the rounding may
    # use the unclamped bracket and clamp the index last (a minimum of two uint32, which keeps
    # the vector lanes 32-bit where compares and selects of Numba's integers do not).
    if rounded:
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
        # zero instead: the far side -t0 when u * 2 t0 >= a + t0
        cross = (a < t0) & (u * (t0 + t0) >= a + t0)
        sign = np.uint32(sign ^ np.uint32(cross))
    return np.uint32(np.uint32(m) | np.uint32(sign << np.uint32(mbits)))


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
    m = level_value(np.uint32(cu & np.uint32((1 << mbits) - 1)), edec, family, mant, bias,
                    mbits)
    return level_to_value(cu, m, mbits, s, dither, kap, u, midrise)


@nb.njit(inline="always", cache=True)
def level_to_value(c, m, mbits, s, dither, kap, u, midrise=False):
    """:func:`element_value` of code ``c`` whose magnitude level ``m`` (float32) is already
    known: the dither, the scale, the saturation and the sign.

    A decode whose levels are table loads reads them in a loop of their own and finishes here
    in a loop without loads: the loads alone would keep the whole loop scalar.
    """
    cu = np.uint32(c)
    neg = np.uint32(np.uint32(cu >> np.uint32(mbits)) & np.uint32(1))
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
