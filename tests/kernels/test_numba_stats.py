"""Numba block statistics of the metadata phase against their torch definitions."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _parity import awkward_statistics_vector
from hypothesis import given, settings
from hypothesis import strategies as hs

from dynamiq import metadata
from dynamiq.collectives.statistics import local_statistics
from dynamiq.kernels import STAT_OPS
from dynamiq.kernels.backend import get_backend
from dynamiq.kernels.blockstats import stats_tolerance

NUMBA = get_backend("numba")
TORCH = get_backend("reference")


def _check(y: torch.Tensor, ops) -> None:
    got = NUMBA.block_statistics(y, ops)
    want = TORCH.block_statistics(y, ops)
    for key in ops:
        g, w = got[key], want[key]
        assert g.dtype == torch.float64 and g.shape == w.shape, key
        assert torch.equal(g.isnan(), w.isnan()), key
        inf = w.isinf()
        assert torch.equal(g[inf], w[inf]), key
        fin = torch.isfinite(w)
        err = (g - w).abs()[fin]
        assert (err <= stats_tolerance(key[0], key[1], y)[fin]).all(), key


def test_every_op_on_awkward_values():
    y = awkward_statistics_vector(3)
    _check(y, [(op, b) for op in STAT_OPS for b in (1, 16, 32, 256, 4096)])


@settings(max_examples=60, deadline=None)
@given(n=hs.integers(1, 3000), block=hs.sampled_from([1, 2, 16, 32, 256]),
       offset=hs.floats(-1e3, 1e3), scale=hs.floats(1e-20, 1e20), seed=hs.integers(0, 2**31))
def test_matches_torch_within_the_bound(n, block, offset, scale, seed):
    # a large common offset is where the centred sum of squares differs from sumsq
    rs = np.random.default_rng(seed)
    y = torch.from_numpy(((rs.standard_normal(n) + offset) * scale).astype(np.float32))
    _check(y, [(op, block) for op in STAT_OPS])


def test_centred_sum_counts_the_padding():
    y = torch.full((3,), 2.0)
    out = NUMBA.block_statistics(y, [("csumsq", 4)])[("csumsq", 4)]
    # block [2, 2, 2, 0]: mean 1.5, deviations 0.5, 0.5, 0.5, -1.5
    assert out.tolist() == [0.25 * 3 + 2.25]


def test_wire_values_equal_the_reference_backend():
    y = torch.randn(70_000) * 3.0 + 0.5
    names = [n for n in metadata.STATISTICS.names() if metadata.STATISTICS[n].op]
    assert {"csumsq", "csumsq8"} <= set(names)
    got = local_statistics(names, y, backend="numba")
    want = local_statistics(names, y, backend="reference")
    for name in names:
        assert torch.equal(got[name], want[name]), name


def test_unknown_op_is_refused():
    with pytest.raises(ValueError, match="block statistics"):
        NUMBA.block_statistics(torch.ones(4), [("median", 2)])


@pytest.mark.parametrize("n", [1, 255, 256, 1000, 70001])
def test_sums_asked_with_centred_sums_are_those_asked_alone(n):
    """A block sum and a centred sum of squares of one block size share a pass; each has the bits
    of its own pass (NaN, Inf and a partial last block included)."""
    y = awkward_statistics_vector(5)[:n].contiguous() if n <= 1000 else torch.randn(n) * 1e3
    together = NUMBA.block_statistics(y, [("sum", 256), ("absmax", 32), ("csumsq", 256)])
    for key in (("sum", 256), ("csumsq", 256), ("absmax", 32)):
        alone = NUMBA.block_statistics(y, [key])[key]
        assert torch.equal(together[key].view(torch.int64), alone.view(torch.int64)), key
