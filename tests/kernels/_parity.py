"""Helpers of the backend-parity tests: adversarial vectors, hop contexts with prepared plans,
and the four hop operations of a codec run under two backends and compared bit for bit."""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import torch

from dynamiq import CODECS, BlockQuantizer, HopContext, PartialSumCodec
from dynamiq.collectives.statistics import local_statistics
from dynamiq.testing import representative_codecs

WRITEBACKS = ("none", "sum", "decoded")


def assert_same(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """Bit-identical tensors (float32 through their bit patterns)."""
    assert got.shape == want.shape and got.dtype == want.dtype, (what, got.shape, want.shape)
    g, w = got, want
    if got.dtype == torch.float32:
        g, w = got.view(torch.int32), want.view(torch.int32)
    if not torch.equal(g, w):
        bad = (g != w).nonzero().flatten()
        i = int(bad[0])
        raise AssertionError(f"{what}: {bad.numel()} of {g.numel()} entries differ; first at "
                             f"{i}: got {got[i].item()!r}, want {want[i].item()!r}")


def vector(n: int, seed: int, specials: bool = True) -> torch.Tensor:
    """Heavy-tailed float32 values; with ``specials``: a zero 256-block and NaN, ±Inf, ±0,
    subnormal and huge values in the third 256-block (or spread over a short chunk)."""
    rs = np.random.default_rng(seed)
    x = (rs.standard_normal(n) * np.exp(1.5 * rs.standard_normal(n))).astype(np.float32)
    x[rs.integers(0, n, size=n // 9)] = 0.0
    if specials:
        if n > 512:
            x[256:512] = 0.0
        odd = np.array([np.nan, np.inf, -np.inf, -0.0, 1e-45, -3e-39, 3e38, -2e38],
                       dtype=np.float32)
        at = 600 + seed if n > 700 else seed % 3
        pos = (at + 7 * np.arange(odd.size)) % n
        x[pos] = odd[: pos.size]
    return torch.from_numpy(x)


@functools.cache
def metadata_context(codec: PartialSumCodec, n: int, rank: int, offset: int = 512,
                     world: int = 3) -> HopContext:
    """A hop of a collective: the codec's statistics and prepared decision for a vector that
    ends with this chunk (as tests/codecs/test_registered_codecs.py builds them)."""
    length = offset + n
    full = vector(length, 99, specials=False)
    stats = local_statistics(codec.statistics, full)
    state: dict = {}
    stats.update({k: v for k, (v, _) in codec.local_metadata(full, state).items()})
    plan = codec.prepare(stats, length, world, state)
    return HopContext(seed=0, stream=(3, 1), rank=rank, world_size=world, index_offset=offset,
                      stats=stats, prepared={codec: plan})


def check_hops(codec: PartialSumCodec, ctx: HopContext, leaf: HopContext, n: int,
               what: str, seed: int = 1, backends: tuple[str, str] = ("triton", "numba")
               ) -> None:
    """The four hop operations (every write-back) under two backends: ``backends[0]`` must
    give the bits of ``backends[1]``."""
    ct = dataclasses.replace(ctx, backend=backends[0])
    cn = dataclasses.replace(ctx, backend=backends[1])
    x = vector(n, seed)
    x0 = x.clone()
    assert_same(codec.compress(x, ct), codec.compress(x, cn), f"{what} compress")
    assert_same(x, x0, f"{what}: compress changed its input")
    msg = codec.compress(vector(n, seed + 1), dataclasses.replace(leaf, backend=backends[1]))
    msg0 = msg.clone()
    want = torch.full((n,), 7.0)
    got = torch.full((n,), 7.0)
    assert codec.decompress(msg, got, ct) is got
    codec.decompress(msg, want, cn)
    assert_same(got, want, f"{what} decompress")
    acc = vector(n, seed + 2)
    a1, a2 = acc.clone(), acc.clone()
    codec.decompress_accumulate(msg, a1, cn)
    codec.decompress_accumulate(msg, a2, ct)
    assert_same(a2, a1, f"{what} decompress_accumulate")
    for wb in WRITEBACKS:
        a1, a2 = acc.clone(), acc.clone()
        r1 = codec.decompress_accumulate_recompress(msg, a1, cn, writeback=wb)
        buf = torch.full_like(r1, 0xA5)
        r2 = codec.decompress_accumulate_recompress(msg, a2, ct, out=buf, writeback=wb)
        assert r2.data_ptr() == buf.data_ptr(), f"{what}: out buffer not used"
        assert_same(r2, r1, f"{what} recompress({wb}) bytes")
        assert_same(a2, a1, f"{what} recompress({wb}) acc")
    assert_same(msg, msg0, f"{what}: a hop changed the incoming message")


def enrolled() -> list[PartialSumCodec]:
    """Representatives of every codec class registered now (not at collection)."""
    out = []
    for name, cls in CODECS.items():
        reps = representative_codecs(cls)
        assert reps, (f"codec {name!r} has no default parameters: give it an examples() "
                      "classmethod")
        out += reps
    return out


# Scale formats and roundings that no registered quantizer uses (compiled only by slow tests).
SCALE_CASES = [
    {"element": "e2m1", "scale": "e4m3", "scale_rounding": "stochastic", "rounding": "stochastic"},
    {"element": "e2m1", "scale": "e4m3", "scale_rounding": "nearest"},
    {"element": "e4m3", "scale": "e8m0", "scale_rounding": "down"},
    {"element": "e4m3", "scale": "fp32", "scale_rounding": "up", "rounding": "stochastic"},
    {"element": "dq4", "scale": "u8rel", "scale_rounding": "nearest", "rounding": "stochastic",
     "super_group_size": 128, "super_scale": "bf16"},
    {"element": "dq4", "scale": "u8rel", "scale_rounding": "down", "super_group_size": 64,
     "super_scale": "e8m0"},
    {"element": "int8", "scale": "u8rel", "scale_rounding": "up", "super_group_size": 32,
     "super_scale": "fp32"},
]


def case_vector(q: BlockQuantizer, seed: int) -> torch.Tensor:
    """One block per awkward case, then a partial block (the length is not a block multiple)."""
    B, G = q.block_size, q.group_size
    ng = B // G
    rs = np.random.default_rng(seed)

    def per_group(mags: np.ndarray) -> np.ndarray:
        return (rs.standard_normal((ng, G)) * np.asarray(mags)[:, None]).reshape(-1)

    def with_value(v: float) -> np.ndarray:
        b = per_group(np.ones(ng))
        b[rs.integers(B)] = v
        return b

    sub = rs.integers(1, 1 << 23, B).astype(np.uint32) | (rs.integers(0, 2, B) << 31).astype(
        np.uint32
    )
    first = np.arange(ng) == 0
    blocks = [
        per_group(10.0 ** rs.uniform(-2, 2, ng)),  # ordinary
        per_group(10.0 ** rs.uniform(-44, 37, ng)),  # subnormal ... huge, group by group
        np.zeros(B),  # all zero
        per_group(np.where(np.arange(ng) % 2 == 1, 3.0, 0.0)),  # zero groups among others
        with_value(np.nan),
        with_value(np.inf),
        with_value(-np.inf),
        sub.view(np.float32).astype(np.float64),  # subnormals only
        rs.choice([-1.0, 1.0], B) * rs.uniform(1e38, 3.4e38, B),  # near the float32 maximum
        rs.choice([-0.0, 0.0, 1e-45, -1e-45, 1e-39, -1.1754944e-38], B),  # signed zeros, tiny
        per_group(np.where(first, 1e30, 1e-3)),  # relative scales round to zero
        per_group(np.where(first, 1e38, 1e25)),  # ... and the lifted group overflows
    ]
    tail = rs.standard_normal(B // 2 + 1 if B > 1 else 0) * 10.0
    x = np.concatenate([*blocks, tail]).astype(np.float32)
    return torch.from_numpy(x)


def awkward_statistics_vector(seed: int = 7) -> torch.Tensor:
    """float32 ``[1000]`` for the statistics kernels: magnitudes from 1e-40 to 1e30, two NaNs,
    ±Inf, and a run of zeros."""
    rs = np.random.default_rng(seed)
    y = (rs.standard_normal(1000) * 10.0 ** rs.uniform(-40, 30, 1000)).astype(np.float32)
    y[[5, 300]] = np.nan
    y[[600, 990]] = np.inf
    y[601] = -np.inf
    y[700:760] = 0.0
    return torch.from_numpy(y)
