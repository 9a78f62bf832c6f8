"""Numba helpers of the LSB-first bit streams that the per-coordinate codecs put on the wire.

Code ``i`` of a ``b``-bit stream occupies bits ``[i*b, (i+1)*b)``, bit ``j`` of the stream being
bit ``j % 8`` of byte ``j // 8``; the last byte is zero-padded. A writer and a reader are a few
registers (a 64-bit accumulator, its fill, the byte position) threaded through these inlined
functions, so a kernel's loop stays one pass.
"""

from __future__ import annotations

import numba as nb
import numpy as np

__all__ = ["flush_codes", "put_code", "take_code"]

_BYTE = np.uint64(0xFF)
_EIGHT = np.uint64(8)


@nb.njit(inline="always", cache=True)
def put_code(out, wacc, wn, pos, code, bits):
    """Append ``code`` (``bits`` wide) to the stream in ``out``; returns the new
    ``(wacc, wn, pos)`` writer state (start from ``(np.uint64(0), 0, 0)``)."""
    wacc |= np.uint64(code) << np.uint64(wn)
    wn += bits
    while wn >= 8:
        out[pos] = np.uint8(wacc & _BYTE)
        wacc >>= _EIGHT
        wn -= 8
        pos += 1
    return wacc, wn, pos


@nb.njit(inline="always", cache=True)
def flush_codes(out, wacc, wn, pos):
    """Write the writer's last, partial byte (zero-padded), if any."""
    if wn > 0:
        out[pos] = np.uint8(wacc & _BYTE)


@nb.njit(inline="always", cache=True)
def take_code(data, racc, rn, pos, bits, mask):
    """Read the next ``bits``-wide code (``mask = 2**bits - 1``) from ``data``; returns
    ``(code, racc, rn, pos)`` (start the reader from ``(np.uint64(0), 0, 0)``)."""
    while rn < bits:
        racc |= np.uint64(data[pos]) << np.uint64(rn)
        pos += 1
        rn += 8
    code = racc & mask
    racc >>= np.uint64(bits)
    rn -= bits
    return code, racc, rn, pos
