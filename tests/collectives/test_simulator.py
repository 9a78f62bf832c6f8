"""The in-process simulator: agreement across ranks, error bounds, accounting, NaN policy, bias.

Every pipeline below runs for n in {1, 2, 3, 4, 8} virtual ranks (butterfly only for powers of
two, the two-level hierarchy only for even n) on d = 1000 coordinates: not a multiple of any
block size (partial last blocks) and, for n = 8 with 256-coordinate blocks, fewer blocks than
chunks (empty chunks).

"Equal" always means bit for bit (float32 compared through ``view(int32)``).

Speed: the Numba kernels are ``parallel=True``. When other processes keep the CPUs busy, every
parallel region waits for descheduled worker threads (measured: ~6 ms per kernel call on a loaded
2-core machine, against ~10 us on one thread), far more than the work on one chunk, and this
file would take minutes. It therefore runs the kernels on one thread (fixture
``one_numba_thread``);
``test_results_do_not_depend_on_numba_threads`` checks that the thread count changes no bit.
"""

from __future__ import annotations

import functools
import itertools
import math
from fractions import Fraction

import numba
import numpy as np
import pytest
import torch

from dynamiq import (
    BlockQuantizer,
    Butterfly,
    Hierarchical,
    Pipeline,
    Requant,
    Ring,
    get_pipeline,
    simulate,
)
from dynamiq.collectives.engine import Plan, RankState, chunk_bounds

D = 1000
NS = (1, 2, 3, 4, 8)
PIPES = {
    "passthrough-fp32": "passthrough-fp32",
    "passthrough-bf16": "passthrough-bf16",
    "requant-dq4": "requant-dq4",
    "requant-mxfp8": "requant-mxfp8",
    "rht+requant": "rht+requant(quantizer=dq4_hier)@ring",
    "butterfly": "requant-dq4-butterfly",
    "hier2": "requant-dq4-hier2",
}
LOSSY = [k for k in PIPES if k not in ("passthrough-fp32", "passthrough-bf16")]


pytestmark = pytest.mark.usefixtures("one_numba_thread")


def _supported(key: str, n: int) -> bool:
    return get_pipeline(PIPES[key]).topology.supports(n)


CASES = [(k, n) for k in PIPES for n in NS if _supported(k, n)]
IDS = [f"{k}-n{n}" for k, n in CASES]


def _inputs(n: int, d: int, seed: int = 0) -> torch.Tensor:
    """Heavy-tailed float32 gradients, a different vector per rank."""
    rs = np.random.default_rng([seed, n, d])
    x = rs.standard_normal((n, d)) * np.exp(rs.standard_normal((n, d)))
    return torch.from_numpy(x.astype(np.float32))


def _bits(t: torch.Tensor) -> torch.Tensor:
    assert t.dtype == torch.float32
    return t.contiguous().view(torch.int32)


def assert_same_bits(a: torch.Tensor, b: torch.Tensor, what: str = "") -> None:
    assert a.shape == b.shape, (what, a.shape, b.shape)
    bad = torch.nonzero(_bits(a) != _bits(b)).flatten()
    assert bad.numel() == 0, f"{what}: {bad.numel()} values differ, first at {int(bad[0])}"


@functools.cache
def _run(key: str, n: int, d: int = D, op: str = "sum", call: int = 0):
    """``(inputs, copy of the inputs made before the call, result)``, computed once per case."""
    x = _inputs(n, d)
    before = x.clone()
    res = simulate(PIPES[key], x, op=op, call=call, track_hops=True)
    return x, before, res


def _reduce_steps(topology, n: int) -> int:
    """Reduce steps of a schedule, from the topologies' definitions."""
    if n == 1:
        return 0
    if isinstance(topology, Ring):
        return n - 1
    if isinstance(topology, Butterfly):
        return int(math.log2(n))
    assert isinstance(topology, Hierarchical)
    p = topology.ranks_per_node
    return _reduce_steps(topology.inner_topology, p) + _reduce_steps(topology.outer_topology,
                                                                      n // p)


def _expected_bytes(p: Pipeline, n: int, d: int) -> list[int]:
    """Bytes each rank sends: the sum of ``wire_bytes(chunk size)`` over its transfers."""
    if n == 1:
        return [0]
    length = d
    for t in p.transforms:
        length = t.padded_length(length)
    sched = p.topology.schedule(n)
    bounds = chunk_bounds(sched.chunk_weights, length, p.block_size)
    assert bounds[0][0] == 0 and bounds[-1][1] == length
    assert all(a1 == b0 for (_, a1), (b0, _) in itertools.pairwise(bounds))
    levels = sched.levels or (None,) * len(sched.transfers)
    sent = [0] * n
    for t, level in zip(sched.transfers, levels):
        size = bounds[t.chunk][1] - bounds[t.chunk][0]
        if size:  # empty chunks are not sent
            codec = p.codec if t.phase == "gather" else p.codec_for(level)
            sent[t.src] += codec.wire_bytes(size)
    return sent


# ---------------------------------------------------------------- agreement and accounting
@pytest.mark.parametrize(("key", "n"), CASES, ids=IDS)
def test_all_ranks_agree_bit_for_bit(key, n):
    _, _, res = _run(key, n)
    assert res.results.shape == (n, D) and res.results.dtype == torch.float32
    for r in range(1, n):
        assert_same_bits(res.results[r], res.results[0], f"rank {r} vs rank 0")


@pytest.mark.parametrize(("key", "n"), CASES, ids=IDS)
def test_every_rank_decodes_the_gathered_bytes_as_the_first_did(key, n, monkeypatch):
    """The simulator decodes each chunk's all-gather bytes once and copies the values to the
    other ranks; decoding them on every rank instead gives the same bits."""
    copies = []

    def decode_and_compare(self, t, data, decoded):
        self.receive(t, data)
        assert_same_bits(self.values(t.chunk), decoded, f"chunk {t.chunk} on rank {self.rank}")
        copies.append(t)

    _, _, res = _run(key, n)
    monkeypatch.setattr(RankState, "receive_decoded", decode_and_compare)
    again = simulate(PIPES[key], _inputs(n, D), track_hops=True)
    assert_same_bits(again.results, res.results, "decoded everywhere vs copied")
    assert copies or n <= 2 or not any(t.phase == "gather"
                                       for t in PIPES[key].topology.schedule(n).transfers)


def test_only_gathered_values_are_copied():
    plan = Plan(get_pipeline("mxfp8"), 4, 1024)
    rs = RankState(plan, 0, torch.zeros(1024))
    reduce = next(t for t in plan.schedule.transfers if t.phase == "reduce" and t.dst == 0)
    with pytest.raises(ValueError, match="all-gather"):
        rs.receive_decoded(reduce, torch.zeros(1, dtype=torch.uint8), torch.zeros(1))


@pytest.mark.parametrize(("key", "n"), CASES, ids=IDS)
def test_caller_inputs_are_not_modified(key, n):
    x, before, _ = _run(key, n)
    assert_same_bits(x, before, "inputs after simulate")


@pytest.mark.parametrize(("key", "n"), CASES, ids=IDS)
def test_reported_fields_are_consistent(key, n):
    x, _, res = _run(key, n)
    exact = x.double().sum(0)
    assert res.exact.dtype == torch.float64 and torch.equal(res.exact, exact)
    vn = float(((res.results[0].double() - exact) ** 2).sum() / (exact**2).sum())
    assert res.vnmse == pytest.approx(vn, rel=1e-12, abs=0)
    assert res.seconds > 0


@pytest.mark.parametrize(("key", "n"), CASES, ids=IDS)
def test_bits_per_coord_counts_every_send(key, n):
    _, _, res = _run(key, n)
    want = _expected_bytes(get_pipeline(PIPES[key]), n, D)
    assert res.bytes_sent == want
    assert res.bits_per_coord == [8 * b / D for b in want]


FLAT = [(k, n) for k, n in CASES if k != "hier2" and n > 1]


@pytest.mark.parametrize(("key", "n"), FLAT, ids=[f"{k}-n{n}" for k, n in FLAT])
def test_bits_per_coord_of_ring_and_butterfly(key, n):
    # With d a multiple of n * 256, every chunk holds d/n coordinates, a whole number of blocks,
    # so its wire size is exactly (d/n) * b / 8 bytes (b: the codec's asymptotic bits per
    # coordinate; no padding, and every section of a payload grows linearly in whole blocks).
    # Each rank sends n - 1 chunks in the reduce phase and n - 1 in the gather phase (ring: one
    # per step for 2(n - 1) steps; butterfly: n/2 + n/4 + ... + 1 per phase), hence
    # 8 * 2(n - 1)(d/n) b/8 / d = 2(n - 1)/n * b bits per coordinate.
    d = n * 256 * 2
    p = get_pipeline(PIPES[key])
    codec = p.codec
    b = Fraction(codec.quantizer.bits_per_coord()) if isinstance(codec, Requant) else Fraction(
        8 * codec.wire_bytes(1)
    )
    _, _, res = _run(key, n, d)
    for r in range(n):
        assert Fraction(8 * res.bytes_sent[r], d) == Fraction(2 * (n - 1), n) * b, r


@pytest.mark.parametrize(("key", "n"), CASES, ids=IDS)
def test_one_hop_error_per_reduce_step(key, n):
    _, _, res = _run(key, n)
    p = get_pipeline(PIPES[key])
    steps = _reduce_steps(p.topology, n)
    if n > 1:  # cross-check with the schedule itself
        sched = p.topology.schedule(n)
        assert steps == len({t.step for t in sched.transfers if t.phase == "reduce"})
    assert len(res.hop_vnmse) == steps
    assert all(math.isfinite(e) and e >= 0 for e in res.hop_vnmse)
    if key == "passthrough-fp32":
        assert all(e < 1e-9 for e in res.hop_vnmse)  # float32 rounding of partial sums only
    elif key in LOSSY and key != "hier2":
        assert all(e > 0 for e in res.hop_vnmse)


def test_track_hops_off_reports_no_hop_errors():
    x = _inputs(4, D)
    res = simulate("requant-dq4", x, track_hops=False)
    assert res.hop_vnmse == []
    assert_same_bits(res.results, _run("requant-dq4", 4)[2].results, "track_hops changes results")


# ---------------------------------------------------------------- accuracy
@pytest.mark.parametrize("n", NS)
def test_passthrough_fp32_is_within_float32_summation_error(n):
    # Lossless wire: each result is the float32 sum of the n inputs, in the order of the
    # aggregation tree (n - 1 additions, each rounded to nearest). For any summation order,
    # |fl(sum) - sum| <= (n - 1) u sum_r |x_r| with u = 2**-24 (Jeannerod & Rump 2013; the
    # classical gamma_{n-1} bound is the same to first order), as long as nothing overflows.
    # The float64 reference itself is off by at most (n - 1) 2**-53 sum_r |x_r|, hence the slack.
    x, _, res = _run("passthrough-fp32", n)
    exact = x.double().sum(0)
    bound = (n - 1) * (2.0**-24 + 2.0**-52) * x.double().abs().sum(0)
    err = (res.results[0].double() - exact).abs()
    worst = int(torch.argmax(err - bound))
    assert err[worst] <= bound[worst], (worst, float(err[worst]), float(bound[worst]))


@pytest.mark.parametrize(("key", "n"), CASES, ids=IDS)
def test_avg_is_sum_divided_by_n(key, n):
    _, _, s = _run(key, n)
    _, _, a = _run(key, n, op="avg")
    assert_same_bits(a.results, s.results / n, "avg vs sum / n")
    assert torch.equal(a.exact, s.exact / n)
    assert a.bytes_sent == s.bytes_sent


# ---------------------------------------------------------------- NaN / Inf
def _affected(key: str, n: int, i: int, d: int) -> torch.Tensor:
    """Where a non-finite input at coordinate ``i`` may (and must) show up in the result.

    Lossless or BF16 wires add element by element: only coordinate ``i``. A requantizing
    codec flags the whole block (super-group or group) holding a non-finite value, every later
    hop adds and re-encodes that block, and a Hadamard block mixes its coordinates; the blocks
    are aligned (chunk bounds are multiples of the pipeline's block size), so the region is the
    aligned block of the largest of these sizes. With one rank nothing is coded at all.
    """
    p = get_pipeline(PIPES[key])
    b = 1 if n == 1 else max([p.block_size] + [t.block_size for t in p.transforms])
    mask = torch.zeros(d, dtype=torch.bool)
    mask[i // b * b : min(d, (i // b + 1) * b)] = True
    return mask


@pytest.mark.parametrize("value", [float("nan"), float("inf")], ids=["nan", "inf"])
@pytest.mark.parametrize(("key", "n"), CASES, ids=IDS)
def test_non_finite_input_stays_in_its_block(key, n, value):
    i = 300 if math.isnan(value) else 990  # a full block, and the partial last block
    x = _inputs(n, D)
    x[n - 1, i] = value
    res = simulate(PIPES[key], x)
    want = _affected(key, n, i, D)
    for r in range(n):
        got = ~torch.isfinite(res.results[r])
        assert torch.equal(got, want), (
            f"rank {r}: non-finite at {torch.nonzero(got).flatten().tolist()[:8]}..., "
            f"expected {torch.nonzero(want).flatten()[[0, -1]].tolist()}"
        )


# ---------------------------------------------------------------- randomness
@pytest.mark.parametrize("key", list(PIPES))
def test_simulation_is_deterministic(key):
    n = 4
    x = _inputs(n, D)
    a = simulate(PIPES[key], x, call=7)
    b = simulate(PIPES[key], x.clone(), call=7)
    assert_same_bits(a.results, b.results, "same call, same inputs")
    assert a.bytes_sent == b.bytes_sent and a.hop_vnmse == b.hop_vnmse
    c = simulate(PIPES[key], x, call=8)
    # a new call draws new random numbers: stochastic rounding, the Hadamard signs. MXFP8
    # rounds to nearest and has no transform, so like passthrough it does not depend on the call.
    p = get_pipeline(PIPES[key])
    random = bool(p.transforms) or (
        isinstance(p.codec, Requant) and p.codec.quantizer.rounding != "nearest"
    )
    assert random == (key not in ("passthrough-fp32", "passthrough-bf16", "requant-mxfp8"))
    assert random == (not torch.equal(_bits(c.results), _bits(a.results))), key
    assert c.bytes_sent == a.bytes_sent


def test_results_do_not_depend_on_numba_threads():
    x = _inputs(4, 3000)
    one = simulate("requant-dq4", x, call=3)
    numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
    try:
        many = simulate("requant-dq4", x, call=3)
    finally:
        numba.set_num_threads(1)
    assert_same_bits(many.results, one.results, "1 thread vs all threads")


def test_list_inputs_equal_stacked_inputs():
    x = _inputs(3, D)
    a = simulate("requant-dq4", list(x))
    assert_same_bits(a.results, _run("requant-dq4", 3)[2].results, "list of tensors")


def test_unsupported_world_size_is_rejected():
    with pytest.raises(ValueError, match="power-of-two"):
        simulate("requant-dq4-butterfly", _inputs(3, D))
    with pytest.raises(ValueError, match="divisible by ranks_per_node=2"):
        simulate("requant-dq4-hier2", _inputs(3, D))
    with pytest.raises(ValueError, match="op must be"):
        simulate("requant-dq4", _inputs(2, D), op="max")


def _bias_z(pipeline: Pipeline | str, x: torch.Tensor, calls: int) -> tuple[float, float]:
    """Global and worst per-block z-statistics of the mean error of the result over calls.

    Each call draws fresh random numbers (the call counter is part of every stream), so the
    per-call errors are i.i.d. Within a call, blocks are coded independently but the coordinates
    of a block share stochastically rounded scales, so errors are summed per block first. Under
    unbiasedness each block's mean error over ``calls`` has standard error sqrt(var / calls)
    (var: the sample variance across calls), so each z is ~N(0, 1) by the CLT (a t with
    calls - 1 degrees of freedom, close to normal for ~200 calls).
    """
    p = get_pipeline(pipeline)
    exact = x.double().sum(0)
    errs = []
    for call in range(calls):
        res = simulate(p, x, call=call, track_hops=False)
        errs.append((res.results[0].double() - exact).reshape(-1, p.block_size).sum(1))
    e = torch.stack(errs).numpy()
    mean, var = e.mean(0), e.var(0, ddof=1)
    assert (var > 0).all()
    z_global = mean.sum() / np.sqrt(var.sum() / calls)
    z_block = np.max(np.abs(mean) / np.sqrt(var / calls))
    return float(z_global), float(z_block)


def test_requant_dq4_is_unbiased_over_calls():
    # n = 3 ranks on a ring: every chunk passes a leaf, an internal node and the owner, i.e.
    # three stochastic requantizations; 6 blocks of 256.
    x = _inputs(3, 6 * 256, seed=1)
    zg, zb = _bias_z("requant-dq4", x, 200)
    # |N(0,1)| > 5 has probability 6e-7; the largest of 6 exceeds 5.5 w.p. < 3e-7
    assert abs(zg) < 5.0, zg
    assert zb < 5.5, zb


def test_bias_statistic_detects_a_biased_pipeline():
    # stochastic elements under an OCP (round-down) scale saturate the largest values: biased
    q = BlockQuantizer("e2m1", group_size=32, scale="e8m0", rounding="stochastic",
                       scale_rounding="ocp")
    assert not q.unbiased
    zg, zb = _bias_z(Pipeline(Requant(q), "ring"), _inputs(3, 6 * 256, seed=1), 200)
    assert abs(zg) > 10 or zb > 10, (zg, zb)


# ---------------------------------------------------------------- scale
@pytest.mark.slow
def test_smoke_64_ranks():
    n, d = 64, 2**16
    x = _inputs(n, d)
    res = simulate("requant-dq4", x)
    assert all(torch.equal(_bits(res.results[r]), _bits(res.results[0])) for r in range(n))
    assert math.isfinite(res.vnmse) and 0 < res.vnmse < 1
    assert len(res.hop_vnmse) == n - 1
    bpc = Fraction(2 * (n - 1), n) * Fraction(Requant("dq4_hier").quantizer.bits_per_coord())
    assert all(Fraction(8 * b, d) == bpc for b in res.bytes_sent)


@pytest.mark.parametrize("topology,n", [("ring", 5), ("butterfly", 8),
                                        ("hierarchical(ranks_per_node=2)", 8)])
def test_schedule_child_counts_match_children(topology, n):
    sched = Plan(Pipeline.parse(f"passthrough@{topology}"), n, 4096).schedule
    for c in range(sched.num_chunks):
        for r in range(n):
            assert sched.child_counts[c][r] == len(sched.children(c, r))
