"""Host-side preparation of a number format for kernels (shared by every backend).

Kernels never see a format object, only these arrays and constants: an ascending search table of
the finite magnitudes, a decode table of every magnitude code, and a bucket lookup table that
turns the float32 bit pattern of a magnitude into its bracket in O(1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dynamiq.formats import NumberFormat

__all__ = ["FormatTables", "bucket_lut", "element_family", "uniform_grid"]

_MAX_LUT_BITS = 16


def bucket_lut(mags: np.ndarray) -> tuple[np.ndarray, int, int]:
    """Build the O(1) bracket lookup for an ascending float32 table.

    Bucket keys are ``float32_bits(a) >> shift``; they are monotone in ``a >= 0``. The coarsest
    ``shift`` is chosen such that no bucket holds more than one table value strictly inside it,
    so ``lo = lut[key - key0]`` followed by one compare against ``tab[lo + 1]`` gives the last
    index with ``tab[lo] <= a``.

    Args:
        mags: Ascending float32 magnitudes (values below ``mags[0]`` bracket to index 0).

    Returns:
        ``(lut, shift, key0)``: int32 lookup table, right shift, and the key of ``lut[0]``.
    """
    mags = np.asarray(mags, dtype=np.float32)
    nfin = len(mags)
    pos = mags[mags > 0]
    if len(pos) == 0:
        return np.zeros(1, np.int32), 23, 0
    emin = max(math.floor(math.log2(float(pos[0]))) - 1, -149)
    lo_bits = int(np.float32(2.0**emin).view(np.uint32))
    hi_bits = int(np.float32(mags[-1]).view(np.uint32))
    for k in range(_MAX_LUT_BITS + 1):
        shift = 23 - k
        key0 = lo_bits >> shift
        length = (hi_bits >> shift) - key0 + 2
        keys = np.arange(length, dtype=np.int64) + key0
        starts = (keys << shift).astype(np.uint32).view(np.float32)
        starts[0] = 0.0  # the first bucket also takes everything below 2**emin
        ends = np.append(starts[1:], np.float32(np.inf))
        inside = np.searchsorted(mags, ends, "left") - np.searchsorted(mags, starts, "right")
        if inside.max() <= 1:
            lut = np.clip(np.searchsorted(mags, starts, "right") - 1, 0, nfin - 1)
            return lut.astype(np.int32), shift, key0
    raise ValueError("magnitudes too closely spaced for a bucket lookup table")


#: How the kernels search an element table (:func:`element_family`).
FAMILY_TABLE, FAMILY_FLOAT, FAMILY_INT, FAMILY_CHAIN = 0, 1, 2, 3
#: Largest table searched by comparing with every level.
CHAIN_LEVELS = 16


def _float_grid(n: int, mant: int, bias: int) -> np.ndarray:
    i = np.arange(n, dtype=np.int64)
    e, m = i >> mant, i & ((1 << mant) - 1)
    sub = m * 2.0 ** (1 - bias - mant)
    normal = (1.0 + m / 2.0**mant) * np.exp2((e - bias).astype(np.float64))
    return np.where(e == 0, sub, normal)


def element_family(mags: np.ndarray, mbits: int) -> tuple[int, int, int]:
    """How a kernel can find the levels bracketing a magnitude: ``(family, mant, bias)``.

    Decided from the values alone, so a registered format needs no kernel code and a format
    is only given an arithmetic search when that search reproduces its table exactly:

    * ``FAMILY_FLOAT``: the finite magnitudes are a minifloat grid with subnormals (``mant``
      mantissa bits, exponent ``bias``), searched by float32 bit arithmetic;
    * ``FAMILY_INT``: the magnitudes are ``0, 1, 2, ...``, searched by truncation;
    * ``FAMILY_CHAIN``: at most :data:`CHAIN_LEVELS` codes, searched by comparing with each;
    * ``FAMILY_TABLE``: anything else, searched through the bucket lookup.

    Args:
        mags: Ascending finite float32 magnitudes (``mags[0] == 0`` but for a mid-rise grid,
            which takes a compare or lookup search).
        mbits: Magnitude bits of the codes.
    """
    mags = np.asarray(mags, dtype=np.float64)
    n = len(mags)
    if n >= 2 and mags[0] == 0:
        if np.array_equal(mags, np.arange(n, dtype=np.float64)):
            return FAMILY_INT, 0, 0
        for mant in range(0, 11):
            bias = 1 - mant - math.log2(mags[1])
            if bias != int(bias):
                continue
            bias = int(bias)
            # both rescaling constants must be float32 numbers
            if bias - 1 + mant > 126 or 1 - bias - mant < -149:
                continue
            if np.array_equal(_float_grid(n, mant, bias), mags):
                return FAMILY_FLOAT, mant, bias
    if (1 << mbits) <= CHAIN_LEVELS:
        return FAMILY_CHAIN, 0, 0
    return FAMILY_TABLE, 0, 0


def uniform_grid(mags: np.ndarray) -> int:
    """``k`` when the finite magnitudes ``mags`` are exactly ``float32(i) / float32(k)`` for
    ``i = 0 .. k`` (a uniform scale grid such as ``u8rel``), else 0: whether a kernel may find a
    value's bracket by arithmetic (:func:`dynamiq.kernels.numba.levels.round_grid`), which
    computes each level so. Decided from the values alone, like :func:`element_family`.
    """
    mags = np.asarray(mags, dtype=np.float32)
    k = len(mags) - 1
    if k < 1 or k >= 1 << 24:  # the indices must be exact float32 integers
        return 0
    grid = np.arange(k + 1, dtype=np.float32) / np.float32(k)
    return k if np.array_equal(mags, grid) else 0


@dataclass(frozen=True)
class FormatTables:
    """Kernel-side view of a format.

    Attributes:
        kind: 0 for table formats, 1 for raw FP32.
        search: float32[2**logp + 1] finite magnitudes padded with +inf.
        nfin: Number of finite magnitudes.
        logp: Binary-search depth.
        dec: float32 value of every magnitude code.
        nan: Magnitude code of NaN (0 if none).
        nbytes: Bytes of one stored code (scales).
        lut, lshift, lkey0: the bucket lookup of :func:`bucket_lut`.
    """

    kind: int
    search: np.ndarray
    nfin: int
    logp: int
    dec: np.ndarray
    nan: int
    nbytes: int
    lut: np.ndarray
    lshift: int
    lkey0: int

    @staticmethod
    def of(fmt: NumberFormat | None) -> FormatTables:
        """Tables of ``fmt`` (``None``: inert placeholders for an absent super scale)."""
        dummy_f = np.zeros(2, np.float32)
        dummy_i = np.zeros(1, np.int32)
        if fmt is None:
            return FormatTables(0, dummy_f, 1, 0, dummy_f, 0, 1, dummy_i, 23, 0)
        if fmt.kind == "fp32":
            return FormatTables(1, dummy_f, 1, 0, dummy_f, 0x7FC00000, 4, dummy_i, 23, 0)
        mags = fmt.magnitudes().astype(np.float32)
        logp = max(1, math.ceil(math.log2(len(mags))))
        search = np.full(2**logp + 1, np.inf, np.float32)
        search[: len(mags)] = mags
        try:
            lut, shift, key0 = bucket_lut(mags)
        except ValueError:  # too finely spaced for a bounded table: binary search instead
            lut, shift, key0 = dummy_i, 23, 0
        return FormatTables(
            0, search, len(mags), logp, fmt.decode_table().astype(np.float32),
            fmt.nan_code if fmt.nan_code is not None else 0,
            max(1, math.ceil(fmt.bits / 8)), lut, shift, key0,
        )
