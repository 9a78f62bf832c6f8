"""Accuracy-targeted budgets: predict a call's vNMSE from the metadata, pick the smallest ``b̄``.

A DynamiQ codec built with ``target=`` chooses its budget per call (docs/method.rst,
"accuracy-targeted budgets"). Everything here reads only what every rank holds after the
metadata phase (the global per-super-group energies) and the schedule, so every rank picks the
same budget without another message.

**The error model.** An option of measured relative error ``v`` (one encode–decode of Gaussian
values, :func:`~dynamiq.codecs.dynamiq.errors.measured_error`) adds ``v · e`` squared error
when it codes values of energy ``e``. In a reduce tree every rank compresses once: a leaf its
own values, an internal node its partial sum of ``s`` contributions, the owner the whole sum
(``s = n``, :meth:`~dynamiq.topologies.Schedule.subtree_sizes`). A super-group of global energy
``E = Σ_i ‖x_i‖²`` (the metadata's sum of squares over ranks) then contributes

* ``v · E · Σ_r s_r / n`` against a true sum of energy ``E`` when the ranks' gradients are
  independent (a partial sum of ``s`` carries ``s E / n``), and
* ``v · E · Σ_r s_r² / n`` against ``n E`` when they are equal (it carries ``s² E / n``).

Relative to the sum these are ``v · c`` with the tree factors ``c_ind = Σ s / n`` and
``c_eq = Σ s² / n²`` (:meth:`~dynamiq.topologies.Schedule.compression_factors`; a ring of 8
gives 4.5 and 3.19, a butterfly 2.5 and 1.44). Real gradients lie between the two regimes
and the metadata cannot tell where, so the prediction is their geometric mean, at most
``sqrt(c_ind / c_eq)`` from either (1.19 on a ring of 8):
``vNMSE ≈ sqrt(c_ind c_eq) · Σ_j E_j v(w_j) / Σ_j E_j`` (:func:`predicted_vnmse`).

The budget search refines this (:func:`tree_vnmse`): each hop position has its own option
(per-hop plans), and a compression also codes the error its children left in the partial sum,
counted up to the partial sum's own energy: ``A(s) = v_s (e_s + min(Σ_c A(c), e_s)) + Σ_c
A(c)``. At widths 2–3 (``v`` of order 0.1–1) that error is of the order of the signal; without
it the model under-predicted gpt-stdlib's early-training vNMSE by 1.6× (1.16× with it), and
without the cap it over-predicted lstm-stdlib's by 2–2.6×, as values already rounded onto a
child's levels gain little error when recoded.

**Calibration.** The measured errors are those of Gaussian values; each option's is
multiplied by a factor measured on a sample of the ranks' own values, and in the independent
regime that factor's sparse share fades over partial sums
(:mod:`dynamiq.codecs.dynamiq.calibration`, :func:`tree_errors`).

**The search.** The predicted error falls as the budget grows (the allocation under a larger
budget never has a larger modelled error), so :func:`smallest_budget` bisects ``b̄`` on a grid
of 1/64 bit between the cheapest option and ``max_bits``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import torch

from dynamiq.codecs.dynamiq.calibration import calibration, zero_share
from dynamiq.codecs.dynamiq.hops import ring_profile
from dynamiq.codecs.shared_scale import MX_ELEMENTS, mx_codec
from dynamiq.transforms.center import REMOVED_ENERGY

__all__ = [
    "BUDGET_STEP",
    "TARGET_NAMES",
    "check_target",
    "predicted_vnmse",
    "reference_error",
    "ring_factors",
    "smallest_budget",
    "targeted_choice",
    "tree_errors",
    "tree_vnmse",
]

#: Grid of the chosen budgets (bits per coordinate): fine enough that the chosen budget is within
#: a rounding of the smallest that meets the target, coarse enough for a dozen bisection steps.
BUDGET_STEP = 1.0 / 64
#: Named targets: the predicted vNMSE of an MX method as the ``mxfp*`` baselines run it (its
#: shared-scale codec, :func:`~dynamiq.codecs.shared_scale.mx_codec`, compresses at every rank).
TARGET_NAMES = tuple(MX_ELEMENTS)


def ring_factors(world_size: int) -> tuple[float, float]:
    """:meth:`~dynamiq.topologies.Schedule.compression_factors` of a ring of ``world_size``
    ranks (subtree sizes 1 … n): ``((n + 1) / 2, (n + 1)(2n + 1) / (6n))``, the factors a
    codec assumes when it is prepared outside an executor that passes its schedule's."""
    n = max(1, int(world_size))
    return (n + 1) / 2, (n + 1) * (2 * n + 1) / (6 * n)


def predicted_vnmse(energy: np.ndarray, errors: np.ndarray, factors: tuple[float, float],
                    removed: float = 0.0, world_size: int = 1) -> float:
    """The model's vNMSE of one call.

    Args:
        energy: float64 ``[m]``, every super-group's global energy (non-negative; non-finite
            entries are left out).
        errors: float64 ``[m]``, the measured relative error of each super-group's option.
        factors: ``(c_ind, c_eq)`` of the schedule (see the module doc).
        removed: Energy of the sum that is restored exactly rather than coded (centering's
            super-group means): it adds to the sum's energy, not to its error.
        world_size: Number of ranks ``n`` (the coded part of the sum carries ``E`` for
            independent gradients, ``n E`` for equal ones).

    Returns:
        The geometric mean of ``c_ind Σ E_j v_j / (E + removed)`` and
        ``c_eq n Σ E_j v_j / (n E + removed)`` (``E = Σ E_j``); 0 for an all-zero vector.
    """
    ok = np.isfinite(energy)
    e = np.where(ok, energy, 0.0)
    tot = float(e.sum())
    if tot <= 0:
        return 0.0
    num = float((e * errors).sum())
    n = max(1, int(world_size))
    r = max(0.0, float(removed)) if math.isfinite(removed) else 0.0
    return math.sqrt(factors[0] * num / (tot + r) * factors[1] * n * num / (n * tot + r))


def _children(profile: Sequence[tuple[int, float, float]]) -> dict[int, list[int]]:
    """The subtree sizes of each hop position's children: ``s − 1`` contributions split
    greedily into the largest positions below ``s`` (a ring's chain: ``s − 1``; a binomial
    tree's: ``s/2, s/4, … 1``)."""
    sizes = sorted(s for s, _, _ in profile)
    out: dict[int, list[int]] = {}
    for s in sizes:
        left, kids = s - 1, []
        for k in reversed([k for k in sizes if k < s]):
            while k <= left:
                kids.append(k)
                left -= k
        out[s] = kids
    return out


def tree_errors(energy: np.ndarray, plan, errors: np.ndarray,
                profile: Sequence[tuple[int, float, float]], world_size: int,
                factor: np.ndarray | None = None, zeros: float = 0.0) -> tuple[float, float]:
    """The model's squared error of a plan's whole reduce tree, in both regimes.

    A compression at hop position ``s`` adds ``v_s`` times what it codes: the partial sum's
    energy ``e_s`` (``s E / n`` for independent gradients, ``s² E / n`` for equal ones) plus
    the error its children's compressions left in it, counted up to ``e_s``:
    ``A(s) = v_s (e_s + min(Σ_c A(c), e_s)) + Σ_c A(c)`` over the children ``c`` of a position,
    and the owner's ``A(n)`` is the tree's error. (Values a child already rounded onto the
    levels gain little error when recoded, so the inherited error does not compound hop after
    hop; uncapped, it predicted 16 times the measured error of lstm-stdlib's faint super-groups
    at width 2.)

    ``v_s`` is the option's Gaussian error times its calibration factor ``f`` (the shape of one
    rank's values). A partial sum of equal gradients keeps that shape, and so does one of
    independent dense gradients whose large coordinates sit at the same places on every rank;
    but the share ``z`` of ``f − 1`` that comes from a sparse support (exact zeros, different on
    every rank) fills in as independent contributions add up: ``1 + (f − 1)(1 − z + z / s)``
    in the independent regime.

    Args:
        energy: float64 ``[m]``, every super-group's global energy (non-finite: left out).
        plan: The :class:`~dynamiq.codecs.dynamiq.WidthPlan` (its :attr:`hops`, or one plan).
        errors: float64 ``[options]``, every option's relative error on Gaussian values.
        profile: The schedule's :meth:`~dynamiq.topologies.Schedule.hop_profile`; empty: a
            ring's of ``world_size``.
        world_size: Number of ranks ``n``.
        factor: float64 ``[options]``, every option's calibration factor
            (:func:`calibration`); ``None``: 1.
        zeros: The calibration sample's share of exact zeros, :func:`zero_share`.

    Returns:
        ``(independent, equal)`` squared errors, summed over the super-groups.
    """
    n = max(1, int(world_size))
    prof = tuple(profile) or ring_profile(n)
    if not prof:
        return 0.0, 0.0
    e = np.where(np.isfinite(energy), energy, 0.0)
    errors = np.asarray(errors, dtype=np.float64)
    kids = _children(prof)
    out = []
    for power in (1, 2):
        acc: dict[int, np.ndarray] = {}
        for s, _, _ in sorted(prof):
            inner = sum((acc[c] for c in kids[s]), np.zeros_like(e))
            choice = plan.for_summands(s).choice
            v = errors[choice]
            if factor is not None:
                f = factor[choice]
                v = v * (f if power == 2 else 1.0 + (f - 1.0) * (1.0 - zeros + zeros / s))
            coded = s ** power / n * e
            acc[s] = v * (coded + np.minimum(inner, coded)) + inner
        out.append(float(acc[max(acc)].sum()))
    return out[0], out[1]


def tree_vnmse(energy: np.ndarray, plan, errors: np.ndarray,
               profile: Sequence[tuple[int, float, float]], removed: float = 0.0,
               world_size: int = 1, factor: np.ndarray | None = None, zeros: float = 0.0
               ) -> float:
    """The model's vNMSE of one call: the geometric mean of :func:`tree_errors`' two regimes,
    each against the sum's energy in that regime (``E + removed`` and ``n E + removed``)."""
    tot = float(np.where(np.isfinite(energy), energy, 0.0).sum())
    if tot <= 0:
        return 0.0
    n = max(1, int(world_size))
    r = max(0.0, float(removed)) if math.isfinite(removed) else 0.0
    ind, eq = tree_errors(energy, plan, errors, profile, n, factor, zeros)
    return math.sqrt(ind / (tot + r) * eq / (n * tot + r))


def smallest_budget(lo: float, hi: float, predict: Callable[[float], float],
                    target: float) -> float:
    """The smallest budget on the :data:`BUDGET_STEP` grid in ``[lo, hi]`` whose prediction
    meets ``target`` (``hi`` when none does).

    Args:
        lo: Cheapest budget (bits per coordinate); rounded up to the grid.
        hi: Largest budget allowed; rounded down to the grid (at least ``lo``'s grid point).
        predict: Budget → predicted vNMSE, non-increasing.
        target: The vNMSE to stay below.
    """
    a = math.ceil(lo / BUDGET_STEP - 1e-9)
    b = max(a, math.floor(hi / BUDGET_STEP + 1e-9))
    if predict(a * BUDGET_STEP) <= target:
        return a * BUDGET_STEP
    if predict(b * BUDGET_STEP) > target:
        return b * BUDGET_STEP
    while b - a > 1:  # invariant: a misses the target, b meets it
        mid = (a + b) // 2
        if predict(mid * BUDGET_STEP) <= target:
            b = mid
        else:
            a = mid
    return b * BUDGET_STEP


def reference_error(name: str) -> float:
    """Measured relative error of one hop of the method behind a named target
    (:data:`TARGET_NAMES`): its shared-scale codec, round to nearest under block scales from the
    block maxima, on Gaussian values (:func:`~dynamiq.codecs.dynamiq.errors.codec_error`).

    That codec, not the OCP MX quantizer (whose scale rounds down and clips the largest
    elements, 1.24× the error for MXFP8), is what the ``mxfp8`` baseline sends; times the tree
    factor it predicts the baseline's vNMSE on a ring of 8 (docs/method.rst, "accuracy-targeted
    budgets", compares it with measurements).
    """
    from dynamiq.codecs.dynamiq.errors import codec_error

    return codec_error(mx_codec(name))


def check_target(target: object, names: Sequence[str] = TARGET_NAMES) -> float | str | None:
    """``target`` as a float in (0, 1), a name of :data:`TARGET_NAMES`, or ``None``.

    Raises:
        ValueError: anything else (a spec string's number is accepted as text).
    """
    if target is None:
        return None
    if isinstance(target, str):
        t = target.strip().lower()
        if t in names:
            return t
        try:
            target = float(t)
        except ValueError:
            raise ValueError(f"target must be a vNMSE in (0, 1) or one of {list(names)}, "
                             f"got {target!r}") from None
    if isinstance(target, bool) or not isinstance(target, (int, float)) or not (
            math.isfinite(target) and 0 < target < 1):
        raise ValueError(f"target must be a vNMSE in (0, 1) or one of {list(names)}, "
                         f"got {target!r}")
    return float(target)


def targeted_choice(codec, energy: np.ndarray, costs: np.ndarray, length: int, meta: float,
                    stats: Mapping[str, torch.Tensor], world_size: int, state: dict,
                    factors: tuple[float, float] | None,
                    profile: Sequence[tuple[int, float, float]] = ()):
    """The allocation of the smallest budget whose predicted vNMSE meets ``codec.target``.

    Args:
        codec: The :class:`~dynamiq.codecs.DynamiQ` codec (its ``target``, ``max_bits``,
            quantizers and fixed-budget allocation ``_choose``).
        energy: float64 ``[m]``, every super-group's global energy.
        costs: float64 ``[m, options]``, the options' wire bits per super-group.
        length: Coordinates in the vector.
        meta: Bits of the metadata phase, the codec's calibration sums included.
        stats: The global statistics and the calibration sums.
        world_size: Number of ranks.
        state: The codec's per-tensor state; ``state["bits"]`` and
            ``state["predicted_vnmse"]`` are written.
        factors: The schedule's compression factors (``None``: a ring's).
        profile: The schedule's :meth:`~dynamiq.topologies.Schedule.hop_profile`, which a
            per-hop allocation weighs (``codec.per_hop``).

    Returns:
        The :class:`~dynamiq.codecs.dynamiq.WidthPlan` (its ``budget_bits``: the bits it was
        allocated per transfer, metadata excluded).
    """
    from dynamiq.codecs.dynamiq.errors import measured_error

    factors = factors or ring_factors(world_size)
    goal = (reference_error(codec.target) * math.sqrt(factors[0] * factors[1])
            if isinstance(codec.target, str) else codec.target)
    errors = np.array([measured_error(q) for q in codec.quantizers])
    factor = calibration(stats, errors, errors.size)
    zeros = zero_share(stats)
    picks: dict = {}
    rem = stats.get(REMOVED_ENERGY)
    removed = float(rem.double().sum()) if rem is not None else 0.0

    def vnmse(plan) -> float:
        return tree_vnmse(energy, plan, errors, profile, removed, world_size, factor, zeros)

    def predict(b: float) -> float:
        picks[b] = codec._allocate(energy, b * length - meta, costs, length, profile, state)
        return vnmse(picks[b])

    lo = (float(costs.min(axis=1).sum()) + meta) / length
    hi = codec.max_bits if codec.max_bits is not None else (
        (float(costs.max(axis=1).sum()) + meta) / length)
    b = smallest_budget(lo, hi, predict, goal)
    if b not in picks:
        predict(b)
    state["bits"] = b
    state["predicted_vnmse"] = vnmse(picks[b])
    return picks[b]
