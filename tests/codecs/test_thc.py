"""THC as its authors run it: ``intsum`` with a clamp (pipelines ``thc``, ``thc-butterfly``).

* the level tables (:mod:`dynamiq.codecs.thc_levels`): uniform at granularity ``L - 1``,
  optimal and non-uniform on finer grids, the clamp table's optimum;
* the headroom: ``ceil(log2(g n + 1))`` bits (one more when ``g n + 1`` is a power of two);
* exactness: the all-reduced value is the exact sum of every rank's own rounded values, on odd
  and even grids, rings and butterflies; the blocks' first coordinates are summed exactly;
* the clamp is the only bias: with a clamp no value can reach the estimate is unbiased (a test
  over many calls with a tolerance derived from Student's t), with a tight one it is not.

"Equal" means bit for bit (float32 compared through ``view(int32)``).
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

import dynamiq.baselines  # noqa: F401  (registers the baseline pipelines)
from dynamiq import get_pipeline, simulate
from dynamiq.codecs import IntSum
from dynamiq.codecs.thc_levels import (
    clamp_bias,
    level_table,
    optimal_clamp,
    rounding_variance,
)
from dynamiq.collectives.engine import Plan, apply_transforms, local_metadata
from dynamiq.metadata import combine

pytestmark = pytest.mark.usefixtures("one_numba_thread")


def _inputs(n: int, d: int, seed: int = 0) -> torch.Tensor:
    """Gaussian gradients whose 256-blocks have log-normal scales, shared by the ranks."""
    g = torch.Generator().manual_seed(1000 * seed + 17 * n + d)
    s = torch.exp(1.5 * torch.randn(1, -(-d // 256), generator=g))
    return torch.randn(n, d, generator=g) * s.repeat_interleave(256, 1)[:, :d]


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


def _plan(spec: str, x: torch.Tensor, call: int = 0) -> tuple[Plan, list[torch.Tensor]]:
    p = get_pipeline(spec)
    n = x.shape[0]
    ys = [apply_transforms(p, x[r].clone(), call)[0] for r in range(n)]
    plan = Plan(p, n, ys[0].numel(), call)
    states: dict = {}
    metas = [local_metadata(p, y, states) for y in ys]
    plan.set_metadata(combine([m for m, _ in metas], metas[0][1]), states)
    return plan, ys


# ================================================================ level tables and the clamp
def test_level_tables():
    t = optimal_clamp(16, 15)
    assert level_table(16, 15, t) == tuple(range(16))  # granularity L - 1: uniform
    assert 2.0 < t < 2.6  # a few standard deviations
    fine = level_table(16, 60, optimal_clamp(16, 60))
    assert fine[0] == 0 and fine[-1] == 60 and len(fine) == 16
    gaps = [b - a for a, b in itertools.pairwise(fine)]
    assert gaps[len(gaps) // 2] < gaps[0]  # denser near 0, where the Gaussian is
    # the finer grid can only do better, and the table's T is a minimum of V + C
    for g in (15, 30, 60):
        t = optimal_clamp(16, g)
        best = rounding_variance(16, g, t) + clamp_bias(t)
        for dt in (-0.1, 0.1):
            assert best <= rounding_variance(16, g, t + dt) + clamp_bias(t + dt)
    assert (rounding_variance(16, 60, optimal_clamp(16, 60)) + clamp_bias(optimal_clamp(16, 60))
            < rounding_variance(16, 15, optimal_clamp(16, 15)) + clamp_bias(optimal_clamp(16, 15)))
    # C(T) = E[(|X| - T)^2; |X| > T]: C(0) = E[X^2] = 1, and it vanishes fast
    assert clamp_bias(0.0) == pytest.approx(1.0)
    assert clamp_bias(4.0) < 1e-5
    with pytest.raises(ValueError, match="do not fit"):
        level_table(16, 14, 2.0)


@pytest.mark.parametrize("g", [14, 15, 16, 30, 31, 60])
def test_headroom_is_thcs_bit_count(g):
    codec = IntSum(levels=min(16, g + 1), clamp="auto", granularity=g)
    for n in range(2, 70):
        thc = math.ceil(math.log2(g * n + 1))
        # offset binary keeps a NaN code: one more bit when g n + 1 is a power of two
        extra = 1 if (g * n + 1) & (g * n) == 0 else 0
        assert codec.bits_for(n) == thc + extra, (g, n)
    assert IntSum(levels=16, clamp="auto").bits_for(8) == 7  # ceil(log2(121))
    assert IntSum(levels=16, clamp="auto", granularity=30).bits_for(8) == 8
    assert IntSum().bits_for(8) == 7 == math.ceil(math.log2(14 * 8 + 1))  # thc-maxscale


def test_thc_bits_on_the_wire():
    n, d = 8, 70_000  # two Hadamard blocks
    res = simulate("thc", _inputs(n, d), track_hops=False)
    # 7 bits per rotated coordinate, a 16-bit scale and a 32-bit first coordinate per block
    assert res.bits == pytest.approx((7 * 2 * 65536 + 2 * 48) / d, abs=1e-12)
    assert get_pipeline("thc").metadata_bits(2 * 65536) == 96


# ================================================================ exactness
@pytest.mark.parametrize(("n", "topology", "g"), [(3, "ring", 15), (4, "ring", 30),
                                                  (8, "ring", 15), (2, "butterfly", 15),
                                                  (8, "butterfly", 15), (4, "butterfly", 31)])
def test_result_is_the_exact_sum_of_each_ranks_rounded_values(n, topology, g):
    # every rank rounds its own values once onto the grid (round_own); the hops add integers,
    # so the all-reduced value is the exact (float64) sum of those roundings, bit for bit, on
    # odd grids (half-step values, shifted codes) and even ones alike
    d = 3000
    spec = f"intsum(levels=16,clamp=auto,granularity={g},block=512)@{topology}"
    x = _inputs(n, d, seed=n + g)
    res = simulate(spec, x, call=3)
    plan, ys = _plan(spec, x, call=3)
    codec = plan.pipeline.codec
    want = torch.zeros(d, dtype=torch.float64)
    for r in range(n):
        own = ys[r].clone()
        for chunk, (a, b) in enumerate(plan.bounds):
            if b > a:
                codec.round_own(own[a:b], plan.context(r, chunk))
        want += own.double()
        # every rounded value is a grid point: (c - g/2) * step with c in [0, g]
        steps = torch.tensor(plan.prepared[codec].steps).repeat_interleave(512)[:d]
        c = own.double() / steps.double() + g / 2
        assert torch.equal(c, c.round()) and c.min() >= 0 and c.max() <= g
    assert torch.equal(_bits(res.results[0]), _bits(want.float()))
    assert torch.equal(want.float().double(), want)  # the float64 sum was exact in float32
    for r in range(1, n):
        assert torch.equal(_bits(res.results[r]), _bits(res.results[0]))


@pytest.mark.parametrize("topology", ["ring", "butterfly"])
def test_first_coordinates_are_summed_exactly(topology):
    n, d, b = 8, 4000, 256
    x = _inputs(n, d, seed=5)
    x[:, ::b] += 50.0  # a mean a rotation would concentrate into the first coordinates
    exact = x.double().sum(0)
    res = simulate(f"intsum(levels=16,clamp=auto,first=True,block={b})@{topology}", x)
    for r in range(n):
        assert torch.equal(_bits(res.results[r][::b]), _bits(exact[::b].float()))
    # on the grid, the large first coordinates would be clamped away
    clipped = simulate(f"intsum(levels=16,clamp=auto,block={b})@{topology}", x)
    assert clipped.vnmse > 20 * res.vnmse


def test_thc_keeps_the_first_coordinates_out_of_the_block_scale():
    plan, _ = _plan("intsum(levels=16,clamp=auto,first=True,block=256)@ring",
                    torch.cat([torch.full((2, 1), 1e4), torch.randn(2, 255)], 1))
    sigma = plan.stats["intsum.sigma"]
    assert sigma.numel() == 1 and 0.5 < float(sigma[0]) < 2  # the 1e4 does not inflate it


# ================================================================ the clamp is the only bias
def _t_statistics(spec: str, x: torch.Tensor, calls: int) -> tuple[torch.Tensor, float]:
    exact = x.double().sum(0)
    errs = torch.stack([simulate(spec, x, call=c, track_hops=False).results[0].double() - exact
                        for c in range(calls)])
    mean, var = errs.mean(0), errs.var(0)
    return mean / (var / calls).sqrt(), float(var.mean())


def _t2_threshold(calls: int, coords: int, sds: float = 5.0) -> float:
    """Bound on the mean of ``coords`` independent squared Student t's with ``calls - 1``
    degrees of freedom: ``E[t²] = ν / (ν - 2)``, ``Var[t²] = 2 ν² (ν - 1) / ((ν - 2)² (ν - 4))``,
    plus ``sds`` standard deviations of the mean."""
    nu = calls - 1
    mean = nu / (nu - 2)
    var = 2 * nu**2 * (nu - 1) / ((nu - 2) ** 2 * (nu - 4))
    return mean + sds * math.sqrt(var / coords)


@pytest.mark.parametrize(("topology", "n", "g"), [("ring", 4, 15), ("butterfly", 8, 30)])
def test_without_clipping_the_estimate_is_unbiased(topology, n, g):
    # A block of 256 holds no value above its norm = 16 sigma (sigma the largest scale over the
    # ranks), so a clamp at T = 16 cannot clip: the rounding between neighbouring levels is then
    # the only error, unbiased. Over K calls every coordinate's mean error, divided by its
    # standard error, is Student's t with K - 1 degrees of freedom.
    d, calls = 1024, 150
    x = _inputs(n, d, seed=7)
    t, _ = _t_statistics(f"intsum(levels=16,clamp=16,granularity={g},block=256)@{topology}",
                         x, calls)
    bound = _t2_threshold(calls, d)
    assert float((t**2).mean()) < bound, (float((t**2).mean()), bound)
    assert float(t.abs().max()) < 6.0
    # a clamp at one standard deviation clips every large value: the same statistic sees it
    t, _ = _t_statistics(f"intsum(levels=16,clamp=1,granularity={g},block=256)@{topology}",
                         x, 40)
    assert float((t**2).mean()) > 10 * _t2_threshold(40, d)


def test_thc_error_is_far_below_the_max_scaled_grid():
    # the case the clamp is for: one rank's outlier block sets the max-scaled step of all
    x = _inputs(8, 60_000, seed=3)
    x[2, 100] = 400.0
    thc = simulate("thc", x, track_hops=False).vnmse
    maxscale = simulate("thc-maxscale", x, track_hops=False).vnmse
    assert thc < 0.05 and thc < maxscale / 3, (thc, maxscale)
    print(f"thc {thc:.4f}, thc-maxscale {maxscale:.4f}")
