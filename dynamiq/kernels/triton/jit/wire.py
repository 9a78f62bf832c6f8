"""Triton kernels of wire values and row permutations: twins of the torch operations of
:class:`dynamiq.kernels.backend.Backend`.

* **Wire** kernels: FP32, BF16 or FP16 values of (a block selection of) the coordinates
  (``FMT``: 0, 1, 2). BF16 is round-to-nearest-even on the bits, FP16 the IEEE conversion
  (round to nearest even, subnormals, overflow to infinity), as torch converts; the NaN pattern
  torch writes is a runtime argument (``nan16``: a constant such as ``0xFFFF`` from the
  vectorised x86 path or ``0x7FC0`` from the scalar one, or ``-1`` for "keep the payload,
  quietened"), probed once per device and format by the launcher, so the bytes equal torch's
  on the same device.
* **Row permutation**: DynamiQ's gather of super-groups by width and the inverse scatter
  (copy or ``out + value``), with the zero padding of the chunk's partial last super-group.
"""

from __future__ import annotations

import triton
import triton.language as tl

from dynamiq.kernels.triton.jit.streams import tile

__all__ = ["bf16_bits", "bf16_value", "fp16_bits", "fp16_value", "gather_rows_kernel",
           "scatter_rows_kernel",
           "wire_decode_kernel", "wire_encode_kernel", "wire_recompress_kernel"]

@triton.jit
def bf16_bits(v, nan16):
    """BF16 bit pattern (int32 in ``[0, 65535]``) of float32 ``v``, round to nearest even.

    NaN becomes ``nan16``, or (``nan16 < 0``) its own top half with the quiet bit set.
    """
    b = v.to(tl.uint32, bitcast=True)
    r = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).to(tl.int32)
    keep = ((b >> 16) | 0x40).to(tl.int32)
    return tl.where(v != v, tl.where(nan16 < 0, keep, nan16), r)


@triton.jit
def bf16_value(h):
    """float32 value of BF16 bit patterns ``h`` (any integer type; exact)."""
    return ((h.to(tl.int32) & 0xFFFF).to(tl.uint32) << 16).to(tl.float32, bitcast=True)


@triton.jit
def fp16_bits(v, nan16):
    """FP16 bit pattern (int32 in ``[0, 65535]``) of float32 ``v`` (IEEE round to nearest
    even). NaN becomes ``nan16``, or (``nan16 < 0``) its sign and top 10 payload bits with the
    quiet bit set."""
    h = v.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    b = v.to(tl.uint32, bitcast=True)
    keep = (((b >> 16) & 0x8000) | 0x7E00 | ((b >> 13) & 0x3FF)).to(tl.int32)
    return tl.where(v != v, tl.where(nan16 < 0, keep, nan16), h)


@triton.jit
def fp16_value(h):
    """float32 value of FP16 bit patterns ``h`` (any integer type; exact)."""
    return h.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _wire_pos(i, m, bpos, SELECT: tl.constexpr, SB: tl.constexpr):
    """Wire index of coordinate ``i`` and whether it travels: ``i`` itself, or, with a
    selection of blocks of ``SB``, ``bpos[i // SB] + i % SB`` (``bpos < 0``: not selected)."""
    if SELECT:
        b = tl.load(bpos + i // SB, mask=m, other=-1)
        return b + i % SB, m & (b >= 0)
    else:
        return i, m


@triton.jit
def _wire_load(wire, p, sel, FMT: tl.constexpr):
    """float32 values of the wire entries ``p`` (0 where not ``sel``)."""
    if FMT == 1:
        v = bf16_value(tl.load(wire + p, mask=sel, other=0))
    elif FMT == 2:
        v = fp16_value(tl.load(wire + p, mask=sel, other=0))
    else:
        v = tl.load(wire + p, mask=sel, other=0.0)
    return tl.where(sel, v, 0.0)


@triton.jit
def _wire_store(wire, p, sel, v, nan16, FMT: tl.constexpr):
    """Store float32 ``v`` into the wire entries ``p`` where ``sel``; returns what was stored,
    as float32 (the decoded value)."""
    if FMT == 1:
        h = bf16_bits(v, nan16)
        tl.store(wire + p, h.to(tl.int16), mask=sel)
        d = bf16_value(h)
    elif FMT == 2:
        h = fp16_bits(v, nan16)
        tl.store(wire + p, h.to(tl.int16), mask=sel)
        d = fp16_value(h)
    else:
        tl.store(wire + p, v, mask=sel)
        d = v
    return d


@triton.jit
def wire_encode_kernel(x, n, wire, bpos, nan16, FMT: tl.constexpr, SELECT: tl.constexpr,
                       SB: tl.constexpr, TILE: tl.constexpr):
    """``wire[p(i)] = cast(x[i])`` for the travelling coordinates."""
    i, m = tile(n, TILE)
    p, sel = _wire_pos(i, m, bpos, SELECT, SB)
    _wire_store(wire, p, sel, tl.load(x + i, mask=m, other=0.0), nan16, FMT)


@triton.jit
def wire_decode_kernel(wire, n, out, bpos, FMT: tl.constexpr, SELECT: tl.constexpr,
                       SB: tl.constexpr, ACCUMULATE: tl.constexpr, TILE: tl.constexpr):
    """``out[i] (=|+=) value(wire[p(i)])``, 0 for coordinates that do not travel."""
    i, m = tile(n, TILE)
    p, sel = _wire_pos(i, m, bpos, SELECT, SB)
    v = _wire_load(wire, p, sel, FMT)
    if ACCUMULATE:
        v = tl.load(out + i, mask=m, other=0.0) + v
    tl.store(out + i, v, mask=m)


@triton.jit
def wire_recompress_kernel(wire, acc, n, out, bpos, nan16, FMT: tl.constexpr,
                           SELECT: tl.constexpr, SB: tl.constexpr, WRITEBACK: tl.constexpr,
                           TILE: tl.constexpr):
    """``out = cast(acc + value(wire))`` on the travelling coordinates.

    ``WRITEBACK``: 0 leaves ``acc``; 1 stores ``acc + value`` (``acc + 0`` where nothing
    travels); 2 stores the decoded outgoing value (0 where nothing travels).
    """
    i, m = tile(n, TILE)
    p, sel = _wire_pos(i, m, bpos, SELECT, SB)
    t = tl.load(acc + i, mask=m, other=0.0) + _wire_load(wire, p, sel, FMT)
    d = _wire_store(out, p, sel, t, nan16, FMT)
    if WRITEBACK == 1:
        tl.store(acc + i, t, mask=m)
    elif WRITEBACK == 2:
        tl.store(acc + i, tl.where(sel, d, 0.0), mask=m)


# ---- row permutation (DynamiQ's reorder by width) -----------------------------------------------
@triton.jit
def gather_rows_kernel(x, n, order, rows, g, ROW: tl.constexpr, RPP: tl.constexpr):
    """``g[k * ROW + j] = x[order[k] * ROW + j]`` (0 past ``n``) for ``RPP`` rows per program."""
    k = tl.program_id(0).to(tl.int64) * RPP + tl.arange(0, RPP)
    km = k < rows
    src = tl.load(order + k, mask=km, other=0).to(tl.int64)
    j = tl.arange(0, ROW)[None, :]
    si = src[:, None] * ROW + j
    v = tl.load(x + si, mask=km[:, None] & (si < n), other=0.0)
    tl.store(g + k[:, None] * ROW + j, v, mask=km[:, None])


@triton.jit
def scatter_rows_kernel(g, n, order, rows, out, ROW: tl.constexpr, RPP: tl.constexpr,
                        ADD: tl.constexpr):
    """``out[order[k] * ROW + j] (=|+=) g[k * ROW + j]`` for destinations below ``n``."""
    k = tl.program_id(0).to(tl.int64) * RPP + tl.arange(0, RPP)
    km = k < rows
    dst = tl.load(order + k, mask=km, other=0).to(tl.int64)
    j = tl.arange(0, ROW)[None, :]
    di = dst[:, None] * ROW + j
    dm = km[:, None] & (di < n)
    v = tl.load(g + k[:, None] * ROW + j, mask=dm, other=0.0)
    if ADD:
        v = tl.load(out + di, mask=dm, other=0.0) + v
    tl.store(out + di, v, mask=dm)

