"""One rank's share of the metadata phase: its statistics, taken on the kernel backend of the
vector's device and rounded to their wire formats (definitions in :mod:`dynamiq.metadata`)."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from dynamiq.kernels import backend_for
from dynamiq.kernels.blockstats import padded_blocks
from dynamiq.metadata import STATISTICS

__all__ = ["local_statistics"]


def local_statistics(names: Iterable[str], y: torch.Tensor, backend: str = "auto"
                     ) -> dict[str, torch.Tensor]:
    """This rank's statistics as they travel: name → float64 ``[blocks]`` of wire values.

    ``y`` (float32, 1-D) is zero-padded to whole blocks; sums are taken in float64 and then
    rounded to the statistic's wire format (:meth:`Statistic.round`; maxima upwards), one
    rounding for every backend.

    Args:
        names: Statistic names in :data:`STATISTICS`.
        y: float32 ``[n]``.
        backend: The kernel backend (``"auto"``: by ``y``'s device) that takes the statistics
            with an :attr:`Statistic.op`; the others are taken by torch on the CPU. Maxima
            agree exactly across backends; a sum may differ from torch's only when its float64
            value lies within about ``1e-13`` relative of a rounding boundary of its wire
            format.

    Returns:
        name → float64 ``[blocks]`` on the CPU.
    """
    names = list(names)
    ops = sorted({(STATISTICS[n].op, STATISTICS[n].block) for n in names
                  if STATISTICS[n].op is not None})
    raw = backend_for(backend, y).block_statistics(y, ops) if ops else {}
    out = {}
    y64 = None
    for name in names:
        st = STATISTICS[name]
        if st.op is not None:
            out[name] = st.round(raw[(st.op, st.block)])
            continue
        if y64 is None:
            y64 = y.detach().to(device="cpu", dtype=torch.float64)
        out[name] = st.round(st.local(padded_blocks(y64, st.block)))
    return out
