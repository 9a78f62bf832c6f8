"""Numba kernels of integer-sum codes (the THC partial-sum codec).

Code ``u`` (``bits`` wide, in an LSB-first bit stream, :mod:`dynamiq.kernels.numba.packing`) is
the offset-binary integer ``w = u - 2**(bits-1)``, decoded as ``(float32(w) - shift) * step``;
``u = 0`` is NaN. A value is coded by ``t = v / step + shift`` (float32), ``w = floor(t) + (r <
t - floor(t))`` with ``r`` the uniform of :func:`dynamiq.kernels.numba.rng.uniform` at the
coordinate's global index, clamped to ``±(2**(bits-1) - 1)``. The ``shift`` (0 or 1/2) puts the
grid of a partial sum whose values are odd multiples of ``step / 2`` onto the integers.

The hop kernels code in tasks of :data:`TASK` coordinates, a whole number of bytes of the
stream at every width, run on the kernels' threads
(:func:`~dynamiq.kernels.numba.tasks.run_tasks`); within a task each pass (unpack, decode and
add, code, pack) is a loop without branches. :func:`round_levels` is THC's rounding of one
rank's own values onto a level table (see :mod:`dynamiq.codecs.thc_levels`), in the same
tasks.
"""

from __future__ import annotations

import numba as nb
import numpy as np
import torch

import dynamiq.kernels.numba.stamps  # noqa: F401  (the cache of its functions: see there)
from dynamiq.kernels.abi import LevelGrid, Writeback
from dynamiq.kernels.numba.packing import put_task, take_task
from dynamiq.kernels.numba.rng import fill_uniforms
from dynamiq.kernels.numba.tasks import run_tasks

__all__ = ["decode", "encode", "recompress", "round_levels"]


#: Coordinates coded per task: the task's codes stay in the first-level cache and fill whole
#: bytes at every width, so tasks are independent and run on the kernels' threads.
TASK = 2048

U = np.uint64


@nb.njit(inline="always", cache=True)
def _int_code(v, step, shift, half, u):
    """Offset-binary code (int64) of the stochastic rounding of ``v / step + shift`` to an
    integer under the uniform ``u``, clamped; 0 for a non-finite ``v``.

    Every case is computed and one selected, so a loop of codes stays free of branches (a
    conversion of a value outside int64, or of a NaN, is never the one selected).
    """
    lim = half - 1
    t = v / step + shift
    f = np.floor(t)
    # exact unless -1 < t < 0, where t + 1 rounds to float32 (2**-24 at most: the resolution
    # of the uniform anyway)
    frac = t - f
    w = np.int64(f) + np.int64(u < frac) + half
    w = np.int64(lim + half) if t >= np.float32(lim) else w
    w = np.int64(half - lim) if t <= np.float32(-lim) else w
    return w if np.isfinite(v) else np.int64(0)


@nb.njit(inline="always", cache=True)
def _int_value(code, step, shift, half):
    val = (np.float32(np.int64(code) - half) - shift) * step
    return np.float32(np.nan) if code == 0 else val


@nb.njit(inline="always", cache=True)
def _task(c, n, bits):
    """First coordinate, coordinate count and first stream byte of task ``c``."""
    i0 = c * TASK
    return i0, min(TASK, n - i0), i0 * bits // 8


@nb.njit(inline="always", cache=True)
def _code_task(x, m, step, shift, half, k0, k1, index, cb, ub):
    """``cb[:m]`` = the codes of ``x[:m]``, whose first coordinate has global ``index``
    (``ub``: scratch for their uniforms, drawn in a loop of their own)."""
    fill_uniforms(ub, m, k0, k1, index)
    for k in range(m):
        i = U(k)
        cb[i] = np.uint32(_int_code(x[i], step, shift, half, ub[i]))


@nb.njit(nogil=True, cache=True, error_model="numpy")
def _encode(c0, c1, x, step, shift, bits, k0, k1, offset, out):
    half = np.int64(1) << np.int64(bits - 1)
    n = x.size
    cb = np.empty(TASK, np.uint32)
    ub = np.empty(TASK, np.float32)
    for c in range(c0, c1):
        i0, m, pos = _task(c, n, bits)
        _code_task(x[i0:i0 + m], m, step, shift, half, k0, k1, offset + i0, cb, ub)
        put_task(out, pos, cb, m, bits)


@nb.njit(nogil=True, cache=True, error_model="numpy")
def _decode(c0, c1, data, step, shift, bits, out, mode):
    half = np.int64(1) << np.int64(bits - 1)
    n = out.size
    cb = np.empty(TASK, np.uint32)
    for c in range(c0, c1):
        i0, m, pos = _task(c, n, bits)
        take_task(data, pos, cb, m, bits)
        o = out[i0:i0 + m]
        if mode == 1:
            for k in range(m):
                i = U(k)
                o[i] = o[i] + _int_value(cb[i], step, shift, half)
        else:
            for k in range(m):
                i = U(k)
                o[i] = _int_value(cb[i], step, shift, half)


@nb.njit(nogil=True, cache=True, error_model="numpy")
def _recompress(c0, c1, data, acc, step, shift_in, shift_out, bits, k0, k1, offset, out, mode):
    half = np.int64(1) << np.int64(bits - 1)
    n = acc.size
    cb = np.empty(TASK, np.uint32)
    v = np.empty(TASK, np.float32)
    ub = np.empty(TASK, np.float32)
    for c in range(c0, c1):
        i0, m, pos = _task(c, n, bits)
        take_task(data, pos, cb, m, bits)
        a = acc[i0:i0 + m]
        for k in range(m):
            i = U(k)
            v[i] = a[i] + _int_value(cb[i], step, shift_in, half)
        _code_task(v, m, step, shift_out, half, k0, k1, offset + i0, cb, ub)
        if mode == 1:
            for k in range(m):
                i = U(k)
                a[i] = v[i]
        elif mode == 2:
            for k in range(m):
                i = U(k)
                a[i] = _int_value(cb[i], step, shift_out, half)
        put_task(out, pos, cb, m, bits)


@nb.njit(nogil=True, cache=True, error_model="numpy")
def _round_levels(c0, c1, x, step, g, lower, upper, k0, k1, offset, out):
    top = np.float32(g)
    mid = np.float32(0.5) * top
    half_step = np.float32(0.5) * step
    n = x.size
    ub = np.empty(TASK, np.float32)
    for c in range(c0, c1):
        i0, m, _ = _task(c, n, 8)
        xs = x[i0:i0 + m]
        o = out[i0:i0 + m]
        fill_uniforms(ub, m, k0, k1, offset + i0)
        for k in range(m):
            i = U(k)
            v = xs[i]
            fin = np.isfinite(v)
            # a non-finite value takes the middle level's path (its result is NaN), so every
            # index below stays in the table
            u = v / step + mid if fin else mid
            u = min(max(u, np.float32(0.0)), top)  # THC's clamp to [-T sigma, T sigma]
            jj = min(np.int64(np.floor(u)), np.int64(g - 1))
            a = np.int64(lower[jj])
            b = np.int64(upper[jj])
            p = (u - np.float32(a)) / np.float32(b - a)
            cv = b if ub[i] < p else a
            r = np.float32(2 * cv - g) * half_step
            o[i] = r if fin else np.float32(np.nan)


def _ntasks(n: int) -> int:
    return -(-n // TASK)


def encode(x: torch.Tensor, step: float, bits: int, key: tuple[int, int], offset: int,
           out: torch.Tensor, shift: float = 0.0) -> None:
    """See :meth:`dynamiq.kernels.backend.Backend.intsum_encode`."""
    run_tasks(_encode, _ntasks(x.numel()), x.numpy(), np.float32(step), np.float32(shift), bits,
              key[0], key[1], offset, out.numpy())


def decode(data: torch.Tensor, step: float, bits: int, out: torch.Tensor,
           accumulate: bool, shift: float = 0.0) -> None:
    """See :meth:`dynamiq.kernels.backend.Backend.intsum_decode`."""
    run_tasks(_decode, _ntasks(out.numel()), data.numpy(), np.float32(step), np.float32(shift),
              bits, out.numpy(), 1 if accumulate else 0)


def recompress(data: torch.Tensor, acc: torch.Tensor, step: float, bits: int,
               key: tuple[int, int], offset: int, writeback: Writeback, out: torch.Tensor,
               shift_in: float = 0.0, shift_out: float = 0.0) -> None:
    """See :meth:`dynamiq.kernels.backend.Backend.intsum_recompress`."""
    run_tasks(_recompress, _ntasks(acc.numel()), data.numpy(), acc.numpy(), np.float32(step),
              np.float32(shift_in), np.float32(shift_out), bits, key[0], key[1], offset,
              out.numpy(), int(writeback))


def round_levels(x: torch.Tensor, step: float, grid: LevelGrid, key: tuple[int, int],
                 offset: int, out: torch.Tensor) -> None:
    """See :meth:`dynamiq.kernels.backend.Backend.intsum_round`."""
    run_tasks(_round_levels, _ntasks(x.numel()), x.numpy(), np.float32(step), grid.granularity,
              grid.lower, grid.upper, key[0], key[1], offset, out.numpy())
