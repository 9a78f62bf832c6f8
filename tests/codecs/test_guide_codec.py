"""The skip_zeros codec of the guide "Add a codec" (docs/examples/skip_zeros.py): each hop
operation against a plain torch statement of its definition, the simulator against the exact sum
and against passthrough's bits, and the same bits on the numba and reference backends (Triton:
tests/kernels/test_guide_codec_triton.py).

The example registers ``skip_zeros`` when it is imported. It is imported here once, by module
name, at collection time: Python runs a module once per process, so the registration happens
once, before any test runs (the guide's own test finds it registered and leaves it alone), and
the shared codec tests collected after this file (tests/codecs/test_registered_codecs.py, the
backend-parity tests) enrol it too.
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import dynamiq
from dynamiq import CODECS, HopContext, get_codec
from dynamiq.collectives.statistics import local_statistics

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"
if str(EXAMPLES) not in sys.path:
    sys.path.insert(0, str(EXAMPLES))
skip_zeros = importlib.import_module("skip_zeros")

SkipZeros = skip_zeros.SkipZeros
BLOCK = 256
WIRES = ("fp32", "bf16")
WRITEBACKS = ("none", "sum", "decoded")
BACKENDS = ("numba", "reference")
OFFSET, N = 512, 1003  # a chunk in the middle of the vector, its last block partial
SKIPPED = (1, 3)  # chunk-local blocks that are zero on every rank (3 is the partial one)
TRAVELLING = N - sum(min(BLOCK, N - j * BLOCK) for j in SKIPPED)  # 512 coordinates

pytestmark = pytest.mark.usefixtures("one_numba_thread")


# ---------------------------------------------------------------- helpers
def bits(t: torch.Tensor) -> torch.Tensor:
    """What "equal" compares: bytes as they are, float32 through its bit pattern."""
    return t.view(torch.int32) if t.dtype == torch.float32 else t


def assert_same(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, (what, got.shape, want.shape)
    diff = (bits(got) != bits(want)).nonzero().flatten()
    assert diff.numel() == 0, f"{what}: {diff.numel()} entries differ, first at {int(diff[0])}"


def vector(n: int, seed: int) -> torch.Tensor:
    """Heavy-tailed float32 values with zeros, ±0, NaN, ±Inf, subnormals and huge values, some
    of them inside the skipped blocks (at positions that depend on ``seed``: a NaN plus a NaN
    has no payload every backend agrees on)."""
    rs = np.random.default_rng(seed)
    x = (rs.standard_normal(n) * np.exp(1.5 * rs.standard_normal(n))).astype(np.float32)
    x[rs.integers(0, n, size=n // 9)] = 0.0
    odd = np.array([np.nan, np.inf, -np.inf, -0.0, 1e-45, -3e-39, 3e38, -2e38, 3e38],
                   dtype=np.float32)
    x[(37 * seed + 11 * np.arange(odd.size)) % n] = odd
    return torch.from_numpy(x)


def context(backend: str, rank: int = 1) -> HopContext:
    """A hop of a 3-rank collective on the chunk ``[OFFSET, OFFSET + N)`` of a vector whose
    blocks ``SKIPPED`` of the chunk are zero (``+0`` or ``-0``) on every rank, whose block 0
    holds only a NaN and whose other blocks are random."""
    length = OFFSET + N
    ranks = []
    for r in range(3):
        v = vector(length, 50 + r)
        v[v.isnan() | v.isinf()] = 1.0
        for j in SKIPPED:
            a = OFFSET + j * BLOCK
            v[a: a + BLOCK] = -0.0 if r == 1 else 0.0
        v[:BLOCK] = 0.0
        ranks.append(v)
    ranks[2][5] = float("nan")
    per_rank = [local_statistics(["absmax"], v) for v in ranks]
    stats = {"absmax": torch.stack([s["absmax"] for s in per_rank]).amax(0)}
    plans = {c: c.prepare(stats, length, 3, {}) for c in map(SkipZeros, WIRES)}
    return HopContext(seed=0, stream=(3, 1), rank=rank, world_size=3, index_offset=OFFSET,
                      stats=stats, prepared=plans, backend=backend)


def travelling(ctx: HopContext, n: int = N) -> torch.Tensor:
    """int64 indices of the chunk's coordinates that travel (by the definition, not the codec:
    blocks whose global absmax is not 0)."""
    per_block = ctx.stats["absmax"][OFFSET // BLOCK:] != 0
    return torch.nonzero(per_block.repeat_interleave(BLOCK)[:n]).flatten()


# the definitions, in plain torch
def wire_values(v: torch.Tensor, wire: str) -> torch.Tensor:
    return v.clone() if wire == "fp32" else v.to(torch.bfloat16)


def define_compress(x: torch.Tensor, wire: str, ctx: HopContext) -> torch.Tensor:
    return wire_values(x[travelling(ctx, x.numel())], wire).view(torch.uint8)


def define_decompress(data: torch.Tensor, wire: str, ctx: HopContext, n: int = N
                      ) -> torch.Tensor:
    dtype = torch.float32 if wire == "fp32" else torch.bfloat16
    out = torch.zeros(n)
    out[travelling(ctx, n)] = data.view(dtype).float()
    return out


# ---------------------------------------------------------------- registration and plan
def test_registered_under_its_name() -> None:
    assert CODECS["skip_zeros"] is SkipZeros
    assert get_codec("skip_zeros") == SkipZeros() and str(SkipZeros()) == "skip_zeros"
    bf16 = get_codec("skip_zeros(wire=bf16)")
    assert bf16 == SkipZeros("bf16") and get_codec(bf16.spec()) == bf16
    assert SkipZeros.examples() == [SkipZeros("fp32"), SkipZeros("bf16")]
    assert (SkipZeros().lossless, SkipZeros().unbiased) == (True, True)
    assert (bf16.lossless, bf16.unbiased) == (False, False)
    with pytest.raises(ValueError, match="'fp32' or 'bf16'"):
        get_codec("skip_zeros(wire=fp16)")


def test_plan_skips_exactly_the_blocks_zero_on_every_rank() -> None:
    ctx = context("numba")
    mask = ctx.prepared[SkipZeros()].mask
    assert mask.dtype == torch.bool and mask.numel() == -(-(OFFSET + N) // BLOCK)
    want = [True] * mask.numel()  # block 0 is a NaN (on one rank) among zeros: it travels
    for j in SKIPPED:
        want[OFFSET // BLOCK + j] = False
    assert mask.tolist() == want
    assert travelling(ctx).numel() == TRAVELLING == 512


# ---------------------------------------------------------------- the four hop operations
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("wire", WIRES)
def test_hops_equal_their_definitions(wire: str, backend: str) -> None:
    codec = SkipZeros(wire)
    ctx, leaf = context(backend), context(backend, rank=2)
    size = 4 if wire == "fp32" else 2
    assert codec.wire_bytes(N, ctx) == size * TRAVELLING
    assert codec.max_wire_bytes(N) == codec.wire_bytes(N) == size * N

    x = vector(N, 1)  # non-zero values in the skipped blocks too: they are dropped
    x0 = x.clone()
    msg = codec.compress(x, leaf)
    assert_same(msg, define_compress(x, wire, ctx), "compress")
    assert_same(x, x0, "compress changed its input")
    buf = torch.full((codec.wire_bytes(N, ctx),), 0xA5, dtype=torch.uint8)
    assert codec.compress(x, ctx, out=buf) is buf
    assert_same(buf, msg, "compress(out=...)")

    msg0 = msg.clone()
    seen = define_decompress(msg, wire, ctx)
    out = torch.full((N,), 7.0)
    assert codec.decompress(msg, out, ctx) is out
    assert_same(out, seen, "decompress")

    acc0 = vector(N, 2)
    acc0[x.abs() > 1e38] = 3e38  # sums that overflow to +Inf, and one that does not
    acc = acc0.clone()
    codec.decompress_accumulate(msg, acc, ctx)
    assert_same(acc, acc0 + seen, "decompress_accumulate")

    for wb in WRITEBACKS:
        acc = acc0.clone()
        total = acc0 + seen
        sent = codec.decompress_accumulate_recompress(msg, acc, ctx, writeback=wb)
        assert_same(sent, define_compress(total, wire, ctx), f"recompress({wb}) bytes")
        kept = {"none": acc0, "sum": total, "decoded": define_decompress(sent, wire, ctx)}[wb]
        assert_same(acc, kept, f"recompress({wb}) acc")
        buf = torch.full_like(sent, 0xA5)
        got = codec.decompress_accumulate_recompress(msg, acc0.clone(), ctx, out=buf,
                                                     writeback=wb)
        assert got is buf
        assert_same(buf, sent, f"recompress({wb}, out=...)")
    assert_same(msg, msg0, "a hop changed the incoming message")

    with pytest.raises(ValueError, match="writeback"):
        codec.decompress_accumulate_recompress(msg, acc0.clone(), ctx, writeback="both")
    with pytest.raises(TypeError, match="1-D float32"):
        codec.compress(x.double(), ctx)


@pytest.mark.parametrize("wire", WIRES)
def test_outside_a_collective_every_block_travels(wire: str) -> None:
    # no prepared plan: the codec is passthrough(wire=...), on every backend
    codec, plain = SkipZeros(wire), get_codec(f"passthrough(wire={wire})")
    x, acc0 = vector(N, 3), vector(N, 4)
    for backend in BACKENDS:
        ctx = HopContext(backend=backend)
        msg = codec.compress(x, ctx)
        assert_same(msg, plain.compress(x, ctx), f"{backend} compress")
        for wb in WRITEBACKS:
            a1, a2 = acc0.clone(), acc0.clone()
            assert_same(codec.decompress_accumulate_recompress(msg, a1, ctx, writeback=wb),
                        plain.decompress_accumulate_recompress(msg, a2, ctx, writeback=wb),
                        f"{backend} recompress({wb})")
            assert_same(a1, a2, f"{backend} recompress({wb}) acc")
    assert_same(codec.decompress(msg, torch.empty(N)), x if wire == "fp32"
                else x.to(torch.bfloat16).float(), "decompress(ctx=None)")


@pytest.mark.parametrize("wire", WIRES)
def test_same_bytes_on_every_cpu_backend(wire: str) -> None:
    codec = SkipZeros(wire)
    cn, cr = context("numba"), context("reference")
    msg = codec.compress(vector(N, 5), cn)
    assert_same(codec.compress(vector(N, 5), cr), msg, "compress")
    for wb in WRITEBACKS:
        a1, a2 = vector(N, 6), vector(N, 6)
        assert_same(codec.decompress_accumulate_recompress(msg, a2, cr, writeback=wb),
                    codec.decompress_accumulate_recompress(msg, a1, cn, writeback=wb),
                    f"recompress({wb}) bytes")
        assert_same(a2, a1, f"recompress({wb}) acc")


# ---------------------------------------------------------------- whole all-reductions
WORLD, D = 4, 5000  # 20 blocks, the last one partial
ALIGNED = 5 * BLOCK * WORLD  # chunks of 5 whole blocks: passthrough cuts the vector alike


def sparse_gradients(seed: int = 0, d: int = D) -> torch.Tensor:
    """Each rank touches a few random blocks; some blocks are zero on every rank (the last
    one always holds data)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(WORLD, d, generator=g) * torch.logspace(-3, 3, d)
    blocks = -(-d // BLOCK)
    touched = torch.rand(WORLD, blocks, generator=g) < 0.25
    touched[0, -1] = True
    keep = touched.repeat_interleave(BLOCK, dim=1)[:, :d]
    return torch.where(keep, x, torch.zeros(()))  # +0 elsewhere (x * 0 could give -0)


def travelling_count(x: torch.Tensor) -> int:
    """Coordinates of the blocks that are non-zero on some rank."""
    d = x.shape[1]
    blocks = -(-d // BLOCK)
    pad = torch.zeros(WORLD, blocks * BLOCK)
    pad[:, :d] = x
    live = (pad.view(WORLD, blocks, BLOCK) != 0).any(2).any(0)
    return int(live.repeat_interleave(BLOCK)[:d].sum())


@pytest.mark.parametrize("wire", WIRES)
def test_ring_sum_within_the_stated_error_at_a_fraction_of_the_bytes(wire: str) -> None:
    x = sparse_gradients()
    res = dynamiq.simulate(f"skip_zeros(wire={wire})@ring", x)
    assert all(torch.equal(bits(res.results[r]), bits(res.results[0])) for r in range(WORLD))
    # coordinates zero on every rank are exactly +0
    skipped = (x == 0).all(0)
    assert skipped.any() and (bits(res.results[:, skipped]) == 0).all()

    # the stated error: a ring compresses each coordinate's partial sum WORLD times, each time
    # rounding it by at most half an ulp (2**-8 relative for BF16; FP32 adds in float32, 2**-24),
    # and every partial sum is bounded by sum |x_r|
    scale = x.abs().double().sum(0)
    u = 2.0**-24 if wire == "fp32" else 2.0**-8 + 2.0**-24
    err = (res.results[0].double() - res.exact).abs()
    assert (err <= WORLD * u * (1 + WORLD * u) * scale).all()
    assert float(err.max()) > 0 and (wire == "bf16") == (res.vnmse > 1e-8)

    # bytes: every travelling coordinate crosses 2 (WORLD - 1) links on a ring
    plain = dynamiq.simulate(f"passthrough(wire={wire})@ring", x)
    size = 4 if wire == "fp32" else 2
    assert sum(res.bytes_sent) == 2 * (WORLD - 1) * size * travelling_count(x)
    assert sum(plain.bytes_sent) == 2 * (WORLD - 1) * size * D
    assert res.metadata_bits == 16 * -(-D // BLOCK)
    assert res.bits == pytest.approx((plain.bits * travelling_count(x) + res.metadata_bits) / D)


@pytest.mark.parametrize("wire", WIRES)
def test_ring_sum_has_passthroughs_bits_on_the_same_chunks(wire: str) -> None:
    # chunk boundaries fall on multiples of the codec's block_size (256 here, 1 for
    # passthrough); with the same chunks the additions happen in the same order
    x = sparse_gradients(3, ALIGNED)
    res = dynamiq.simulate(f"skip_zeros(wire={wire})@ring", x)
    plain = dynamiq.simulate(f"passthrough(wire={wire})@ring", x)
    assert_same(res.results, plain.results, "skip_zeros vs passthrough")
    assert travelling_count(x) < ALIGNED


def test_non_finite_values_stay_visible() -> None:
    x = sparse_gradients(1)
    x[2, 7], x[1, D - 1] = float("nan"), float("-inf")
    res = dynamiq.simulate("skip_zeros@butterfly", x)
    assert torch.isnan(res.results[:, 7]).all() and torch.isneginf(res.results[:, D - 1]).all()
    finite = torch.isfinite(x).all(0)
    plain = dynamiq.simulate("passthrough@butterfly", x)
    assert_same(res.results[:, finite], plain.results[:, finite], "finite coordinates")


@pytest.mark.parametrize("wire", WIRES)
def test_reference_backend_gives_the_same_bits(wire: str) -> None:
    x = sparse_gradients(2)
    x[0, 3] = float("nan")
    spec = f"skip_zeros(wire={wire})@ring"
    numba = dynamiq.simulate(spec, x, backend="numba")
    ref = dynamiq.simulate(spec, x, backend="reference")
    assert_same(ref.results, numba.results, f"{spec} reference vs numba")
    assert ref.bytes_sent == numba.bytes_sent


def test_guide_codec_is_a_dataclass_of_its_parameters() -> None:
    assert [f.name for f in dataclasses.fields(SkipZeros)] == ["wire"]
    assert hash(SkipZeros("bf16")) == hash(get_codec("skip_zeros(wire=bf16)"))
