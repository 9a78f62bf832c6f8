"""Triton twin of :mod:`dynamiq.rng` and :mod:`dynamiq.kernels.numba.rng` (bit-identical).

The hash works on ``tl.uint32`` values: Triton's unsigned 32-bit multiply, add and xor wrap
modulo ``2**32`` (``mul.lo.u32`` on NVIDIA, numpy ``uint32`` in the interpreter), which is
exactly the masking the Numba and NumPy versions do on 64-bit words. Shifts of unsigned values are
logical. Every constant is materialised as a ``tl.uint32`` so that no operand is promoted to a
wider or signed type.
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["fmix32", "hash_u32", "stratum", "uniform"]

_GOLD = tl.constexpr(0x9E3779B1)
_HI_MUL = tl.constexpr(0x85EBCA77)
_M1 = tl.constexpr(0x85EBCA6B)
_M2 = tl.constexpr(0xC2B2AE35)


@triton.jit
def _u32(v):
    """The constant ``v`` (a Python int below ``2**32``) as a ``tl.uint32`` scalar."""
    return tl.full((), v, tl.uint32)


@triton.jit
def fmix32(h):
    """MurmurHash3's 32-bit finalizer of a ``tl.uint32`` tensor (equivalent to numba ``fmix32``)."""
    h = h ^ (h >> 16)
    h = h * _u32(_M1)
    h = h ^ (h >> 13)
    h = h * _u32(_M2)
    h = h ^ (h >> 16)
    return h


@triton.jit
def hash_u32(k0, k1, index):
    """uint32 hash of each element index under the key ``(k0, k1)``.

    Args:
        k0, k1: ``tl.uint32`` scalars (a key from :func:`dynamiq.rng.make_key`).
        index: ``tl.int64`` tensor of element indices (``>= 0``).

    Returns:
        ``tl.uint32`` tensor of ``index``'s shape; equivalent to numba ``hash_u32``.
    """
    lo = (index & 0xFFFFFFFF).to(tl.uint32)
    hi = (index >> 32).to(tl.uint32)
    h = fmix32(lo * _u32(_GOLD) + k0)
    return fmix32(h ^ k1 ^ (hi * _u32(_HI_MUL)))


@triton.jit
def uniform(k0, k1, index):
    """float32 uniforms in ``[0, 1)`` with 24 random bits: ``(hash >> 8) * 2**-24`` (exact)."""
    h = hash_u32(k0, k1, index)
    return (h >> 8).to(tl.float32) * 5.9604644775390625e-08


@triton.jit
def stratum(h, rank, world):
    """The stratum of ``rank`` under the per-element random permutation drawn from ``h``.

    Equivalent to numba ``stratum`` and :func:`dynamiq.rng.stratum`: over the smallest
    ``2**k >= world``, ``g(x) = y ^ (y >> ((k + 1) // 2))`` with ``y = (a * x + b) mod 2**k``,
    ``a = (h mod 2**k) | 1``, ``b = (h >> 16) mod 2**k``, applied to ``x = rank`` at least once
    and repeated until ``x < world`` (cycle walking). ``a * x + b`` may wrap modulo ``2**32``;
    only its low ``k <= 16`` bits are kept, which wrapping does not change.

    Args:
        h: ``tl.uint32`` tensor of shared hashes (one per element).
        rank, world: ``tl.uint32`` scalars, ``rank < world <= 2**16``.

    Returns:
        ``tl.uint32`` strata in ``[0, world)``, ``h``'s shape.
    """
    k = 0
    while (1 << k) < world:
        k += 1
    m = ((1 << k) - 1).to(tl.uint32)
    s = ((k + 1) >> 1).to(tl.uint32)
    a = (h & m) | 1
    b = (h >> 16) & m
    x = tl.zeros(h.shape, tl.uint32) + rank
    todo = x == x
    while tl.max(todo.to(tl.int32)) > 0:
        y = (a * x + b) & m
        y = y ^ (y >> s)
        x = tl.where(todo, y, x)
        todo = todo & (x >= world)
    return x
