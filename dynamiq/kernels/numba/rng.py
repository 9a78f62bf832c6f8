"""Numba twin of :mod:`dynamiq.rng` (bit-identical).

These take and return scalars only, so they are compiled once (and cached) as ordinary
functions that LLVM inlines into the element loops, rather than copied into each caller by
Numba: that keeps the generated kernels' compile time down at no cost in speed.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from dynamiq.rng import GOLDEN, MASK32

_HI_MUL = np.uint64(0x85EBCA77)
_M1 = np.uint64(0x85EBCA6B)
_M2 = np.uint64(0xC2B2AE35)
_MASK = np.uint64(MASK32)
_GOLD = np.uint64(GOLDEN)


@nb.njit(cache=True)
def fmix32(h):
    h = np.uint64(h) & _MASK
    h ^= h >> np.uint64(16)
    h = (h * _M1) & _MASK
    h ^= h >> np.uint64(13)
    h = (h * _M2) & _MASK
    h ^= h >> np.uint64(16)
    return h


@nb.njit(cache=True)
def hash_u32(k0, k1, index):
    """uint32 hash (held in a uint64) of ``index`` under key ``(k0, k1)``."""
    idx = np.uint64(index)
    lo = idx & _MASK
    hi = idx >> np.uint64(32)
    h = fmix32((lo * _GOLD + np.uint64(k0)) & _MASK)
    return fmix32(h ^ np.uint64(k1) ^ ((hi * _HI_MUL) & _MASK))


@nb.njit(cache=True)
def uniform(k0, k1, index):
    """float32 in [0, 1) with 24 random bits."""
    h = hash_u32(k0, k1, index)
    return np.float32(h >> np.uint64(8)) * np.float32(5.9604644775390625e-08)


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
    """:func:`stratum` for a power-of-two ``world``, without loops.

    Then the permutation's domain is exactly ``[0, world)``, so the cycle walk ends after its
    first step, and ``log2(world)`` is the float32 exponent of ``world``: the same result, in
    code an element loop can vectorise.
    """
    w = np.uint64(world)
    k = np.uint64((np.float32(world).view(np.uint32) >> np.uint32(23)) - np.uint32(127))
    m = w - np.uint64(1)
    s = (k + np.uint64(1)) >> np.uint64(1)
    hh = np.uint64(h)
    a = (hh & m) | np.uint64(1)
    b = (hh >> np.uint64(16)) & m
    y = (a * np.uint64(rank) + b) & m
    return y ^ (y >> s)
