"""Counter-based random numbers shared by every backend.

A random number is a pure function of ``(key, element index)``; the key is derived on the host
from ``(seed, stream...)`` (stream values name the step, rank, purpose, ...). No state is carried
between calls, so any kernel (Numba, Triton, or this NumPy reference) that sees the same key and
index draws exactly the same number, and work can be split over threads or blocks freely.

The mixing function is the 32-bit finalizer of MurmurHash3 applied twice. All arithmetic is on
unsigned 32-bit words with wrap-around, which both Numba (via explicit masking) and Triton
(``tl.uint32``) reproduce exactly.
"""

from __future__ import annotations

import functools

import numpy as np

__all__ = ["GOLDEN", "MASK32", "MAX_WORLD", "fmix32", "hash_u32", "make_key", "make_keys",
           "stratum", "uniform"]

MASK32 = 0xFFFFFFFF
GOLDEN = 0x9E3779B1  # odd, close to 2**32 / golden ratio
_HI_MUL = 0x85EBCA77
_M1 = 0x85EBCA6B
_M2 = 0xC2B2AE35


def fmix32(h: int) -> int:
    """MurmurHash3's 32-bit finalizer on a Python int (host-side, exact)."""
    h &= MASK32
    h ^= h >> 16
    h = (h * _M1) & MASK32
    h ^= h >> 13
    h = (h * _M2) & MASK32
    h ^= h >> 16
    return h


@functools.lru_cache(maxsize=1 << 16)
def make_key(seed: int, *streams: int) -> tuple[int, int]:
    """Derive a 2-word kernel key from a seed and any number of stream identifiers.

    Args:
        seed: Any non-negative Python int (only its low 64 bits are used).
        *streams: Non-negative ints that separate independent streams (step, rank, purpose ...).

    Returns:
        ``(k0, k1)``, two uint32 values passed to kernels.
    """
    if seed < 0 or any(s < 0 for s in streams):
        raise ValueError("seed and stream ids must be non-negative integers")
    if not streams:
        k0 = fmix32(seed ^ 0x243F6A88)
        return k0, fmix32((seed >> 32) ^ 0x85A308D3 ^ k0)
    # the key folds the streams in one at a time, so it extends its prefix's key: keys that
    # share a prefix (every rank's keys of one step, every purpose of one rank) share its
    # cached value and pay for the last stream only
    k0, k1 = make_key(seed, *streams[:-1])
    s = streams[-1]
    k0 = fmix32(k0 ^ fmix32(s & MASK32) ^ fmix32((s >> 32) + 0x13198A2E))
    return k0, fmix32(k1 + GOLDEN ^ k0)


def make_keys(seed: int, *streams: int | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`make_key` of many stream tuples at once.

    Args:
        seed: As for :func:`make_key`.
        *streams: Non-negative ints or integer arrays (below ``2**63``), broadcast together:
            element ``i`` of the result is the key of the ``i``-th stream tuple.

    Returns:
        ``(k0, k1)``: uint64 arrays of the broadcast shape holding uint32 values, equal to
        ``make_key(seed, *(s[i] for s in streams))`` element by element.
    """
    cols = [np.asarray(s) for s in streams]
    if any(c.size and (not np.issubdtype(c.dtype, np.integer) or int(c.min()) < 0) for c in cols):
        raise ValueError("stream ids must be non-negative integers")
    shape = np.broadcast_shapes(*(c.shape for c in cols)) if cols else ()
    # the leading streams that are plain ints fold on the host (cached), the rest in NumPy
    lead = 0
    while lead < len(cols) and cols[lead].ndim == 0:
        lead += 1
    k0s, k1s = make_key(seed, *(int(c) for c in cols[:lead]))
    k0 = np.full(shape, k0s, dtype=np.uint64)
    k1 = np.full(shape, k1s, dtype=np.uint64)
    mask, tail = np.uint64(MASK32), np.uint64(0x13198A2E)
    for c in cols[lead:]:
        s = np.broadcast_to(c.astype(np.uint64), shape)
        k0 = _fmix32_np(k0 ^ _fmix32_np(s & mask) ^ _fmix32_np((s >> np.uint64(32)) + tail))
        k1 = _fmix32_np(((k1 + np.uint64(GOLDEN)) & mask) ^ k0)
    return k0, k1


def _fmix32_np(h: np.ndarray) -> np.ndarray:
    h = h.astype(np.uint64) & MASK32
    h ^= h >> np.uint64(16)
    h = (h * np.uint64(_M1)) & np.uint64(MASK32)
    h ^= h >> np.uint64(13)
    h = (h * np.uint64(_M2)) & np.uint64(MASK32)
    h ^= h >> np.uint64(16)
    return h


def hash_u32(k0: int, k1: int, index: np.ndarray) -> np.ndarray:
    """Reference: the uint32 hash of each element index under key ``(k0, k1)``.

    Args:
        k0, k1: A key from :func:`make_key`.
        index: Integer array of element indices (``>= 0``, any shape).

    Returns:
        ``uint32`` array of the same shape. Equivalent to the Numba ``hash_u32`` kernel function.
    """
    idx = np.asarray(index, dtype=np.uint64)
    lo = idx & np.uint64(MASK32)
    hi = idx >> np.uint64(32)
    h = _fmix32_np((lo * np.uint64(GOLDEN) + np.uint64(k0)) & np.uint64(MASK32))
    h = _fmix32_np(h ^ np.uint64(k1) ^ ((hi * np.uint64(_HI_MUL)) & np.uint64(MASK32)))
    return h.astype(np.uint32)


def uniform(k0: int, k1: int, index: np.ndarray) -> np.ndarray:
    """Reference: float32 uniforms in ``[0, 1)`` with 24 random bits, ``(hash >> 8) * 2**-24``."""
    h = hash_u32(k0, k1, index)
    return ((h >> np.uint32(8)).astype(np.float32) * np.float32(2.0**-24)).astype(np.float32)


#: Largest world size :func:`stratum` supports (16 bits of the hash per parameter).
MAX_WORLD = 1 << 16


def _perm_params(world: int) -> tuple[int, int]:
    """``(mask, shift)``: the power-of-two domain ``[0, mask]`` covering ``world`` and the
    xorshift distance of the permutation round."""
    k = max(0, (int(world) - 1).bit_length())
    return (1 << k) - 1, (k + 1) // 2


def stratum(h: np.ndarray, rank: int, world: int) -> np.ndarray:
    """The stratum of ``rank`` under a per-element random permutation of ``world`` ranks.

    Correlated rounding gives every rank one stratum ``[s/world, (s+1)/world)`` per element, a
    permutation of the ranks drawn from the shared hash ``h`` (uint32, one per element). The
    permutation is ``x ↦ g(x)`` iterated until it lands in ``[0, world)`` (cycle walking) where
    ``g(x) = y ^ (y >> shift)`` with ``y = (a·x + b) mod 2^k``, ``a = (h mod 2^k) | 1`` odd and
    ``b = (h >> 16) mod 2^k`` over the smallest ``2^k >= world``: a bijection of ``[0, 2^k)``,
    so its cycle walk is a bijection of ``[0, world)``. Consecutive ranks (successive hops of a
    ring) get unrelated strata, unlike a cyclic shift, which would give them adjacent ones.

    Args:
        h: uint32 (or uint64 holding uint32) hashes, any shape.
        rank: ``0 <= rank < world``.
        world: ``1 <= world <= MAX_WORLD``.

    Returns:
        uint64 strata, ``h``'s shape.
    """
    if not 1 <= world <= MAX_WORLD:
        raise ValueError(f"world size must be in [1, {MAX_WORLD}], got {world}")
    mask, shift = _perm_params(world)
    h = np.asarray(h, dtype=np.uint64)
    m, s = np.uint64(mask), np.uint64(shift)
    a = (h & m) | np.uint64(1)
    b = (h >> np.uint64(16)) & m
    x = np.full(h.shape, rank, dtype=np.uint64)
    todo = np.ones(h.shape, dtype=bool)
    while todo.any():
        y = (a * x + b) & m
        y ^= y >> s
        x = np.where(todo, y, x)
        todo &= x >= np.uint64(world)
    return x
