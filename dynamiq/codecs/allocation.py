"""Bit-width allocation across super-groups under a budget (docs/method.rst, step 3).

Super-group ``j`` with energy ``E_j`` (the global sum of squares) coded at width ``w`` is
modelled to cost ``E_j · v(w)`` squared error and ``c(w)`` bits. The allocation minimises
``Σ_j E_j v(w_j)`` subject to ``Σ_j c(w_j) ≤ B``; its Lagrangian relaxation gives every
super-group the width minimising ``E_j v(w) + λ c(w)``, monotone in the one free scalar ``λ``.
:func:`allocate` finds ``λ`` by bisection on ``log2 λ`` (warm-started from the previous call's
value), then settles the few super-groups whose choice flips inside the final bracket greedily
in the order of their own thresholds, so the result is the same whatever the starting point and
the budget holds exactly (never exceeded; the leftover is less than one more upgrade).

Two error models:

* ``"paper"``: ``v(w) = 4^−w`` and ``c(w)`` = value bits only (``w`` per coordinate), which
  gives the paper's thresholds ``T_{2,4} = (17/512) T_{4,8}`` etc.;
* ``"measured"``: ``v(w)`` is the codec's own measured relative error at width ``w`` and
  ``c(w)`` its exact wire bits, scales included.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["WidthOption", "allocate", "lagrangian_choice"]

#: Bisection stops when the bracket on log2(λ) is this narrow or few choices still flip.
_TOL = 1e-10
_FEW = 64
_MAX_ITERS = 200


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


def _total(choice: np.ndarray, cost: np.ndarray) -> float:
    """Bits of ``choice`` under the per-item costs ``cost`` (``[m, k]``)."""
    return float(np.take_along_axis(cost, choice[:, None], 1).sum())


def _hull_steps(e: float, a: int, b: int, err: np.ndarray, cost: np.ndarray
                ) -> list[tuple[float, int]]:
    """The upgrades from option ``a`` to ``b`` along the lower convex hull of ``(c, e·v)``.

    Returns ``[(threshold λ, next option), ...]`` in order; thresholds decrease along the hull,
    which is what makes settling them greedily the Lagrangian allocation.
    """
    steps = []
    cur = a
    while cur != b:
        cands = [o for o in range(len(cost)) if cost[cur] < cost[o] <= cost[b]]
        slopes = [e * (err[cur] - err[o]) / (cost[o] - cost[cur]) for o in cands]
        k = int(np.argmax(slopes))
        # among equal slopes, the farthest option (so one step covers a straight hull edge)
        best = max((o for o, sl in zip(cands, slopes) if sl == slopes[k]), key=lambda o: cost[o])
        steps.append((slopes[k], best))
        cur = best
    return steps


def allocate(energy: np.ndarray, options: list[WidthOption], budget: float, state: dict,
             costs: np.ndarray | None = None) -> np.ndarray:
    """Widths per super-group that fit ``budget`` bits and minimise the modelled error.

    Args:
        energy: float64 ``[m]`` per-super-group energies (identical on every rank).
        options: Candidate widths sorted by increasing cost (at least one).
        budget: Bits available for the ``m`` super-groups (model costs).
        state: Warm-start state; ``state["log2_lambda"]`` (relative to the largest energy, so
            it carries over between calls whatever the gradients' scale) is read and updated.
        costs: float64 ``[m, len(options)]`` bits of each option for each super-group, where
            they differ from the options' own costs (a partial last super-group costs less);
            Default: every row is the options' costs.

    Returns:
        int64 ``[m]`` indices into ``options``: the allocation at the largest threshold whose
        upgrades all fit (ties broken by super-group index). When even the cheapest option
        exceeds the budget, every super-group gets the cheapest one (the caller reports the
        overrun).
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
    cheapest = np.argmin(cost, axis=1).astype(np.int64)
    if _total(cheapest, cost) >= budget or len(options) == 1:
        return cheapest
    best = np.full(m, int(np.argmin(err)), dtype=np.int64)
    if _total(best, cost) <= budget:
        return best
    # the allocation only depends on energy ratios: normalise so λ stays in a fixed range
    # (an infinite energy is "more than anything else": it ranks first)
    finite = energy[np.isfinite(energy)]
    top = float(finite.max()) if finite.size and finite.max() > 0 else 1.0
    e = np.where(np.isfinite(energy), energy / top, 2.0**100)

    def fits(log_lam: float) -> tuple[bool, np.ndarray]:
        ch = lagrangian_choice(e, options, float(np.exp2(log_lam)), cost)
        return _total(ch, cost) <= budget, ch

    lo_lim, hi_lim = -1100.0, 128.0  # λ beyond these: every choice is the cheapest / the best
    start = float(np.clip(state.get("log2_lambda", -np.log2(max(base.mean(), 1.0))),
                          lo_lim, hi_lim))
    step = 0.5
    ok, ch = fits(start)
    if ok:
        hi, hi_ch, lo = start, ch, start - step
        while True:
            lo = max(lo, lo_lim)
            ok, ch = fits(lo)
            if not ok:
                lo_ch = ch
                break
            hi, hi_ch = lo, ch
            if lo <= lo_lim:
                return hi_ch
            step *= 2
            lo -= step
    else:
        lo, lo_ch, hi = start, ch, start + step
        while True:
            hi = min(hi, hi_lim)
            ok, ch = fits(hi)
            if ok:
                hi_ch = ch
                break
            lo, lo_ch = hi, ch
            if hi >= hi_lim:
                hi_ch = cheapest
                break
            step *= 2
            hi += step
    for _ in range(_MAX_ITERS):
        flips = int((lo_ch != hi_ch).sum())
        if flips <= _FEW or hi - lo < _TOL:
            break
        mid = 0.5 * (lo + hi)
        ok, ch = fits(mid)
        if ok:
            hi, hi_ch = mid, ch
        else:
            lo, lo_ch = mid, ch
    state["log2_lambda"] = hi
    # settle the super-groups that change inside (lo, hi]: take their hull upgrades in
    # decreasing order of threshold while the budget allows (the first that does not fit ends
    # it, so the result is the threshold allocation, whatever bracket the search ended on)
    result = hi_ch.copy()
    flip = np.nonzero(lo_ch != hi_ch)[0]
    if flip.size:
        steps = []
        for j in flip:
            for k, (lam, nxt) in enumerate(_hull_steps(float(e[j]), int(hi_ch[j]),
                                                       int(lo_ch[j]), err, cost[j])):
                steps.append((-lam, int(j), k, nxt))
        steps.sort()
        left = budget - _total(result, cost)
        for _, j, _, nxt in steps:
            extra = cost[j, nxt] - cost[j, result[j]]
            if extra > left:
                break
            result[j] = nxt
            left -= extra
    return result
