"""Reference (NumPy) shared-scale minifloat codes: :mod:`dynamiq.kernels.numba.shared_scale`'s
maths as whole-array operations.

The code of ``v`` in a block of scale ``s`` is the nearest of the decoded levels
``L_j = tab[j] * s`` (float32), ties to the even magnitude code, saturating at the largest;
``v`` or ``s`` non-finite gives ``nan_code``. For ``s >= 0`` the levels are non-decreasing in
``j``, so the bracket ``lo`` is the last ``j`` with ``L_j <= |v|`` (0 if none), which is what the
compiled kernels' bucket lookup followed by their settling loops computes.
"""

from __future__ import annotations

import numpy as np

from dynamiq.kernels.abi import SharedScaleCode, Writeback
from dynamiq.kernels.reference.packing import pack, unpack

__all__ = ["decode", "encode", "recompress"]

_F = np.float32


def _per_coord(scales: np.ndarray, block: int, n: int) -> np.ndarray:
    return np.repeat(np.asarray(scales, dtype=_F), block)[:n]


def codes_of(code: SharedScaleCode, v: np.ndarray, s: np.ndarray) -> np.ndarray:
    """int64 codes of float32 values ``v`` under per-coordinate float32 scales ``s``."""
    nfin = code.tables.nfin
    tab = code.tables.search[:nfin].astype(_F)
    with np.errstate(invalid="ignore", over="ignore"):
        a = np.abs(v).astype(_F)
        levels = (tab[None, :] * s[:, None]).astype(_F)
        lo = np.clip((levels <= a[:, None]).sum(1) - 1, 0, nfin - 1)
        hi = np.minimum(lo + 1, nfin - 1)
        d1 = a.astype(np.float64) - (tab[lo] * s).astype(_F).astype(np.float64)
        d2 = (tab[hi] * s).astype(_F).astype(np.float64) - a.astype(np.float64)
    up = (d2 < d1) | ((d2 == d1) & (lo % 2 == 1))
    mag = np.minimum(lo + up.astype(np.int64), nfin - 1)
    neg = (v < 0) & (mag != 0)
    out = mag | (neg.astype(np.int64) << code.mbits)
    return np.where(np.isfinite(v) & np.isfinite(s), out, code.nan_code).astype(np.int64)


def encode(code: SharedScaleCode, x: np.ndarray, scales: np.ndarray, block: int) -> np.ndarray:
    """The packed codes (uint8) of float32 ``x``; block ``j`` has ``scales[j]``."""
    x = np.asarray(x, dtype=_F)
    return pack(codes_of(code, x, _per_coord(scales, block, x.size)), code.bits)


def values(code: SharedScaleCode, data: np.ndarray, scales: np.ndarray, block: int,
           n: int) -> np.ndarray:
    """float32 ``[n]`` decoded values ``dec[c] * s`` of the stream ``data``."""
    c = unpack(data, code.bits, n)
    with np.errstate(invalid="ignore", over="ignore"):
        return (code.dec[c] * _per_coord(scales, block, n)).astype(_F)


def decode(code: SharedScaleCode, data: np.ndarray, scales: np.ndarray, block: int,
           out: np.ndarray, accumulate: bool) -> np.ndarray:
    """``out (=|+=) values`` (float32)."""
    v = values(code, data, scales, block, out.size)
    return (out + v).astype(_F) if accumulate else v


def recompress(code: SharedScaleCode, data: np.ndarray, acc: np.ndarray, scales: np.ndarray,
               block: int, writeback: Writeback) -> tuple[np.ndarray, np.ndarray]:
    """The codes of ``acc + decode(data)`` and what ``acc`` holds afterwards."""
    acc = np.asarray(acc, dtype=_F)
    s = _per_coord(scales, block, acc.size)
    with np.errstate(invalid="ignore", over="ignore"):
        v = (acc + values(code, data, scales, block, acc.size)).astype(_F)
        new = codes_of(code, v, s)
        if writeback == Writeback.SUM:
            acc = v
        elif writeback == Writeback.DECODED:
            acc = (code.dec[new] * s).astype(_F)
    return pack(new, code.bits), acc
