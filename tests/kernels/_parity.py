"""Helpers of the backend-parity tests: adversarial vectors, hop contexts with prepared plans,
and the four hop operations of a codec run under two backends and compared bit for bit."""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import torch

from dynamiq import CODECS, HopContext, PartialSumCodec
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


