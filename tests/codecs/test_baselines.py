"""The paper's baselines (docs/method.rst) as partial-sum codecs and registered pipelines.

* ``shared_scale`` (MXFP8/6/4, NVFP4): round-to-nearest-even onto a shared per-block grid,
  saturation, the auto-scale factor;
* ``intsum`` (THC, max-scaled grid): integer partial sums are exact along any tree, the result
  is unbiased (THC's clamped grid: tests/codecs/test_thc.py);
* ``sparse`` (OmniReduce): the budget holds, selected blocks are summed, the rest is dropped,
  ``k`` adapts; the paper's configuration sends FP16 and its bits follow its keep fraction;
* every registered baseline pipeline on ring and butterfly, and one gloo world showing that
  ``dynamiq.all_reduce`` equals :func:`dynamiq.simulate` bit for bit over successive calls.

"Equal" means bit for bit (float32 compared through ``view(int32)``).
"""

from __future__ import annotations

import functools
import math
import time

import numpy as np
import pytest
import torch
from _world import world_results

import dynamiq.baselines  # noqa: F401  (registers the baseline pipelines)
from dynamiq import PIPELINES, HopContext, Pipeline, get_codec, get_pipeline, simulate
from dynamiq.baselines import BASELINES
from dynamiq.codecs import IntSum, SharedScale, SharedScalePlan, Sparse
from dynamiq.codecs.intsum import grid_step
from dynamiq.codecs.shared_scale import initial_mu
from dynamiq.collectives import api, p2p
from dynamiq.collectives.engine import Plan, apply_transforms, local_metadata
from dynamiq.collectives.statistics import local_statistics
from dynamiq.formats import FORMATS
from dynamiq.metadata import combine

D = 5000  # not a multiple of 256: a partial last block


pytestmark = pytest.mark.usefixtures("one_numba_thread")


def _inputs(n: int, d: int = D, seed: int = 0, shared_scales: bool = True) -> torch.Tensor:
    """Gaussian gradients whose 256-blocks have log-normal scales (spread over ~3 decades)."""
    g = torch.Generator().manual_seed(1000 * seed + 17 * n + d)
    blocks = -(-d // 256)
    s = torch.exp(1.5 * torch.randn(1 if shared_scales else n, blocks, generator=g))
    return torch.randn(n, d, generator=g) * s.repeat_interleave(256, 1)[:, :d]


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32) if t.dtype == torch.float32 else t


def assert_same_bits(a: torch.Tensor, b: torch.Tensor, what: str = "") -> None:
    assert a.shape == b.shape, (what, a.shape, b.shape)
    bad = torch.nonzero(_bits(a) != _bits(b)).flatten()
    assert bad.numel() == 0, f"{what}: {bad.numel()} values differ, first at {int(bad[0])}"


def _plan(pipeline: str | Pipeline, x: torch.Tensor, call: int = 0,
          states: dict | None = None) -> tuple[Plan, list[torch.Tensor]]:
    """The plan (with prepared decisions) and transformed inputs of a simulated call."""
    p = get_pipeline(pipeline)
    n = x.shape[0]
    ys = [apply_transforms(p, x[r].clone(), call)[0] for r in range(n)]
    plan = Plan(p, n, ys[0].numel(), call)
    states = {} if states is None else states
    metas = [local_metadata(p, y, states) for y in ys]
    plan.set_metadata(combine([m for m, _ in metas], metas[0][1]), states)
    return plan, ys


# ================================================================ specs and parameters
CODEC_SAMPLES = [
    SharedScale(), SharedScale("e3m2"), SharedScale("e2m1"), SharedScale("e2m1", 16, "e4m3"),
    SharedScale("e5m2", 16, "e8m0"),
    IntSum(), IntSum(levels=7, headroom_bits=12, seed=3),
    IntSum(levels=16, clamp="auto", first=True), IntSum(levels=16, clamp=2.5, granularity=30),
    Sparse(), Sparse(bits=4, momentum=0.5), Sparse(wire="fp16", keep=0.25),
]


@pytest.mark.parametrize("codec", CODEC_SAMPLES, ids=str)
def test_codec_spec_round_trip(codec):
    spec = codec.spec()
    back = get_codec(spec)
    assert back == codec and hash(back) == hash(codec) and back.spec() == spec
    assert " " not in spec


@pytest.mark.parametrize(
    ("spec", "codec"),
    [
        ("shared_scale", SharedScale("e4m3", 32, "e8m0")),
        ("shared_scale(element=fp8_e4m3)", SharedScale()),  # aliases resolve to one codec
        ("shared_scale(element=e2m1,block=16,scale=e4m3)", SharedScale("e2m1", 16, "e4m3")),
        ("intsum(headroom_bits=12)", IntSum(headroom_bits=12)),
        ("intsum(levels=15,seed=0)", IntSum()),
        ("sparse(bits=8)", Sparse()),
        ("sparse(bits=4.5,momentum=0)", Sparse(4.5, 0.0)),
        ("sparse(wire=fp16,keep=0.25)", Sparse(wire="fp16", keep=0.25)),
        ("intsum(levels=16,clamp=auto,first=true)", IntSum(levels=16, clamp="auto", first=True)),
        ("intsum(levels=16,clamp=2,granularity=30)", IntSum(levels=16, clamp=2.0, granularity=30)),
    ],
)
def test_specs_parse_to_codecs(spec, codec):
    assert get_codec(spec) == codec


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("shared_scale(element=e9m9)", "unknown number format"),
        ("shared_scale(element=e8m0)", "signed format"),
        ("shared_scale(block=64)", "block must be one of"),
        ("shared_scale(scale=int8)", "float format"),
        ("shared_scale(seed=1)", "no parameter 'seed'"),
        ("intsum(levels=16)", "odd"),
        ("intsum(levels=1)", "odd integer in"),
        ("intsum(headroom_bits=3)", "cannot hold one rank"),
        ("intsum(headroom_bits=30)", r"\[2, 24\]"),
        ("intsum(headroom_bits=x)", "must be an integer"),
        ("intsum(seed=-1)", "non-negative"),
        ("intsum(clamp=0)", "positive number of standard deviations"),
        ("intsum(clamp=-2)", "positive number of standard deviations"),
        ("intsum(clamp=nan)", "positive number of standard deviations"),
        ("intsum(clamp=wide)", "positive number of standard deviations"),
        ("intsum(granularity=30)", "needs a clamp"),
        ("intsum(levels=16,clamp=auto,granularity=10)", r"granularity must be .*\[levels - 1"),
        ("intsum(levels=16,clamp=auto,granularity=4096)", "granularity must be"),
        ("intsum(levels=1,clamp=auto)", r"levels must be an integer in \[2"),
        ("intsum(block=100)", "power of two"),
        ("intsum(block=128)", "power of two"),
        ("intsum(levels=16,clamp=auto,granularity=30,headroom_bits=4)", "cannot hold one rank"),
        ("sparse(bits=0)", r"\(0, 64\]"),
        ("sparse(bits=nan)", "finite"),
        ("sparse(momentum=1)", r"\[0, 1\)"),
        ("sparse(wire=fp8)", "wire must be one of"),
        ("sparse(keep=0)", r"fraction in \(0, 1\]"),
        ("sparse(keep=1.5)", r"fraction in \(0, 1\]"),
        ("sparse(bits=4,keep=0.5)", "not both"),
    ],
)
def test_bad_codec_parameters(spec, match):
    with pytest.raises(ValueError, match=match):
        get_codec(spec)


def test_bad_parameters_found_at_prepare_time():
    x = _inputs(8, 1000)
    with pytest.raises(ValueError, match="cannot hold the sum of 8 ranks"):
        simulate("intsum(headroom_bits=6)@ring", x)  # 7 * 8 = 56 > 31
    with pytest.raises(ValueError, match="pass headroom_bits"):
        IntSum().prepare({"absmax": torch.ones(1, dtype=torch.float64)}, 256, 5000, {})
    with pytest.raises(ValueError, match="metadata alone"):
        Sparse(bits=0.05).target_blocks(5000)


NAMES = [name + suffix for name in [*BASELINES, "bf16"] for suffix in ("", "-butterfly")]


@pytest.mark.parametrize("name", NAMES)
def test_pipeline_specs_round_trip(name):
    p = PIPELINES[name]
    assert Pipeline.parse(str(p)) == p and get_pipeline(str(p)) == p
    assert PIPELINES.name_of(p) == PIPELINES.canonical(name)
    assert p.topology.spec() == ("butterfly" if name.endswith("-butterfly") else "ring")


def test_registered_pipeline_strings():
    assert get_pipeline("bf16") is PIPELINES["passthrough-bf16"]
    assert str(PIPELINES["mxfp8"]) == "shared_scale@ring"
    assert str(PIPELINES["mxfp6"]) == "shared_scale(element=e3m2)@ring"
    assert str(PIPELINES["mxfp4"]) == "shared_scale(element=e2m1)@ring"
    assert str(PIPELINES["nvfp4"]) == "shared_scale(element=e2m1,block=16,scale=e4m3)@ring"
    assert str(PIPELINES["thc"]) == ("rht(block_size=65536)+intsum(levels=16,clamp=auto,"
                                     "first=True)@ring")
    assert str(PIPELINES["thc-maxscale"]) == "rht(block_size=65536)+intsum@ring"
    assert str(PIPELINES["omnireduce-butterfly"]) == "sparse@butterfly"
    assert str(PIPELINES["omnireduce-paper"]) == "sparse(wire=fp16,keep=0.25)@ring"
    assert not IntSum().lossless and IntSum().unbiased
    assert not PIPELINES["thc"].codec.unbiased  # the clamp
    assert not SharedScale().unbiased and not Sparse().unbiased


# ================================================================ the hop operations, prepared
# (tests/codecs/test_registered_codecs.py checks them outside a collective, where no plan exists)
PREPARED = [SharedScale(), SharedScale("e3m2"), SharedScale("e2m1", 16, "e4m3"), IntSum(),
            IntSum(levels=16, clamp="auto", first=True, block=256),
            IntSum(levels=16, clamp="auto", granularity=30, block=512),
            Sparse(4.0), Sparse(wire="fp16", keep=0.25)]


def _prepared_ctx(codec, rank: int) -> HopContext:
    x = _inputs(3, 4096, seed=11, shared_scales=False)
    states: dict = {}
    metas = [local_metadata(Pipeline(codec, "ring"), x[r], states) for r in range(3)]
    plan = codec.prepare(combine([m for m, _ in metas], metas[0][1]), 4096, 3,
                         states.setdefault(codec, {}))
    return HopContext(seed=0, stream=(2, 1), rank=rank, world_size=3, index_offset=1024,
                      prepared={codec: plan})


@pytest.mark.parametrize("codec", PREPARED, ids=str)
def test_hop_operations_agree_with_a_prepared_plan(codec):
    n = 1500  # a partial last block
    ctx, leaf = _prepared_ctx(codec, 1), _prepared_ctx(codec, 2)
    x = _inputs(3, 4096, seed=11, shared_scales=False)
    data = codec.compress(x[2, 1024:1024 + n].contiguous(), leaf)
    assert data.numel() == codec.wire_bytes(n, leaf) == codec.wire_bytes(n, ctx)
    assert data.numel() <= codec.max_wire_bytes(n)
    if isinstance(codec, Sparse):  # the chunk holds selected and dropped blocks
        assert 0 < data.numel() < 2 * n
    acc0 = x[1, 1024:1024 + n].clone()
    acc0[[3, 700, 1400]] = torch.tensor([-0.0, float("nan"), -0.0])
    dec = torch.empty(n)
    codec.decompress(data, dec, ctx)
    acc = acc0.clone()
    codec.decompress_accumulate(data, acc, ctx)
    assert_same_bits(acc, acc0 + dec, "decompress_accumulate")
    want = codec.compress(acc0 + dec, ctx)
    for wb in ("none", "sum", "decoded"):
        acc = acc0.clone()
        got = codec.decompress_accumulate_recompress(data, acc, ctx, writeback=wb)
        assert_same_bits(got, want, f"fused recompress, writeback={wb}")
        if wb == "none":
            assert_same_bits(acc, acc0, "writeback=none")
        elif wb == "sum":
            assert_same_bits(acc, acc0 + dec, "writeback=sum")
        else:
            back = torch.empty(n)
            codec.decompress(got, back, ctx)
            assert_same_bits(acc, back, "writeback=decoded")
    # a context without this codec's plan is a misuse, not a standalone call
    with pytest.raises(ValueError, match="no prepared"):
        codec.compress(acc0, HopContext(prepared={}))


# ================================================================ shared_scale
def _single_rank_ctx(codec: SharedScale, x: torch.Tensor, mu: float = 1.0):
    stats = local_statistics(codec.statistics, x)
    plan = codec.prepare(stats, x.numel(), 1, {"mu": mu})
    return plan, HopContext(prepared={codec: plan})


@pytest.mark.parametrize("element", ["e4m3", "e3m2", "e2m1"])
def test_shared_scale_round_trip_error_is_half_a_level_gap(element):
    codec = SharedScale(element)
    fmt = FORMATS[element]
    x = _inputs(1, 4096, seed=1)[0]
    plan, ctx = _single_rank_ctx(codec, x)
    y = torch.empty_like(x)
    codec.decompress(codec.compress(x, ctx), y, ctx)
    s = plan.scales.repeat_interleave(32)[: x.numel()].double()
    # μ = 1: the scale is the block maximum / elem_max rounded up, so nothing saturates and the
    # error is at most half the gap 2**(e - mbits) * s between neighbouring levels, with
    # e = max(floor(log2 |x/s|), 1 - bias) (subnormals share the smallest normal gap)
    a = (x.double() / s).abs()
    emin = 1 - fmt.bias
    e = torch.floor(torch.log2(a.clamp_min(2.0**emin))).clamp_min(emin)
    bound = 0.5 * torch.exp2(e - fmt.mbits) * s
    err = (y.double() - x.double()).abs()
    assert torch.all(err <= bound), float((err / bound).max())
    assert torch.all(a <= fmt.max_value)
    # power-of-two scales make x / s exact: the format's own reference cast agrees bit for bit
    # (up to the sign of zero: the codec codes every zero as +0)
    ref = fmt.decode(fmt.encode((x.double() / s).numpy())) * s.numpy() + 0.0
    assert_same_bits(y, torch.from_numpy(ref.astype(np.float32)), "reference RNE cast")


def test_shared_scale_saturates_and_keeps_nan_visible():
    for codec in (SharedScale("e4m3"), SharedScale("e2m1")):  # with and without a NaN code
        fmt = codec.element_format
        scales = torch.full((2,), 0.25)
        plan = SharedScalePlan(scales, (fmt.max_value * scales).float(), 1.0)
        ctx = HopContext(prepared={codec: plan})
        x = torch.tensor([1e6, -1e6, fmt.max_value * 0.25 * 1.01, float("nan"), float("inf"),
                          float("-inf"), -1e-30, 0.0] + [0.1] * 56, dtype=torch.float32)
        y = torch.empty_like(x)
        codec.decompress(codec.compress(x, ctx), y, ctx)
        top = fmt.max_value * 0.25
        assert y[:3].tolist() == [top, -top, top]  # saturation, not NaN or Inf
        assert torch.isnan(y[3:6]).all()  # NaN and ±Inf stay visible as NaN
        assert y[6].item() == 0.0 and y[7].item() == 0.0 and not torch.signbit(y[6])
        # a partial sum that overflows saturates too, and a NaN partial sum stays NaN
        acc = torch.full_like(x, top)
        out = codec.decompress_accumulate_recompress(codec.compress(x, ctx), acc, ctx,
                                                     writeback="decoded")
        assert acc[0].item() == top and acc[1].item() == 0.0 and torch.isnan(acc[3])
        codec.decompress(out, y, ctx)
        assert_same_bits(y, acc, "decoded writeback")


@pytest.mark.parametrize("seed", range(6))
def test_shared_scale_counts_every_saturated_coordinate(seed):
    """The overflow rate is the share of coordinates at their block's saturation value (either
    sign), counted per coordinate: blocks with a NaN, a partial last block and saturation
    values of 0 included."""
    g = torch.Generator().manual_seed(seed)
    block = 32
    n = int(torch.randint(1, 9 * block, (1,), generator=g))
    blocks = -(-n // block)
    sat = (torch.rand(blocks, generator=g) * 4).float()
    sat[torch.rand(blocks, generator=g) < 0.2] = 0.0
    per = sat.repeat_interleave(block)[:n]
    r = (torch.rand(n, generator=g) * 2 - 1) * per
    pick = torch.rand(n, generator=g)
    r = torch.where(pick < 0.15, per, torch.where(pick < 0.3, -per, r))
    r[torch.rand(n, generator=g) < 0.05] = float("nan")
    want = int((r.abs() == per).sum())
    state: dict = {}
    SharedScale(block=block).observe(r, SharedScalePlan(torch.ones(blocks), sat, 2.0), 4, state)
    assert state["overflow_rate"] == want / n


def test_shared_scale_auto_scale_doubles_on_overflow_and_halves_to_one():
    codec = SharedScale()
    assert [initial_mu(n) for n in (1, 2, 3, 4, 8, 16)] == [1, 2, 2, 2, 4, 4]
    scales = torch.ones(4)
    sat = (448.0 * scales).float()
    result = torch.randn(128)
    hit = result.clone()
    hit[5] = -448.0  # 1 of 128 coordinates saturated: above the 1e-4 rate
    for mu, res, want in ((4.0, hit, 8.0), (4.0, result, 2.0), (1.0, result, 1.0),
                          (1.0, hit, 2.0)):
        state: dict = {}
        codec.observe(res, SharedScalePlan(scales, sat, mu), 4, state)
        assert state["mu"] == want, (mu, want)
    # end to end: identical ranks sum to 8x the maximum, which the first call's μ = 4 cannot
    # hold; every later call follows the rule from the overflow rate it observed
    x = _inputs(1, 2048, seed=3).repeat(8, 1)
    state: dict = {}
    mus, rates, errs = [], [], []
    for call in range(6):
        res = simulate("mxfp8", x, call=call, state=state, track_hops=False)
        mus.append(state[codec]["mu"])
        rates.append(state[codec]["overflow_rate"])
        errs.append(res.vnmse)
    assert rates[0] > 0.01 and mus[0] == 8.0  # the blocks' maxima saturated
    assert errs[1] < errs[0] / 4  # no more clipped maxima
    for prev, rate, mu in zip([4.0, *mus], rates, mus):
        assert mu == (2 * prev if rate > 1e-4 else max(1.0, prev / 2) if rate == 0 else prev)
    print(f"mxfp8 auto-scale on 8 identical ranks: mu {mus}, overflow rates {rates}")


@pytest.mark.parametrize("element,bits", [("e4m3", 8), ("e3m2", 6), ("e2m1", 4)])
def test_shared_scale_wire_is_the_packed_codes(element, bits):
    codec = SharedScale(element)
    for n in (8, 32, 1000, 1024):
        assert codec.wire_bytes(n) == math.ceil(bits * n / 8)
    assert codec.wire_bytes(4096) == bits * 4096 // 8
    res = simulate(Pipeline(codec, "ring"), _inputs(4, 4096), track_hops=False)
    # 2(n-1)/n of the vector per rank, plus the 16-bit block maxima: bits + 0.5 exactly
    assert res.bits == pytest.approx(bits + 16 / 32, abs=1e-12)
    assert sum(res.bytes_sent) == 2 * 3 * bits * 4096 // 8


def test_shared_scale_ring_sum_is_close_to_exact():
    x = _inputs(4)
    res = simulate("mxfp8", x)
    assert res.vnmse < 5e-3
    # and every hop's error stays at the element format's scale
    assert max(res.hop_vnmse) < 5e-3


# ================================================================ intsum
@pytest.mark.parametrize(("n", "topology"), [(2, "ring"), (4, "ring"), (8, "ring"),
                                             (2, "butterfly"), (4, "butterfly"),
                                             (8, "butterfly")])
def test_intsum_on_grid_inputs_sum_exactly(n, topology):
    # every rank's value is w * 2**-3 with |w| <= 7 and some |w| = 7: M = 7/8, step = 1/8,
    # nothing rounds, and the integer sums must give the exact sum bit for bit
    g = torch.Generator().manual_seed(n)
    w = torch.randint(-7, 8, (n, 3000), generator=g)
    w[0, 17] = 7
    x = w.float() / 8
    res = simulate(f"intsum@{topology}", x)
    exact = x.double().sum(0).float()
    for r in range(n):
        assert_same_bits(res.results[r], exact, f"rank {r}")


@pytest.mark.parametrize(("n", "topology"), [(3, "ring"), (4, "ring"), (8, "ring"),
                                             (2, "butterfly"), (8, "butterfly")])
def test_intsum_result_is_the_sum_of_each_ranks_own_codes(n, topology):
    # each rank's own stochastic rounding, decoded independently, summed in float64: the
    # all-reduced value must be that sum. At an internal node a rank's raw value enters as
    # part of x + (received partial sum) in float32, which may move its last bits by
    # 2**(bits-24) steps and flip a rounding with that probability: at most a few coordinates
    # may differ, by exactly one step.
    x = _inputs(n, seed=2)
    p = get_pipeline(f"intsum@{topology}")
    call = 5
    res = simulate(p, x, call=call)
    plan, ys = _plan(p, x, call)
    codec = p.codec
    want = torch.zeros(D, dtype=torch.float64)
    for r in range(n):
        for chunk, (a, b) in enumerate(plan.bounds):
            if b > a:
                ctx = plan.context(r, chunk)
                out = torch.empty(b - a)
                codec.decompress(codec.compress(ys[r][a:b].contiguous(), ctx), out, ctx)
                want[a:b] += out.double()
    step = plan.prepared[codec].step
    assert plan.prepared[codec].bits == codec.bits_for(n)
    diff = (res.results[0].double() - want).abs()
    assert diff.max() <= step and int((diff > 0).sum()) <= 3
    for r in range(1, n):
        assert_same_bits(res.results[r], res.results[0], f"rank {r}")


@pytest.mark.parametrize(("n", "topology"), [(4, "ring"), (8, "butterfly")])
def test_intsum_is_unbiased(n, topology):
    # K calls draw independent rotations and roundings. A rank's rounding of a coordinate has
    # variance f(1-f) step**2 <= step**2 / 4, independent across ranks and coordinates, and the
    # inverse rotation is orthogonal, so every result coordinate has variance at most
    # v_c = n * step_c**2 / 4 in call c, and the mean of K results at most mean(v_c) / K.
    x = _inputs(n, 1024, seed=4)
    exact = x.double().sum(0)
    k_calls = 150
    codec = IntSum()
    errs, bounds = [], []
    for call in range(k_calls):
        res = simulate(f"thc-maxscale{'-butterfly' if topology == 'butterfly' else ''}", x,
                       call=call, track_hops=False)
        errs.append(res.results[0].double() - exact)
        step = grid_step(float(res.stats["absmax"].max()), codec.half_levels,
                         codec.bits_for(n))
        bounds.append(n * step**2 / 4)
    err = torch.stack(errs)
    bound = sum(bounds) / k_calls
    mean = err.mean(0)
    var = err.var(0)  # per coordinate, over the calls
    assert float(var.mean()) <= bound  # the derived variance bound holds
    assert float(var.mean()) > bound / 10  # and is not vacuous
    assert float((mean.abs() / math.sqrt(bound / k_calls)).max()) < 5.5
    # Student's t of every coordinate's mean error: ~N(0, 1) without bias, so mean(t**2) is
    # 1 +- 0.05; a bias b adds K b**2 / sigma**2, 0.375 for b = 5 % of one call's noise sigma
    t = mean / (var / k_calls).sqrt()
    assert float(t.abs().max()) < 6 and float((t**2).mean()) < 1.25
    print(f"intsum n={n} {topology}: var/bound {float(var.mean()) / bound:.3f}, mean t^2 "
          f"{float((t**2).mean()):.3f}, max |t| {float(t.abs().max()):.2f} over {k_calls} calls")


def test_intsum_wire_bytes_follow_the_world_size():
    codec = IntSum()
    for n, bits in ((2, 5), (4, 6), (8, 7), (16, 8), (18, 8), (19, 9)):
        assert codec.bits_for(n) == bits == math.ceil(math.log2(14 * n + 1))
    x = _inputs(4)
    res = simulate("thc-maxscale", x, track_hops=False)
    # rht pads 5000 to one block of 65536; 6 bits each, plus the 256-block maxima
    assert res.bits == pytest.approx((6 * 65536 + 16 * 256) / D, abs=1e-12)
    assert codec.variable_size and not IntSum(headroom_bits=8).variable_size
    assert codec.max_wire_bytes(1000) == 2000 and IntSum(headroom_bits=12).wire_bytes(10) == 15


# ================================================================ sparse
@pytest.mark.parametrize("bits", [0.5, 2.0, 4.0, 8.0, 12.0, 20.0])
def test_sparse_budget_holds(bits):
    x = _inputs(4, seed=5, shared_scales=False)
    codec = Sparse(bits)
    res = simulate(Pipeline(codec, "ring"), x, track_hops=False)
    assert res.bits <= bits + 1e-9
    target = codec.target_blocks(D)
    blocks = -(-D // 256)
    if target < blocks:  # it spends at least all but one block of the budget
        assert res.bits > bits - 16 * 256 / D - 1e-9
    else:
        # every block in BF16, 17 bits of metadata per block and the energies' shift byte
        assert res.bits == pytest.approx(16 + (17 * blocks + 8) / D)


def test_sparse_sums_the_selected_blocks_and_drops_the_rest():
    n = 4
    x = _inputs(n, seed=6, shared_scales=False)
    codec = Sparse(4.0)
    p = Pipeline(codec, "ring")
    res = simulate(p, x)
    plan, _ = _plan(p, x)
    sel = plan.prepared[codec].selected.repeat_interleave(256)[:D]
    out = res.results[0].double()
    exact = x.double().sum(0)
    assert torch.all(out[~sel] == 0)
    # n roundings to BF16 (leaf, n - 2 internal hops, sink), each within 2**-9 of a partial sum
    bound = n * 2.0**-9 * x.double().abs().sum(0)
    assert torch.all((out[sel] - exact[sel]).abs() <= bound[sel])
    # the selection: union of the ranks' top-k, trimmed to the budget by global energy
    sp = plan.prepared[codec]
    k = sp.k
    energy = (torch.nn.functional.pad(x.double(), (0, 20 * 256 - D)).view(n, 20, 256) ** 2
              ).sum(2)
    union = torch.zeros(20, dtype=torch.bool)
    for r in range(n):
        union[torch.sort(-energy[r], stable=True).indices[:k]] = True
    assert sp.union == int(union.sum()) and sp.target == codec.target_blocks(D)
    assert int(sp.selected.sum()) == min(sp.union, sp.target)
    assert torch.all(union[sp.selected])
    kept_min = plan.stats["sumsq"][sp.selected].min()
    assert torch.all(plan.stats["sumsq"][union & ~sp.selected] <= kept_min)
    print(f"sparse: k={k} union={sp.union} target={sp.target} vNMSE={res.vnmse:.4f} "
          f"bits={res.bits:.3f}")


def test_sparse_union_contains_every_ranks_top_k():
    n = 4
    x = _inputs(n, seed=7, shared_scales=False)
    codec = Sparse(12.0)  # room for the whole union
    p = Pipeline(codec, "butterfly")
    states = {codec: {"k": 3}}
    plan, _ = _plan(p, x, states=states)
    sp = plan.prepared[codec]
    assert sp.k == 3 and sp.union <= sp.target
    for r in range(n):
        norms = (torch.nn.functional.pad(x[r], (0, 20 * 256 - D)).view(20, 256) ** 2).sum(1)
        top = torch.topk(norms, 3).indices
        assert torch.all(sp.selected[top]), r
    res = simulate(p, x, state={codec: {"k": 3}})
    assert torch.count_nonzero(res.results[0].view(-1)[: 19 * 256].view(19, 256).abs()
                               .sum(1)) == int(sp.selected[:19].sum())


def test_sparse_k_adapts_with_momentum():
    n = 4
    codec = Sparse(6.0)
    p = Pipeline(codec, "ring")
    target = codec.target_blocks(D)
    state: dict = {}
    ks, unions = [], []
    for call in range(12):
        x = _inputs(n, seed=100 + call, shared_scales=False)  # fresh gradients every step
        plan, _ = _plan(p, x, call, states=state)
        sp = plan.prepared[codec]
        ks.append(sp.k)
        unions.append(sp.union)
        if call == 0:
            # first call: k = target; the update is 0.8 k + 0.2 k*
            assert sp.k == target
            k_star = codec._k_star(sp.k, sp.union, target, 20)
            assert state[codec]["k"] == pytest.approx(0.8 * target + 0.2 * k_star)
    assert unions[0] > target  # independent top-k's overlap little: the union overshoots
    assert ks[-1] < ks[0]
    assert abs(unions[-1] - target) < abs(unions[0] - target)
    print(f"sparse k: {ks}, union: {unions}, target {target}")


def test_omnireduce_paper_sends_fp16_and_its_bits_follow_the_keep_fraction():
    n = 4
    x = _inputs(n, seed=12, shared_scales=False)
    p = get_pipeline("omnireduce-paper")
    codec = p.codec
    assert codec.wire == "fp16" and codec.keep == 0.25 and codec.statistics == ()
    res = simulate(p, x)
    plan, _ = _plan(p, x)
    sp = plan.prepared[codec]
    blocks = -(-D // 256)
    k = math.ceil(0.25 * blocks)
    # every rank's own top quarter of blocks by norm, and their union travels whole
    energy = (torch.nn.functional.pad(x.double(), (0, blocks * 256 - D))
              .view(n, blocks, 256) ** 2).sum(2)
    union = torch.zeros(blocks, dtype=torch.bool)
    for r in range(n):
        union[torch.sort(-energy[r], stable=True).indices[:k]] = True
    assert sp.k == k and torch.equal(sp.selected, union)
    assert k <= int(union.sum()) <= min(blocks, n * k)
    # bits: 16 per travelling coordinate, the 1-bit-per-block bitmap and the 16-bit maximum
    # of FP16's scale, nothing else
    sel = union.repeat_interleave(256)[:D]
    assert res.bits == pytest.approx((16 * int(sel.sum()) + blocks + 16) / D, abs=1e-12)
    assert res.bits <= 16 * min(1.0, n * 0.25) + (blocks + 16) / D
    # the scale: the power of two that puts n times the largest magnitude just below 65504
    s = sp.scale
    top = float(plan.stats["sparse.absmax"][0])
    assert top >= float(x.abs().max()) and n * top * s <= 65504 < 2 * n * top * s
    # the wire holds FP16 values: a leaf's message is its selected coordinates, scaled, in FP16
    a, b = plan.bounds[0]
    msg = codec.compress(x[1, a:b].contiguous(), plan.context(1, 0))
    want = (x[1, a:b][sel[a:b]] * s).half()
    assert torch.equal(msg.view(torch.int16), want.view(torch.int16))
    # every rank ends with (scaled) FP16 values on the travelling blocks (BF16 would keep 8
    # bits only), and exact zeros elsewhere
    out = res.results[0]
    assert torch.equal((out[sel] * s).half().float(), out[sel] * s)
    assert not torch.equal((out[sel] * s).bfloat16().float(), out[sel] * s)
    assert torch.all(out[~sel] == 0)
    exact = x.double().sum(0)
    # n roundings to FP16, each within 2**-11 of a partial sum (2**-25 / s below FP16's normals)
    bound = n * (2.0**-11 * x.double().abs().sum(0) + 2.0**-25 / s)
    assert torch.all((out[sel].double() - exact[sel]).abs() <= bound[sel])


def test_fp16_wire_saturates_to_infinity_and_keeps_nan():
    codec = Sparse(wire="fp16", keep=1.0)
    x = torch.tensor([1e5, -7e4, 65504.0, 2.9e-8, float("nan"), 1.0] + [0.0] * 250)
    y = torch.empty_like(x)
    codec.decompress(codec.compress(x, HopContext()), y, HopContext())
    assert y[0].item() == math.inf and y[1].item() == -math.inf and y[2].item() == 65504.0
    assert y[3].item() == 0.0 and math.isnan(y[4].item()) and y[5].item() == 1.0


# ================================================================ every baseline pipeline
# loose sanity bounds on the first call's vNMSE for the test data (4 ranks, block scales
# spread over ~3 decades); measured values are printed
VNMSE_BOUND = {"bf16": 1e-4, "mxfp8": 5e-3, "mxfp6": 2e-2, "mxfp4": 0.2, "nvfp4": 0.1,
               "thc": 0.1, "thc-maxscale": 1.0, "omnireduce": 0.05, "omnireduce-paper": 0.05}


def _nominal_bits(name: str) -> float:
    return {"bf16": 16.0, "mxfp8": 8 + 16 * 157 / D, "mxfp6": 6 + 16 * 157 / D,
            "mxfp4": 4 + 16 * 157 / D, "nvfp4": 4 + 16 * 313 / D,
            "thc": (6 * 65536 + 16 + 32) / D, "thc-maxscale": (6 * 65536 + 16 * 256) / D}[name]


@pytest.mark.parametrize("name", NAMES)
def test_baseline_pipeline_sanity(name):
    n = 4
    x = _inputs(n, seed=8)
    t0 = time.perf_counter()
    res = simulate(name, x, track_hops=False)
    seconds = time.perf_counter() - t0
    base = name.removesuffix("-butterfly")
    assert torch.isfinite(res.results).all()
    for r in range(1, n):
        assert_same_bits(res.results[r], res.results[0], f"rank {r}")
    assert res.vnmse < VNMSE_BOUND[base]
    if base == "omnireduce":
        assert 6.0 < res.bits <= 8.0
    elif base == "omnireduce-paper":  # the union of the ranks' top quarters: 4 to 16 bits
        assert 16 * 0.25 < res.bits <= 16 + 36 / D
    else:
        assert res.bits == pytest.approx(_nominal_bits(base), abs=1e-9)
    print(f"{name:22s} vNMSE {res.vnmse:.3e}  bits {res.bits:.4f}  {seconds * 1e3:.1f} ms")


# the region a non-finite input poisons: its shared-scale block (the block maximum is not
# finite), its Hadamard block (the rotation mixes it), or the coordinate alone (BF16 sums)
POISONED = {"mxfp8": 32, "mxfp4": 32, "nvfp4": 16, "thc": 1 << 16, "thc-maxscale": 1 << 16,
            "omnireduce": 1, "omnireduce-paper": 1}


@pytest.mark.parametrize("value", [float("nan"), float("inf")], ids=["nan", "inf"])
@pytest.mark.parametrize("name", [*POISONED, "thc-butterfly"])
def test_non_finite_input_stays_visible_in_its_block(name, value):
    x = _inputs(4, 3000, seed=10)
    x[1, 300] = value
    res = simulate(name, x, track_hops=False)
    b = POISONED[name.removesuffix("-butterfly")]
    want = torch.zeros(3000, dtype=torch.bool)
    want[300 // b * b: 300 // b * b + b] = True
    for r in range(4):
        assert torch.equal(~torch.isfinite(res.results[r]), want), r
        # coded values turn NaN; BF16 and FP16 sums keep an infinity as it is
        if name.startswith("omnireduce") and math.isinf(value):
            assert res.results[r][300].item() == value
        else:
            assert torch.isnan(res.results[r][300])


# ================================================================ gloo: all_reduce == simulate
GLOO_N = 3  # a ring of uneven chunks
GLOO_PIPES = ("mxfp8", "omnireduce", "thc", "nvfp4", "omnireduce-paper")
GLOO_D = 5000
GLOO_TILE = 512


def _gloo_inputs(n: int) -> torch.Tensor:
    return _inputs(n, GLOO_D, seed=9, shared_scales=False)


def _gloo_plan(rank: int, n: int, _barriers: list) -> dict:
    out: dict = {}
    x = _gloo_inputs(n)[rank]
    stats = p2p.P2PStats()
    for name in GLOO_PIPES:
        for call in (0, 1):
            t = x.clone()
            api.all_reduce(t, name, timeout=30, stats=stats)
            out[(name, call)] = (t.numpy().copy(), stats.bytes_sent)
        y = p2p.run_p2p(x.clone(), name, call=7, timeout=30, tile_elems=GLOO_TILE, stats=stats)
        out[(name, "tiled")] = (y.numpy().copy(), stats.bytes_sent)
    return out


@functools.cache
def _gloo_world(n: int) -> list[dict]:
    return world_results(n, _gloo_plan, deadline=180)


@pytest.mark.parametrize("name", GLOO_PIPES)
def test_all_reduce_equals_simulate_over_successive_calls(name):
    res = _gloo_world(GLOO_N)
    x = _gloo_inputs(GLOO_N)
    codec = get_pipeline(name).codec
    state: dict = {}
    for call in (0, 1):  # one state carried across calls, as all_reduce keeps it per tensor
        sim = simulate(name, x, call=call, state=state, track_hops=False)
        for r in range(GLOO_N):
            y, sent = res[r][(name, call)]
            assert_same_bits(torch.from_numpy(y), sim.results[r], f"{name} call {call} rank {r}")
            assert sent == sim.bytes_sent[r]
        if call == 0 and isinstance(codec, SharedScale):
            # the auto-scale factor moved, so call 1 ran with a state that call 0 produced
            assert state[codec]["mu"] != initial_mu(GLOO_N)
        if call == 0 and isinstance(codec, Sparse) and codec.keep is None:
            assert state[codec]["k"] != state[codec]["k_used"]
    sim = simulate(name, x, call=7, track_hops=False)  # fresh state, as a new tiling has
    for r in range(GLOO_N):
        y, sent = res[r][(name, "tiled")]
        assert_same_bits(torch.from_numpy(y), sim.results[r], f"{name} tiled rank {r}")
        assert sent == sim.bytes_sent[r]
