"""THC's level tables: which points of a fine uniform grid a rank's rotated coordinates round to.

After a randomized Hadamard rotation, the coordinates of a block of ``B`` are close to
Gaussian with scale ``σ = ‖x‖ / √B``. THC (NSDI'24) clamps them to ``[-T σ, T σ]`` and rounds
each one stochastically to one of ``L`` levels (16: 4-bit indices on a rank). The levels are
a subset of a *fine grid* of ``g + 1`` equally spaced points ``-T σ + i Δ``, ``Δ = 2 T σ / g``,
``i = 0 … g`` (``g`` the *granularity*), so that a level is an integer ``i`` and the integers of
all ranks sum exactly; the sum of ``n`` ranks needs ``ceil(log2(g n + 1))`` bits.

Everything here is in units of ``σ`` for a standard normal ``X``:

* stochastic rounding of ``x ∈ [a, b]`` between neighbouring levels has variance
  ``(b - x)(x - a)``; :func:`level_table` picks the ``L`` grid points (the two ends always
  included, so every clamped value is covered) that minimise its expectation ``V`` under ``X``
  clamped to ``[-T, T]`` (the clamped mass sits on the end levels, where it rounds exactly), by
  dynamic programming over the grid;
* clamping costs the squared bias ``C(T) = E[(|X| - T)²; |X| > T] = 2((1 + T²) Q(T) - T φ(T))``
  (``Q`` the normal tail, ``φ`` its density), the only bias of the scheme;
* :func:`optimal_clamp` is THC's precomputed table: the ``T`` minimising one rank's mean
  squared error ``V(T) + C(T)`` (golden-section search over ``[1, 8]``).

With ``g = L - 1`` every grid point is a level (uniform levels, ``Δ = 2 T / (L - 1)``); a finer
grid lets the levels follow the density (denser near 0), at ``log2(g / (L - 1))`` more bits
per partial sum. All results are cached and deterministic (float64 NumPy), so every rank
derives the same table.
"""

from __future__ import annotations

import functools
import math

import numpy as np

__all__ = ["MAX_GRANULARITY", "clamp_bias", "level_table", "optimal_clamp", "rounding_variance"]

#: Finest grid the tables are computed for (the dynamic programme is quadratic in ``g``).
MAX_GRANULARITY = 1024
_SEARCH = (1.0, 8.0)  # the range of T searched by optimal_clamp, in standard deviations
_GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0


def _phi(x: np.ndarray) -> np.ndarray:
    return np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)


def _cdf(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


def _interval_costs(points: np.ndarray) -> np.ndarray:
    """``cost[i, j] = ∫_{p_i}^{p_j} (p_j - x)(x - p_i) φ(x) dx`` for ``i < j`` (``inf``
    elsewhere): the expected variance of rounding between levels ``p_i`` and ``p_j``."""
    a, b = points[:, None], points[None, :]
    cdf, pdf = _cdf(points), _phi(points)
    m0 = cdf[None, :] - cdf[:, None]  # ∫ φ
    m1 = pdf[:, None] - pdf[None, :]  # ∫ x φ
    m2 = m0 + a * pdf[:, None] - b * pdf[None, :]  # ∫ x² φ
    cost = -a * b * m0 + (a + b) * m1 - m2
    i, j = np.indices(cost.shape)
    return np.where(j > i, np.maximum(cost, 0.0), np.inf)


def _check(levels: int, granularity: int) -> None:
    if not 2 <= levels <= granularity + 1:
        raise ValueError(f"{levels} levels do not fit a grid of granularity {granularity} "
                         f"(at most granularity + 1 = {granularity + 1} points)")
    if granularity > MAX_GRANULARITY:
        raise ValueError(f"granularity must be at most {MAX_GRANULARITY}, got {granularity}")


@functools.cache
def _table(levels: int, granularity: int, clamp: float) -> tuple[tuple[int, ...], float]:
    _check(levels, granularity)
    g = granularity
    points = -clamp + np.arange(g + 1) * (2.0 * clamp / g)
    cost = _interval_costs(points)
    # best[m, j]: least variance of m + 1 levels from point 0 to point j (j a level)
    best = np.full((levels, g + 1), np.inf)
    prev = np.zeros((levels, g + 1), dtype=np.int64)
    best[0, 0] = 0.0
    for m in range(1, levels):
        total = best[m - 1][:, None] + cost  # [from i, to j]
        prev[m] = np.argmin(total, axis=0)  # ties: the lowest i, so the table is deterministic
        best[m] = total[prev[m], np.arange(g + 1)]
    table = [g]
    for m in range(levels - 1, 0, -1):
        table.append(int(prev[m, table[-1]]))
    return tuple(reversed(table)), float(best[levels - 1, g])


def level_table(levels: int, granularity: int, clamp: float) -> tuple[int, ...]:
    """The optimal levels as fine-grid indices (ascending, from 0 to ``granularity``).

    Args:
        levels: ``L``, at least 2 and at most ``granularity + 1``.
        granularity: ``g``, the fine grid's number of steps across ``[-T, T]``.
        clamp: ``T`` in standard deviations (positive).

    Raises:
        ValueError: the levels do not fit the grid, or the grid is finer than
            :data:`MAX_GRANULARITY`.
    """
    return _table(levels, granularity, float(clamp))[0]


def rounding_variance(levels: int, granularity: int, clamp: float) -> float:
    """``V``: the expected variance of rounding a clamped standard normal to the levels of
    :func:`level_table` (in ``σ²``)."""
    return _table(levels, granularity, float(clamp))[1]


def clamp_bias(clamp: float) -> float:
    """``C(T) = E[(|X| - T)²; |X| > T]`` for a standard normal ``X`` (in ``σ²``)."""
    t = float(clamp)
    tail = 0.5 * math.erfc(t / math.sqrt(2.0))
    return max(0.0, 2.0 * ((1.0 + t * t) * tail - t * float(_phi(np.float64(t)))))


@functools.cache
def optimal_clamp(levels: int, granularity: int) -> float:
    """THC's table entry: the clamp ``T`` (in ``σ``) minimising ``V(T) + C(T)`` for ``L``
    levels on a grid of granularity ``g``, rounded to 4 decimals (a value that prints well in
    a spec and that every rank derives alike)."""
    _check(levels, granularity)

    def mse(t: float) -> float:
        return rounding_variance(levels, granularity, t) + clamp_bias(t)

    lo, hi = _SEARCH
    x1, x2 = hi - _GOLDEN * (hi - lo), lo + _GOLDEN * (hi - lo)
    f1, f2 = mse(x1), mse(x2)
    while hi - lo > 1e-5:
        if f1 <= f2:
            hi, x2, f2 = x2, x1, f1
            x1 = hi - _GOLDEN * (hi - lo)
            f1 = mse(x1)
        else:
            lo, x1, f1 = x1, x2, f2
            x2 = lo + _GOLDEN * (hi - lo)
            f2 = mse(x2)
    return round(0.5 * (lo + hi), 4)
