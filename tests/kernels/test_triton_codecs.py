"""Every codec's hops, and whole all-reductions, on the Triton backend equal Numba's bit for bit.

Runs under Triton's interpreter on CPU tensors (``tests/kernels/conftest.py`` sets
``TRITON_INTERPRET=1``). "Equal" always means bit-identical: messages compared byte for byte,
float32 results through ``view(int32)`` (signed zeros and NaN payloads count).

* every class registered in :data:`dynamiq.CODECS` when the test runs, with representative
  instances (every registered quantizer as a ``requant`` codec), through the four hop operations
  and every write-back, on chunks with partial blocks, zeros, NaN, ±Inf, subnormals;
* the baseline kernels with tiles small enough that a chunk spans several programs, awkward
  shared scales (non-powers of two, subnormal, infinite, NaN), every integer-sum width, sparse
  selections and DynamiQ width plans chosen by hand;
* :func:`dynamiq.simulate` for every registered pipeline, and ``dynamiq.all_reduce`` on a gloo
  group of two processes;
* formats registered inside a test, backend errors, and the GPU benchmark's ``--quick`` mode.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("triton")

import dynamiq.baselines  # noqa: F401  (registers the baseline pipelines)
from dynamiq import (
    FORMATS,
    PIPELINES,
    QUANTIZERS,
    BlockQuantizer,
    DynamiQ,
    HopContext,
    IntSum,
    PartialSumCodec,
    Passthrough,
    Requant,
    SharedScale,
    Sparse,
    simulate,
)
from dynamiq.codecs import IntSumPlan, SharedScalePlan, SparsePlan, WidthPlan
from dynamiq.collectives import api, p2p
from dynamiq.formats import LevelFormat
from dynamiq.kernels import backend as kb
from dynamiq.kernels.triton import intsum as lb_int
from dynamiq.kernels.triton import shared_scale as lb_shared
from dynamiq.kernels.triton import wire as lb

ROOT = Path(__file__).resolve().parents[2]
WRITEBACKS = ("none", "sum", "decoded")


pytestmark = pytest.mark.usefixtures("one_numba_thread")


from _parity import assert_same, check_hops, enrolled, metadata_context, vector  # noqa: E402


# ---------------------------------------------------------------- every registered codec
def test_every_registered_codec_matches_numba():
    codecs = enrolled()
    assert {type(c) for c in codecs} >= {Passthrough, Requant, DynamiQ, SharedScale, IntSum,
                                         Sparse}
    n = 1003  # no block size divides it: every codec has a partial last block
    for codec in codecs:
        check_hops(codec, metadata_context(codec, n, 1), metadata_context(codec, n, 2), n,
                   str(codec) if not isinstance(codec, Requant) else repr(codec.quantizer))


@pytest.mark.slow
@pytest.mark.parametrize("n", [1, 37, 256])
def test_every_registered_codec_matches_numba_on_short_chunks(n):
    for codec in enrolled():
        if isinstance(codec, Requant) and codec.quantizer not in (QUANTIZERS["dq4_hier"],
                                                                  QUANTIZERS["nvfp4"]):
            continue  # test_triton_kernels covers short inputs of every quantizer
        check_hops(codec, metadata_context(codec, n, 1, 1024, 2),
                   metadata_context(codec, n, 0, 1024, 2), n, f"{codec!r} n={n}", seed=n)


def test_codecs_outside_a_collective_match_numba():
    # no prepared plan: shared scales of 1, intsum's default grid, sparse sends everything;
    # decompress with ctx=None resolves "auto" from the (CPU) tensor: numba
    for codec in (SharedScale("e3m2"), IntSum(), Sparse(), Passthrough("bf16")):
        ctx = HopContext(stream=(1,), rank=0, world_size=2, index_offset=40)
        check_hops(codec, ctx, ctx, 300, f"{codec} outside a collective")
        msg = codec.compress(vector(300, 5), ctx)
        o1, o2 = torch.empty(300), torch.empty(300)
        codec.decompress(msg, o1)
        codec.decompress(msg, o2, HopContext(backend="triton"))
        assert_same(o2, o1, f"{codec} decompress(ctx=None)")


# ---------------------------------------------------------------- the baseline kernels in detail
@pytest.fixture
def small_tiles(monkeypatch):
    """Tiles of 64 coordinates and one row per program: chunks span several programs, the last
    one partly outside the chunk."""
    from dynamiq.kernels.triton import common

    monkeypatch.setattr(common, "TILE_INTERPRETED", 64)
    monkeypatch.setattr(lb, "ROWS_INTERPRETED", 1)


def _plan_context(codec: PartialSumCodec, plan: object, offset: int = 0, rank: int = 1
                  ) -> HopContext:
    return HopContext(seed=3, stream=(2, 5), rank=rank, world_size=4, index_offset=offset,
                      prepared={codec: plan})


@pytest.mark.parametrize("element,block,scale", [("e4m3", 32, "e8m0"), ("e3m2", 32, "e8m0"),
                                                 ("e2m1", 16, "e4m3"), ("e5m2", 32, "e8m0")])
def test_shared_scale_awkward_scales_and_small_tiles(small_tiles, element, block, scale):
    codec = SharedScale(element, block, scale)
    n = 9 * block + 5
    rs = np.random.default_rng(block)
    # scales that are not powers of two (the bracket is then settled on the decoded levels),
    # subnormal, the smallest subnormal, huge, infinite and NaN ones
    s = (10.0 ** rs.uniform(-3, 1, 10)).astype(np.float32)
    s[[2, 3, 4, 5, 6, 7]] = [1e-40, 1.4e-45, 3e38, np.inf, np.nan, 0.3]
    scales = torch.from_numpy(s)
    plan = SharedScalePlan(scales, (FORMATS[element].max_value * scales).float(), 1.0)
    check_hops(codec, _plan_context(codec, plan), _plan_context(codec, plan, rank=0), n,
               f"{codec} with awkward scales")


def _check_intsum(bits: int, step: float, offset: int, n: int = 203) -> None:
    codec = IntSum(headroom_bits=bits)
    plan = IntSumPlan(step, bits, 1.0)
    check_hops(codec, _plan_context(codec, plan, offset),
               _plan_context(codec, plan, offset, rank=0), n,
               f"intsum bits={bits} step={step} offset={offset}")


@pytest.mark.parametrize("bits", [4, 7, 8, 13, 16, 24])
def test_intsum_widths_and_offsets(bits):
    # an offset past 2**32 uses the high word of the hashed index
    _check_intsum(bits, 0.7109375, 2**33 + 8)


def test_intsum_steps_and_small_tiles(small_tiles):
    for step in (2.0**-3, 2.0**-100, 3.0e30):
        _check_intsum(5, step, 8)


@pytest.mark.parametrize("g", [15, 30])
def test_thc_grid_hops_level_rounding_and_small_tiles(small_tiles, g):
    # THC's clamped grid: a step per block of 256 (one of them poisoned), shifted codes on the
    # odd grid, the final messages' exact first coordinates, and the rounding onto the levels
    codec = IntSum(levels=16, clamp="auto", granularity=g, block=256, first=True)
    n, offset = 3 * 256 + 77, 256
    steps = (0.5, 2.0**-7, 3.0e-3, float("nan"), 1.5e20)
    plan = IntSumPlan(float("nan"), 9, float("nan"), steps=steps, fine=g, block=256,
                      first=torch.tensor([1.0, -2.5, 3.25, 7.0, 0.5]))
    ctx = _plan_context(codec, plan, offset)
    check_hops(codec, ctx, _plan_context(codec, plan, offset, 0), n, f"thc g={g}")
    final = dataclasses.replace(ctx, summands=4, source=dataclasses.replace(ctx, summands=4))
    check_hops(codec, final, dataclasses.replace(final, rank=0), n, f"thc g={g} final")
    x = vector(n, 5)
    want = x.clone()
    codec.round_own(want, dataclasses.replace(ctx, backend="numba"))
    got = x.clone()
    codec.round_own(got, dataclasses.replace(ctx, backend="triton"))
    assert_same(got, want, f"thc g={g} round_own")


@pytest.mark.parametrize("pattern", ["1011", "0110", "0000", "1111", "1"])
def test_sparse_selections_and_small_tiles(small_tiles, pattern):
    codec = Sparse()
    blocks = len(pattern)
    n = (blocks - 1) * 256 + 77  # a partial last block, selected or not
    selected = torch.tensor([False] + [c == "1" for c in pattern])  # the chunk starts at 256
    plan = SparsePlan(selected, int(selected.sum()), 1, 1, 256 + n)
    check_hops(codec, _plan_context(codec, plan, 256), _plan_context(codec, plan, 256, 0), n,
               f"sparse {pattern}")


@pytest.mark.parametrize("scale", [1.0, 2.0**12])
def test_sparse_fp16_selections_scales_and_small_tiles(small_tiles, scale):
    # FP16 values under the scale that emulates loss scaling: subnormals, saturation to Inf
    codec = Sparse(wire="fp16", keep=0.5)
    n = 3 * 256 + 77
    selected = torch.tensor([False, True, False, True, True])
    plan = SparsePlan(selected, 3, 1, 3, 256 + n, scale)
    check_hops(codec, _plan_context(codec, plan, 256), _plan_context(codec, plan, 256, 0), n,
               f"sparse fp16 scale={scale}")
    x = torch.tensor([7e4, -1e5, 3e-8, 1e-6, float("nan"), -0.0] + [1.0] * 250)
    ct, cn = HopContext(backend="triton"), HopContext()
    assert_same(codec.compress(x, ct), codec.compress(x, cn), "fp16 saturation and NaN bytes")


@pytest.mark.parametrize("choice", [[2, 0, 1, 0, 2], [0, 3, 3, 1, 0], [3, 2, 1, 0, 0], [1]])
def test_dynamiq_width_plans_and_small_tiles(small_tiles, choice):
    codec = DynamiQ(bits=7.0, widths=(2, 4, 8, 16), group_size=32)
    sgs = len(choice)
    n = (sgs - 1) * 256 + 100  # the partial super-group takes the chosen width, whatever it is
    plan = WidthPlan(np.array([0, *choice], dtype=np.int64), codec.width_list, 0.0, 0.0)
    check_hops(codec, _plan_context(codec, plan, 256), _plan_context(codec, plan, 256, 0), n,
               f"dynamiq choice={choice}")


def test_row_permutation_kernels(small_tiles):
    rs = np.random.default_rng(5)
    for rows, n in ((1, 100), (5, 5 * 256), (7, 6 * 256 + 3)):
        order = torch.from_numpy(rs.permutation(rows).astype(np.int64))
        x = vector(n, rows)
        want = torch.zeros(rows * 256)
        want[:n] = x
        want = want.view(rows, 256).index_select(0, order).view(-1)
        g = lb.gather_rows(x, order)
        assert_same(g, want, f"gather rows={rows}")
        for add in (False, True):
            out = vector(n, rows + 1)
            full = torch.zeros(rows * 256)
            full.view(rows, 256).index_copy_(0, order, g.view(rows, 256))
            ref = out + full[:n] if add else full[:n].clone()
            lb.scatter_rows(g, order, out, add)
            assert_same(out, ref, f"scatter rows={rows} add={add}")
        # a subset of the rows, in any order (a segment of a DynamiQ message), matches the
        # torch rows of the base backend
        sub = order[: max(1, rows // 2)]
        base = kb.get_backend("numba")
        g = lb.gather_rows(x, sub)
        assert_same(g, base.gather_rows(x, sub, 256), f"gather subset rows={rows}")
        for add in (False, True):
            out = vector(n, rows + 2)
            ref = out.clone()
            base.scatter_rows(g, sub, ref, add, 256)
            lb.scatter_rows(g, sub, out, add)
            assert_same(out, ref, f"scatter subset rows={rows} add={add}")


def test_bf16_nan_pattern_is_torchs():
    nan16 = lb.bf16_nan_pattern(torch.device("cpu"))
    x = torch.tensor([float("nan"), -float("nan")])
    got = x.to(torch.bfloat16).view(torch.int16).numpy().astype(np.int64) & 0xFFFF
    if nan16 >= 0:
        assert (got == nan16).all()
    codec = Passthrough("bf16")
    ct = HopContext(backend="triton")
    assert_same(codec.compress(x, ct), codec.compress(x, HopContext()), "bf16 NaN bytes")


def test_launcher_argument_checks():
    x = torch.randn(64)
    with pytest.raises(ValueError, match="writeback"):
        lb.wire_recompress(torch.zeros(256, dtype=torch.uint8), x, "fp32", writeback="all")
    with pytest.raises(ValueError, match="message"):
        lb.wire_decode(torch.zeros(3, dtype=torch.uint8), "fp32", x)
    with pytest.raises(ValueError, match="must not be the incoming"):
        data = lb_int.intsum_encode(x, 1.0, 8, (1, 2), 0)
        lb_int.intsum_recompress(data, x, 1.0, 8, (1, 2), 0, out=data)
    with pytest.raises(ValueError, match="bits"):
        lb_int.intsum_encode(x, 1.0, 25, (1, 2), 0)
    with pytest.raises(ValueError, match="scales"):
        lb_shared.shared_encode(x, torch.ones(1), 32, 7, (None,) * 4)
    with pytest.raises(ValueError, match="power of two"):
        lb.gather_rows(torch.randn(300), torch.arange(1), 96)


# ---------------------------------------------------------------- formats registered in a test
def test_formats_registered_in_the_test_get_triton_kernels():
    FORMATS.register("test_tc_lvl8", LevelFormat((0.0, 0.05, 0.1, 0.2, 0.35, 0.5, 0.7, 1.0)))
    q = BlockQuantizer("test_tc_lvl8", group_size=16, scale="e4m3")  # nvfp4's kernel spec
    QUANTIZERS.register("test_tc_lvl8_q", q)
    try:
        assert "test_tc_lvl8_q" in QUANTIZERS.names()
        codecs = [Requant("test_tc_lvl8_q"), SharedScale("test_tc_lvl8"),
                  # new ε-level formats, built by the codec itself: no kernel code either
                  DynamiQ(widths="3/5", eps="0.31/0.11")]
        for codec in codecs:
            check_hops(codec, metadata_context(codec, 700, 1), metadata_context(codec, 700, 2),
                       700, f"registered format: {codec}")
    finally:
        QUANTIZERS.unregister("test_tc_lvl8_q")
        FORMATS.unregister("test_tc_lvl8")


# ---------------------------------------------------------------- whole all-reductions
def _inputs(n: int, d: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g) * torch.exp(1.5 * torch.randn(n, 1 + d // 256,
                                                                     generator=g)
                                                   ).repeat_interleave(256, 1)[:, :d]
    x[:, 300:400] = 0.0
    x[0, 7] = 3e4
    return x


def _simulate_both(name: str, n: int, d: int, seed: int, track_hops: bool = True) -> None:
    x = _inputs(n, d, seed)
    want = simulate(name, x, backend="numba", call=seed % 3, track_hops=track_hops)
    got = simulate(name, x, backend="triton", call=seed % 3, track_hops=track_hops)
    assert_same(got.results, want.results, f"simulate {name} n={n} d={d}")
    assert got.bytes_sent == want.bytes_sent, name
    assert got.hop_vnmse == want.hop_vnmse, name


def _world_sizes(name: str) -> list[int]:
    ok = [n for n in (2, 3, 4) if PIPELINES[name].topology.supports(n)]
    assert ok, name
    return ok


def test_simulate_matches_numba_for_every_registered_pipeline():
    names = PIPELINES.names()
    assert {"dynamiq", "thc", "mxfp8", "omnireduce", "requant-dq4"} <= set(names)
    for k, name in enumerate(names):
        sizes = _world_sizes(name)
        _simulate_both(name, sizes[k % len(sizes)], 700 + 37 * (k % 9), k)


@pytest.mark.slow
def test_simulate_matches_numba_for_every_pipeline_and_world_size():
    # the world sizes the test above did not run, at other lengths and seeds
    for k, name in enumerate(PIPELINES.names()):
        sizes = _world_sizes(name)
        for n in sizes:
            if n != sizes[k % len(sizes)]:
                _simulate_both(name, n, 2000 - 97 * (k % 11), 100 + k, track_hops=False)


_RANK = textwrap.dedent("""
    import datetime, json, os, sys
    os.environ["TRITON_INTERPRET"] = "1"  # before anything imports dynamiq.kernels.triton
    import numpy as np, torch
    import torch.distributed as dist
    import dynamiq, dynamiq.baselines
    from dynamiq.collectives import api, p2p
    from triton.runtime.interpreter import InterpretedFunction
    from dynamiq.kernels.triton.jit import blocks
    assert isinstance(blocks.encode_kernel, InterpretedFunction)
    rank, port, out, d = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2, timeout=datetime.timedelta(seconds=120))
    res = {}
    for name in sys.argv[5:]:
        x = torch.randn(2, d, generator=torch.Generator().manual_seed(len(name)))[rank]
        x = x * torch.logspace(-2, 2, d)
        for backend in ("numba", "triton"):
            p2p.clear_cache()  # fresh codec state (auto-scale) and call counters per backend
            api.reset_call_counters()
            t = x.clone()
            for _ in range(2):  # two calls: the second sees the first's codec state
                t = x.clone()
                dynamiq.all_reduce(t, name, timeout=60, backend=backend)
            res[f"{name}/{backend}"] = t.numpy().view(np.int32).tolist()
    with open(out, "w") as f:
        json.dump(res, f)
    dist.destroy_process_group()
""")


def test_all_reduce_triton_equals_numba_on_a_gloo_group(tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(_RANK)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    names = ["dynamiq", "thc", "mxfp8", "omnireduce"]
    env = {**os.environ, "TRITON_INTERPRET": "1", "NUMBA_NUM_THREADS": "1",
           "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, str(script), str(r), str(port),
                               str(tmp_path / f"r{r}.json"), "1100", *names],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(2)]
    logs = [p.communicate(timeout=600)[0] for p in procs]
    for r, (p, log) in enumerate(zip(procs, logs)):
        assert p.returncode == 0, f"rank {r} failed:\n{log[-4000:]}"
    res = [json.loads((tmp_path / f"r{r}.json").read_text()) for r in range(2)]
    for name in names:
        want = res[0][f"{name}/numba"]
        for r in range(2):
            assert res[r][f"{name}/triton"] == want, f"{name}: rank {r} triton != numba"
            assert res[r][f"{name}/numba"] == want, f"{name}: ranks differ"


# ---------------------------------------------------------------- backend selection
def test_hop_context_backend_is_not_part_of_equality():
    a, b = HopContext(rank=1), HopContext(rank=1, backend="triton")
    assert a == b and hash(a) == hash(b) and a.backend == "auto"


def test_bogus_backend_is_rejected_everywhere():
    x = torch.randn(2, 300)
    with pytest.raises(ValueError, match="backend must be one of"):
        simulate("requant-dq4", x, backend="bogus")
    with pytest.raises(ValueError, match="backend must be one of"):
        api.all_reduce(torch.randn(300), "requant-dq4", backend="bogus")
    with pytest.raises(ValueError, match="backend must be one of"):
        p2p.run_p2p(torch.randn(300), "requant-dq4", call=0, timeout=1, backend="bogus")
    ctx = HopContext(backend="bogus")
    for codec in (Passthrough(), Requant("mxfp8"), SharedScale(), IntSum(), Sparse(),
                  DynamiQ(widths="4", group_size=32)):
        with pytest.raises(ValueError, match="backend must be one of"):
            codec.compress(torch.randn(300), ctx)
        msg = codec.compress(torch.randn(300), HopContext())
        with pytest.raises(ValueError, match="backend must be one of"):
            codec.decompress_accumulate(msg, torch.randn(300), ctx)


def test_triton_on_cpu_without_the_interpreter_fails_clearly(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    x = torch.randn(2, 300)
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        simulate("dynamiq", x, backend="triton")
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        api.all_reduce(torch.randn(300), "requant-dq4", backend="triton")
    ctx = HopContext(backend="triton")
    for codec in (Passthrough("bf16"), SharedScale(), IntSum(), Sparse(),
                  DynamiQ(widths="4", group_size=32)):
        with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
            codec.compress(torch.randn(300), ctx)
    # and "auto" stays on Numba for CPU tensors
    assert kb.resolve_backend("auto", "cpu") == "numba"
    simulate("thc", x, backend="auto")


# ---------------------------------------------------------------- the GPU benchmark
def test_gpu_benchmark_runs_quick_under_the_interpreter(tmp_path):
    out = tmp_path / "bench.json"
    env = {**os.environ, "TRITON_INTERPRET": "1", "NUMBA_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu.py"), "--quick",
                          "--repeat", "1", "--sizes-mb", "0.004", "--json", str(out)], env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    report = json.loads(out.read_text())
    rows = report["rows"]
    assert report["interpreted"] is True
    codecs = {r["codec"] for r in rows}
    assert {"copy (torch)", "dq4_hier", "dq8_hier", "mxfp8 (shared scale)",
            "dynamiq 2/4/8"} <= codecs
    for codec in codecs - {"copy (torch)"}:
        assert {r["op"] for r in rows if r["codec"] == codec} == {
            "compress", "decompress", "decompress_accumulate",
            "decompress_accumulate_recompress"}
    assert all(r["gbps"] > 0 and r["seconds"] > 0 for r in rows)
    assert "GB/s" in run.stdout
    # without a GPU and without the interpreter it says why, and fails
    env.pop("TRITON_INTERPRET")
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu.py")], env=env,
                         capture_output=True, text=True, timeout=120)
    if not torch.cuda.is_available():
        assert run.returncode != 0 and "needs a CUDA device" in run.stderr


# ---------------------------------------------------------------- compiled for a GPU
_COMPILE = textwrap.dedent("""
    import math, os, sys
    assert os.environ.get("TRITON_INTERPRET", "0") == "0"
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from dynamiq.kernels.triton.jit import intsum as ki
    from dynamiq.kernels.triton.jit import shared_scale as ks
    from dynamiq.kernels.triton.jit import wire as kw

    def compile_(fn, sig, consts):
        src = ASTSource(fn=fn, signature={**sig, **{k: "constexpr" for k in consts}},
                        constexprs=consts)
        k = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                           options={"num_warps": 4, "enable_fp_fusion": False})
        ptx = k.asm["ptx"]
        # the arithmetic contract: no fused multiply-add, no approximate division, no FTZ
        for bad in ("fma.rn.f32", "div.full", "div.approx", ".ftz"):
            assert bad not in ptx, (fn.__name__, consts, bad)

    F, U8, I64 = "*fp32", "*u8", "*i64"
    for mb, blk in ((3, 16), (5, 32), (7, 32)):
        g = math.gcd(mb + 1, 8)
        c = dict(BLOCK=blk, MBITS=mb, TILE=1024, E=8 // g, L=(mb + 1) // g)
        compile_(ks.shared_encode_kernel, dict(x=F, n="i64", nbytes="i64", scales=F, out=U8,
                 tab=F, lut="*i32", iconst=I64), c)
        compile_(ks.shared_decode_kernel, dict(data=U8, n="i64", nbytes="i64", scales=F,
                 out=F, dec=F), {**c, "ACCUMULATE": True})
        compile_(ks.shared_recompress_kernel, dict(data=U8, acc=F, n="i64", nbytes="i64",
                 scales=F, out=U8, tab=F, lut="*i32", dec=F, iconst=I64),
                 {**c, "WRITEBACK": 2})
    for bits in (6, 13, 24):
        g = math.gcd(bits, 8)
        c = dict(BITS=bits, TILE=1024, E=8 // g, L=bits // g)
        compile_(ki.intsum_encode_kernel, dict(x=F, n="i64", nbytes="i64", out=U8, fconst=F,
                 rand=I64), c)
        compile_(ki.intsum_decode_kernel, dict(data=U8, n="i64", nbytes="i64", out=F,
                 fconst=F), {**c, "ACCUMULATE": True})
        compile_(ki.intsum_recompress_kernel, dict(data=U8, acc=F, n="i64", nbytes="i64",
                 out=U8, fconst=F, rand=I64), {**c, "WRITEBACK": 2})
    compile_(ki.intsum_round_kernel, dict(x=F, n="i64", out=F, lower="*i32", upper="*i32",
             g="i32", fconst=F, rand=I64), dict(TILE=1024))
    for fmt, wire in ((1, "*i16"), (2, "*i16"), (0, F)):
        c = dict(FMT=fmt, SELECT=True, SB=256, TILE=1024)
        compile_(kw.wire_encode_kernel, dict(x=F, n="i64", wire=wire, bpos=I64, nan16="i32"), c)
        compile_(kw.wire_decode_kernel, dict(wire=wire, n="i64", out=F, bpos=I64),
                 {**c, "ACCUMULATE": True})
        compile_(kw.wire_recompress_kernel, dict(wire=wire, acc=F, n="i64", out=wire,
                 bpos=I64, nan16="i32"), {**c, "WRITEBACK": 2})
    compile_(kw.gather_rows_kernel, dict(x=F, n="i64", order=I64, rows="i64", g=F),
             dict(ROW=256, RPP=4))
    compile_(kw.scatter_rows_kernel, dict(g=F, n="i64", order=I64, rows="i64", out=F),
             dict(ROW=256, RPP=4, ADD=True))
    print("compiled")
""")


@pytest.mark.slow
def test_baseline_kernels_compile_for_a_gpu_without_fma_or_ftz():
    # no GPU needed: Triton compiles for sm_90 down to PTX and cubin on the CPU
    pytest.importorskip("triton.backends.nvidia")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", _COMPILE], env=env, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0 and "compiled" in run.stdout, run.stderr[-4000:]
