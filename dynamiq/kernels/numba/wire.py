"""BF16 wire values on the CPU, one pass each: the cast, the decode (optionally added into an
accumulator) and the fused decode–accumulate–recast of a hop.

:class:`~dynamiq.kernels.backend.Backend` does the same with torch operations, which allocate
a float32 temporary per operation and take up to five passes over memory for a hop; these
kernels give the same bits. The cast rounds to nearest even, and writes a NaN as torch does
on the CPU (:func:`~dynamiq.kernels.nan16.nan_pattern`: a fixed pattern, or the NaN's sign and
top payload bits, quietened). The work is cut into tasks of :data:`TASK` coordinates run on
the kernels' threads (:func:`~dynamiq.kernels.numba.tasks.run_tasks`).
"""

from __future__ import annotations

import numba as nb
import numpy as np
import torch

import dynamiq.kernels.numba.stamps  # noqa: F401  (the cache of its functions: see there)
from dynamiq.kernels.abi import Writeback
from dynamiq.kernels.nan16 import nan_pattern
from dynamiq.kernels.numba.tasks import run_tasks

__all__ = ["TASK", "decode", "encode", "recompress"]

#: Coordinates per task (a task's data stays in the second-level cache).
TASK = 1 << 16

U32 = np.uint32


@nb.njit(inline="always", cache=True)
def _round(v, keep, nan16):
    """The BF16 bits (uint32, low 16 bits) of float32 ``v``, rounded to nearest even."""
    u = np.float32(v).view(np.uint32)
    up = U32(u >> U32(16))
    r = U32(U32(u + U32(0x7FFF) + (up & U32(1))) >> U32(16))
    nan = U32(up | U32(0x40)) if keep else nan16
    return nan if U32(u & U32(0x7FFFFFFF)) > U32(0x7F800000) else r


@nb.njit(inline="always", cache=True)
def _value(h):
    """float32 of BF16 bits ``h``."""
    return U32(U32(h) << U32(16)).view(np.float32)


@nb.njit(inline="always", cache=True)
def _span(c0, c1, n):
    """First index (uint64) and count of tasks ``c0 .. c1`` of ``n`` coordinates: loops run
    ``k`` from 0 and index at ``a + k`` unsigned, as a signed index gets a wrap-around
    select that defeats the vectoriser."""
    a = np.uint64(c0) * np.uint64(TASK)
    return a, np.int64(min(np.uint64(n), np.uint64(c1) * np.uint64(TASK)) - a)


@nb.njit(nogil=True, cache=True, error_model="numpy")
def _encode(c0, c1, x, out, keep, nan16):
    a, m = _span(c0, c1, x.size)
    for k in range(m):
        j = a + np.uint64(k)
        out[j] = np.uint16(_round(x[j], keep, nan16))


@nb.njit(nogil=True, cache=True, error_model="numpy")
def _decode(c0, c1, data, out, accumulate):
    a, m = _span(c0, c1, out.size)
    if accumulate:
        for k in range(m):
            j = a + np.uint64(k)
            out[j] = out[j] + _value(data[j])
    else:
        for k in range(m):
            j = a + np.uint64(k)
            out[j] = _value(data[j])


@nb.njit(nogil=True, cache=True, error_model="numpy")
def _recompress(c0, c1, data, acc, out, writeback, keep, nan16):
    a, m = _span(c0, c1, acc.size)
    # one loop per writeback, so that each is a loop without branches
    if writeback == 0:
        for k in range(m):
            j = a + np.uint64(k)
            out[j] = np.uint16(_round(acc[j] + _value(data[j]), keep, nan16))
    elif writeback == 1:
        for k in range(m):
            j = a + np.uint64(k)
            s = acc[j] + _value(data[j])
            out[j] = np.uint16(_round(s, keep, nan16))
            acc[j] = s
    else:
        for k in range(m):
            j = a + np.uint64(k)
            h = _round(acc[j] + _value(data[j]), keep, nan16)
            out[j] = np.uint16(h)
            acc[j] = _value(h)


def _nan_args() -> tuple[bool, np.uint32]:
    rule = nan_pattern(torch.device("cpu"), "bf16")
    return rule < 0, np.uint32(max(rule, 0))


def _bits(t: torch.Tensor) -> np.ndarray:
    """uint16 view of a BF16 wire tensor (int16 or bfloat16, contiguous)."""
    return t.view(torch.int16).numpy().view(np.uint16)


def _tasks(n: int) -> int:
    return -(-n // TASK)


def encode(x: torch.Tensor, out: torch.Tensor) -> None:
    """``out`` ← ``x`` cast to BF16.

    Args:
        x: float32 ``[n]`` on the CPU.
        out: ``[n]`` 16-bit (int16 or bfloat16), contiguous, written.

    Equivalent to ``out.view(torch.bfloat16).copy_(x)``.
    """
    keep, nan16 = _nan_args()
    run_tasks(_encode, _tasks(x.numel()), x.numpy(), _bits(out), keep, nan16)


def decode(data: torch.Tensor, out: torch.Tensor, accumulate: bool) -> None:
    """``out`` ← (``+=`` when ``accumulate``) the float32 values of BF16 ``data``.

    Args:
        data: ``[n]`` 16-bit (int16 or bfloat16), contiguous.
        out: float32 ``[n]``, contiguous, written in place.
        accumulate: Add instead of overwriting.

    Equivalent to ``out.add_(data.view(torch.bfloat16).float())`` (or ``copy_``).
    """
    run_tasks(_decode, _tasks(out.numel()), _bits(data), out.numpy(), bool(accumulate))


def recompress(data: torch.Tensor, acc: torch.Tensor, out: torch.Tensor,
               writeback: Writeback) -> None:
    """``out`` ← BF16 of ``acc + value(data)``; ``acc`` ← that sum (``SUM``), the value of
    ``out`` (``DECODED``) or unchanged (``NONE``).

    Args:
        data: ``[n]`` 16-bit (int16 or bfloat16), contiguous, the incoming message.
        acc: float32 ``[n]``, contiguous.
        out: ``[n]`` 16-bit, contiguous, the outgoing message (may not overlap ``data``).
        writeback: What ``acc`` holds afterwards.

    Equivalent to ``s = acc + data.float(); out.copy_(s)`` and the writeback.
    """
    keep, nan16 = _nan_args()
    run_tasks(_recompress, _tasks(acc.numel()), _bits(data), acc.numpy(), _bits(out),
              int(writeback), keep, nan16)
