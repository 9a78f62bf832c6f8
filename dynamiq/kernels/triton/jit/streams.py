"""Triton helpers shared by the per-coordinate kernels: tiles, code-stream chunks, finiteness.

A program handles a tile of ``TILE`` consecutive coordinates (a multiple of 8, hence of every
code chunk ``E = 8 / gcd(bits, 8)``), so tiles start on whole bytes of the packed bit streams;
the stream's last byte is cut short through the ``limit`` of
:func:`~dynamiq.kernels.triton.jit.elements.pack_codes`.
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["is_finite", "stream_chunks", "tile"]

_FMAX = tl.constexpr(3.4028234663852886e38)  # the largest float32


@triton.jit
def is_finite(v):
    """``np.isfinite`` of a float32 tensor (exact comparisons only)."""
    return (v == v) & (tl.abs(v) <= _FMAX)


@triton.jit
def tile(n, TILE: tl.constexpr):
    """This program's coordinates (int64) and their validity."""
    i = tl.program_id(0).to(tl.int64) * TILE + tl.arange(0, TILE)
    return i, i < n


@triton.jit
def stream_chunks(n, TILE: tl.constexpr, E: tl.constexpr):
    """Validity (bool ``[TILE / E]``) of this program's chunks of ``E`` codes: those that
    start inside the ``n`` coordinates."""
    c0 = tl.program_id(0).to(tl.int64) * (TILE // E)
    return (c0 + tl.arange(0, TILE // E)) * E < n


