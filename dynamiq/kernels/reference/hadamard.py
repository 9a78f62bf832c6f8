"""Reference (NumPy) blocked randomized Hadamard transform, stage by stage.

Per block of ``block`` coordinates: forward ``y = norm * FWHT(d * x)``, inverse
``x = d * (norm * FWHT(y))``; ``d_i = -1`` when ``hash_u32(k0, k1, i)`` is odd (``i`` the global
index), applied as an exact sign-bit flip. ``FWHT`` runs in float32 stages ``h = 1, 2, ...,
block/2``, each replacing every pair ``(a, b) = (v[p], v[p + h])`` (``p & h == 0``) by
``(a + b, a - b)``: the contract of :mod:`dynamiq.kernels.numba.hadamard`.
"""

from __future__ import annotations

import numpy as np

from dynamiq import rng

__all__ = ["fwht", "rht_forward", "rht_inverse"]

_SIGN = np.uint32(0x80000000)


def _flip(v: np.ndarray, key: tuple[int, int]) -> np.ndarray:
    odd = (rng.hash_u32(key[0], key[1], np.arange(v.size, dtype=np.int64)) & 1).astype(bool)
    bits = v.astype(np.float32).view(np.uint32)
    return np.where(odd, bits ^ _SIGN, bits).astype(np.uint32).view(np.float32)


def fwht(v: np.ndarray, block: int) -> np.ndarray:
    """Unnormalised Walsh–Hadamard transform of every block of float32 ``v``."""
    out = np.asarray(v, dtype=np.float32).reshape(-1, block).copy()
    h = 1
    with np.errstate(invalid="ignore", over="ignore"):
        while h < block:
            pairs = out.reshape(out.shape[0], block // (2 * h), 2, h)
            a, b = pairs[:, :, 0, :].copy(), pairs[:, :, 1, :].copy()
            pairs[:, :, 0, :] = a + b
            pairs[:, :, 1, :] = a - b
            h *= 2
    return out.reshape(-1)


def rht_forward(x: np.ndarray, block: int, key: tuple[int, int], norm: float) -> np.ndarray:
    """Forward transform of float32 ``x`` (length a multiple of ``block``)."""
    with np.errstate(invalid="ignore", over="ignore"):
        return (fwht(_flip(x, key), block) * np.float32(norm)).astype(np.float32)


def rht_inverse(y: np.ndarray, block: int, key: tuple[int, int], norm: float) -> np.ndarray:
    """Inverse transform of float32 ``y`` (length a multiple of ``block``)."""
    with np.errstate(invalid="ignore", over="ignore"):
        return _flip((fwht(y, block) * np.float32(norm)).astype(np.float32), key)
