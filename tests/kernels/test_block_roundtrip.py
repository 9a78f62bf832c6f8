"""``block_roundtrip``: blocks of many chunks and ranks coded in one call, each under its own
keys, give what coding each block alone gives (the reference backend, one block at a time).

Every backend is enrolled (Numba's keyed kernels, and the base class's run-by-run default
that Triton and the reference use), with correlated and dithered keys, a world size that is not
a power of two, blocks in scrambled order, and two neighbouring blocks that share their keys
(one run of the default). The quantizers cover every path of the keyed kernels (nearest,
stochastic and correlated rounding; flat and hierarchical scales; arithmetic and table element
search; dithered decoding): compiling the keyed kernels of every registered quantizer would add
minutes to a cold run for no path more.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dynamiq import QUANTIZERS
from dynamiq.kernels import backend_names

BACKENDS = [b for b in backend_names() if b != "auto"]
#: Quantizers per backend: the interpreted Triton runs the default's code, one is enough.
COVER = ("mxfp8", "nvfp4", "int4_sr", "dq8_hier", "dq4_dither")

pytestmark = [pytest.mark.usefixtures("one_numba_thread"), pytest.mark.timeout(3600)]


def _case(q, seed: int = 0):
    b = q.block_size
    g = torch.Generator().manual_seed(seed)
    nblocks = 8
    x = torch.randn(nblocks * b, generator=g) * torch.rand(nblocks * b, generator=g) ** 3
    rows = torch.tensor([5, 2, 3, 7, 0], dtype=torch.int64)
    world = 6
    ranks = np.array([1, 4, 4, 0, 5])
    chunk = np.array([3, 9, 9, 2, 3])
    height = np.array([0, 2, 2, 5, 1])
    offsets = np.array([7 * b, 40 * b, 41 * b, 3 * b, 12 * b])  # blocks 1, 2: one run
    return x, rows, world, ranks, (11, chunk, height), offsets


@pytest.fixture(autouse=True)
def keyed_kernels(monkeypatch):
    """Numba's keyed kernels even for the few runs of these cases."""
    import dynamiq.kernels.numba as nbk

    monkeypatch.setattr(nbk, "KEYED_MIN_RUNS", 0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_quantizer_codes_each_block_as_alone(backend):
    for name in COVER if backend != "triton" else ("dq4_dither",):
        q = QUANTIZERS[name]
        x, rows, world, ranks, streams, offsets = _case(q)
        keys = q.block_keys(5, streams, ranks, world, offsets)
        got = x.clone()
        q.roundtrip_blocks(got, rows, keys, backend=backend)
        want = x.clone()
        b = q.block_size
        for i, r in enumerate(rows.tolist()):
            blk = x[r * b:(r + 1) * b].clone()
            want[r * b:(r + 1) * b] = q.roundtrip(
                blk, seed=5, rank=int(ranks[i]), world_size=world,
                stream=tuple(int(c[i]) if np.ndim(c) else c for c in streams),
                index_offset=int(offsets[i]), backend="reference")
        assert torch.equal(got.view(torch.int32), want.view(torch.int32)), (name, backend)


def test_block_keys_equal_the_per_call_keys():
    q = QUANTIZERS["dq4_hier"]
    _, _, world, ranks, streams, offsets = _case(q)
    keys = q.block_keys(5, streams, ranks, world, offsets)
    for i in range(len(ranks)):
        want = q._rand(5, int(ranks[i]), world, (11, int(streams[1][i]), int(streams[2][i])),
                       int(offsets[i]))
        assert keys.block(i) == want
    assert keys.runs(q.block_size).tolist() == [0, 1, 3, 4, 5]


def test_bad_inputs_raise():
    q = QUANTIZERS["dq4_hier"]
    x, rows, world, ranks, streams, offsets = _case(q)
    keys = q.block_keys(5, streams, ranks, world, offsets)
    with pytest.raises(ValueError, match="keys for"):
        q.roundtrip_blocks(x, rows[:3], keys)
    with pytest.raises(ValueError, match="whole blocks"):
        q.roundtrip_blocks(x, rows + 100, keys)
    with pytest.raises(ValueError, match="float32"):
        q.roundtrip_blocks(x.double(), rows, keys)
    with pytest.raises(ValueError, match="ranks must be in"):
        q.block_keys(5, streams, ranks + 10, world, offsets)
    with pytest.raises(ValueError, match="offsets"):
        q.block_keys(5, streams, ranks, world, offsets - 10**9)
