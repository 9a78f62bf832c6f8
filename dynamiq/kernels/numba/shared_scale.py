"""Numba kernels of shared-scale minifloat codes (the MX-style partial-sum codec).

One ``mbits + 1``-bit code per coordinate in an LSB-first bit stream
(:mod:`dynamiq.kernels.numba.packing`). The value of code ``c`` in a block of scale ``s`` is
``dec[c] * s`` (one float32 multiply); a value ``v`` is coded as the nearest of the decoded levels
``tab[j] * s`` (ties to the even magnitude code), saturating at the largest; non-finite ``v``
(or a non-finite scale) gives ``nan_code``. Each kernel is one pass (decode, add, encode and
pack fused), so the float32 arithmetic and its order are fixed here.

The work is cut into tasks of :data:`TASK` coordinates, each a whole number of bytes of the
stream at every width, so tasks are independent and run on the kernels' threads
(:func:`~dynamiq.kernels.numba.tasks.run_tasks`). When the element format is a minifloat grid
(:func:`~dynamiq.kernels.tables.element_family`) and every scale of a task is a power of two
whose products with the levels are exact float32 numbers (MX's E8M0 scales, but at the far
ends of their range), the nearest level of ``v`` is the nearest grid point of the exact
quotient ``|v| / s``, found by bit arithmetic in one vectorised loop
(:func:`~dynamiq.kernels.numba.levels.float_nearest`); other tasks search the table.

``mode`` arguments: decoders ``0`` write (``out = dec``), ``1`` accumulate (``out += dec``);
the fused recompress takes a :class:`~dynamiq.kernels.abi.Writeback` value.
"""

from __future__ import annotations

import weakref

import numba as nb
import numpy as np
import torch

import dynamiq.kernels.numba.stamps  # noqa: F401  (the cache of its functions: see there)
from dynamiq.kernels.abi import SharedScaleCode, Writeback
from dynamiq.kernels.numba.levels import (
    float_nearest_consts,
    float_nearest_with,
    lut_finish,
    lut_key,
)
from dynamiq.kernels.numba.packing import put_task, take_task
from dynamiq.kernels.numba.tasks import run_tasks
from dynamiq.kernels.tables import FAMILY_FLOAT, element_family

__all__ = ["decode", "encode", "recompress"]


#: Coordinates coded per task: the task's scratch arrays stay in the first-level cache, and
#: its codes fill whole bytes at every width.
TASK = 2048

U = np.uint64
U32 = np.uint32


@nb.njit(inline="always", cache=True)
def _task_scales(scales, block, i0, n, sv, elo, ehi):
    """``sv[i]`` = the scale of coordinate ``i0 + i``, ``i < n`` (per-element scales, so that
    the loops that use them read contiguous arrays and vectorise); returns whether every one
    is a power of two with its float32 exponent field in ``[elo, ehi]`` (then the arithmetic
    search is exact: see the module)."""
    i = 0
    exact = True
    while i < n:
        j = (i0 + i) // block
        sc = scales[j]
        b = np.float32(sc).view(np.uint32)
        e = U32(U32(b >> U32(23)) & U32(0xFF))
        exact = exact and U32(b & U32(0x7FFFFF)) == U32(0) and e >= elo and e <= ehi
        stop = min(n, (j + 1) * block - i0)
        for k in range(i, stop):
            sv[k] = sc
        i = stop
    return exact


@nb.njit(inline="always", cache=True)
def _sign_code(x, mag, sc, mbits, nan_code):
    """The code of ``x`` with magnitude code ``mag`` under scale ``sc``: sign on top (never
    -0: formats without a NaN code use that pattern for NaN), ``nan_code`` for a non-finite
    value or scale (tested on the bit patterns, without a branch)."""
    neg = U32((x < 0) & (mag != U32(0)))
    code = U32(mag | U32(neg << U32(mbits)))
    fin = ((np.float32(x).view(np.uint32) & U32(0x7F800000)) != U32(0x7F800000)) \
        & ((np.float32(sc).view(np.uint32) & U32(0x7F800000)) != U32(0x7F800000))
    return code if fin else U32(nan_code)


@nb.njit(inline="always", cache=True)
def _code_task(v, sv, n, tab, nfin, lut, lshift, lkey0, mbits, nan_code, kb, vl, vh, cb,
               exact, mant, bias):
    """``cb[i]`` = sign-magnitude code of ``v[i]`` under scale ``sv[i]``, ``i < n``: the
    decoded level ``tab[j] * s`` nearest to ``v`` (ties to the even magnitude code),
    saturating at the largest, ``nan_code`` for a non-finite value or scale.

    ``exact`` (a minifloat grid of ``mant`` mantissa bits and exponent ``bias`` under exact
    power-of-two scales): one vectorised loop of
    :func:`~dynamiq.kernels.numba.levels.float_nearest` on ``|v| / s``.
    Otherwise three loops: the bucket keys of ``|v| / s`` (vectorised), the bracket by the
    table's bucket lookup (:func:`dynamiq.kernels.tables.bucket_lut`), settled on the decoded
    levels themselves, in a scalar loop of table loads, and the rounding from the bracket
    (vectorised). In one loop, the loads kept everything scalar.
    """
    top = U32(nfin - 1)
    if exact:
        drop, flip, half, offset, scale, qtop, normal_ex = float_nearest_consts(mant, bias)
        for k in range(n):
            i = U(k)
            x = v[i]
            sc = sv[i]
            mag = min(float_nearest_with(abs(x) / sc, drop, flip, half, offset, scale, qtop,
                                         normal_ex), top)
            cb[i] = _sign_code(x, mag, sc, mbits, nan_code)
        return
    llen = lut.size
    for k in range(n):
        i = U(k)
        # the quotient is kept for the bracket (in vl, which the bracket's level replaces)
        t = abs(v[i]) / sv[i]
        vl[i] = t
        kb[i] = lut_key(t, lshift, lkey0, llen)
    for k in range(n):
        i = U(k)
        a = abs(v[i])
        sc = sv[i]
        lo = np.int64(lut_finish(vl[i], kb[i], lut, tab, nfin))
        # a / s may be off by one rounding (scales that are not powers of two): settle the
        # bracket on the decoded levels themselves (never taken for power-of-two scales); the
        # first step of each walk tests the levels that the rounding needs anyway
        lv = tab[lo] * sc
        if lo > 0 and lv > a:
            while lo > 0 and tab[lo] * sc > a:
                lo -= 1
            lv = tab[lo] * sc
        hv = tab[min(lo + 1, nfin - 1)] * sc
        if lo < nfin - 1 and hv <= a:
            while lo < nfin - 1 and tab[lo + 1] * sc <= a:
                lo += 1
            lv = tab[lo] * sc
            hv = tab[min(lo + 1, nfin - 1)] * sc
        kb[i] = U32(lo)
        vl[i] = lv
        vh[i] = hv
    for k in range(n):
        i = U(k)
        x = v[i]
        a = abs(x)
        lo = kb[i]
        d1 = np.float64(a) - np.float64(vl[i])  # exact in float64
        d2 = np.float64(vh[i]) - np.float64(a)
        # nearer neighbour, ties to the even magnitude code; at the top d2 <= 0 <= d1 and the
        # minimum saturates
        up = U32((d2 < d1) | ((d2 == d1) & ((lo & U32(1)) == U32(1))))
        cb[i] = _sign_code(x, min(U32(lo + up), top), sv[i], mbits, nan_code)


@nb.njit(inline="always", cache=True)
def _take_levels(data, pos, cb, v, n, bits, dec):
    """The ``n`` codes of a task whose stream starts at byte ``pos`` into ``cb``, and their
    levels ``dec[code]`` into ``v``, in a loop of table loads of its own, so that the loop
    that scales them vectorises."""
    take_task(data, pos, cb, n, bits)
    for k in range(n):
        v[U(k)] = dec[cb[U(k)]]


@nb.njit(inline="always", cache=True)
def _scratch():
    """A task's arrays: per-element scales, bracket indices, the levels below and above,
    codes, values."""
    return (np.empty(TASK, np.float32), np.empty(TASK, np.uint32), np.empty(TASK, np.float32),
            np.empty(TASK, np.float32), np.empty(TASK, np.uint32), np.empty(TASK, np.float32))


@nb.njit(inline="always", cache=True)
def _task(c, n, bits):
    """First coordinate, coordinate count and first stream byte of task ``c``."""
    i0 = c * TASK
    return i0, min(TASK, n - i0), i0 * bits // 8


@nb.njit(nogil=True, cache=True, error_model="numpy")
def _encode(c0, c1, x, scales, block, tab, nfin, lut, lshift, lkey0, mbits, nan_code, out,
            fast, mant, bias, elo, ehi):
    n = x.size
    sv, kb, vl, vh, cb, _ = _scratch()
    for c in range(c0, c1):
        i0, m, pos = _task(c, n, mbits + 1)
        exact = _task_scales(scales, block, i0, m, sv, elo, ehi) and fast
        _code_task(x[i0:i0 + m], sv, m, tab, nfin, lut, lshift, lkey0, mbits, nan_code, kb,
                   vl, vh, cb, exact, mant, bias)
        put_task(out, pos, cb, m, mbits + 1)


@nb.njit(nogil=True, cache=True, error_model="numpy")
def _decode(c0, c1, data, scales, block, dec, bits, out, mode):
    n = out.size
    sv, _, _, _, cb, v = _scratch()
    for c in range(c0, c1):
        i0, m, pos = _task(c, n, bits)
        _task_scales(scales, block, i0, m, sv, U32(0), U32(0))
        _take_levels(data, pos, cb, v, m, bits, dec)
        o = out[i0:i0 + m]
        if mode == 1:
            for k in range(m):
                i = U(k)
                o[i] = o[i] + v[i] * sv[i]
        else:
            for k in range(m):
                i = U(k)
                o[i] = v[i] * sv[i]


@nb.njit(nogil=True, cache=True, error_model="numpy")
def _recompress(c0, c1, data, acc, scales, block, tab, nfin, lut, lshift, lkey0, mbits,
                nan_code, dec, out, mode, fast, mant, bias, elo, ehi):
    n = acc.size
    bits = mbits + 1
    sv, kb, vl, vh, cb, v = _scratch()
    for c in range(c0, c1):
        i0, m, pos = _task(c, n, bits)
        exact = _task_scales(scales, block, i0, m, sv, elo, ehi) and fast
        _take_levels(data, pos, cb, v, m, bits, dec)
        a = acc[i0:i0 + m]
        for k in range(m):
            i = U(k)
            v[i] = a[i] + v[i] * sv[i]
        _code_task(v, sv, m, tab, nfin, lut, lshift, lkey0, mbits, nan_code, kb, vl, vh, cb,
                   exact, mant, bias)
        if mode == 1:
            for k in range(m):
                i = U(k)
                a[i] = v[i]
        elif mode == 2:
            for k in range(m):
                i = U(k)
                a[i] = dec[cb[i]] * sv[i]
        put_task(out, pos, cb, m, bits)


_arith: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _tables(code: SharedScaleCode) -> tuple:
    t = code.tables
    return t.search, t.nfin, t.lut, t.lshift, t.lkey0


def _arithmetic(code: SharedScaleCode) -> tuple[bool, int, int, np.uint32, np.uint32]:
    """``(fast, mant, bias, elo, ehi)``: whether the format is a minifloat grid, its
    parameters, and the float32 exponent fields of the power-of-two scales under which every
    product ``level * scale`` is an exact float32 number (normal, finite), cached per code."""
    hit = _arith.get(code)
    if hit is not None:
        return hit
    t = code.tables
    mags = t.search[: t.nfin].astype(np.float64)
    fam, mant, bias = element_family(t.search[: t.nfin], code.mbits)
    pos = mags[mags > 0]
    if fam == FAMILY_FLOAT and pos.size:
        # 2**k * min >= 2**-126 and 2**k * max below float32's top binade's end
        lo = max(-126, int(np.ceil(-126 - np.log2(pos.min()))))
        hi = min(127, int(np.floor(127 - np.log2(pos.max()))))
        while hi >= lo and not np.isfinite(np.float32(pos.max() * 2.0 ** hi)):
            hi -= 1
        args = (hi >= lo, mant, bias, np.uint32(lo + 127), np.uint32(hi + 127))
    else:
        args = (False, 0, 0, np.uint32(0), np.uint32(0))
    _arith[code] = args
    return args


def _ntasks(n: int) -> int:
    return -(-n // TASK)


def encode(code: SharedScaleCode, x: torch.Tensor, scales: torch.Tensor, block: int,
           out: torch.Tensor) -> None:
    """See :meth:`dynamiq.kernels.backend.Backend.shared_encode`."""
    run_tasks(_encode, _ntasks(x.numel()), x.numpy(), scales.numpy(), block, *_tables(code),
              code.mbits, code.nan_code, out.numpy(), *_arithmetic(code))


def decode(code: SharedScaleCode, data: torch.Tensor, scales: torch.Tensor, block: int,
           out: torch.Tensor, accumulate: bool) -> None:
    """See :meth:`dynamiq.kernels.backend.Backend.shared_decode`."""
    run_tasks(_decode, _ntasks(out.numel()), data.numpy(), scales.numpy(), block, code.dec,
              code.bits, out.numpy(), 1 if accumulate else 0)


def recompress(code: SharedScaleCode, data: torch.Tensor, acc: torch.Tensor,
               scales: torch.Tensor, block: int, writeback: Writeback, out: torch.Tensor) -> None:
    """See :meth:`dynamiq.kernels.backend.Backend.shared_recompress`."""
    run_tasks(_recompress, _ntasks(acc.numel()), data.numpy(), acc.numpy(), scales.numpy(),
              block, *_tables(code), code.mbits, code.nan_code, code.dec, out.numpy(),
              int(writeback), *_arithmetic(code))
