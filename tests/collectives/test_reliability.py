"""Regressions for inputs at the edges: non-finite values, extreme magnitudes, short vectors.

Each test pins one defect found by adversarial use (and fails on the code before its fix).
"""

from __future__ import annotations

import math

import pytest
import torch

from dynamiq import get_quantizer, simulate
from dynamiq.collectives.statistics import local_statistics
from dynamiq.metadata import STATISTICS, combine, round_bf16


def _inputs(n: int, d: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, d, generator=g, dtype=torch.float64) * scale).float()


# ---- non-finite values ------------------------------------------------------------------------
def test_a_nan_maximum_travels_as_inf_so_every_reduction_order_agrees():
    # a backend's elementwise max may drop a NaN depending on the order (gloo's MAX does);
    # +inf is the maximum in every order, so simulate and all_reduce see the same scale
    y = torch.randn(64)
    y[3] = math.nan
    for name in ("absmax", "absmax32", "absmax16"):
        v = local_statistics([name], y)[name]
        assert math.isinf(float(v[0])) and float(v[0]) > 0, name
        other = torch.zeros_like(v)
        for order in ([v, other], [other, v]):
            assert math.isinf(float(combine([{name: t} for t in order])[name][0]))


def test_finite_statistics_never_become_infinite():
    big = torch.tensor([3.4e38, -3.4e38, 1e300, -1e300], dtype=torch.float64)
    assert torch.isfinite(round_bf16(big)).all() and torch.isfinite(round_bf16(big, up=True)).all()
    y = torch.full((256,), 3e37)
    for name in ("sum", "sumsq", "csumsq", "absmax"):
        assert torch.isfinite(local_statistics([name], y)[name]).all(), name


@pytest.mark.parametrize("d", [64, 300, 512, 1000])
def test_omnireduce_keeps_non_finite_values_at_their_coordinates(d):
    xs = _inputs(2, d, d)
    xs[1, 3] = math.nan
    xs[0, 10] = math.inf
    xs[0, d - 1] = -math.inf
    res = simulate("omnireduce", xs).results
    for r in range(2):
        assert math.isnan(res[r, 3]) and res[r, 10] == math.inf and res[r, d - 1] == -math.inf
    assert torch.equal(res[0].view(torch.int32), res[1].view(torch.int32))  # bit for bit


# ---- extreme magnitudes -----------------------------------------------------------------------
@pytest.mark.parametrize("scale", [1e-30, 1e-22, 1e37])
def test_dynamiq_paper_error_does_not_depend_on_the_scale(scale):
    # BF16 sums of squares of tiny (huge) gradients underflowed (overflowed) BF16's range
    ref = simulate("dynamiq-paper", _inputs(3, 1024, 5)).vnmse
    res = simulate("dynamiq-paper", _inputs(3, 1024, 5, scale))
    assert torch.isfinite(res.results).all()
    assert res.vnmse < 2 * ref


@pytest.mark.parametrize("name", ["int4_sr", "int8_sr", "dq4_hier", "dq8_hier"])
def test_float32_maximum_decodes_finite(name):
    q = get_quantizer(name)
    x = torch.tensor([3.4028e38, 1.0, -3.4028e38] + [0.5] * 29)
    y = q.decode(q.encode(x))
    assert torch.isfinite(y).all(), y[:3]
    assert float(y[0]) > 1e38 and float(y[2]) < -1e38


def test_fp8_and_bf16_statistics_round_subnormals():
    st = STATISTICS["csumsq"]
    t = torch.tensor([5e-324, 1e-300, 0.0], dtype=torch.float64)
    r = st.round(t)
    assert torch.isfinite(r).all() and (r[:2] > 0).all() and r[2] == 0


# ---- short vectors ----------------------------------------------------------------------------
LENGTHS = [1, 2, 7, 33, 58, 64, 100, 255, 257, 300, 513, 1023, 1025, 2000, 5000]


@pytest.mark.parametrize("name", ["dynamiq", "dynamiq-paper"])
def test_dynamiq_error_is_uniform_over_lengths(name):
    # the reference backend: the same bits as the kernels (the parity tests), no compile
    long = sum(simulate(name, _inputs(3, 8192, c), call=c, backend="reference").vnmse
               for c in range(2)) / 2
    for d in LENGTHS:
        res = [simulate(name, _inputs(3, d, 100 + c), call=c, backend="reference")
               for c in range(2)]
        worst = max(r.vnmse for r in res)
        assert worst < 4 * long, (d, worst, long)
        if d >= 1024:  # the budget holds once fixed costs are spread over enough coordinates
            assert all(r.bits <= 5.0 + 1e-9 for r in res), (d, [r.bits for r in res])


def test_dynamiq_on_seven_ranks_and_a_short_vector():
    vs = [simulate("dynamiq", _inputs(7, 58, c), call=c).vnmse for c in range(4)]
    assert max(vs) < 0.1, vs


@pytest.mark.parametrize("name", ["thc", "rht(block_size=128)+requant(quantizer=dq4_hier)@ring"])
@pytest.mark.parametrize("scale", [1e-36, 1e-34, 1e36, 1e37])
def test_rotations_neither_overflow_nor_underflow(name, scale):
    # the unnormalised Hadamard butterflies overflowed float32 for gradients above ~5e33
    # (blocks of 2**16) although the rotated values fit; THC's smallest step was 2**-100
    ref = simulate(name, _inputs(3, 3000, 9)).vnmse
    res = simulate(name, _inputs(3, 3000, 9, scale))
    assert torch.isfinite(res.results).all()
    assert res.vnmse < 2 * ref + 1e-3, (res.vnmse, ref)


def test_rht_round_trip_near_the_float32_maximum():
    from dynamiq import RandomizedHadamard

    t = RandomizedHadamard(block_size=1 << 16)
    x = _inputs(1, 70_000, 3, 1e37)[0]
    x[5] = 3.0e38
    y = t.forward(x)
    assert torch.isfinite(y).all()
    back = t.inverse(y, x.numel())
    assert torch.allclose(back.double(), x.double(), rtol=1e-4, atol=1e33)
    # in-range vectors take the unscaled path: the same bits as before
    small = _inputs(1, 70_000, 4)[0]
    assert t._range_scales(t.forward(small).clone()) is None


@pytest.mark.parametrize("scale", [1e-6, 1e-4, 1.0, 1e4, 1e30])
def test_nvfp4_spans_any_gradient_scale(scale):
    # an E4M3 group scale alone clipped above 6 * 448 and zeroed groups below ~1e-3
    q = get_quantizer("nvfp4")
    x = _inputs(1, 4096, 2, scale)[0]
    y = q.decode(q.encode(x))
    err = float(((y.double() - x.double()) ** 2).sum() / (x.double() ** 2).sum())
    assert err < 0.02, err
    assert float(y.abs().max()) >= 0.9 * float(x.abs().max())  # the maximum is not clipped
    res = simulate("requant(quantizer=nvfp4)@ring", _inputs(3, 4096, 3, scale))
    assert res.vnmse < 0.05, res.vnmse


@pytest.mark.parametrize("name", sorted(__import__("dynamiq").PIPELINES.names()))
def test_every_pipeline_commutes_with_power_of_two_scaling(name):
    # every scale is relative (groups, super-groups, tensors, metadata under a shift), so
    # scaling the inputs by 2**k scales the result by 2**k, bit for bit, far from the ends of
    # float32's range
    from dynamiq import get_pipeline

    n = 4
    try:
        get_pipeline(name).topology.check_world_size(n)
    except ValueError:
        n = 2
    x = _inputs(n, 3000, 11)
    ref = simulate(name, x).results
    for k in (-60, 40):
        got = simulate(name, x * 2.0**k).results
        assert torch.equal(got, ref * 2.0**k), k
