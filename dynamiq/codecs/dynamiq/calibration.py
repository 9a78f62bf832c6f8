"""Calibration of the targeted mode's error model on the ranks' own values.

The measured errors are those of Gaussian values; real gradients are
often heavier-tailed inside a group (a group's maximum then sits further above its typical
value, and the levels are coarser relative to it), which raises an option's error by a
factor of up to about 2. So each rank also codes a fixed sample of its own super-groups
(:data:`CALIBRATION_SUPER_GROUPS` non-zero ones, evenly spaced along their energy order, each
centred on its own mean and scaled to unit energy) with every option, and adds its squared
errors and the sample's size to the metadata phase (:func:`calibration_sums`); from the sums
over ranks every rank derives the same factor per option, :func:`calibration` (the mean
relative error per super-group over the Gaussian one), which multiplies the measured errors.
A sample of the most energetic super-groups instead missed the error of the many mid-energy
ones, where the narrow widths go (1.2 against 1.5–1.8 on minilm-mlm).

The factor ``f`` describes one rank's values. A partial sum of equal gradients keeps their
shape, and so does a sum of independent dense ones whose large coordinates sit at the same
places on every rank (minilm-mlm: its partial sums err as much as one rank's values predict).
Heavy tails that come from a sparse support, exact zeros where a rank's rows were not touched,
fill in as the ranks' contributions add up. So the sample also reports its share ``z`` of exact
zeros (:func:`zero_share`), and in the independent regime a partial sum of ``s`` contributions
gets ``1 + (f − 1)(1 − z + z / s)``. On bag-pydoc (factors of 2–6 on one rank) a factor
applied at every hop over-predicted its vNMSE 1.6–3.3×.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from dynamiq.metadata import SUPER_GROUP

__all__ = [
    "CALIBRATION_ENERGY",
    "CALIBRATION_ERRORS",
    "CALIBRATION_SUPER_GROUPS",
    "calibration",
    "calibration_sums",
    "zero_share",
]

#: Super-groups per rank coded with every option to calibrate the error model.
CALIBRATION_SUPER_GROUPS = 128
#: Metadata names of the calibration sums.
CALIBRATION_ERRORS = "dynamiq.calibration.errors"
CALIBRATION_ENERGY = "dynamiq.calibration.energy"
#: Stream of the calibration's random numbers (kept apart from every hop's).
_CALIBRATION_STREAM = (0xCA11B,)


def calibration_sums(y: torch.Tensor, quantizers: Sequence, seed: int, backend: str = "auto"
                     ) -> dict[str, tuple[torch.Tensor, str]]:
    """One rank's calibration sums: every option's squared error on a sample of ``y``.

    Args:
        y: float32 ``[d]``, the rank's vector.
        quantizers: The codec's quantizer per option (``None``: BF16, not sampled).
        seed: Seed of the sample's rounding.
        backend: Kernel backend that codes the sample, on ``y``'s device (the call's own:
            every backend gives the same bits, and no other backend's kernels get compiled).

    Returns:
        ``{CALIBRATION_ERRORS: (float64 [options], "sum"), CALIBRATION_ENERGY: (float64 [2],
        "sum")}``: the squared errors of coding the sample with each option, and the sample's
        energy and its share of exact zeros (per super-group, summed: see :func:`zero_share`).
        The sample is :data:`CALIBRATION_SUPER_GROUPS` whole super-groups evenly spaced along
        the rank's non-zero super-groups sorted by energy, each minus its own mean (what
        centering leaves, near enough) and scaled to unit energy, so that the sums give the
        mean relative error per super-group; non-finite values count as 0.
    """
    m = y.numel() // SUPER_GROUP
    k = len(quantizers)
    errs = torch.zeros(k, dtype=torch.float64)
    if m == 0:
        return {CALIBRATION_ERRORS: (errs, "sum"),
                CALIBRATION_ENERGY: (torch.zeros(2, dtype=torch.float64), "sum")}
    whole = torch.nan_to_num(y.detach()[: m * SUPER_GROUP].view(m, SUPER_GROUP).float(),
                             nan=0.0, posinf=0.0, neginf=0.0)
    # a relative error per super-group, averaged over the rank's non-zero super-groups taken
    # evenly along their energy order (ties by index, so every run samples alike): the bulk of
    # the vector, where the narrow widths go, counts as much as its few largest groups
    xc = whole - whole.mean(1, keepdim=True)
    energy = (xc * xc).sum(1).cpu()
    nonzero = torch.nonzero(energy > 0).flatten()
    if nonzero.numel() == 0:
        return {CALIBRATION_ERRORS: (errs, "sum"),
                CALIBRATION_ENERGY: (torch.zeros(2, dtype=torch.float64), "sum")}
    ranked = nonzero[torch.sort(energy[nonzero], stable=True).indices]
    pick = torch.linspace(0, ranked.numel() - 1,
                          min(ranked.numel(), CALIBRATION_SUPER_GROUPS)).round().long()
    idx = torch.unique(ranked[pick]).to(whole.device)
    x = xc[idx].cpu().double()
    x = (x / x.norm(dim=1, keepdim=True)).float().reshape(-1).contiguous()
    x64 = x.double()
    xd = x.to(whole.device)
    for i, q in enumerate(quantizers):
        xh = (x.to(torch.bfloat16).float() if q is None
              else q.decode(q.encode(xd, seed=seed, stream=_CALIBRATION_STREAM, backend=backend),
                            seed=seed, stream=_CALIBRATION_STREAM, backend=backend).cpu())
        errs[i] = float(((xh.double() - x64) ** 2).sum())
    # exact zeros inside non-zero super-groups: a sparse gradient's (rows that only some ranks
    # touch), whose heavy tails fill in when the ranks' contributions add up
    zeros = float((whole[idx] == 0).double().mean(1).sum())
    energy = torch.tensor([float((x64 * x64).sum()), zeros], dtype=torch.float64)
    return {CALIBRATION_ERRORS: (errs, "sum"), CALIBRATION_ENERGY: (energy, "sum")}


def calibration(stats: Mapping[str, torch.Tensor], errors: np.ndarray, options: int
                ) -> np.ndarray:
    """float64 ``[options]``: the factor by which the sampled errors exceed the model's.

    ``(Σ sampled error / Σ sampled energy) / errors`` per option, from the calibration sums of
    every rank; 1 where the sums are missing (a codec prepared outside an executor), empty or
    not finite. Clipped to [0.25, 8] so that one odd sample cannot run the budget to an end.
    """
    e = stats.get(CALIBRATION_ERRORS)
    en = stats.get(CALIBRATION_ENERGY)
    ones = np.ones(options)
    if e is None or en is None:
        return ones
    e = np.asarray(e, dtype=np.float64).reshape(-1)
    tot = float(np.asarray(en, dtype=np.float64).reshape(-1)[0])
    if e.size != options or not (math.isfinite(tot) and tot > 0):
        return ones
    with np.errstate(divide="ignore", invalid="ignore"):
        f = (e / tot) / errors
    return np.clip(np.where(np.isfinite(f) & (f > 0), f, 1.0), 0.25, 8.0)


def zero_share(stats: Mapping[str, torch.Tensor]) -> float:
    """The mean share of exact zeros in the calibration's sampled super-groups, over every
    rank (0 where the sums are missing or empty): how much of the sample's heavy tails come
    from a sparse support, which differs between ranks, rather than from the values' shape."""
    en = stats.get(CALIBRATION_ENERGY)
    if en is None:
        return 0.0
    en = np.asarray(en, dtype=np.float64).reshape(-1)
    if en.size < 2 or not (np.all(np.isfinite(en[:2])) and en[0] > 0):
        return 0.0
    # every sampled super-group has unit energy: the energy sum counts the sample
    return float(np.clip(en[1] / en[0], 0.0, 1.0))
