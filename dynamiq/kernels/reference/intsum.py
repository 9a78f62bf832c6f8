"""Reference (NumPy) integer-sum codes: :mod:`dynamiq.kernels.numba.intsum`'s maths as
whole-array operations.

Code ``u`` is the offset-binary integer ``w = u - 2**(bits-1)`` decoded as ``float32(w) * step``
(``u = 0``: NaN); ``v`` codes as ``t = v / step``, ``w = floor(t) + (r < t - floor(t))`` with
``r`` the uniform at the coordinate's global index, clamped to ``±(2**(bits-1) - 1)``.
"""

from __future__ import annotations

import numpy as np

from dynamiq import rng
from dynamiq.kernels.abi import Writeback
from dynamiq.kernels.reference.packing import pack, unpack

__all__ = ["decode", "encode", "recompress"]

_F = np.float32


def codes_of(v: np.ndarray, step: float, bits: int, key: tuple[int, int], offset: int
             ) -> np.ndarray:
    """int64 codes of float32 ``v`` (global indices from ``offset``)."""
    half = 1 << (bits - 1)
    lim = half - 1
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        t = (v / _F(step)).astype(_F)
        f = np.floor(t).astype(_F)
        frac = (t - f).astype(_F)
        r = rng.uniform(key[0], key[1], offset + np.arange(v.size, dtype=np.int64))
        w = np.where(np.isfinite(f), f, 0).astype(np.int64) + (r < frac)
    code = w + half
    code = np.where(t >= _F(lim), lim + half, np.where(t <= _F(-lim), half - lim, code))
    return np.where(np.isfinite(v), code, 0).astype(np.int64)


def values(data: np.ndarray, step: float, bits: int, n: int) -> np.ndarray:
    """float32 ``[n]`` decoded values of the stream ``data``."""
    half = 1 << (bits - 1)
    return _values(unpack(data, bits, n), step, half)


def _values(c: np.ndarray, step: float, half: int) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore"):
        v = ((c - half).astype(_F) * _F(step)).astype(_F)
    return np.where(c == 0, _F(np.nan), v).astype(_F)


def encode(x: np.ndarray, step: float, bits: int, key: tuple[int, int], offset: int
           ) -> np.ndarray:
    """The packed codes (uint8) of float32 ``x``."""
    return pack(codes_of(np.asarray(x, dtype=_F), step, bits, key, offset), bits)


def decode(data: np.ndarray, step: float, bits: int, out: np.ndarray, accumulate: bool
           ) -> np.ndarray:
    """``out (=|+=) values`` (float32)."""
    v = values(data, step, bits, out.size)
    return (out + v).astype(_F) if accumulate else v


def recompress(data: np.ndarray, acc: np.ndarray, step: float, bits: int, key: tuple[int, int],
               offset: int, writeback: Writeback) -> tuple[np.ndarray, np.ndarray]:
    """The codes of ``acc + decode(data)`` and what ``acc`` holds afterwards."""
    acc = np.asarray(acc, dtype=_F)
    with np.errstate(invalid="ignore", over="ignore"):
        v = (acc + values(data, step, bits, acc.size)).astype(_F)
    new = codes_of(v, step, bits, key, offset)
    if writeback == Writeback.SUM:
        acc = v
    elif writeback == Writeback.DECODED:
        acc = _values(new, step, 1 << (bits - 1))
    return pack(new, bits), acc
