"""Triton kernel of the metadata phase's per-block statistics.

Twin of the float64 block statistics that :func:`dynamiq.collectives.metadata.local_statistics`
takes for the built-in statistics (``"sum"``, ``"sumsq"``, ``"absmax"``, ``"absmax32"``,
``"absmax16"``): the vector is read as zero-padded to whole blocks of the statistic's ``block``
coordinates, widened to float64 and reduced per block. The rounding to the wire format is not
done here: the metadata phase applies the same rounding to every backend's values.

Agreement with the torch (CPU) version:

* ``absmax*`` is exact (a maximum does not depend on order); a block holding a NaN gives NaN,
  as ``torch.amax`` does.
* ``sum`` and ``sumsq`` add in float64 in a different order (a tree here, torch's vectorised
  accumulation there). Every float32 value and every square of one is exact in float64, so only
  the ``m - 1`` additions of a block of ``m`` coordinates round; for any order the float64 result
  is within ``(m - 1) * 2**-53 * sum(|terms|)`` (first order) of the exact sum, so the two
  float64 values differ by at most ``2 * (m - 1) * 2**-53 * sum(|x_i|)`` (``sum``) or
  ``2 * (m - 1) * 2**-53 * sum(x_i**2)`` (``sumsq``), about ``5.7e-14`` of the sum of
  magnitudes for ``m = 256`` (:func:`stats_tolerance`). After rounding to BF16 (8 significant
  bits) the values are equal unless that float64 interval straddles a BF16 rounding boundary, in
  which case they are neighbouring BF16 values. NaN and ±Inf propagate identically.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import triton
import triton.language as tl

from dynamiq.collectives.metadata import STATISTICS
from dynamiq.kernels.triton.launch import _check_device, _on

__all__ = ["OPS", "local_statistics", "stats_tolerance"]

#: The statistics this kernel computes, and the reduction each one is.
OPS = {"sum": 0, "sumsq": 1, "absmax": 2, "absmax32": 2, "absmax16": 2}

_TILE = 1024


@triton.jit
def stats_kernel(y, n, nblocks, out, OP: tl.constexpr, SG: tl.constexpr, NSG: tl.constexpr):
    """One statistic of ``NSG`` blocks of ``SG`` coordinates per program into ``out[nblocks]``.

    ``OP``: 0 sum, 1 sum of squares, 2 maximum magnitude.
    """
    g = tl.program_id(0).to(tl.int64) * NSG + tl.arange(0, NSG)
    idx = g[:, None] * SG + tl.arange(0, SG)[None, :]
    v = tl.load(y + idx, mask=idx < n, other=0.0).to(tl.float64)
    if OP == 0:
        r = tl.sum(v, axis=1)
    elif OP == 1:
        r = tl.sum(v * v, axis=1)
    else:
        r = tl.max(tl.abs(v), axis=1)
        has_nan = tl.max((v != v).to(tl.int32), axis=1) != 0
        # the sum of a block with a NaN is NaN on every device, whatever its max does
        r = tl.where(has_nan, tl.sum(v, axis=1), r)
    tl.store(out + g, r, mask=g < nblocks)


def local_statistics(names: Iterable[str], y: torch.Tensor) -> dict[str, torch.Tensor]:
    """This rank's float64 block statistics before their rounding to the wire format.

    Equivalent to ``STATISTICS[name].local`` of the zero-padded blocks; the metadata phase
    rounds them (:meth:`dynamiq.collectives.metadata.Statistic.round`, the one rounding of
    every backend).

    Args:
        names: Statistics among :data:`OPS`.
        y: float32 ``[n]``, contiguous, on a CUDA device (or the CPU under the interpreter).

    Returns:
        name → float64 ``[ceil(n / block)]`` on ``y``'s device (see the module notes for how
        the sums may differ from torch's).

    Raises:
        ValueError: an unknown statistic name, or a malformed ``y``.
    """
    names = list(names)
    for name in names:
        if name not in OPS:
            raise ValueError(f"the Triton statistics kernel computes {tuple(OPS)}, not {name!r}")
    if not isinstance(y, torch.Tensor):
        raise TypeError(f"y must be a torch.Tensor, got {type(y).__name__}")
    if y.dtype != torch.float32 or y.dim() != 1 or not y.is_contiguous():
        raise ValueError("y must be a contiguous 1-D float32 tensor")
    _check_device(y.device)
    n = y.numel()
    out = {}
    for name in names:
        st = STATISTICS[name]
        nblocks = st.blocks(n)
        r = torch.empty(nblocks, dtype=torch.float64, device=y.device)
        if nblocks:
            nsg = max(1, _TILE // st.block)
            with _on(y.device):
                stats_kernel[(-(-nblocks // nsg),)](
                    y, n, nblocks, r, OP=OPS[name], SG=st.block, NSG=nsg, num_warps=4,
                    enable_fp_fusion=False,
                )
        out[name] = r
    return out


def stats_tolerance(name: str, y: torch.Tensor) -> torch.Tensor:
    """Bound on ``|triton - torch|`` per block for the *unrounded* statistic ``name``.

    Args:
        name: One of :data:`OPS`.
        y: The float32 vector the statistics were taken of.

    Returns:
        float64 ``[blocks]`` on the CPU: 0 for maxima, ``2 * (m - 1) * 2**-53 * sum(|x|)`` for
        ``sum`` (``x**2`` for ``sumsq``) with ``m`` the block size, enlarged by ``1e-6``
        relative for second-order terms.
    """
    st = STATISTICS[name]
    nb = st.blocks(y.numel())
    g = torch.zeros(nb * st.block, dtype=torch.float64)
    g[: y.numel()] = y.detach().to("cpu", torch.float64)
    g = g.view(nb, st.block)
    if OPS[name] == 2:
        return torch.zeros(nb, dtype=torch.float64)
    mag = g.abs().sum(1) if OPS[name] == 0 else (g * g).sum(1)
    return mag * (2.0 * (st.block - 1) * 2.0**-53 * (1.0 + 1e-6))
