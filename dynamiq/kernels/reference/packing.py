"""LSB-first bit streams and little-endian words, as whole-array NumPy operations.

Code ``i`` of a ``b``-bit stream occupies bits ``[i*b, (i+1)*b)``, bit ``j`` of the stream being
bit ``j % 8`` of byte ``j // 8``; the last byte is zero-padded. A block payload's code section is
the same stream (its groups are byte-aligned).
"""

from __future__ import annotations

import numpy as np

__all__ = ["pack", "unpack", "unwords", "words"]


def pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """uint8 ``[ceil(len * bits / 8)]`` stream of the ``bits``-bit ``codes``."""
    shifts = np.arange(bits, dtype=np.uint64)
    bitmat = ((codes.astype(np.uint64)[:, None] >> shifts) & np.uint64(1)).astype(np.uint8)
    return np.packbits(bitmat.reshape(-1), bitorder="little")


def unpack(buf: np.ndarray, bits: int, count: int) -> np.ndarray:
    """int64 ``[count]`` codes of the stream ``buf``."""
    bitv = np.unpackbits(np.asarray(buf, dtype=np.uint8), bitorder="little")
    bitv = bitv[: count * bits].reshape(count, bits)
    return (bitv.astype(np.int64) << np.arange(bits, dtype=np.int64)).sum(1)


def words(codes: np.ndarray, nbytes: int) -> np.ndarray:
    """Little-endian ``nbytes``-byte words of ``codes``, concatenated (uint8)."""
    c = codes.astype(np.uint64)
    out = np.stack([(c >> np.uint64(8 * k)) & np.uint64(0xFF) for k in range(nbytes)], 1)
    return out.astype(np.uint8).reshape(-1)


def unwords(buf: np.ndarray, nbytes: int) -> np.ndarray:
    """uint64 values of the little-endian ``nbytes``-byte words in ``buf``."""
    b = buf.reshape(-1, nbytes).astype(np.uint64)
    return sum(b[:, k] << np.uint64(8 * k) for k in range(nbytes))
