"""The arithmetic and compare searches of element levels agree with the table search.

:func:`dynamiq.kernels.tables.element_family` gives a format an arithmetic search only when the
search reproduces its table; these tests check the classification and then, exhaustively over
dense sets of magnitudes (every level, its neighbours one float32 step away, midpoints, values
past the top, subnormals), that each family's Numba search returns the table search's code.
"""

from __future__ import annotations

import numba as nb
import numpy as np
import pytest

from dynamiq.formats import EpsilonFormat, FloatFormat, IntFormat, LevelFormat
from dynamiq.kernels.abi import Rounding
from dynamiq.kernels.numba.elements import draw_uniform, element_code
from dynamiq.kernels.numba.levels import halving_levels, lut_bracket, round_bracket, round_grid
from dynamiq.kernels.tables import (
    FAMILY_CHAIN,
    FAMILY_FLOAT,
    FAMILY_INT,
    FAMILY_TABLE,
    FormatTables,
    element_family,
    uniform_grid,
)

FORMATS = [
    (FloatFormat(2, 1), FAMILY_FLOAT),  # e2m1 (MXFP4's elements)
    (FloatFormat(3, 2), FAMILY_FLOAT),
    (FloatFormat(4, 3, special="fn"), FAMILY_FLOAT),  # e4m3 (MXFP8's elements)
    (FloatFormat(5, 2), FAMILY_FLOAT),  # e5m2
    (FloatFormat(4, 3, subnormals=False), FAMILY_TABLE),
    (IntFormat(4), FAMILY_INT),
    (IntFormat(8), FAMILY_INT),
    (IntFormat(4, normalized=True), FAMILY_CHAIN),  # 8 levels: the halving search
    (IntFormat(3, normalized=True), FAMILY_CHAIN),  # 4 levels: the compare chain
    (IntFormat(8, normalized=True), FAMILY_TABLE),
    (EpsilonFormat(4, 0.19), FAMILY_CHAIN),
    (EpsilonFormat(5, 0.19), FAMILY_CHAIN),  # 16 levels: the halving search
    (EpsilonFormat(3, 0.19), FAMILY_CHAIN),
    (EpsilonFormat(8, 0.09), FAMILY_TABLE),
]


def _probe(mags: np.ndarray) -> np.ndarray:
    """Every level, its float32 neighbours, midpoints, tiny and huge values (float32)."""
    m = mags.astype(np.float32)
    up = np.nextafter(m, np.float32(np.inf))
    down = np.nextafter(m, np.float32(0))
    mid = ((m[:-1].astype(np.float64) + m[1:]) / 2).astype(np.float32)
    tiny = np.array([0.0, 1e-45, 1e-40, 1e-30, 2.0**-126], np.float32)
    big = np.array([m[-1] * 1.01, m[-1] * 2, 3.0e38], np.float32)
    return np.unique(np.concatenate([m, up, down, mid, tiny, big]).astype(np.float32))


_KERNELS: dict = {}


def _codes_for(mbits: int):
    """A loop of ``element_code`` over ``y`` with ``mbits`` a literal (the kernels compile it
    as one: the 8- and 16-level searches read a tuple of table entries loaded before the
    loop, whose length follows from it)."""
    fn = _KERNELS.get(mbits)
    if fn is None:
        @nb.njit(cache=False)
        def fn(y, etab, enfin, lut, lshift, lkey0, llen, family, mant, bias, emode, u0, out):
            levels = halving_levels(etab, mbits)
            for i in range(y.size):
                # emode NEAREST ignores the uniform; STOCHASTIC rounds with it (the same for
                # every family)
                u = draw_uniform(emode, u0, 7, 0, 0, 0, 1, i, False)
                out[i] = element_code(y[i], u, etab, enfin, lut, lshift, lkey0, llen, mbits,
                                      family, mant, bias, emode, False, levels)

        _KERNELS[mbits] = fn
    return fn


def _run(fmt, family: int, emode: int, y: np.ndarray) -> np.ndarray:
    t = FormatTables.of(fmt)
    need = (1 << fmt.magnitude_bits) + 2
    etab = np.concatenate([t.search, np.full(max(0, need - t.search.size), np.inf, np.float32)])
    _, mant, bias = element_family(t.search[: t.nfin], fmt.magnitude_bits)
    out = np.empty(y.size, np.uint32)
    _codes_for(fmt.magnitude_bits)(y, etab, t.nfin, t.lut, t.lshift, t.lkey0, len(t.lut),
                                   family, mant, bias, emode, 12345, out)
    return out


@pytest.mark.parametrize("fmt,family", FORMATS, ids=[str(f) for f, _ in FORMATS])
def test_family_classification(fmt, family):
    t = FormatTables.of(fmt)
    assert element_family(t.search[: t.nfin], fmt.magnitude_bits)[0] == family


@pytest.mark.parametrize("emode", [Rounding.NEAREST, Rounding.STOCHASTIC])
@pytest.mark.parametrize("fmt,family", [f for f in FORMATS if f[1] != FAMILY_TABLE],
                         ids=[str(f) for f, fam in FORMATS if fam != FAMILY_TABLE])
def test_family_search_equals_table_search(fmt, family, emode):
    t = FormatTables.of(fmt)
    y = _probe(t.search[: t.nfin])
    y = np.concatenate([y, -y])  # the sign bit travels apart from the magnitude
    fast = _run(fmt, family, int(emode), y)
    table = _run(fmt, FAMILY_TABLE, int(emode), y)
    bad = np.flatnonzero(fast != table)
    assert bad.size == 0, (f"{fmt}: first mismatch at |y|={y[bad[0]]!r}: "
                           f"{fast[bad[0]]} vs table {table[bad[0]]}")


def test_chain_applies_to_any_small_table():
    # a level set that is no grid at all still gets the compare search at 4 bits
    mags = np.array([0.0, 0.1, 0.15, 0.7, 0.71, 2.0, 9.0, 9.5], np.float32)
    assert element_family(mags, 3)[0] == FAMILY_CHAIN
    assert element_family(np.linspace(0, 1, 128, dtype=np.float32) ** 3, 7)[0] == FAMILY_TABLE


# ---- uniform scale grids ------------------------------------------------------------------
def test_uniform_grid_classification():
    # u8rel (and any IntFormat(normalized=True) of unsigned levels) is the grid i / k; the
    # others are not
    u8rel = FormatTables.of(IntFormat(8, signed=False, normalized=True))
    assert uniform_grid(u8rel.search[: u8rel.nfin]) == 255
    assert uniform_grid(np.arange(5, dtype=np.float32) / np.float32(4)) == 4
    assert uniform_grid(np.linspace(0, 1, 16, dtype=np.float32) ** 2) == 0
    assert uniform_grid(np.array([0.0, 0.5, 1.0 + 2**-23], np.float32)) == 0  # one ulp off
    assert uniform_grid(np.array([1.0], np.float32)) == 0


@nb.njit(cache=False)
def _round_both(a, u, tab, nfin, lut, lshift, lkey0, llen, k, mode, grid, table):
    for i in range(a.size):
        grid[i] = round_grid(a[i], k, mode, u[i])
        table[i] = round_bracket(a[i], lut_bracket(a[i], lut, lshift, lkey0, llen, tab, nfin),
                                 tab, nfin, mode, u[i])


def _grid_format(k: int):
    """Unsigned levels ``i / k``: an integer format's for ``k = 2**b - 1``, a level table's
    otherwise (where ``a * k`` truncated misses the bracket by one now and then)."""
    if (k + 1) & k == 0:
        return IntFormat(k.bit_length(), signed=False, normalized=True)
    return LevelFormat(tuple(np.arange(k + 1, dtype=np.float32) / np.float32(k)), signed=False)


@pytest.mark.parametrize("mode", list(Rounding))
@pytest.mark.parametrize("k", [3, 15, 255, 4095, 100, 1000])
def test_grid_search_equals_table_search(k, mode):
    # every level, its float32 neighbours up to 64 steps away and midpoints, zero, tiny, past
    # the top, +inf and NaN, and random values, each with a uniform near 0, near 1 and in
    # between: the arithmetic bracket and rounding give the table search's index
    t = FormatTables.of(_grid_format(k))
    assert uniform_grid(t.search[: t.nfin]) == k == t.nfin - 1
    levels = t.search[: t.nfin]
    near = [(levels.view(np.int32) + d).view(np.float32) for d in range(-64, 65, 3)]
    rand = np.random.default_rng(k).random(20000, dtype=np.float32)
    y = np.concatenate([_probe(levels), *near, rand, np.array([np.inf, np.nan], np.float32)])
    y = y[~(y < 0)]
    a = np.repeat(y, 3)
    u = np.tile(np.array([0.0, 0.999999940, 0.5], np.float32), y.size)
    grid = np.empty(a.size, np.uint32)
    table = np.empty(a.size, np.uint32)
    _round_both(a, u, t.search, t.nfin, t.lut, t.lshift, t.lkey0, len(t.lut), k, int(mode),
                grid, table)
    bad = np.flatnonzero(grid != table)
    assert bad.size == 0, (f"k={k}: first mismatch at {a[bad[0]]!r}, u={u[bad[0]]}: "
                           f"{grid[bad[0]]} vs table {table[bad[0]]}")
