"""Numba block statistics of the metadata phase: one compiled pass per statistic (a block sum
and centred sum of squares asked together share one).

Twin of :meth:`dynamiq.kernels.backend.Backend.block_statistics` (torch on the CPU). The vector
is read as zero-padded to whole blocks and every block is reduced in float64 (in vector
registers, see ``_FASTMATH``), blocks in parallel. The rounding to the wire format is not done
here: the metadata phase applies one rounding to every backend's values.

Agreement with the torch version is that of the Triton kernels
(:mod:`dynamiq.kernels.triton.stats`): maxima are exact, and the float64 sums lie within
:func:`~dynamiq.kernels.backend.stats_tolerance` of torch's, so that after rounding to 8 or 16
bits they agree unless the two straddle a rounding boundary.
"""

from __future__ import annotations

from collections.abc import Sequence

import numba as nb
import numpy as np
import torch

import dynamiq.kernels.numba.stamps  # noqa: F401  (the cache of its functions: see there)
from dynamiq.kernels.abi import STAT_OPS
from dynamiq.kernels.numba.elements import absmax

__all__ = ["block_statistics"]

# op codes of the kernel, in the order of STAT_OPS
_SUM, _SUMSQ, _ABSMAX, _CSUMSQ = range(4)
assert STAT_OPS == ("sum", "sumsq", "absmax", "csumsq")


#: The float64 sums may be reassociated (and multiply-adds fused): one running sum is a chain
#: of dependent additions at the adder's latency, several partial sums in vector registers run
#: at its throughput. The sums then differ from index order by the partial sums' combination,
#: which :func:`~dynamiq.kernels.blockstats.stats_tolerance` covers; no flag that assumes
#: finite values is set, so NaN and infinities propagate.
_FASTMATH = {"reassoc", "contract"}


@nb.njit(inline="always", cache=True)
def _sums(y, lo, hi, shift):  # pragma: no cover - compiled
    """The float64 sums of ``y[lo:hi] - shift`` and of its squares."""
    s = 0.0
    q = 0.0
    for i in range(np.uint64(lo), np.uint64(hi)):
        v = np.float64(y[i]) - shift
        s += v
        q += v * v
    return s, q


@nb.njit(inline="always", cache=True)
def _sum_csumsq(y, lo, hi, block):  # pragma: no cover - compiled
    """The float64 sum of ``y[lo:hi]``, and its sum of squares about the block's own mean, the
    zero padding to ``block`` included (as the definition reads)."""
    s = _sums(y, lo, hi, 0.0)[0]
    mean = s / block
    return s, _sums(y, lo, hi, mean)[1] + (block - (hi - lo)) * (mean * mean)


@nb.njit(parallel=True, cache=True, fastmath=_FASTMATH)
def _stats(y, block, op, out):  # pragma: no cover - compiled
    n = y.size
    nb_ = out.size
    for b in nb.prange(nb_):
        lo = b * block
        hi = min(lo + block, n)
        if op == _ABSMAX:
            m = 0.0
            nan = False
            for i in range(lo, hi):
                v = abs(np.float64(y[i]))
                if v != v:
                    nan = True
                elif v > m:
                    m = v
            out[b] = np.nan if nan else m
        elif op == _SUM:
            out[b] = _sums(y, lo, hi, 0.0)[0]
        elif op == _SUMSQ:
            out[b] = _sums(y, lo, hi, 0.0)[1]
        else:
            out[b] = _sum_csumsq(y, lo, hi, block)[1]


@nb.njit(parallel=True, cache=True, fastmath=_FASTMATH)
def _sum_and_csumsq(y, block, sums, out):  # pragma: no cover - compiled
    # the "csumsq" pass of _stats, keeping the block sums it takes on the way: one read of the
    # data gives both statistics, each with the bits its own pass gives
    n = y.size
    for b in nb.prange(out.size):
        lo = b * block
        sums[b], out[b] = _sum_csumsq(y, lo, min(lo + block, n), block)


@nb.njit(parallel=True, cache=True)
def _absmax32(y, block, out):  # pragma: no cover - compiled
    # the "absmax" pass of _stats for float32 values, by the block kernels' bit-pattern
    # maximum (it vectorises, where a float maximum with a NaN test is a serial chain): the
    # largest pattern read back is the maximum, +Inf or a NaN, as the definition reads
    n = y.size
    for b in nb.prange(out.size):
        lo = b * block
        out[b] = np.float64(absmax(y, np.uint64(lo), min(lo + block, n) - lo)[0])


def block_statistics(y: torch.Tensor, ops: Sequence[tuple[str, int]]
                     ) -> dict[tuple[str, int], torch.Tensor]:
    """See :meth:`dynamiq.kernels.backend.Backend.block_statistics` (the sums are added in
    index order; see the module notes for how they may differ from torch's)."""
    yn = y.detach().contiguous().numpy()
    n = yn.size
    out = {}
    asked = set(ops)
    for op, block in ops:
        if op not in STAT_OPS:
            raise ValueError(f"block statistics are {STAT_OPS}, not {op!r}")
        if (op, block) in out:
            continue
        r = np.empty(-(-n // block), dtype=np.float64)
        if op in ("sum", "csumsq") and r.size and {("sum", block), ("csumsq", block)} <= asked:
            sums = np.empty_like(r)
            _sum_and_csumsq(yn, int(block), sums, r)
            out[("csumsq", block)] = torch.from_numpy(r)
            out[("sum", block)] = torch.from_numpy(sums)
            continue
        if r.size and op == "absmax" and yn.dtype == np.float32:
            _absmax32(yn, int(block), r)
        elif r.size:
            _stats(yn, int(block), STAT_OPS.index(op), r)
        out[(op, block)] = torch.from_numpy(r)
    return out
