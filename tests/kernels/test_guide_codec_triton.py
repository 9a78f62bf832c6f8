"""The skip_zeros codec of the guide "Add a codec" (docs/examples/skip_zeros.py) on the Triton
backend: its hops and a whole all-reduction give Numba's bits.

Runs under Triton's interpreter on CPU tensors (``conftest.py`` sets ``TRITON_INTERPRET=1`` before
the Triton kernels are imported), on tiny vectors. The example is imported by module name at
collection time, as in tests/codecs/test_guide_codec.py (a module runs once per process, so the
codec is registered once).
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("triton")

from dynamiq import HopContext, simulate
from dynamiq.collectives.statistics import local_statistics

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"
if str(EXAMPLES) not in sys.path:
    sys.path.insert(0, str(EXAMPLES))
skip_zeros = importlib.import_module("skip_zeros")

WIRES = ("fp32", "bf16")
WRITEBACKS = ("none", "sum", "decoded")
BLOCK = 256
N = 1003  # four blocks, the last one partial

pytestmark = pytest.mark.usefixtures("one_numba_thread")


def assert_same(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, what
    if got.dtype == torch.float32:
        got, want = got.view(torch.int32), want.view(torch.int32)
    assert torch.equal(got, want), f"{what}: {int((got != want).sum())} entries differ"


def vector(n: int, seed: int) -> torch.Tensor:
    """Random values with zeros, ±0, NaN, ±Inf, a subnormal and a huge value, at positions that
    depend on ``seed`` (a NaN plus a NaN has no payload every backend agrees on); block 1 is all
    zero (+0 and -0)."""
    rs = np.random.default_rng(seed)
    x = (rs.standard_normal(n) * np.exp(1.5 * rs.standard_normal(n))).astype(np.float32)
    x[rs.integers(0, n, size=n // 9)] = 0.0
    x[BLOCK: 2 * BLOCK] = 0.0
    x[BLOCK + 1], x[3] = -0.0, -0.0
    x[[5 + seed, 40 + seed, 70 + seed, 600 + seed, 700]] = [np.nan, np.inf, -np.inf, 1e-45, 3e38]
    return torch.from_numpy(x)


def context(codec, backend: str, rank: int = 1) -> HopContext:
    """A hop of a collective whose vector is this chunk: blocks 1 and 3 are zero everywhere."""
    v = vector(N, 9)
    v[3 * BLOCK:] = 0.0
    stats = local_statistics(codec.statistics, v)
    plan = codec.prepare(stats, N, 3, {})
    assert plan.mask.tolist() == [True, False, True, False]
    return HopContext(seed=0, stream=(1, 0), rank=rank, world_size=3, stats=stats,
                      prepared={codec: plan}, backend=backend)


@pytest.mark.parametrize("wire", WIRES)
def test_hops_match_numba(wire: str) -> None:
    codec = skip_zeros.SkipZeros(wire)
    cn, ct = context(codec, "numba"), context(codec, "triton")
    x = vector(N, 1)
    msg = codec.compress(x, cn)
    assert_same(codec.compress(x, ct), msg, "compress")
    o1, o2 = torch.full((N,), 7.0), torch.full((N,), 7.0)
    assert_same(codec.decompress(msg, o2, ct), codec.decompress(msg, o1, cn), "decompress")
    acc = vector(N, 2)
    a1, a2 = acc.clone(), acc.clone()
    codec.decompress_accumulate(msg, a1, cn)
    codec.decompress_accumulate(msg, a2, ct)
    assert_same(a2, a1, "decompress_accumulate")
    for wb in WRITEBACKS:
        a1, a2 = acc.clone(), acc.clone()
        r1 = codec.decompress_accumulate_recompress(msg, a1, cn, writeback=wb)
        r2 = codec.decompress_accumulate_recompress(msg, a2, ct, writeback=wb)
        assert_same(r2, r1, f"recompress({wb}) bytes")
        assert_same(a2, a1, f"recompress({wb}) acc")


@pytest.mark.parametrize("wire", WIRES)
def test_all_reduce_matches_numba(wire: str) -> None:
    world, d = 3, 2000
    g = torch.Generator().manual_seed(0)
    x = torch.randn(world, d, generator=g)
    x[:, 256:768] = 0.0  # two blocks skipped
    x[1, 1500] = float("nan")
    spec = f"skip_zeros(wire={wire})@ring"
    numba = simulate(spec, x, backend="numba")
    triton = simulate(spec, x, backend="triton")
    assert_same(triton.results, numba.results, spec)
    assert triton.bytes_sent == numba.bytes_sent
    assert (triton.results[:, 256:768] == 0).all() and triton.results[:, 1500].isnan().all()
