"""Numba kernels of integer-sum codes (the THC partial-sum codec).

Code ``u`` (``bits`` wide, in an LSB-first bit stream, :mod:`dynamiq.kernels.numba.packing`) is
the offset-binary integer ``w = u - 2**(bits-1)``, decoded as ``(float32(w) - shift) * step``;
``u = 0`` is NaN. A value is coded by ``t = v / step + shift`` (float32), ``w = floor(t) + (r <
t - floor(t))`` with ``r`` the uniform of :func:`dynamiq.kernels.numba.rng.uniform` at the
coordinate's global index, clamped to ``±(2**(bits-1) - 1)``. The ``shift`` (0 or 1/2) puts the
grid of a partial sum whose values are odd multiples of ``step / 2`` onto the integers.

:func:`round_levels` is THC's rounding of one rank's own values onto a level table (see
:mod:`dynamiq.codecs.thc_levels`). Each kernel is one serial pass.
"""

from __future__ import annotations

import numba as nb
import numpy as np
import torch

import dynamiq.kernels.numba.stamps  # noqa: F401  (the cache of its functions: see there)
from dynamiq.kernels.abi import LevelGrid, Writeback
from dynamiq.kernels.numba.packing import flush_codes, put_code, take_code
from dynamiq.kernels.numba.rng import uniform

__all__ = ["decode", "encode", "recompress", "round_levels"]


@nb.njit(inline="always", cache=True)
def _int_code(v, step, shift, half, k0, k1, index):
    """Offset-binary code of the stochastic rounding of ``v / step + shift`` to an integer."""
    if not np.isfinite(v):
        return np.int64(0)
    lim = half - 1
    t = v / step + shift
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
def _int_value(code, step, shift, half):
    if code == 0:
        return np.float32(np.nan)
    return (np.float32(np.int64(code) - half) - shift) * step


@nb.njit(cache=True)
def _encode(x, step, shift, bits, k0, k1, offset, out):
    half = np.int64(1) << np.int64(bits - 1)
    wacc, wn, pos = np.uint64(0), 0, 0
    for i in range(x.size):
        code = _int_code(x[i], step, shift, half, k0, k1, offset + i)
        wacc, wn, pos = put_code(out, wacc, wn, pos, code, bits)
    flush_codes(out, wacc, wn, pos)


@nb.njit(cache=True)
def _decode(data, step, shift, bits, out, mode):
    half = np.int64(1) << np.int64(bits - 1)
    mask = np.uint64((1 << bits) - 1)
    racc, rn, pos = np.uint64(0), 0, 0
    for i in range(out.size):
        code, racc, rn, pos = take_code(data, racc, rn, pos, bits, mask)
        val = _int_value(np.int64(code), step, shift, half)
        if mode == 1:
            out[i] = out[i] + val
        else:
            out[i] = val


@nb.njit(cache=True)
def _recompress(data, acc, step, shift_in, shift_out, bits, k0, k1, offset, out, mode):
    half = np.int64(1) << np.int64(bits - 1)
    mask = np.uint64((1 << bits) - 1)
    racc, rn, rpos = np.uint64(0), 0, 0
    wacc, wn, wpos = np.uint64(0), 0, 0
    for i in range(acc.size):
        code, racc, rn, rpos = take_code(data, racc, rn, rpos, bits, mask)
        v = acc[i] + _int_value(np.int64(code), step, shift_in, half)
        new = _int_code(v, step, shift_out, half, k0, k1, offset + i)
        if mode == 1:
            acc[i] = v
        elif mode == 2:
            acc[i] = _int_value(new, step, shift_out, half)
        wacc, wn, wpos = put_code(out, wacc, wn, wpos, new, bits)
    flush_codes(out, wacc, wn, wpos)


@nb.njit(cache=True)
def _round_levels(x, step, g, lower, upper, k0, k1, offset, out):
    top = np.float32(g)
    mid = np.float32(0.5) * top
    half_step = np.float32(0.5) * step
    for i in range(x.size):
        v = x[i]
        if not np.isfinite(v):
            out[i] = np.float32(np.nan)
            continue
        u = v / step + mid
        u = min(max(u, np.float32(0.0)), top)  # THC's clamp to [-T sigma, T sigma]
        j = min(np.int64(np.floor(u)), np.int64(g - 1))
        a = np.int64(lower[j])
        b = np.int64(upper[j])
        p = (u - np.float32(a)) / np.float32(b - a)
        c = b if uniform(k0, k1, offset + i) < p else a
        out[i] = np.float32(2 * c - g) * half_step


def encode(x: torch.Tensor, step: float, bits: int, key: tuple[int, int], offset: int,
           out: torch.Tensor, shift: float = 0.0) -> None:
    """See :meth:`dynamiq.kernels.backend.Backend.intsum_encode`."""
    _encode(x.numpy(), np.float32(step), np.float32(shift), bits, key[0], key[1], offset,
            out.numpy())


def decode(data: torch.Tensor, step: float, bits: int, out: torch.Tensor,
           accumulate: bool, shift: float = 0.0) -> None:
    """See :meth:`dynamiq.kernels.backend.Backend.intsum_decode`."""
    _decode(data.numpy(), np.float32(step), np.float32(shift), bits, out.numpy(),
            1 if accumulate else 0)


def recompress(data: torch.Tensor, acc: torch.Tensor, step: float, bits: int,
               key: tuple[int, int], offset: int, writeback: Writeback, out: torch.Tensor,
               shift_in: float = 0.0, shift_out: float = 0.0) -> None:
    """See :meth:`dynamiq.kernels.backend.Backend.intsum_recompress`."""
    _recompress(data.numpy(), acc.numpy(), np.float32(step), np.float32(shift_in),
                np.float32(shift_out), bits, key[0], key[1], offset, out.numpy(),
                int(writeback))


def round_levels(x: torch.Tensor, step: float, grid: LevelGrid, key: tuple[int, int],
                 offset: int, out: torch.Tensor) -> None:
    """See :meth:`dynamiq.kernels.backend.Backend.intsum_round`."""
    _round_levels(x.numpy(), np.float32(step), grid.granularity, grid.lower, grid.upper,
                  key[0], key[1], offset, out.numpy())
