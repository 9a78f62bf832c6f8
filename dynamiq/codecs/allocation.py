"""Bit-width allocation across super-groups under a budget (docs/method.rst, step 3).

Super-group ``j`` with energy ``E_j`` (the global sum of squares) coded at width ``w`` is
modelled to cost ``E_j · v(w)`` squared error and ``c(w)`` bits. The allocation minimises
``Σ_j E_j v(w_j)`` subject to ``Σ_j c(w_j) ≤ B``; its Lagrangian relaxation gives every
super-group the width minimising ``E_j v(w) + λ c(w)``, monotone in the one free scalar ``λ``.
:func:`allocate` does not search for ``λ``: every super-group's upgrades along the convex hull
of its options have thresholds ``E_j · Δv / Δc`` (the ``λ`` at which the rule starts to take
them), and taking upgrades in decreasing threshold order until the first that does not fit
gives the rule's allocation at the largest ``λ`` that fits, with the leftover settled greedily.
The threshold where the budget runs out is found by a bisection on ``log2 λ`` over the
super-groups sorted once by energy (each step a binary search per upgrade), and the budget
holds exactly (never exceeded; the leftover is less than the upgrade that did not fit).

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

import numba as nb
import numpy as np

__all__ = ["RELATIVE_FLOOR", "WidthOption", "allocate", "lagrangian_choice", "remembered"]

#: Weights of the cost rows' keys (:func:`_row_classes`); fixed so every rank groups alike.
_ROW_KEY = 1.0 + np.random.default_rng(0x5EED).random((2, 64))
#: Below this many upgrades inside the bracket the bisection stops and the rest are sorted.
_FEW = 64
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


def _cheapest(err: np.ndarray, cost: np.ndarray) -> int:
    """The cheapest affordable option of one super-group, the most accurate among equally cheap
    ones (then the first): an equally cheap, less accurate option is never worth sending, and
    no upgrade leads from it to the other (costs tie where a partial super-group's are cut)."""
    return min((o for o in range(cost.size) if np.isfinite(cost[o])),
               key=lambda o: (cost[o], err[o], o))


def _hull_path(err: np.ndarray, cost: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The lower convex hull of one super-group's options ``(c, v)``, cheapest to most accurate.

    Args:
        err: float64 ``[k]``, ``v`` of every option.
        cost: float64 ``[k]``, the super-group's cost of every option (``inf``: excluded).

    Returns:
        ``(vertices, derr, dcost)``: the option index of every hull vertex (``[h + 1]``, from
        the cheapest option to the most accurate affordable one), and each of the ``h``
        upgrades' error decrease and cost increase. An upgrade's threshold for energy ``e`` is
        ``e · derr / dcost``; thresholds decrease along the hull, which is what makes taking
        upgrades in threshold order the Lagrangian allocation. Among options of equal slope
        the farthest is taken, so one upgrade covers a straight hull edge.
    """
    finite = np.isfinite(cost)
    cur = _cheapest(err, cost)
    # the most accurate affordable option, the cheaper one among equal errors
    b = min((o for o in range(cost.size) if finite[o]), key=lambda o: (err[o], cost[o], o))
    vertices, derr, dcost = [cur], [], []
    while cur != b:
        cands = [o for o in range(cost.size) if cost[cur] < cost[o] <= cost[b]]
        slopes = [(err[cur] - err[o]) / (cost[o] - cost[cur]) for o in cands]
        top = max(slopes)
        nxt = max((o for o, sl in zip(cands, slopes) if sl == top), key=lambda o: cost[o])
        vertices.append(nxt)
        derr.append(err[cur] - err[nxt])
        dcost.append(cost[nxt] - cost[cur])
        cur = nxt
    return np.array(vertices, np.int64), np.array(derr), np.array(dcost)


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


@nb.njit(cache=True)
def _count_cuts(e, derr, dcost, lam, cuts):  # pragma: no cover - compiled
    """Per upgrade column ``k``, how many of the sorted energies ``e`` have a threshold
    ``(e · derr[k]) / dcost[k]`` of at most ``lam`` (into ``cuts``); returns the bits of the
    upgrades above ``lam``. The thresholds are evaluated in the binary search itself, with
    the same two roundings as everywhere else (no column of them is stored)."""
    r = e.size
    spent = 0.0
    for k in range(derr.size):
        lo, hi = 0, r
        while lo < hi:
            mid = (lo + hi) >> 1
            if (e[mid] * derr[k]) / dcost[k] <= lam:
                lo = mid + 1
            else:
                hi = mid
        cuts[k] = lo
        spent += (r - lo) * dcost[k]
    return spent


@dataclass
class _Block:
    """The super-groups of one large cost class, sorted by energy: each upgrade's thresholds
    ``E_j · Δv / Δc`` then ascend with the position, so "how many exceed ``λ``" is a binary
    search per upgrade (compiled, :func:`_count_cuts`: the bisection asks it some fifty
    times per call)."""

    rows: np.ndarray  # int64 [r], super-group indices by increasing energy
    energy: np.ndarray  # float64 [r], their energies (ascending)
    derr: np.ndarray  # float64 [h], each upgrade's error decrease
    col_cost: np.ndarray  # float64 [h], each upgrade's cost
    common: np.ndarray  # int64 [h + 1], the option of every hull vertex

    def thresholds(self, pos: np.ndarray, col: int) -> np.ndarray:
        """float64: the thresholds of upgrade ``col`` at sorted positions ``pos``."""
        return (self.energy[pos] * self.derr[col]) / self.col_cost[col]

    def cuts(self, lam: float) -> tuple[np.ndarray, float]:
        """Per column, the first sorted position whose threshold exceeds ``lam``, and the bits
        of the upgrades from there on."""
        out = np.empty(self.derr.size, dtype=np.int64)
        spent = _count_cuts(self.energy, self.derr, self.col_cost, float(lam), out)
        return out, float(spent)


class _Upgrades:
    """Every super-group's hull upgrades, with their thresholds ``E_j · Δv / Δc``.

    Cost classes of more than :data:`_FEW` super-groups are :class:`_Block` s of sorted
    columns; the few others (a partial last super-group) are listed one upgrade at a time.
    """

    def __init__(self, e: np.ndarray, err: np.ndarray, cost: np.ndarray,
                 classes: list[np.ndarray] | None = None) -> None:
        classes = _row_classes(cost) if classes is None else classes
        self.size = cost.shape[0]
        big = max(range(len(classes)), key=lambda i: classes[i].size)
        self.blocks: list[_Block] = []
        self.vertices: dict[int, np.ndarray] = {}
        ts, js, ks, cs = [], [], [], []
        for i, rows in enumerate(classes):
            v, derr, dcost = _hull_path(err, cost[rows[0]])
            if i == big or rows.size > _FEW:
                order = rows[np.argsort(e[rows])]  # ties: any order (walked by index below)
                self.blocks.append(_Block(order, np.ascontiguousarray(e[order]), derr, dcost, v))
            else:
                for j in rows:
                    self.vertices[int(j)] = v
                t = (e[rows][:, None] * derr[None, :]) / dcost[None, :]
                ts.append(t.ravel())
                js.append(np.repeat(rows, derr.size))
                ks.append(np.tile(np.arange(derr.size), rows.size))
                cs.append(np.tile(dcost, rows.size))
        def cat(parts: list[np.ndarray], dt: type) -> np.ndarray:
            return np.concatenate(parts).astype(dt) if parts else np.zeros(0, dt)

        self.xt, self.xj = cat(ts, np.float64), cat(js, np.int64)
        self.xk, self.xc = cat(ks, np.int64), cat(cs, np.float64)

    def _cuts(self, lam: float) -> tuple[list[np.ndarray], float]:
        """Every block's :meth:`_Block.cuts` at ``lam``, and the bits of every upgrade whose
        threshold exceeds ``lam``."""
        cuts, spent = [], float(self.xc[self.xt > lam].sum())
        for b in self.blocks:
            c, bits = b.cuts(lam)
            cuts.append(c)
            spent += bits
        return cuts, spent

    def _between(self, cut_lo: list[np.ndarray], cut_hi: list[np.ndarray]) -> int:
        return int(sum((h - lo).sum() for lo, h in zip(cut_lo, cut_hi)))

    def take(self, left: float) -> tuple[np.ndarray, float]:
        """Per super-group, how many upgrades the greedy takes (in decreasing threshold order,
        ties by super-group then along the hull, each while it fits, until the first that does
        not), and the threshold of that first one (``-inf`` when all are taken)."""
        lo = hi = 0.0
        cut_lo, spent_hi = self._cuts(0.0)
        cut_hi = cut_lo
        if spent_hi > left:
            # the smallest and largest positive thresholds: a column's ends, the listed ones'
            first, top = [], []
            for b, c0 in zip(self.blocks, cut_lo):
                for k in range(b.derr.size):
                    if c0[k] < b.rows.size:
                        first.append(float(b.thresholds(c0[k], k)))
                    if b.rows.size:
                        top.append(float(b.thresholds(b.rows.size - 1, k)))
            first += [float(t) for t in self.xt[self.xt > 0]]
            top += [float(t) for t in self.xt]
            lo, hi = min(first) / 2, max(top)
            cut_lo = self._cuts(lo)[0]
            cut_hi, spent_hi = self._cuts(hi)
            # bisection on log2 λ: spend(lo) > left >= spend(hi)
            while (self._between(cut_lo, cut_hi)
                   + ((self.xt > lo) & (self.xt <= hi)).sum()) > _FEW:
                mid = float(np.exp2(0.5 * (np.log2(lo) + np.log2(hi))))
                if not lo < mid < hi:
                    break  # the rest tie: walked in order below
                cut_mid, spent_mid = self._cuts(mid)
                if spent_mid <= left:
                    hi, cut_hi, spent_hi = mid, cut_mid, spent_mid
                else:
                    lo, cut_lo = mid, cut_mid
        # (hi = 0 when every upgrade worth anything fits)
        left -= spent_hi
        # every upgrade above hi is taken: per column a suffix of the sorted positions
        ups = np.zeros(self.size, dtype=np.int64)
        for b, ch in zip(self.blocks, cut_hi):
            ups[b.rows] = np.searchsorted(ch, np.arange(b.rows.size), side="right")
        above = self.xt > hi
        np.add.at(ups, self.xj[above], 1)
        # the upgrades inside (lo, hi], walked in order while they fit
        t, j, k, c = [], [], [], []
        for b, cl, ch in zip(self.blocks, cut_lo, cut_hi):
            for col in range(b.derr.size):
                p = np.arange(cl[col], ch[col])
                t.append(b.thresholds(p, col))
                j.append(b.rows[p])
                k.append(np.full(p.size, col))
                c.append(np.full(p.size, b.col_cost[col]))
        inside = (self.xt > lo) & (self.xt <= hi)
        t.append(self.xt[inside])
        j.append(self.xj[inside])
        k.append(self.xk[inside])
        c.append(self.xc[inside])
        t_, j_, k_, c_ = (np.concatenate(a) for a in (t, j, k, c))
        stop = -np.inf
        for i in np.lexsort((k_, j_, -t_)):
            if t_[i] <= 0:
                break
            if c_[i] > left:
                stop = float(t_[i])
                break
            ups[j_[i]] += 1
            left -= c_[i]
        return ups, stop

    def choice(self, ups: np.ndarray) -> np.ndarray:
        """Option index of every super-group after ``ups`` upgrades."""
        out = np.empty(ups.size, dtype=np.int64)
        for b in self.blocks:
            out[b.rows] = b.common[ups[b.rows]]
        for j, v in self.vertices.items():  # listed rows, those without upgrades included
            out[j] = v[ups[j]]
        return out


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
    cheapest = np.empty(m, dtype=np.int64)
    floor = ceiling = 0.0
    b = int(np.argmin(err))
    for rows in classes:
        row = cost[rows[0]]
        c0 = _cheapest(err, row)
        cheapest[rows] = c0
        floor += rows.size * float(row[c0])
        ceiling += rows.size * float(row[b])
    best = np.full(m, b, dtype=np.int64)
    if floor >= budget or len(options) == 1:
        return cheapest
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
    upgrades = _Upgrades(e, err, cost, classes)
    ups, stop = upgrades.take(budget - floor)
    state["log2_lambda"] = float(np.log2(stop)) if stop > 0 else -np.inf
    return upgrades.choice(ups)
