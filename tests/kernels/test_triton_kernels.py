"""The Triton block kernels equal the Numba ones bit for bit (run under Triton's interpreter).

Every quantizer registered in ``QUANTIZERS`` when the test runs is checked, plus quantizers built
on formats registered inside a test, correlated-rounding variants, code widths 2–9, 12, 15 and 16
and every scale rounding (the slow tests add the odd wide widths and the scale cases that no
other test compiles Numba kernels for). Inputs hold the awkward cases in dedicated blocks: a
partial last block, all-zero groups, NaN and ±Inf, subnormals, values near the float32 maximum,
signed zeros, and groups whose relative scale rounds to zero under a huge neighbour (the
lifted-normaliser path, where the lifted values may even overflow).
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

pytest.importorskip("triton")

import triton
import triton.language as tl
from _parity import SCALE_CASES, awkward_statistics_vector, case_vector

from dynamiq import FORMATS, QUANTIZERS, BlockQuantizer, metadata
from dynamiq import rng as host_rng
from dynamiq.collectives.statistics import local_statistics
from dynamiq.formats import FloatFormat, IntFormat, LevelFormat
from dynamiq.kernels import backend as kb
from dynamiq.kernels import triton as ktriton
from dynamiq.kernels.triton import blocks as launch
from dynamiq.kernels.triton import stats as tstats
from dynamiq.kernels.triton.jit import rng as trng

# (seed, rank, world_size, stream, index_offset): trivial, and everything non-trivial (an offset
# past 2**32 exercises the high word of the hashed index)
RANDS = [(0, 0, 1, (), 0), (2**40 + 7, 3, 4, (2, 9), 2**33 + 5)]


def _rand_kw(r: tuple) -> dict:
    seed, rank, world, stream, off = r
    return {"seed": seed, "rank": rank, "world_size": world, "stream": stream,
            "index_offset": off}


def assert_same_floats(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """Bit-identical float32 tensors (NaN payloads and signed zeros included)."""
    g, w = got.view(torch.int32), want.view(torch.int32)
    if not torch.equal(g, w):
        bad = (g != w).nonzero().flatten()
        i = int(bad[0])
        raise AssertionError(
            f"{what}: {bad.numel()} of {g.numel()} floats differ; first at {i}: triton "
            f"{got[i].item()!r} ({int(g[i]) & 0xFFFFFFFF:#010x}), numba {want[i].item()!r} "
            f"({int(w[i]) & 0xFFFFFFFF:#010x})"
        )


def assert_same_bytes(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    if not torch.equal(got, want):
        bad = (got != want).nonzero().flatten()
        raise AssertionError(
            f"{what}: {bad.numel()} of {got.numel()} bytes differ, first at {int(bad[0])}"
        )


def check_against_numba(q: BlockQuantizer, what: str, rands=RANDS, decode: bool = True,
                        recompress: bool = True) -> int:
    """Encode, decode (plain and accumulating) and recompress (every writeback) under both
    backends; returns the number of comparisons made.

    (Each new quantizer variant costs a Numba compilation per kernel, ~10 s for encode, ~7 s for
    recompress, ~2 s for decode on a cold cache, hence the switches.)
    """
    x = case_vector(q, 1)
    acc0 = case_vector(q, 2)
    incoming = q.encode(case_vector(q, 3), seed=11)
    checks = 0
    for r in rands:
        kw = _rand_kw(r)
        want = q.encode(x, **kw)
        got = q.encode(x, backend="triton", **kw)
        assert_same_bytes(got.data, want.data, f"{what} encode {r}")
        checks += 1
    if decode:
        p = q.encode(x, **_rand_kw(rands[-1]))
        assert_same_floats(q.decode(p, backend="triton"), q.decode(p), f"{what} decode")
        o1, o2 = acc0.clone(), acc0.clone()
        q.decode(p, o1, accumulate=True)
        q.decode(p, o2, accumulate=True, backend="triton")
        assert_same_floats(o2, o1, f"{what} decode(accumulate=True)")
        checks += 2
    kw = _rand_kw(rands[-1])
    for wb in ("none", "sum", "decoded") if recompress else ():
        a1, a2 = acc0.clone(), acc0.clone()
        want = q.recompress(incoming, a1, writeback=wb, **kw)
        got = q.recompress(incoming, a2, writeback=wb, backend="triton", **kw)
        assert_same_bytes(got.data, want.data, f"{what} recompress({wb}) bytes")
        assert_same_floats(a2, a1, f"{what} recompress({wb}) acc")
        checks += 2
    return checks


def registered_quantizers() -> list[str]:
    """The registry's names *now* (not at collection), so a new registration is enrolled."""
    return list(QUANTIZERS.names())


# ---------------------------------------------------------------- random numbers
@triton.jit
def _hash_kernel(idx_ptr, key_ptr, h_ptr, u_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    idx = tl.load(idx_ptr + i)
    k0 = tl.load(key_ptr + 0).to(tl.uint32)
    k1 = tl.load(key_ptr + 1).to(tl.uint32)
    tl.store(h_ptr + i, trng.hash_u32(k0, k1, idx).to(tl.int64))
    tl.store(u_ptr + i, trng.uniform(k0, k1, idx))


def test_hash_and_uniforms_match_the_host_reference():
    # uint32 products wrap modulo 2**32; indices past 2**32 use the high word
    idx = np.array([0, 1, 2, 255, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**32 + 1, 2**40 + 3,
                    2**53 + 11, 2**62 + 5, 123456789, 987654321, 7, 2**33 + 5], dtype=np.int64)
    for key in (host_rng.make_key(0), host_rng.make_key(2**64 - 1, 5, 0x454C454D), (0, 0),
                (2**32 - 1, 2**32 - 1)):
        h = torch.empty(16, dtype=torch.int64)
        u = torch.empty(16, dtype=torch.float32)
        _hash_kernel[(1,)](torch.from_numpy(idx), torch.tensor(key, dtype=torch.int64), h, u,
                           N=16)
        assert np.array_equal(h.numpy(), host_rng.hash_u32(*key, idx).astype(np.int64)), key
        assert np.array_equal(u.numpy().view(np.uint32),
                              host_rng.uniform(*key, idx).view(np.uint32)), key


@triton.jit
def _stratum_kernel(h_ptr, arg_ptr, out_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    h = tl.load(h_ptr + i).to(tl.uint32)
    rank = tl.load(arg_ptr + 0).to(tl.uint32)
    world = tl.load(arg_ptr + 1).to(tl.uint32)
    tl.store(out_ptr + i, trng.stratum(h, rank, world).to(tl.int64))


def test_strata_match_the_host_reference():
    h = np.random.default_rng(3).integers(0, 2**32, 64)
    for world in (1, 2, 3, 5, 64, 100, 2**16):
        for rank in sorted({0, world // 2, world - 1}):
            out = torch.empty(64, dtype=torch.int64)
            _stratum_kernel[(1,)](torch.from_numpy(h), torch.tensor([rank, world]), out, N=64)
            want = host_rng.stratum(h, rank, world).astype(np.int64)
            assert np.array_equal(out.numpy(), want), (world, rank)


# ---------------------------------------------------------------- every registered quantizer
def test_every_registered_quantizer_matches_numba():
    names = registered_quantizers()
    assert {"mxfp8", "nvfp4", "int4_sr", "dq4_hier"} <= set(names)
    for name in names:
        check_against_numba(QUANTIZERS[name], name)


def test_correlated_rounding_matches_numba():
    hier = BlockQuantizer("dq4", group_size=16, scale="u8rel", rounding="correlated",
                          scale_rounding="stochastic", super_group_size=256, super_scale="bf16")
    flat = BlockQuantizer("dq4", group_size=32, scale="bf16", rounding="correlated")
    for q in (hier, flat):
        rands = [*RANDS, (3, 0, 3, (1,), 17), (3, 2, 3, (1,), 17), (9, 6, 7, (), 2**32 - 3),
                 (4, 999, 1000, (5,), 1)]
        check_against_numba(q, q.describe(), rands=rands, decode=False)


def test_formats_registered_in_the_test_are_enrolled():
    FORMATS.register("test_triton_lvl5", LevelFormat((0.0, 0.1, 0.3, 0.7, 1.0)))
    FORMATS.register("test_triton_e3m4", FloatFormat(3, 4, special="none"))
    QUANTIZERS.register("test_triton_lvl5_q", BlockQuantizer("test_triton_lvl5", group_size=16))
    QUANTIZERS.register(
        "test_triton_e3m4_sr",
        BlockQuantizer("test_triton_e3m4", group_size=16, rounding="stochastic"),
    )
    try:
        names = registered_quantizers()
        assert "test_triton_lvl5_q" in names and "test_triton_e3m4_sr" in names
        for name in ("test_triton_lvl5_q", "test_triton_e3m4_sr"):
            check_against_numba(QUANTIZERS[name], name)
    finally:
        QUANTIZERS.unregister("test_triton_e3m4_sr")
        QUANTIZERS.unregister("test_triton_lvl5_q")
        FORMATS.unregister("test_triton_e3m4")
        FORMATS.unregister("test_triton_lvl5")


# ---------------------------------------------------------------- widths, scales, tiles
def _width_quantizer(bits: int) -> BlockQuantizer:
    # the element format / group / fp32 scale of the format conformance checks (same kernels)
    return BlockQuantizer(IntFormat(bits), group_size=8, scale="fp32", scale_rounding="nearest")


@pytest.mark.parametrize("bits", [2, 3, 5, 6, 7, 16])
def test_code_widths_match_numba(bits):
    # packing only: encode and decode (recompress packs with the same device functions)
    check_against_numba(_width_quantizer(bits), f"int{bits}", rands=RANDS[1:], recompress=False)


@pytest.mark.slow
@pytest.mark.parametrize("bits", [9, 12, 15])
def test_wide_odd_code_widths_match_numba(bits):
    check_against_numba(_width_quantizer(bits), f"int{bits}", rands=RANDS[1:], recompress=False)


@pytest.mark.slow
@pytest.mark.parametrize("case", SCALE_CASES, ids=lambda c: "-".join(map(str, c.values())))
def test_scale_formats_and_roundings_match_numba(case):
    q = BlockQuantizer(group_size=16, **case)
    check_against_numba(q, q.describe(), rands=RANDS[1:], recompress=False)


@pytest.mark.parametrize("name", ["mxfp6", "dq2_hier"])
@pytest.mark.parametrize("nb", [1, 2])
def test_tile_size_does_not_change_bytes(name, nb):
    # several programs per launch, the last one partly outside the data
    q = QUANTIZERS[name]
    x = case_vector(q, 4)[: 3 * q.block_size + 5].clone()
    rand = q._rand(5, 1, 2, (3,), 40)
    want = launch.encode(q._code, x, rand)
    got = launch.encode(q._code, x, rand, blocks_per_program=nb)
    assert_same_bytes(got, want, f"{name} NB={nb}")
    assert_same_floats(launch.decode(q._code, got, x.numel(), rand, blocks_per_program=nb),
                       launch.decode(q._code, want, x.numel(), rand), f"{name} decode NB={nb}")
    acc1, acc2 = x.clone(), x.clone()
    r1 = launch.recompress(q._code, want, acc1, rand, "decoded")
    r2 = launch.recompress(q._code, want, acc2, rand, "decoded", blocks_per_program=nb)
    assert_same_bytes(r2, r1, f"{name} recompress NB={nb}")
    assert_same_floats(acc2, acc1, f"{name} recompress acc NB={nb}")


def test_short_inputs_and_out_buffers():
    q = QUANTIZERS["nvfp4"]
    for n in (1, 7, 16, 17):
        x = torch.randn(n)
        out = torch.full((q.nbytes(n),), 0xAB, dtype=torch.uint8)
        p = q.encode(x, out=out, backend="triton")
        assert p.data is out
        assert_same_bytes(out, q.encode(x).data, f"n={n}")
        dec = torch.empty(n)
        assert q.decode(p, dec, backend="triton") is dec
        assert_same_floats(dec, q.decode(p), f"decode n={n}")
    x16 = torch.randn(40, dtype=torch.float16)
    assert_same_bytes(q.encode(x16, backend="triton").data, q.encode(x16).data, "float16 input")


# ---------------------------------------------------------------- launcher argument checks
def test_launchers_reject_bad_arguments():
    q = QUANTIZERS["mxfp8"]
    x = torch.randn(100)
    rand = q._rand(0, 0, 1, (), 0)
    with pytest.raises(ValueError, match="float32"):
        launch.encode(q._code, x.double(), rand)
    with pytest.raises(ValueError, match="contiguous"):
        launch.encode(q._code, torch.randn(200)[::2], rand)
    with pytest.raises(TypeError, match=r"torch\.Tensor"):
        launch.encode(q._code, x.numpy(), rand)
    with pytest.raises(ValueError, match="out must be"):
        launch.encode(q._code, x, rand, torch.empty(3, dtype=torch.uint8))
    data = launch.encode(q._code, x, rand)
    with pytest.raises(ValueError, match="payload data"):
        launch.decode(q._code, data[:-1], 100, rand)
    with pytest.raises(ValueError, match="accumulate"):
        launch.decode(q._code, data, 100, rand, accumulate=True)
    with pytest.raises(ValueError, match="writeback"):
        launch.recompress(q._code, data, x.clone(), rand, "all")
    with pytest.raises(ValueError, match="must not be the incoming"):
        launch.recompress(q._code, data, x.clone(), rand, "none", out=data)
    with pytest.raises(ValueError, match="power of two"):
        launch.encode(q._code, x, rand, blocks_per_program=3)
    with pytest.raises(ValueError, match="different quantizer"):
        QUANTIZERS["mxfp6"].decode(q.encode(x), backend="triton")


# ---------------------------------------------------------------- backend selection
def test_resolve_backend(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert kb.resolve_backend("auto", cpu) == "numba"
    assert kb.resolve_backend("auto", cuda) == "triton"
    assert kb.resolve_backend("numba", "cpu") == "numba"
    assert kb.resolve_backend("triton", cuda) == "triton"
    assert kb.resolve_backend("triton", cpu) == "triton"  # the interpreter is on here
    with pytest.raises(ValueError, match="backend must be one of"):
        kb.resolve_backend("cuda", cpu)
    with pytest.raises(ValueError, match="CPU tensors only"):
        kb.resolve_backend("numba", cuda)
    with pytest.raises(ValueError, match="no backend"):
        kb.resolve_backend("auto", "meta")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        kb.resolve_backend("triton", cpu)
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        QUANTIZERS["mxfp8"].encode(torch.randn(8), backend="triton")
    monkeypatch.setattr(ktriton.importlib.util, "find_spec", lambda name: None)
    for be, dev in (("triton", cpu), ("triton", cuda), ("auto", cuda)):
        with pytest.raises(ImportError) as err:
            kb.resolve_backend(be, dev)
        assert str(err.value) == ktriton.TRITON_MISSING
    assert str(ktriton.TRITON_MISSING) == (
        "backend='triton' needs the triton package: pip install 'dynamiq[triton]'"
    )


def test_importing_dynamiq_does_not_import_triton():
    code = (
        "import sys, torch, dynamiq\n"
        "from dynamiq.quantizers import QUANTIZERS\n"
        "from dynamiq.transforms import RandomizedHadamard\n"
        "q = QUANTIZERS['nvfp4']\n"
        "q.decode(q.encode(torch.randn(64)))\n"
        "RandomizedHadamard(16).forward(torch.randn(20))\n"
        "assert 'triton' not in sys.modules, 'triton was imported'\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=120)


# ---------------------------------------------------------------- metadata statistics
def test_statistics_match_metadata_phase():
    y = awkward_statistics_vector()
    names = [n for n in metadata.STATISTICS.names() if metadata.STATISTICS[n].op]
    assert {"sum", "sumsq", "absmax"} <= set(names)
    want = local_statistics(names, y)
    got = local_statistics(names, y, backend="triton")
    ops = sorted({(metadata.STATISTICS[n].op, metadata.STATISTICS[n].block) for n in names})
    raw_ops = tstats.block_statistics(y, ops)
    for name in names:
        st = metadata.STATISTICS[name]
        raw = raw_ops[(st.op, st.block)]
        nb = st.blocks(y.numel())
        g = torch.zeros(nb * st.block, dtype=torch.float64)
        g[: y.numel()] = y.double()
        exact = st.local(g.view(nb, st.block))
        assert torch.equal(torch.isnan(raw), torch.isnan(exact)), name
        fin = torch.isfinite(exact)
        assert torch.equal(raw[~fin & ~exact.isnan()], exact[~fin & ~exact.isnan()]), name
        err = (raw - exact).abs()[fin]
        assert (err <= tstats.stats_tolerance(st.op, st.block, y)[fin]).all(), name
        # the wire values through either backend: equal (no sum here sits within the float64
        # bound of a rounding boundary)
        assert torch.equal(got[name].nan_to_num(7.0), want[name].nan_to_num(7.0)), name
        assert torch.equal(got[name].isnan(), want[name].isnan()), name
    with pytest.raises(ValueError, match="computes"):
        tstats.block_statistics(y, [("median", 256)])

