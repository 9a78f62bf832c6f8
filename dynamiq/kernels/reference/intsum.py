"""Reference (NumPy) integer-sum codes: :mod:`dynamiq.kernels.numba.intsum`'s maths as
whole-array operations.

Code ``u`` is the offset-binary integer ``w = u - 2**(bits-1)`` decoded as ``(float32(w) -
shift) * step`` (``u = 0``: NaN); ``v`` codes as ``t = v / step + shift``, ``w = floor(t) + (r <
t - floor(t))`` with ``r`` the uniform at the coordinate's global index, clamped to
``±(2**(bits-1) - 1)``. :func:`round_levels` is THC's rounding onto a level table.
"""

from __future__ import annotations

import numpy as np

from dynamiq import rng
from dynamiq.kernels.abi import LevelGrid, Writeback
from dynamiq.kernels.reference.packing import pack, unpack

__all__ = ["decode", "encode", "recompress", "round_levels"]

_F = np.float32


def codes_of(v: np.ndarray, step: float, bits: int, key: tuple[int, int], offset: int,
             shift: float = 0.0) -> np.ndarray:
    """int64 codes of float32 ``v`` (global indices from ``offset``)."""
    half = 1 << (bits - 1)
    lim = half - 1
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        t = ((v / _F(step)).astype(_F) + _F(shift)).astype(_F)
        f = np.floor(t).astype(_F)
        frac = (t - f).astype(_F)
        r = rng.uniform(key[0], key[1], offset + np.arange(v.size, dtype=np.int64))
        w = np.where(np.isfinite(f), f, 0).astype(np.int64) + (r < frac)
    code = w + half
    code = np.where(t >= _F(lim), lim + half, np.where(t <= _F(-lim), half - lim, code))
    return np.where(np.isfinite(v), code, 0).astype(np.int64)


def values(data: np.ndarray, step: float, bits: int, n: int, shift: float = 0.0) -> np.ndarray:
    """float32 ``[n]`` decoded values of the stream ``data``."""
    half = 1 << (bits - 1)
    return _values(unpack(data, bits, n), step, half, shift)


def _values(c: np.ndarray, step: float, half: int, shift: float) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore"):
        w = ((c - half).astype(_F) - _F(shift)).astype(_F)
        v = (w * _F(step)).astype(_F)
    return np.where(c == 0, _F(np.nan), v).astype(_F)


def encode(x: np.ndarray, step: float, bits: int, key: tuple[int, int], offset: int,
           shift: float = 0.0) -> np.ndarray:
    """The packed codes (uint8) of float32 ``x``."""
    return pack(codes_of(np.asarray(x, dtype=_F), step, bits, key, offset, shift), bits)


def decode(data: np.ndarray, step: float, bits: int, out: np.ndarray, accumulate: bool,
           shift: float = 0.0) -> np.ndarray:
    """``out (=|+=) values`` (float32)."""
    v = values(data, step, bits, out.size, shift)
    return (out + v).astype(_F) if accumulate else v


def recompress(data: np.ndarray, acc: np.ndarray, step: float, bits: int, key: tuple[int, int],
               offset: int, writeback: Writeback, shift_in: float = 0.0, shift_out: float = 0.0
               ) -> tuple[np.ndarray, np.ndarray]:
    """The codes of ``acc + decode(data)`` and what ``acc`` holds afterwards."""
    acc = np.asarray(acc, dtype=_F)
    with np.errstate(invalid="ignore", over="ignore"):
        v = (acc + values(data, step, bits, acc.size, shift_in)).astype(_F)
    new = codes_of(v, step, bits, key, offset, shift_out)
    if writeback == Writeback.SUM:
        acc = v
    elif writeback == Writeback.DECODED:
        acc = _values(new, step, 1 << (bits - 1), shift_out)
    return pack(new, bits), acc


def round_levels(x: np.ndarray, step: float, grid: LevelGrid, key: tuple[int, int],
                 offset: int) -> np.ndarray:
    """float32 ``(c - g/2) * step`` for THC's level ``c`` of every value of float32 ``x``: the
    stochastic rounding of ``u = clamp(x / step + g/2, 0, g)`` to the neighbouring levels
    ``a <= u <= b``, up with probability ``(u - a) / (b - a)``; NaN where ``x`` is not finite."""
    x = np.asarray(x, dtype=_F)
    g = grid.granularity
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        u = ((x / _F(step)).astype(_F) + _F(0.5 * g)).astype(_F)
        u = np.minimum(np.maximum(u, _F(0.0)), _F(g)).astype(_F)
        cell = np.minimum(np.floor(np.where(np.isfinite(u), u, 0)).astype(np.int64), g - 1)
        a = grid.lower[cell].astype(np.int64)
        b = grid.upper[cell].astype(np.int64)
        p = ((u - a.astype(_F)).astype(_F) / (b - a).astype(_F)).astype(_F)
        r = rng.uniform(key[0], key[1], offset + np.arange(x.size, dtype=np.int64))
        c = np.where(r < p, b, a)
        out = ((2 * c - g).astype(_F) * (_F(0.5) * _F(step))).astype(_F)
    return np.where(np.isfinite(x), out, _F(np.nan)).astype(_F)
