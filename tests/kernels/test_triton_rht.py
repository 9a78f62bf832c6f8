"""The Triton randomized Hadamard transform equals the Numba one bit for bit (interpreter)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("triton")

from dynamiq.kernels.abi import rht_norm
from dynamiq.kernels.numba import hadamard as nh
from dynamiq.kernels.triton import hadamard as th
from dynamiq.transforms import RandomizedHadamard


def assert_same_floats(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    g, w = got.view(torch.int32), want.view(torch.int32)
    if not torch.equal(g, w):
        i = int((g != w).nonzero()[0])
        raise AssertionError(
            f"{what}: {int((g != w).sum())} floats differ; first at {i}: triton "
            f"{got[i].item()!r}, numba {want[i].item()!r}"
        )


def _vector(n: int, seed: int) -> torch.Tensor:
    rs = np.random.default_rng(seed)
    x = rs.standard_normal(n) * 10.0 ** rs.uniform(-3, 3, n)
    x[rs.integers(n, size=max(1, n // 16))] = 0.0
    return torch.from_numpy(x.astype(np.float32))


# odd and even log2(block): the norm is a rounded 1/sqrt(2) multiple or an exact power of two
@pytest.mark.parametrize("block", [2, 4, 8, 16, 64, 128, 1024])
@pytest.mark.parametrize("extra", [0, 1])
def test_transform_matches_numba(block, extra):
    n = 3 * block + extra * (block // 2 + 1)
    t = RandomizedHadamard(block_size=block, seed=2**63 + 5)
    x = _vector(n, block + extra)
    for step in (0, 7):
        want = t.forward(x, step=step)
        got = t.forward(x, step=step, backend="triton")
        assert_same_floats(got, want, f"forward block={block} n={n} step={step}")
        back = t.inverse(want, n, step=step)
        assert_same_floats(t.inverse(want, n, step=step, backend="triton"), back,
                           f"inverse block={block} n={n} step={step}")


def test_large_block_and_special_values():
    block = 4096
    t = RandomizedHadamard(block_size=block, seed=3)
    x = _vector(2 * block, 1)
    x[5] = float("inf")  # first block: non-finite everywhere (inf - inf = NaN)
    x[block + 9] = 1e-45  # subnormals in the second
    x[block + 10] = -3e38
    want = t.forward(x, step=1)
    assert_same_floats(t.forward(x, step=1, backend="triton"), want, "forward 4096")
    assert_same_floats(t.inverse(want, 2 * block, step=1, backend="triton"),
                       t.inverse(want, 2 * block, step=1), "inverse 4096")


@pytest.mark.parametrize(("block", "max_tile"), [(256, 16), (1024, 64), (64, 4)])
def test_multi_pass_blocks_match_numba(block, max_tile):
    # blocks above max_tile run as several passes of strided tiles (how 2**16 runs on a GPU)
    k0, k1 = 0x9E3779B1, 0x0BADF00D
    norm = rht_norm(block)
    x = _vector(2 * block, block + max_tile)
    for inverse in (False, True):
        want = x.numpy().copy()
        (nh.rht_inverse if inverse else nh.rht_forward)(want, want, block, k0, k1, norm)
        got = torch.empty_like(x)
        (th.rht_inverse if inverse else th.rht_forward)(x, got, block, k0, k1, norm,
                                                        max_tile=max_tile)
        assert_same_floats(got, torch.from_numpy(want), f"{block=} {max_tile=} {inverse=}")


def test_kernels_in_place_and_arguments():
    block, n = 32, 96
    k0, k1 = 0x12345678, 0xFEDCBA98
    norm = rht_norm(block)
    x = _vector(n, 9)
    want = x.numpy().copy()
    nh.rht_forward(want, want, block, k0, k1, norm)
    buf = x.clone()
    th.rht_forward(buf, buf, block, k0, k1, norm)  # in place
    assert_same_floats(buf, torch.from_numpy(want), "in-place forward")
    out = torch.empty(n)
    th.rht_inverse(buf, out, block, k0, k1, norm)
    ref = np.empty(n, np.float32)
    nh.rht_inverse(want, ref, block, k0, k1, norm)
    assert_same_floats(out, torch.from_numpy(ref), "inverse")
    with pytest.raises(ValueError, match="multiple of block"):
        th.rht_forward(torch.randn(33), torch.empty(33), block, k0, k1, norm)
    with pytest.raises(ValueError, match="power of two"):
        th.rht_forward(torch.randn(48), torch.empty(48), 24, k0, k1, norm)
    with pytest.raises(ValueError, match="float32"):
        th.rht_forward(torch.randn(32).double(), torch.empty(32), block, k0, k1, norm)
    with pytest.raises(ValueError, match="length and device"):
        th.rht_forward(torch.randn(32), torch.empty(64), block, k0, k1, norm)
