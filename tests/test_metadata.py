"""The metadata phase: declared per-super-group statistics, computed once and seen by every hop."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from dynamiq import Passthrough, Pipeline, simulate
from dynamiq.collectives.statistics import local_statistics
from dynamiq.metadata import (
    STATISTICS,
    SUPER_GROUP,
    Statistic,
    combine,
    metadata_bits,
    pack_bf16,
    round_bf16,
    round_fp8,
    unpack_bf16,
)

SEEN: list = []


@dataclass(frozen=True)
class _Probe(Passthrough):
    """An fp32 passthrough that declares statistics and records what its hops are given."""

    statistics = ("absmax", "sum", "sumsq")

    def compress(self, x, ctx, out=None):
        SEEN.append(ctx.stats)
        return super().compress(x, ctx, out)


def _bf16(a: np.ndarray, up: bool = False) -> np.ndarray:
    return round_bf16(torch.from_numpy(np.ascontiguousarray(a, dtype=np.float64)), up).numpy()


def _exact(x: np.ndarray) -> dict[str, np.ndarray]:
    """Global statistics as the metadata phase defines them: per-rank BF16 values, summed."""
    n, d = x.shape
    groups = -(-d // SUPER_GROUP)
    pad = np.zeros((n, groups * SUPER_GROUP))
    pad[:, :d] = x
    g = pad.reshape(n, groups, SUPER_GROUP)
    return {"sum": _bf16(g.sum(2)).sum(0), "sumsq": _bf16((g * g).sum(2)).sum(0),
            "absmax": _bf16(np.abs(g).max(2), up=True).max(0)}


def test_registry_and_local_statistics():
    assert set(STATISTICS.names()) >= {"sum", "sumsq", "absmax", "absmax32"}
    y = torch.randn(700)
    loc = local_statistics(["sum", "absmax", "absmax32"], y)
    assert loc["sum"].shape == (3,) and loc["sum"].dtype == torch.float64
    assert loc["absmax32"].shape == (22,)
    ref = np.zeros(768)
    ref[:700] = y.numpy()
    # (BF16 under the shift: the same values as plain BF16 while they are in BF16's range)
    assert np.array_equal(loc["sum"].numpy(), _bf16(ref.reshape(3, 256).sum(1)))
    amax = np.abs(ref.reshape(3, 256)).max(1)
    # maxima round upwards, to the next BF16 value at most
    assert np.all(loc["absmax"].numpy() >= amax) and np.all(loc["absmax"].numpy() <= amax * 1.008)
    # additive statistics travel under a per-vector shift byte
    assert metadata_bits(["sum", "absmax32"], 700) == 16 * (3 + 22) + 8


def _fp8_ok(t: torch.Tensor, r: torch.Tensor, exponents: int) -> None:
    top = float(t.abs().max())
    floor = 2.0 ** (np.floor(np.log2(top)) + 2 - exponents)  # the lowest binade
    for v, w in zip(t.tolist(), r.tolist()):
        if abs(v) >= floor:
            assert abs(w - v) <= abs(v) / 16, (v, w)  # 4 significant bits, to nearest
        else:
            assert abs(w - v) <= floor / 16, (v, w)  # a multiple of the lowest step
        m, _ = np.frexp(w)
        assert m * 16 == np.round(m * 16), w  # at most 4 significant bits


@given(st.lists(st.floats(-1e30, 1e30, allow_nan=False, allow_infinity=False), min_size=1,
                max_size=40), st.sampled_from([16, 32]))
@example([5e-324], 16)  # the smallest subnormal: its step must not flush to zero
@example([2.0**-1060, -5e-324, 0.0], 32)
def test_round_fp8_keeps_four_significant_bits_within_its_range(vals, exponents):
    t = torch.tensor(vals, dtype=torch.float64)
    if float(t.abs().max()) == 0.0:
        assert round_fp8(t, exponents).tolist() == vals
        return
    _fp8_ok(t, round_fp8(t, exponents), exponents)


def test_round_fp8_subnormal_statistics_stay_finite():
    t = torch.tensor([5e-324, -1.5e-323, 2.0**-1060], dtype=torch.float64)
    for exponents in (16, 32):
        for keep in (False, True):
            r = round_fp8(t, exponents, keep_nonzero=keep)
            assert torch.isfinite(r).all(), r
    assert round_fp8(torch.tensor([5e-324], dtype=torch.float64), 16).tolist() == [5e-324]


def test_round_fp8_edges_and_cost():
    t = torch.tensor([1.0, 0.3, -5.5, 1e-6, 7.99, 0.0, float("nan"), float("inf")],
                     dtype=torch.float64)
    r = round_fp8(t)
    assert r[:6].tolist() == [1.0, 0.3125, -5.5, 0.0, 8.0, 0.0]  # 1e-6 is below 16 binades
    assert np.isnan(r[6].item()) and r[7].item() == float("inf")
    # sums of fp8 values are exact in float64 (so every summation order agrees)
    vals = round_fp8(torch.randn(64, dtype=torch.float64) * 1e3)
    assert float(vals.sum()) == float(vals.flip(0).sum())
    assert metadata_bits(["sum8", "csumsq8"], 700) == 2 * (8 * 3 + 8)
    assert STATISTICS["csumsq8"].signed is False
    with pytest.raises(ValueError, match="wire must be one of"):
        Statistic("sum", lambda g: g.sum(1), wire="fp4")
    with pytest.raises(ValueError, match="additive"):
        Statistic("max", lambda g: g.amax(1), wire="fp8")


def test_fp8_statistics_are_the_rounded_float64_ones():
    y = torch.randn(700) * 10
    loc = local_statistics(["sum8", "csumsq8"], y)
    g = np.zeros(768)
    g[:700] = y.numpy()
    g = torch.from_numpy(g.reshape(3, 256))
    assert torch.equal(loc["sum8"], round_fp8(g.sum(1)))
    assert torch.equal(loc["csumsq8"], round_fp8(((g - g.mean(1, keepdim=True)) ** 2).sum(1), 32))


def test_round_bf16_nearest_and_up():
    t = torch.tensor([1.0, 1.0 + 2.0**-9, 1.0 + 2.0**-7, -3.0000001, 0.0], dtype=torch.float64)
    assert round_bf16(t).tolist() == [1.0, 1.0, 1.0 + 2.0**-7, -3.0, 0.0]
    assert round_bf16(t, up=True).tolist() == [1.0, 1.0 + 2.0**-7, 1.0 + 2.0**-7, -3.015625, 0.0]


def test_combine_sums_and_maxes():
    a = {"sum": torch.tensor([1.0, -2.0]), "absmax": torch.tensor([3.0, 1.0])}
    b = {"sum": torch.tensor([0.5, 4.0]), "absmax": torch.tensor([1.0, 7.0])}
    out = combine([a, b])
    assert out["sum"].tolist() == [1.5, 2.0] and out["absmax"].tolist() == [3.0, 7.0]
    assert combine([{"m": torch.tensor([1.0])}, {"m": torch.tensor([2.0])}],
                   {"m": "max"})["m"].tolist() == [2.0]


def test_pipeline_collects_declared_statistics():
    p = Pipeline(_Probe(), "ring")
    assert p.statistics == ("absmax", "sum", "sumsq")
    assert Pipeline(Passthrough(), "ring").statistics == ()


@pytest.mark.parametrize("n", [2, 3, 4])
def test_every_hop_sees_the_global_statistics(n):
    rs = np.random.default_rng(n)
    x = rs.standard_normal((n, 1000)).astype(np.float32)
    SEEN.clear()
    res = simulate(Pipeline(_Probe(), "ring"), torch.from_numpy(x))
    exact = _exact(x.astype(np.float64))
    assert res.stats is not None
    for name, want in exact.items():
        # sums of BF16 values in float64 are exact, in any order
        assert np.array_equal(res.stats[name].numpy(), want), name
    assert SEEN and all(s is res.stats for s in SEEN)
    # the statistics do not change what the lossless pipeline computes
    plain = simulate("passthrough-fp32", torch.from_numpy(x))
    assert torch.equal(res.results, plain.results)


_WIRE_NAMES = ("sum", "sumsq", "csumsq", "absmax", "sum8", "csumsq8", "absmax32")


@given(st.lists(st.floats(-1e300, 1e300, allow_nan=False, allow_infinity=False), min_size=1,
                max_size=40), st.sampled_from([1e-300, 1e-30, 1.0, 1e30]),
       st.sampled_from([None, float("nan"), float("inf"), -float("inf")]))
@example([5e-324, 0.0], 1.0, None)
@example([2.0**-1060, -5e-324, 3.0], 1.0, float("nan"))
def test_statistics_travel_exactly_in_16_bits(vals, scale, special):
    """Every statistic's rounded values, packed in 16 bits under their shifts, come back bit for
    bit (non-finite ones as non-finite of the same kind), so the all-gathered metadata equals
    the float64 all-reduce's."""
    t = torch.tensor(vals, dtype=torch.float64) * scale
    if special is not None:
        t[0] = special
    values = {}
    for name in _WIRE_NAMES:
        v = t.abs() if not STATISTICS[name].signed or STATISTICS[name].reduce == "max" else t
        values[name] = STATISTICS[name].round(v)
    back = unpack_bf16(pack_bf16(values), {n: v.numel() for n, v in values.items()})
    assert list(back) == list(values)
    for name, v in values.items():
        b = back[name]
        assert torch.equal(v.isnan(), b.isnan()), name
        fin = ~v.isnan()
        assert torch.equal(v[fin], b[fin]), (name, v[fin] - b[fin])
        assert torch.equal(torch.signbit(v[fin]), torch.signbit(b[fin])), name
