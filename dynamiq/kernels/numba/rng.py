"""Numba twin of :mod:`dynamiq.rng` (bit-identical).

These take and return scalars only, so they are compiled once (and cached) as ordinary
functions that LLVM inlines into the element loops, rather than copied into each caller by
Numba: that keeps the generated kernels' compile time down at no cost in speed.
"""

from __future__ import annotations

import numba as nb
import numpy as np

import dynamiq.kernels.numba.stamps  # noqa: F401  (the cache of its functions: see there)
from dynamiq.rng import GOLDEN

_HI_MUL = np.uint32(0x85EBCA77)
_M1 = np.uint32(0x85EBCA6B)
_M2 = np.uint32(0xC2B2AE35)
_GOLD = np.uint32(GOLDEN)
U32 = np.uint32

# The arithmetic is modulo 2**32 and held in uint32 throughout: every product and sum is cast
# back to uint32 at once (Numba types them 64-bit), so that element loops which draw uniforms
# vectorise with 32-bit lanes and 32-bit multiplies, twice the lanes of 64-bit ones and far
# cheaper than 64-bit vector multiplies. The values are those of dynamiq.rng, which masks
# 64-bit products to 32 bits.


@nb.njit(cache=True)
def fmix32(h):
    h = U32(h)
    h = U32(h ^ (h >> U32(16)))
    h = U32(h * _M1)
    h = U32(h ^ (h >> U32(13)))
    h = U32(h * _M2)
    return U32(h ^ (h >> U32(16)))


#: What the state of :func:`weyl_state` advances by from one element to the next.
WEYL_STEP = _GOLD


@nb.njit(cache=True)
def weyl_state(k0, k1, index):
    """``(w, c)`` (uint32) of element ``index`` under key ``(k0, k1)``: its hash is
    ``weyl_hash(w, c)``; element ``index + t`` has ``w + t * WEYL_STEP`` (mod ``2**32``) and the
    same ``c``, as long as the low 32 bits of the indices do not wrap (see :func:`window_end`).

    A loop over consecutive elements carries ``w`` as an induction variable (one 32-bit add per
    element) instead of forming each index's product: the 64-bit index arithmetic and its
    64-bit multiply were about a third of a vectorised draw's instructions.
    """
    idx = np.uint64(index)
    # the casts to uint32 keep the low 32 bits (the masks of dynamiq.rng)
    lo = U32(idx)
    hi = U32(idx >> np.uint64(32))
    return U32(U32(lo * _GOLD) + U32(np.uint64(k0))), U32(U32(np.uint64(k1)) ^ U32(hi * _HI_MUL))


@nb.njit(cache=True)
def weyl_hash(w, c):
    """The uint32 hash of the element whose :func:`weyl_state` is ``(w, c)``."""
    return fmix32(U32(fmix32(w) ^ c))


@nb.njit(cache=True)
def weyl_uniform(w, c):
    """float32 in [0, 1) with 24 random bits, of the element whose state is ``(w, c)``."""
    h = U32(weyl_hash(w, c))
    return np.float32(U32(h >> U32(8))) * np.float32(5.9604644775390625e-08)


@nb.njit(cache=True)
def window_end(gidx0, j, n, stride):
    """The end (int64, at most ``n``) of the run of elements ``j ..`` whose indices
    ``gidx0 + j * stride ..`` share their high 32 bits, so that one :func:`weyl_state`
    (advanced by ``stride * WEYL_STEP`` per element) serves them all: ``n`` but where the
    run crosses a multiple of ``2**32``."""
    st = np.uint64(stride)
    lo = (np.uint64(gidx0) + np.uint64(j) * st) & np.uint64(0xFFFFFFFF)
    room = (np.uint64(1 << 32) - lo + st - np.uint64(1)) // st
    return np.int64(min(np.uint64(n), np.uint64(j) + room))


@nb.njit(inline="always", cache=True)
def fill_uniforms(ub, n, k0, k1, index):
    """``ub[j] = uniform(k0, k1, index + j)`` for ``j < n``: one loop that carries the hash
    state from each element to the next (:func:`weyl_state`), restarting it only where the
    indices' high words change (:func:`window_end`)."""
    j = 0
    while j < n:
        end = window_end(index, j, n, 1)
        w, c = weyl_state(k0, k1, np.uint64(index) + np.uint64(j))
        for k in range(j, end):
            ub[np.uint64(k)] = weyl_uniform(w, c)
            w = U32(w + WEYL_STEP)
        j = end


@nb.njit(cache=True)
def hash_u32(k0, k1, index):
    """uint32 hash of ``index`` under key ``(k0, k1)``."""
    w, c = weyl_state(k0, k1, index)
    return weyl_hash(w, c)


@nb.njit(cache=True)
def uniform(k0, k1, index):
    """float32 in [0, 1) with 24 random bits."""
    w, c = weyl_state(k0, k1, index)
    return weyl_uniform(w, c)


@nb.njit(cache=True)
def stratum(h, rank, world):
    """Numba twin of :func:`dynamiq.rng.stratum` for one element (uint64 result)."""
    w = np.uint64(world)
    k = np.uint64(0)
    while (np.uint64(1) << k) < w:
        k += np.uint64(1)
    m = (np.uint64(1) << k) - np.uint64(1)
    s = (k + np.uint64(1)) >> np.uint64(1)
    hh = np.uint64(h)
    a = (hh & m) | np.uint64(1)
    b = (hh >> np.uint64(16)) & m
    x = np.uint64(rank)
    while True:
        y = (a * x + b) & m
        x = y ^ (y >> s)
        if x < w:
            return x


@nb.njit(cache=True)
def stratum_pow2(h, rank, world):
    """:func:`stratum` for a power-of-two ``world``, without loops (uint32 result).

    Then the permutation's domain is exactly ``[0, world)``, so the cycle walk ends after its
    first step, and ``log2(world)`` is the float32 exponent of ``world``: the same result, in
    code an element loop can vectorise.
    """
    # 32-bit (see the note above): m < 2**32, so the product is only needed modulo 2**32
    w = U32(world)
    k = U32(U32(np.float32(world).view(np.uint32) >> U32(23)) - U32(127))
    m = U32(w - U32(1))
    s = U32(U32(k + U32(1)) >> U32(1))
    hh = U32(h)
    a = U32(U32(hh & m) | U32(1))
    b = U32(U32(hh >> U32(16)) & m)
    y = U32(U32(U32(a * U32(rank)) + b) & m)
    # uint32, not uint64 like stratum: a 64-bit result would widen the caller's vector lanes
    return U32(y ^ U32(y >> U32(s & U32(31))))


@nb.njit(cache=True)
def stratum_params(world):
    """``(m, s)`` (uint32) of :func:`stratum`'s permutation for ``world``: the mask of the
    smallest power of two at or above it, and the permutation's shift. Computed once per
    loop, outside it."""
    k = 0
    while (1 << k) < world:
        k += 1
    return U32((1 << k) - 1), U32((k + 1) >> 1)


@nb.njit(cache=True)
def stratum_steps(h, rank, world, m, s, steps):
    """:func:`stratum` (``m``, ``s``: :func:`stratum_params`) with its cycle walk cut at
    ``steps`` steps (a literal): ``(slot, done)``, ``slot`` (uint32) the stratum when ``done``.

    No exit depends on the data, so an element loop that calls it vectorises; the walk ends
    within a few steps for all but a small fraction of elements (each step leaves the world's
    range with probability below one half), which the caller draws again with
    :func:`stratum`.
    """
    # 32-bit arithmetic: the mask keeps at most 32 low bits, which the products modulo 2**32
    # give exactly (see stratum_pow2)
    hh = U32(h)
    a = U32(U32(hh & m) | U32(1))
    b = U32(U32(hh >> U32(16)) & m)
    w = U32(world)
    x = U32(rank)
    slot = U32(0)
    done = False
    for _ in range(steps):
        y = U32(U32(U32(a * x) + b) & m)
        x = U32(y ^ U32(y >> U32(s & U32(31))))
        first = (x < w) & (not done)
        slot = x if first else slot
        done = done | first
    return slot, done
