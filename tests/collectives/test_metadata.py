"""The metadata phase: declared per-super-group statistics, computed once and seen by every hop."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch

from dynamiq import Passthrough, Pipeline, simulate
from dynamiq.collectives.metadata import (
    STATISTICS,
    SUPER_GROUP,
    combine,
    local_statistics,
    metadata_bits,
    round_bf16,
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
    assert np.array_equal(loc["sum"].numpy(), _bf16(ref.reshape(3, 256).sum(1)))
    amax = np.abs(ref.reshape(3, 256)).max(1)
    # maxima round upwards, to the next BF16 value at most
    assert np.all(loc["absmax"].numpy() >= amax) and np.all(loc["absmax"].numpy() <= amax * 1.008)
    assert metadata_bits(["sum", "absmax32"], 700) == 16 * (3 + 22)


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
