"""Numba kernels of shared-scale minifloat codes (the MX-style partial-sum codec).

One ``mbits + 1``-bit code per coordinate in an LSB-first bit stream
(:mod:`dynamiq.kernels.numba.packing`). The value of code ``c`` in a block of scale ``s`` is
``dec[c] * s`` (one float32 multiply); a value ``v`` is coded as the nearest of the decoded levels
``tab[j] * s`` (ties to the even magnitude code), saturating at the largest; non-finite ``v``
(or a non-finite scale) gives ``nan_code``. Each kernel is one serial pass (decode, add, encode
and pack fused), so the float32 arithmetic and its order are fixed here.

``mode`` arguments: decoders ``0`` write (``out = dec``), ``1`` accumulate (``out += dec``);
the fused recompress takes a :class:`~dynamiq.kernels.abi.Writeback` value.
"""

from __future__ import annotations

import numba as nb
import numpy as np
import torch

import dynamiq.kernels.numba.stamps  # noqa: F401  (the cache of its functions: see there)
from dynamiq.kernels.abi import SharedScaleCode, Writeback
from dynamiq.kernels.numba.levels import lut_finish, lut_key
from dynamiq.kernels.numba.packing import flush_codes, put_code, take_code

__all__ = ["decode", "encode", "recompress"]


#: Coordinates coded per pass: the pass's scratch arrays stay in the first-level cache.
TASK = 2048


@nb.njit(inline="always", cache=True)
def _task_scales(scales, block, i0, n, sv):
    """``sv[i]`` = the scale of coordinate ``i0 + i``, ``i < n``: per-element scales, so that
    the loops that use them read contiguous arrays and vectorise."""
    i = 0
    while i < n:
        j = (i0 + i) // block
        s = scales[j]
        stop = min(n, (j + 1) * block - i0)
        for k in range(i, stop):
            sv[k] = s
        i = stop


@nb.njit(inline="always", cache=True)
def _code_task(v, sv, n, tab, nfin, lut, lshift, lkey0, mbits, nan_code, kb, vl, vh, cb):
    """``cb[i]`` = sign-magnitude code of ``v[i]`` under scale ``sv[i]``, ``i < n``: the
    decoded level ``tab[j] * s`` nearest to ``v`` (ties to the even magnitude code),
    saturating at the largest, ``nan_code`` for a non-finite value or scale.

    Three loops: the bucket keys of ``|v| / s`` (vectorised), the bracket by the table's
    bucket lookup (:func:`dynamiq.kernels.tables.bucket_lut`), settled on the decoded levels
    themselves, in a scalar loop of table loads, and the rounding from the bracket
    (vectorised). In one loop, the loads kept everything scalar.
    """
    llen = lut.size
    for i in range(n):
        # the quotient is kept for the bracket (in vl, which the bracket's level replaces)
        t = abs(v[i]) / sv[i]
        vl[i] = t
        kb[i] = lut_key(t, lshift, lkey0, llen)
    top = np.uint32(nfin - 1)
    for i in range(n):
        a = abs(v[i])
        s = sv[i]
        lo = np.int64(lut_finish(vl[i], kb[i], lut, tab, nfin))
        # a / s may be off by one rounding (scales that are not powers of two): settle the
        # bracket on the decoded levels themselves (never taken for power-of-two scales); the
        # first step of each walk tests the levels that the rounding needs anyway
        lv = tab[lo] * s
        if lo > 0 and lv > a:
            while lo > 0 and tab[lo] * s > a:
                lo -= 1
            lv = tab[lo] * s
        hv = tab[min(lo + 1, nfin - 1)] * s
        if lo < nfin - 1 and hv <= a:
            while lo < nfin - 1 and tab[lo + 1] * s <= a:
                lo += 1
            lv = tab[lo] * s
            hv = tab[min(lo + 1, nfin - 1)] * s
        kb[i] = np.uint32(lo)
        vl[i] = lv
        vh[i] = hv
    for i in range(n):
        x = v[i]
        a = abs(x)
        lo = kb[i]
        d1 = np.float64(a) - np.float64(vl[i])  # exact in float64
        d2 = np.float64(vh[i]) - np.float64(a)
        # nearer neighbour, ties to the even magnitude code; at the top d2 <= 0 <= d1 and the
        # minimum saturates
        up = np.uint32((d2 < d1) | ((d2 == d1) & ((lo & np.uint32(1)) == np.uint32(1))))
        mag = min(np.uint32(lo + up), top)
        # never -0: formats without a NaN code use that pattern for NaN
        neg = np.uint32((x < 0) & (mag != np.uint32(0)))
        code = np.uint32(mag | np.uint32(neg << np.uint32(mbits)))
        # finite value and scale: exponent bits not all ones, on the bit patterns (no branch)
        fin = ((np.float32(x).view(np.uint32) & np.uint32(0x7F800000)) != np.uint32(0x7F800000)) \
            & ((np.float32(sv[i]).view(np.uint32) & np.uint32(0x7F800000))
               != np.uint32(0x7F800000))
        cb[i] = code if fin else np.uint32(nan_code)


@nb.njit(inline="always", cache=True)
def _put_task(out, state, cb, n, bits):
    """Append the codes ``cb[:n]`` to the stream; ``state`` is the writer's ``(wacc, wn,
    pos)``, returned updated.

    A task holds ``TASK`` codes, a whole number of bytes at every width, so every task but a
    partial last one starts and ends on a byte boundary: 8- and 4-bit codes are then stored
    as bytes and nibble pairs in a loop that vectorises, other widths through the bit stream.
    """
    wacc, wn, pos = state
    if wn == 0 and bits == 8:
        for i in range(n):
            out[pos + i] = np.uint8(cb[i])
        return wacc, wn, pos + n
    if wn == 0 and bits == 4:
        half = n // 2
        for i in range(half):
            out[pos + i] = np.uint8(cb[2 * i] | (cb[2 * i + 1] << np.uint32(4)))
        pos += half
        if n % 2:
            wacc, wn, pos = put_code(out, wacc, wn, pos, cb[n - 1], bits)
        return wacc, wn, pos
    for i in range(n):
        wacc, wn, pos = put_code(out, wacc, wn, pos, cb[i], bits)
    return wacc, wn, pos


@nb.njit(inline="always", cache=True)
def _take_task(data, state, cb, n, bits):
    """Inverse of :func:`_put_task`: the next ``n`` codes of the stream into ``cb``;
    ``state`` is the reader's ``(racc, rn, pos)``, returned updated."""
    racc, rn, pos = state
    if rn == 0 and bits == 8:
        for i in range(n):
            cb[i] = np.uint32(data[pos + i])
        return racc, rn, pos + n
    if rn == 0 and bits == 4 and n % 2 == 0:
        for i in range(n // 2):
            b = np.uint32(data[pos + i])
            cb[2 * i] = b & np.uint32(0xF)
            cb[2 * i + 1] = b >> np.uint32(4)
        return racc, rn, pos + n // 2
    mask = np.uint64((1 << bits) - 1)
    for i in range(n):
        code, racc, rn, pos = take_code(data, racc, rn, pos, bits, mask)
        cb[i] = np.uint32(code)
    return racc, rn, pos


@nb.njit(inline="always", cache=True)
def _scratch():
    """A pass's arrays: per-element scales, bracket indices, the levels below and above,
    codes, values."""
    return (np.empty(TASK, np.float32), np.empty(TASK, np.uint32), np.empty(TASK, np.float32),
            np.empty(TASK, np.float32), np.empty(TASK, np.uint32), np.empty(TASK, np.float32))


@nb.njit(inline="always", cache=True)
def _take_levels(data, reader, cb, v, n, bits, dec):
    """The next ``n`` codes of the stream into ``cb`` and their levels ``dec[code]`` into
    ``v``, in a loop of table loads of its own, so that the loop that scales them
    vectorises; returns the reader's state."""
    reader = _take_task(data, reader, cb, n, bits)
    for i in range(n):
        v[i] = dec[cb[i]]
    return reader


@nb.njit(cache=True, error_model="numpy")
def _encode(x, scales, block, tab, nfin, lut, lshift, lkey0, mbits, nan_code, out):
    n = x.size
    sv, kb, vl, vh, cb, _ = _scratch()
    state = (np.uint64(0), 0, 0)
    for i0 in range(0, n, TASK):
        m = min(TASK, n - i0)
        _task_scales(scales, block, i0, m, sv)
        _code_task(x[i0:i0 + m], sv, m, tab, nfin, lut, lshift, lkey0, mbits, nan_code, kb,
                   vl, vh, cb)
        state = _put_task(out, state, cb, m, mbits + 1)
    flush_codes(out, state[0], state[1], state[2])


@nb.njit(cache=True, error_model="numpy")
def _decode(data, scales, block, dec, bits, out, mode):
    n = out.size
    sv, _, _, _, cb, v = _scratch()
    reader = (np.uint64(0), 0, 0)
    for i0 in range(0, n, TASK):
        m = min(TASK, n - i0)
        _task_scales(scales, block, i0, m, sv)
        reader = _take_levels(data, reader, cb, v, m, bits, dec)
        if mode == 1:
            for i in range(m):
                out[i0 + i] = out[i0 + i] + v[i] * sv[i]
        else:
            for i in range(m):
                out[i0 + i] = v[i] * sv[i]


@nb.njit(cache=True, error_model="numpy")
def _recompress(data, acc, scales, block, tab, nfin, lut, lshift, lkey0, mbits, nan_code, dec,
                out, mode):
    n = acc.size
    sv, kb, vl, vh, cb, v = _scratch()
    reader = (np.uint64(0), 0, 0)
    state = (np.uint64(0), 0, 0)
    for i0 in range(0, n, TASK):
        m = min(TASK, n - i0)
        _task_scales(scales, block, i0, m, sv)
        reader = _take_levels(data, reader, cb, v, m, mbits + 1, dec)
        for i in range(m):
            v[i] = acc[i0 + i] + v[i] * sv[i]
        _code_task(v, sv, m, tab, nfin, lut, lshift, lkey0, mbits, nan_code, kb, vl, vh, cb)
        if mode == 1:
            for i in range(m):
                acc[i0 + i] = v[i]
        elif mode == 2:
            for i in range(m):
                acc[i0 + i] = dec[cb[i]] * sv[i]
        state = _put_task(out, state, cb, m, mbits + 1)
    flush_codes(out, state[0], state[1], state[2])


def _tables(code: SharedScaleCode) -> tuple:
    t = code.tables
    return t.search, t.nfin, t.lut, t.lshift, t.lkey0


def encode(code: SharedScaleCode, x: torch.Tensor, scales: torch.Tensor, block: int,
           out: torch.Tensor) -> None:
    """See :meth:`dynamiq.kernels.backend.Backend.shared_encode`."""
    _encode(x.numpy(), scales.numpy(), block, *_tables(code), code.mbits, code.nan_code,
            out.numpy())


def decode(code: SharedScaleCode, data: torch.Tensor, scales: torch.Tensor, block: int,
           out: torch.Tensor, accumulate: bool) -> None:
    """See :meth:`dynamiq.kernels.backend.Backend.shared_decode`."""
    _decode(data.numpy(), scales.numpy(), block, code.dec, code.bits, out.numpy(),
            1 if accumulate else 0)


def recompress(code: SharedScaleCode, data: torch.Tensor, acc: torch.Tensor,
               scales: torch.Tensor, block: int, writeback: Writeback, out: torch.Tensor) -> None:
    """See :meth:`dynamiq.kernels.backend.Backend.shared_recompress`."""
    _recompress(data.numpy(), acc.numpy(), scales.numpy(), block, *_tables(code), code.mbits,
                code.nan_code, code.dec, out.numpy(), int(writeback))
