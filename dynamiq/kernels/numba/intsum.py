"""Numba kernels of integer-sum codes (the THC partial-sum codec).

Code ``u`` (``bits`` wide, in an LSB-first bit stream, :mod:`dynamiq.kernels.numba.packing`) is
the offset-binary integer ``w = u - 2**(bits-1)``, decoded as ``float32(w) * step``; ``u = 0`` is
NaN. A value is coded by ``t = v / step`` (float32), ``w = floor(t) + (r < t - floor(t))`` with
``r`` the uniform of :func:`dynamiq.kernels.numba.rng.uniform` at the coordinate's global index,
clamped to ``±(2**(bits-1) - 1)``. Each kernel is one serial pass.
"""

from __future__ import annotations

import numba as nb
import numpy as np
import torch

from dynamiq.kernels.abi import Writeback
from dynamiq.kernels.numba.packing import flush_codes, put_code, take_code
from dynamiq.kernels.numba.rng import uniform

__all__ = ["decode", "encode", "recompress"]


@nb.njit(inline="always", cache=True)
def _int_code(v, step, half, k0, k1, index):
    """Offset-binary code of the stochastic rounding of ``v / step`` to an integer."""
    if not np.isfinite(v):
        return np.int64(0)
    lim = half - 1
    t = v / step
    if t >= np.float32(lim):
        return np.int64(lim + half)
    if t <= np.float32(-lim):
        return np.int64(half - lim)
    f = np.floor(t)
    # exact unless -1 < t < 0, where t + 1 rounds to float32 (2**-24 at most: the resolution
    # of the uniform anyway)
    frac = t - f
    w = np.int64(f)
    if uniform(k0, k1, index) < frac:
        w += 1
    return w + half


@nb.njit(inline="always", cache=True)
def _int_value(code, step, half):
    if code == 0:
        return np.float32(np.nan)
    return np.float32(np.int64(code) - half) * step


@nb.njit(cache=True)
def _encode(x, step, bits, k0, k1, offset, out):
    half = np.int64(1) << np.int64(bits - 1)
    wacc, wn, pos = np.uint64(0), 0, 0
    for i in range(x.size):
        code = _int_code(x[i], step, half, k0, k1, offset + i)
        wacc, wn, pos = put_code(out, wacc, wn, pos, code, bits)
    flush_codes(out, wacc, wn, pos)


@nb.njit(cache=True)
def _decode(data, step, bits, out, mode):
    half = np.int64(1) << np.int64(bits - 1)
    mask = np.uint64((1 << bits) - 1)
    racc, rn, pos = np.uint64(0), 0, 0
    for i in range(out.size):
        code, racc, rn, pos = take_code(data, racc, rn, pos, bits, mask)
        val = _int_value(np.int64(code), step, half)
        if mode == 1:
            out[i] = out[i] + val
        else:
            out[i] = val


@nb.njit(cache=True)
def _recompress(data, acc, step, bits, k0, k1, offset, out, mode):
    half = np.int64(1) << np.int64(bits - 1)
    mask = np.uint64((1 << bits) - 1)
    racc, rn, rpos = np.uint64(0), 0, 0
    wacc, wn, wpos = np.uint64(0), 0, 0
    for i in range(acc.size):
        code, racc, rn, rpos = take_code(data, racc, rn, rpos, bits, mask)
        v = acc[i] + _int_value(np.int64(code), step, half)
        new = _int_code(v, step, half, k0, k1, offset + i)
        if mode == 1:
            acc[i] = v
        elif mode == 2:
            acc[i] = _int_value(new, step, half)
        wacc, wn, wpos = put_code(out, wacc, wn, wpos, new, bits)
    flush_codes(out, wacc, wn, wpos)


def encode(x: torch.Tensor, step: float, bits: int, key: tuple[int, int], offset: int,
           out: torch.Tensor) -> None:
    """See :meth:`dynamiq.kernels.backend.Backend.intsum_encode`."""
    _encode(x.numpy(), np.float32(step), bits, key[0], key[1], offset, out.numpy())


def decode(data: torch.Tensor, step: float, bits: int, out: torch.Tensor,
           accumulate: bool) -> None:
    """See :meth:`dynamiq.kernels.backend.Backend.intsum_decode`."""
    _decode(data.numpy(), np.float32(step), bits, out.numpy(), 1 if accumulate else 0)


def recompress(data: torch.Tensor, acc: torch.Tensor, step: float, bits: int,
               key: tuple[int, int], offset: int, writeback: Writeback, out: torch.Tensor
               ) -> None:
    """See :meth:`dynamiq.kernels.backend.Backend.intsum_recompress`."""
    _recompress(data.numpy(), acc.numpy(), np.float32(step), bits, key[0], key[1], offset,
                out.numpy(), int(writeback))
