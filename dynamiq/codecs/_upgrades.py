"""The threshold-ordered walk over every super-group's hull upgrades (the search behind
:func:`dynamiq.codecs.allocation.allocate`).

Each super-group's options form a lower convex hull from its cheapest option to its most
accurate one; moving one vertex along it is an *upgrade* with threshold ``E_j · Δv / Δc``.
:class:`Upgrades` finds where a budget runs out in the decreasing-threshold order of all of
them: a bisection over the super-groups sorted once by energy (each step a compiled binary
search per upgrade column), then a walk of the few upgrades left in the bracket.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba as nb
import numpy as np

__all__ = ["FEW", "Upgrades", "cheapest", "hull_path"]

#: Below this many upgrades inside the bracket the bisection stops and the rest are sorted.
FEW = 64


def cheapest(err: np.ndarray, cost: np.ndarray) -> int:
    """The cheapest affordable option of one super-group, the most accurate among equally cheap
    ones (then the first): an equally cheap, less accurate option is never worth sending, and
    no upgrade leads from it to the other (costs tie where a partial super-group's are cut)."""
    return min((o for o in range(cost.size) if np.isfinite(cost[o])),
               key=lambda o: (cost[o], err[o], o))


def hull_path(err: np.ndarray, cost: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
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
    cur = cheapest(err, cost)
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

    def thresholds(self, pos: np.ndarray, col: int | np.ndarray) -> np.ndarray:
        """float64: the thresholds of upgrade ``col`` at sorted positions ``pos`` (or of
        upgrades ``col[i]`` at positions ``pos[i]``)."""
        return (self.energy[pos] * self.derr[col]) / self.col_cost[col]

    def cuts(self, lam: float) -> tuple[np.ndarray, float]:
        """Per column, the first sorted position whose threshold exceeds ``lam``, and the bits
        of the upgrades from there on."""
        out = np.empty(self.derr.size, dtype=np.int64)
        spent = _count_cuts(self.energy, self.derr, self.col_cost, float(lam), out)
        return out, float(spent)


class Upgrades:
    """Every super-group's hull upgrades, with their thresholds ``E_j · Δv / Δc``.

    ``classes`` are the super-groups grouped by identical cost rows. Cost classes of more
    than :data:`FEW` super-groups are :class:`_Block` s of sorted columns; the few others (a
    partial last super-group) are listed one upgrade at a time.
    """

    def __init__(self, e: np.ndarray, err: np.ndarray, cost: np.ndarray,
                 classes: list[np.ndarray]) -> None:
        self.size = cost.shape[0]
        big = max(range(len(classes)), key=lambda i: classes[i].size)
        self.blocks: list[_Block] = []
        self.vertices: dict[int, np.ndarray] = {}
        ts, js, ks, cs = [], [], [], []
        for i, rows in enumerate(classes):
            v, derr, dcost = hull_path(err, cost[rows[0]])
            if i == big or rows.size > FEW:
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

    def _split(self, cut_lo: list[np.ndarray], cut_hi: list[np.ndarray], lo: float,
               hi: float) -> float:
        """A multiplier inside ``(lo, hi)`` that splits the upgrades between them, or ``hi``
        when they all tie at ``hi`` (nothing splits them; the caller walks them in order).

        The median threshold of the column holding the most of them: every column of a block
        is the same sorted energies times a constant, so it splits the others near their
        middles too, and the bracket shrinks geometrically in the number of upgrades. Where
        the median is ``hi`` itself, the smallest threshold inside. Where the bisection splits
        does not change the allocation, only how soon the bracket holds few enough upgrades
        to walk (equal thresholds, e.g. equal energies, used to take dozens of halvings of
        ``log2 λ`` down to the float resolution).
        """
        best, at = 0, (None, 0, 0)
        low = hi
        for b, cl, ch in zip(self.blocks, cut_lo, cut_hi):
            ks = np.flatnonzero(ch > cl)
            if ks.size:
                # each column's first threshold above lo, the smallest inside
                low = min(low, float(b.thresholds(cl[ks], ks).min()))
                k = int(ks[np.argmax((ch - cl)[ks])])
                if ch[k] - cl[k] > best:
                    best, at = int(ch[k] - cl[k]), (b, k, int(cl[k] + ch[k]) // 2)
        inside = self.xt[(self.xt > lo) & (self.xt <= hi)]
        if inside.size:
            low = min(low, float(inside.min()))
        b, k, pos = at
        if b is not None:
            mid = float(b.thresholds(pos, k))
            if lo < mid < hi:
                return mid
        else:
            mid = float(np.exp2(0.5 * (np.log2(lo) + np.log2(hi))))
            if lo < mid < hi and low < hi:
                return mid
        return low

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
            # bisection: spend(lo) > left >= spend(hi)
            while (self._between(cut_lo, cut_hi)
                   + ((self.xt > lo) & (self.xt <= hi)).sum()) > FEW:
                mid = self._split(cut_lo, cut_hi, lo, hi)
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
