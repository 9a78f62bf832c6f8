"""The metadata phase: declared per-super-group statistics, computed once and seen by every hop."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch

from dynamiq import Passthrough, Pipeline, simulate
from dynamiq.collectives.metadata import STATISTICS, SUPER_GROUP, combine, local_statistics

SEEN: list = []


@dataclass(frozen=True)
class _Probe(Passthrough):
    """An fp32 passthrough that declares statistics and records what its hops are given."""

    statistics = ("absmax", "sum", "sumsq")

    def compress(self, x, ctx, out=None):
        SEEN.append(ctx.stats)
        return super().compress(x, ctx, out)


def _exact(x: np.ndarray) -> dict[str, np.ndarray]:
    n, d = x.shape
    groups = -(-d // SUPER_GROUP)
    pad = np.zeros((n, groups * SUPER_GROUP))
    pad[:, :d] = x
    g = pad.reshape(n, groups, SUPER_GROUP)
    return {"sum": g.sum((0, 2)), "sumsq": (g * g).sum((0, 2)), "absmax": np.abs(g).max((0, 2))}


def test_registry_and_local_statistics():
    assert set(STATISTICS.names()) >= {"sum", "sumsq", "absmax"}
    y = torch.randn(700)
    loc = local_statistics(["sum", "absmax"], y)
    assert loc.shape == (2, 3) and loc.dtype == torch.float64
    ref = np.zeros(768)
    ref[:700] = y.numpy()
    assert np.allclose(loc[0].numpy(), ref.reshape(3, 256).sum(1), rtol=1e-12, atol=1e-12)
    assert np.array_equal(loc[1].numpy(), np.abs(ref.reshape(3, 256)).max(1))


def test_combine_sums_and_maxes():
    a, b = torch.tensor([[1.0, -2.0], [3.0, 1.0]]), torch.tensor([[0.5, 4.0], [1.0, 7.0]])
    out = combine(["sum", "absmax"], [a, b])
    assert out["sum"].tolist() == [1.5, 2.0] and out["absmax"].tolist() == [3.0, 7.0]


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
        # float64 sums of float32 inputs over n ranks: relative error far below 1e-12
        assert np.allclose(res.stats[name].numpy(), want, rtol=1e-12, atol=1e-12), name
    assert SEEN and all(s is res.stats for s in SEEN)
    # the statistics do not change what the lossless pipeline computes
    plain = simulate("passthrough-fp32", torch.from_numpy(x))
    assert torch.equal(res.results, plain.results)
