"""Bit-width allocation across super-groups under a budget (docs/method.rst, step 3).

Super-group ``j`` with energy ``E_j`` (the global sum of squares) coded at width ``w`` is
modelled to cost ``E_j · v(w)`` squared error and ``c(w)`` bits. The allocation minimises
``Σ_j E_j v(w_j)`` subject to ``Σ_j c(w_j) ≤ B``; its Lagrangian relaxation gives every
super-group the width minimising ``E_j v(w) + λ c(w)``, monotone in the one free scalar ``λ``.
:func:`allocate` does not search for ``λ``: every super-group's upgrades along the convex hull
of its options have thresholds ``E_j · Δv / Δc`` (the ``λ`` at which the rule starts to take
them), and taking upgrades in decreasing threshold order until the first that does not fit
gives the rule's allocation at the largest ``λ`` that fits, with the leftover settled greedily.
The threshold where the budget runs out is found by a bisection over the super-groups sorted
once by energy (each step a binary search per upgrade, :mod:`dynamiq.codecs._upgrades`), and
the budget holds exactly (never exceeded; the leftover is less than the upgrade that did not
fit).

Two error models:

* ``"paper"``: ``v(w) = 4^−w`` and ``c(w)`` = value bits only (``w`` per coordinate), which
  gives the paper's thresholds ``T_{2,4} = (17/512) T_{4,8}`` etc.;
* ``"measured"``: ``v(w)`` is the codec's own measured relative error at width ``w`` and
  ``c(w)`` its exact wire bits, scales included.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass

import numpy as np

from dynamiq.codecs._upgrades import Upgrades, cheapest

__all__ = ["RELATIVE_FLOOR", "WidthOption", "allocate", "lagrangian_choice", "remembered"]

#: Weights of the cost rows' keys (:func:`_row_classes`); fixed so every rank groups alike.
_ROW_KEY = 1.0 + np.random.default_rng(0x5EED).random((2, 64))
#: Energies below this fraction of the largest count as 0 (no upgrade is worth their bits).
RELATIVE_FLOOR = 2.0**-600


@dataclass(frozen=True)
class WidthOption:
    """One candidate width: its model error factor and its cost.

    Attributes:
        width: Bits per coded value (the label written to the width map).
        error: ``v(w)``, squared error per unit of energy.
        cost: ``c(w)``, the bits the model charges per super-group.
    """

    width: int
    error: float
    cost: float


def lagrangian_choice(energy: np.ndarray, options: list[WidthOption], lam: float,
                      costs: np.ndarray | None = None) -> np.ndarray:
    """Index into ``options`` minimising ``E_j v + λ c`` per super-group (ties: cheapest).

    Args:
        energy: float64 ``[m]``, non-negative.
        options: Candidates sorted by increasing cost.
        lam: The multiplier ``λ > 0``.

    Returns:
        int64 ``[m]`` option indices.
    """
    err = np.array([o.error for o in options])
    cost = np.array([o.cost for o in options])[None, :] if costs is None else costs
    # an excluded option (infinite cost) stays excluded even where λ underflows to 0
    excluded = np.isinf(cost)
    price = np.where(excluded, np.inf, lam * np.where(excluded, 0.0, cost))
    obj = energy[:, None] * err[None, :] + price
    return np.argmin(obj, axis=1)


def _row_classes(cost: np.ndarray) -> list[np.ndarray]:
    """Super-groups grouped by identical cost rows, each class's rows increasing (a plain
    call has one class, or two with a partial last super-group; a per-hop allocation has one
    per hop weight)."""
    # rows are keyed by two fixed random projections (excluded options as -1: costs are
    # positive) and sorted once by the first; rows that share a first key but differ in the
    # second (distinct rows whose first keys collide) send the grouping to an exact comparison
    marked = np.where(np.isinf(cost), -1.0, cost)
    k = cost.shape[1]
    if k <= _ROW_KEY.shape[1]:
        # elementwise products summed along each row: the same operations for equal rows
        # (a matrix product may round rows differently by where they fall in its blocks)
        key, check = ((marked * _ROW_KEY[j, :k]).sum(axis=1) for j in (0, 1))
        order = np.argsort(key, kind="stable")
        same = np.diff(key[order]) == 0
        if not (np.diff(check[order]) != 0)[same].any():
            return np.split(order, np.flatnonzero(~same) + 1)
    _, inverse = np.unique(marked, axis=0, return_inverse=True)
    order = np.argsort(inverse.reshape(-1), kind="stable")
    bounds = np.flatnonzero(np.diff(inverse.reshape(-1)[order])) + 1
    return np.split(order, bounds)


def remembered(store: OrderedDict, key: Hashable, make, kept: int):
    """``store[key]``, made by ``make()`` when missing; ``store`` keeps the ``kept`` most
    recently used keys (the caches of what the allocation derives from a named cost matrix)."""
    hit = store.get(key)
    if hit is None:
        hit = store[key] = make()
        while len(store) > kept:
            store.popitem(last=False)
    else:
        store.move_to_end(key)
    return hit


#: Row classes of recent cost matrices, by the callers' keys (a few: one per tensor size).
_CLASSES: OrderedDict[Hashable, list[np.ndarray]] = OrderedDict()
_CLASSES_KEPT = 16


def _classes_of(cost: np.ndarray, key: Hashable | None) -> list[np.ndarray]:
    """:func:`_row_classes` of ``cost``, remembered under ``key`` (``None``: not remembered)."""
    if key is None:
        return _row_classes(cost)
    return remembered(_CLASSES, key, lambda: _row_classes(cost), _CLASSES_KEPT)


def allocate(energy: np.ndarray, options: list[WidthOption], budget: float, state: dict,
             costs: np.ndarray | None = None, cost_key: Hashable | None = None) -> np.ndarray:
    """Widths per super-group that fit ``budget`` bits and minimise the modelled error.

    Every super-group's upgrades along the lower convex hull of its options have thresholds
    ``E_j · Δv / Δc``; the allocation takes them in decreasing threshold order (ties by
    super-group, then along the hull) while they fit, and stops at the first that does not.
    That is the Lagrangian allocation at the largest multiplier whose upgrades all fit, with
    the leftover settled greedily (exact with two options, within the duality gap otherwise).

    Args:
        energy: float64 ``[m]`` per-super-group energies (identical on every rank).
        options: Candidate widths sorted by increasing cost (at least one).
        budget: Bits available for the ``m`` super-groups (model costs).
        state: Per-tensor state; ``state["log2_lambda"]`` is set to the multiplier the
            allocation stopped at (``log2``, relative to the largest energy), for reporting.
        costs: float64 ``[m, len(options)]`` bits of each option for each super-group, where
            they differ from the options' own costs (a partial last super-group costs less;
            ``inf`` excludes an option); default: every row is the options' costs.
        cost_key: A hashable naming ``costs`` (equal keys only for equal costs), so that what
            the allocation derives from the costs alone is computed once per key (calls on
            tensors of one size repeat their costs); ``None``: derived on every call.

    Returns:
        int64 ``[m]`` indices into ``options``. When even the cheapest option exceeds the
        budget, every super-group gets the cheapest one (the caller reports the overrun).
    """
    energy = np.nan_to_num(np.asarray(energy, dtype=np.float64), nan=0.0, posinf=np.inf)
    energy = np.maximum(energy, 0.0)
    m = energy.size
    base = np.array([o.cost for o in options])
    cost = np.broadcast_to(base, (m, base.size)) if costs is None else np.asarray(costs, float)
    if cost.shape != (m, base.size):
        raise ValueError(f"costs must have shape {(m, base.size)}, got {cost.shape}")
    err = np.array([o.error for o in options])
    if m == 0:
        return np.zeros(0, dtype=np.int64)
    classes = _classes_of(cost, cost_key)
    # every row of a class is the same: one row's facts stand for the class's (the costs are
    # whole bits, so the totals are exact in any order)
    floor_opts = np.empty(m, dtype=np.int64)
    floor = ceiling = 0.0
    b = int(np.argmin(err))
    for rows in classes:
        row = cost[rows[0]]
        c0 = cheapest(err, row)
        floor_opts[rows] = c0
        floor += rows.size * float(row[c0])
        ceiling += rows.size * float(row[b])
    best = np.full(m, b, dtype=np.int64)
    if floor >= budget or len(options) == 1:
        return floor_opts
    if ceiling <= budget:
        return best
    # the allocation only depends on energy ratios: normalise (an infinite energy is "more
    # than anything else": it ranks first)
    finite = energy[np.isfinite(energy)]
    top = float(finite.max()) if finite.size and finite.max() > 0 else 1.0
    e = np.where(np.isfinite(energy), energy / top, 2.0**100)
    # energies this far below the largest are nothing to code; as subnormals their thresholds
    # would keep too few bits to order alike under different weights (hop positions)
    e = np.where(e < RELATIVE_FLOOR, 0.0, e)
    upgrades = Upgrades(e, err, cost, classes)
    ups, stop = upgrades.take(budget - floor)
    state["log2_lambda"] = float(np.log2(stop)) if stop > 0 else -np.inf
    return upgrades.choice(ups)
