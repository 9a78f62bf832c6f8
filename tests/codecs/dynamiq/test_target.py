"""DynamiQ's accuracy-targeted budgets: the tree factors, the search, the calibration, the mode."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from dynamiq.codecs import DynamiQ
from dynamiq.codecs.dynamiq.target import (
    BUDGET_STEP,
    check_target,
    predicted_vnmse,
    reference_error,
    ring_factors,
    smallest_budget,
)
from dynamiq.collectives.simulator import simulate
from dynamiq.pipeline import Pipeline
from dynamiq.topologies import get_topology


@pytest.mark.parametrize("n", [1, 2, 3, 8, 13])
def test_ring_subtree_sizes_and_factors(n):
    sched = get_topology("ring").schedule(n)
    for c in range(sched.num_chunks):
        assert sorted(sched.subtree_sizes(c)) == list(range(1, n + 1))
        assert sched.subtree_sizes(c)[sched.owners[c]] == n
    assert sched.compression_factors() == pytest.approx(ring_factors(n))


def test_butterfly_factors_are_smaller_than_the_ring():
    ring = get_topology("ring").schedule(8).compression_factors()
    bf = get_topology("butterfly").schedule(8)
    for c in range(bf.num_chunks):
        s = bf.subtree_sizes(c)
        assert max(s) == 8 and sum(s) == 20  # a binomial tree: 8, 4, 2, 2, 1, 1, 1, 1
    ind, eq = bf.compression_factors()
    assert ind == pytest.approx(2.5) and eq == pytest.approx(92 / 64)
    assert ind < ring[0] and eq < ring[1]


def test_smallest_budget_is_the_first_grid_point_meeting_the_target():
    calls = []

    def predict(b):
        calls.append(b)
        return 2.0 ** -b

    b = smallest_budget(2.0, 8.0, predict, 2.0 ** -5.3)
    assert b == pytest.approx(5.3, abs=BUDGET_STEP)
    assert 2.0 ** -b <= 2.0 ** -5.3 < 2.0 ** -(b - BUDGET_STEP)
    assert len(calls) < 16
    assert smallest_budget(2.0, 8.0, predict, 1.0) == 2.0  # the cheapest already meets it
    assert smallest_budget(2.0, 8.0, predict, 1e-9) == 8.0  # nothing does: the cap


@pytest.mark.parametrize("bad", [0, 1, -1e-3, 2.0, float("nan"), "mxfp9", True, "x"])
def test_bad_targets_raise(bad):
    with pytest.raises(ValueError, match="target"):
        check_target(bad)
    with pytest.raises(ValueError):
        DynamiQ(target=bad)


def test_targets_accepted():
    assert check_target("1e-3") == 1e-3
    assert check_target(" MXFP8 ") == "mxfp8"
    assert DynamiQ(target=0.01).target == 0.01
    with pytest.raises(ValueError, match="max_bits"):
        DynamiQ(target=0.01, max_bits=-1)


def test_predicted_vnmse_is_the_energy_weighted_error_times_the_factor():
    e = np.array([1.0, 3.0, 0.0, np.inf])
    v = np.array([0.1, 0.01, 1.0, 1.0])
    got = predicted_vnmse(e, v, (4.0, 1.0))
    assert got == pytest.approx(2.0 * (0.1 + 0.03) / 4.0)
    assert predicted_vnmse(np.zeros(3), v[:3], (4.0, 1.0)) == 0.0


@pytest.mark.parametrize("topology", ["ring", "butterfly"])
def test_target_mode_meets_its_target_on_gaussian_gradients(topology):
    g = torch.Generator().manual_seed(1)
    n, d = 8, 1 << 16
    # super-groups of log-normal energies; every rank's gradient a shared part plus its own
    scale = torch.exp(torch.randn(d // 256, generator=g)).repeat_interleave(256)
    x = (torch.randn(d, generator=g) + torch.randn(n, d, generator=g)) * scale
    chosen = []
    for target in (3e-3, 3e-4):
        p = Pipeline(DynamiQ(target=target), topology, ("center",))
        state: dict = {}
        r = simulate(p, x, state=state, track_hops=False)
        bits = state[p.codec]["bits"]
        chosen.append(bits)
        assert r.bits == pytest.approx(bits, abs=0.01)  # the budget it chose is what it spent
        assert target / 1.5 <= r.vnmse <= 1.5 * target, (target, r.vnmse, bits)
    assert chosen[1] > chosen[0]


def test_target_mode_respects_max_bits_and_agrees_with_the_fixed_budget():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(4, 1 << 14, generator=g)
    capped = Pipeline(DynamiQ(target=1e-6, max_bits=4.5), "ring")
    st: dict = {}
    r = simulate(capped, x, state=st, track_hops=False)
    assert st[capped.codec]["bits"] == 4.5 and r.bits <= 4.5 + 1e-9
    # a fixed budget equal to the chosen one allocates the same widths (same bytes, same sum)
    b = st[capped.codec]["bits"]
    fixed = Pipeline(dataclasses.replace(capped.codec, target=None, max_bits=None, bits=b),
                     "ring")
    assert math.isclose(simulate(fixed, x, track_hops=False).bits, r.bits, abs_tol=0.02)


def test_tree_errors_reduce_to_the_tree_factors_for_small_errors():
    """With one plan and tiny errors the children's error is negligible: the tree's error is
    ``v c E`` in both regimes (ring of 8: c = 4.5 and n · 3.19); with ``v = 1`` at the leaves
    of a chain it compounds, the inherited error counted up to the partial sum's energy; a
    calibration factor holds, except for the sparse share of it in independent partial sums,
    which fades as ``1/s``."""
    from dynamiq.codecs.dynamiq import WidthPlan
    from dynamiq.codecs.dynamiq.hops import ring_profile
    from dynamiq.codecs.dynamiq.target import tree_errors

    e = np.array([1.0, 3.0])
    plan = WidthPlan(np.zeros(2, dtype=np.int64), (4,), 0.0, 0.0)
    ind, eq = tree_errors(e, plan, np.array([1e-9]), ring_profile(8), 8)
    c_ind, c_eq = ring_factors(8)
    assert ind == pytest.approx(1e-9 * c_ind * 4.0, rel=1e-6)
    assert eq == pytest.approx(1e-9 * c_eq * 8 * 4.0, rel=1e-6)
    big, _ = tree_errors(e, plan, np.array([1.0]), ring_profile(3), 3)
    # A(1) = E/3, A(2) = (2E/3 + A(1)) + A(1) = 4E/3, A(3) = (E + min(A(2), E)) + A(2) = 10E/3
    assert big == pytest.approx(10.0 / 3.0 * 4.0)
    f = np.array([3.0])
    ind_f, eq_f = tree_errors(e, plan, np.array([1e-9]), ring_profile(8), 8, factor=f)
    # a dense sample: the factor holds at every hop in both regimes
    assert eq_f == pytest.approx(3.0 * eq, rel=1e-6)
    assert ind_f == pytest.approx(3.0 * ind, rel=1e-6)
    # an all-sparse sample: in the independent regime hop s's factor is 1 + 2/s, weighted by s
    ind_z, eq_z = tree_errors(e, plan, np.array([1e-9]), ring_profile(8), 8, factor=f, zeros=1.0)
    assert eq_z == pytest.approx(3.0 * eq, rel=1e-6)
    assert ind_z == pytest.approx(1e-9 * 4.0 * sum(s + 2.0 for s in range(1, 9)) / 8, rel=1e-6)


def test_named_targets_measure_the_baselines_codec():
    """``target="mxfp8"`` aims at the ``mxfp8`` baseline's own coding: round to nearest E4M3
    under power-of-two block scales from the block maxima (computed here with torch's float8
    cast), not the OCP quantizer, whose scale rounds down and clips the largest elements."""
    from dynamiq.baselines import BASELINES
    from dynamiq.codecs.dynamiq.errors import _sample, measured_error
    from dynamiq.codecs.shared_scale import mx_codec
    from dynamiq.quantizers import QUANTIZERS

    assert BASELINES["mxfp8"][0] == mx_codec("mxfp8")
    x = _sample().view(-1, 32).double()
    s = 2.0 ** torch.ceil(torch.log2(x.abs().amax(1, keepdim=True) / 448))
    y = (x / s).float().to(torch.float8_e4m3fn).double() * s
    expect = float(((y - x) ** 2).sum() / (x**2).sum())
    got = reference_error("mxfp8")
    assert got == pytest.approx(expect, rel=1e-12)
    assert got < measured_error(QUANTIZERS.get("mxfp8")) / 1.2
    assert reference_error("mxfp8") < reference_error("mxfp6") < reference_error("mxfp4")
