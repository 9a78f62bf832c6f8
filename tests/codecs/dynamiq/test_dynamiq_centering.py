"""Mean-centering (``center``) in front of the DynamiQ codec.

What is checked: centering pays off on offset data, its adjusted statistics are the centered
sums of squares, and the energies the codec allocates from are accurate.
"""

from __future__ import annotations

import pytest
import torch
from _dynamiq_data import SG

from dynamiq import Center, simulate


def _offset_data(n: int, d: int, seed: int = 0) -> torch.Tensor:
    """Per-super-group offsets ~N(0, 10²) shared by all ranks, spread 0.1 per entry."""
    g = torch.Generator().manual_seed(seed)
    off = (10 * torch.randn(d // SG, generator=g)).repeat_interleave(SG)
    return off + 0.1 * torch.randn(n, d, generator=g)


@pytest.mark.parametrize("topology", ["ring", "butterfly"])
def test_centering_wins_on_offset_data(topology):
    x = _offset_data(4, 1 << 14)
    centered = simulate(f"center+dynamiq@{topology}", x, track_hops=False)
    plain = simulate(f"dynamiq@{topology}", x, track_hops=False)
    assert centered.vnmse < 0.1 * plain.vnmse, (centered.vnmse, plain.vnmse)
    assert centered.bits <= 5 and plain.bits <= 5


def test_adjust_statistics_is_the_centered_sum_of_squares():
    """``F_j − S_j²/(n c_j)`` from exact float64 statistics equals the two-pass
    ``Σ_i Σ_{k∈j} (x_ik − μ_j)²`` (float64 rounding only), on a length with a partial last
    super-group; the centered sums are zero, other statistics pass through."""
    n, d = 3, 5 * SG + 37
    g = torch.Generator().manual_seed(11)
    x = (3.0 + torch.randn(n, d, generator=g, dtype=torch.float64)) * torch.linspace(0.1, 5, d,
                                                                                       dtype=torch.float64)
    m = -(-d // SG)
    xp = torch.zeros(n, m * SG, dtype=torch.float64)
    xp[:, :d] = x
    blocks = xp.view(n, m, SG)
    counts = torch.tensor([SG] * (m - 1) + [d - (m - 1) * SG], dtype=torch.float64)
    stats = {"sum": blocks.sum((0, 2)), "sumsq": (blocks**2).sum((0, 2)),
             "absmax": blocks.abs().amax((0, 2))}
    out = Center(statistic="sum").adjust_statistics(stats, n, d)
    mu = stats["sum"] / (n * counts)
    mask = torch.zeros(m, SG, dtype=torch.bool).view(-1)
    mask[:d] = True
    mask = mask.view(m, SG)
    direct = (((blocks - mu[None, :, None]) ** 2) * mask[None]).sum((0, 2))
    torch.testing.assert_close(out["sumsq"], direct, rtol=1e-10, atol=1e-12 * float(
        stats["sumsq"].max()))
    assert torch.equal(out["sum"], torch.zeros(m, dtype=torch.float64))
    assert torch.equal(out["absmax"], stats["absmax"])


def test_centered_energies_seen_by_the_codec_are_accurate():
    """Repro: offsets ~N(0, 10²) per super-group, spread 0.1, n = 4, d = 2^14: true centered
    energies are ≈ 10 in every super-group, the codec sees 0 … 1264, and equal-energy
    super-groups get widths 2, 4 or 8."""
    n, d = 4, 1 << 14
    x = _offset_data(n, d)
    res = simulate("center+dynamiq@ring", x, track_hops=False)
    blocks = x.double().view(n, -1, SG)
    mu = blocks.sum((0, 2)) / (n * SG)
    true = ((blocks - mu[None, :, None]) ** 2).sum((0, 2))
    # the codec's energy: each rank's spread about its own mean (centering zeroed the sums)
    assert not res.stats["sum8"].any()
    ratio = res.stats["csumsq8"] / true
    assert ((ratio > 0.5) & (ratio < 2.0)).all(), ratio
