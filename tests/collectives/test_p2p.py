"""The P2P executor and ``all_reduce`` over gloo on localhost, against the simulator and torch.

Each world size is spawned once (processes are the expensive part on a 2-core machine); its
ranks run every check of a plan in one go and send plain Python/numpy results back through a
queue. The test functions then compare those results, in this process, with
:func:`dynamiq.simulate` on the same inputs.
"""

from __future__ import annotations

import functools
import math
import time

import numpy as np
import pytest
import torch
import torch.distributed as dist
from _world import world_results

from dynamiq.codecs import CODECS, Passthrough
from dynamiq.collectives import agreement, api, p2p
from dynamiq.collectives.simulator import simulate
from dynamiq.collectives.tiling import default_tile
from dynamiq.pipeline import get_pipeline
from dynamiq.registry import UnknownNameError


@CODECS.register("test_p2p_stats_probe")
class _StatsProbe(Passthrough):
    """fp32 passthrough declaring metadata statistics (registered in every spawned rank too)."""

    statistics = ("absmax", "sum", "sumsq")

    @classmethod
    def examples(cls) -> list:
        return [cls()]  # one instance: its spec does not carry the wire

    def spec(self) -> str:
        return "test_p2p_stats_probe"


PROBE = "test_p2p_stats_probe@ring"
D = 10_000  # not a multiple of the 256-element block: exercises padded tails
TILE = 512  # forced tile size: several tiles per chunk at D, for every world size used
SHORT = 3.0  # seconds a rank waits for an absent peer in the timeout checks
SIZES = {"bf16": (50, 37), "fp16": (41, 43), "avg": 3000, "async": 2999, "nan": 2000,
         "spec": 1024, "numel": (1500, 1400), "dtype": 1300, "after": 100, "stall": 777,
         "stats": (1600, 1700), "checks": 2500}


def _inputs(n: int, d: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * seed + n)
    return torch.randn(n, d, generator=g) * torch.logspace(-2, 2, d)


def _pipelines(n: int) -> list[str]:
    names = ["requant-dq4"]
    if n & (n - 1) == 0:
        names.append("requant-dq4-butterfly")
    if n % 2 == 0:
        names.append("requant-dq4-hier2")
    return names


def _record(out: dict, key: str, fn) -> None:
    try:
        out[key] = ("ok", fn())
    except Exception as e:
        out[key] = ("err", type(e).__name__, str(e))


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().float().reshape(-1).numpy().copy()


def _reduced(x: torch.Tensor, name: str, stats: p2p.P2PStats | None = None) -> np.ndarray:
    t = x.clone()
    api.all_reduce(t, name, timeout=30, stats=stats)
    return _np(t)


# ---- what the ranks run -----------------------------------------------------------------------
def _plan_main(rank: int, n: int, out: dict) -> None:
    x = _inputs(n, D)[rank]

    def ours(name):
        stats = p2p.P2PStats()
        return _reduced(x, name, stats), stats.bytes_sent

    def theirs():
        t = x.clone()
        dist.all_reduce(t)
        return _np(t)

    def tiled(name):
        stats = p2p.P2PStats()
        y = p2p.run_p2p(x, name, call=7, timeout=30, tile_elems=TILE, stats=stats)
        return _np(y), stats.bytes_sent, stats.messages_sent

    _record(out, "passthrough-fp32", lambda: ours("passthrough-fp32"))
    _record(out, "torch", theirs)
    # the direct path (messages are slices of the accumulator), cut into many tiles
    _record(out, "passthrough-fp32/tiled", lambda: tiled("passthrough-fp32"))
    for name in _pipelines(n):
        _record(out, f"{name}/0", lambda name=name: ours(name))
        _record(out, f"{name}/tiled", lambda name=name: tiled(name))
        untiled = p2p.P2PStats()
        p2p.run_p2p(x, name, call=7, timeout=30, stats=untiled)  # to count its messages
        out[f"{name}/messages"] = untiled.messages_sent
    _record(out, "requant-dq4/1", lambda: ours("requant-dq4"))  # second call: call 1

    def probe():
        stats = p2p.P2PStats()
        y = _reduced(x, PROBE, stats)
        return y, {k: v.double().numpy().copy() for k, v in (stats.stats or {}).items()}

    _record(out, "probe", probe)

    def checks():
        """Which calls exchange the fingerprint, and the time split of each."""
        xc = _inputs(n, SIZES["checks"], 15)[rank]
        seen = []
        for op in ("sum", "sum", "avg", "sum"):
            stats = p2p.P2PStats()
            t = xc.clone()
            api.all_reduce(t, "passthrough-fp32", op=op, timeout=30, stats=stats)
            seen.append((stats.checked, stats.metadata_seconds, stats.codec_seconds,
                         stats.wire_seconds, stats.wait_seconds, stats.seconds, _np(t)))
        api.reset_call_counters()
        stats = p2p.P2PStats()
        api.all_reduce(xc.clone(), "passthrough-fp32", timeout=30, stats=stats)
        seen.append((stats.checked, stats.metadata_seconds, stats.codec_seconds,
                     stats.wire_seconds, stats.wait_seconds, stats.seconds, None))
        stats = p2p.P2PStats()
        api.all_reduce(xc.clone(), PROBE, timeout=30, stats=stats)  # exchanges statistics
        api.all_reduce(xc.clone(), PROBE, timeout=30, stats=stats)
        seen.append((stats.checked, stats.metadata_seconds, stats.codec_seconds,
                     stats.wire_seconds, stats.wait_seconds, stats.seconds, None))
        return seen

    _record(out, "checks", checks)

    def steady_allocations():
        """Bytes of tensor memory one steady-state call allocates (FP32, in place)."""
        t = x.clone()
        for _ in range(2):  # programs, buffers and the agreement are set up here
            api.all_reduce(t, "passthrough-fp32", timeout=30)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                    profile_memory=True) as prof:
            api.all_reduce(t, "passthrough-fp32", timeout=30)
        return sum(e.cpu_memory_usage for e in prof.events() if e.cpu_memory_usage > 0)

    _record(out, "allocations", steady_allocations)


def _plan_features(rank: int, n: int, out: dict) -> None:
    def low_precision(dtype, shape, name, seed):
        t = _inputs(n, math.prod(shape), seed)[rank].reshape(shape).to(dtype)
        api.all_reduce(t, name, timeout=30)
        return _np(t), str(t.dtype), tuple(t.shape)

    _record(out, "bf16", lambda: low_precision(torch.bfloat16, SIZES["bf16"], "requant-dq4", 2))
    _record(out, "fp16", lambda: low_precision(torch.float16, SIZES["fp16"], "passthrough-fp32",
                                               3))

    xa = _inputs(n, SIZES["avg"], 4)[rank]

    def avg(op):
        t = xa.clone()
        api.all_reduce(t, "requant-dq4", op=op, timeout=30)
        return _np(t)

    _record(out, "avg/0", lambda: avg("avg"))
    _record(out, "avg/1", lambda: avg(dist.ReduceOp.AVG))

    def asynchronous():
        xs = [_inputs(n, SIZES["async"], 5 + i)[rank] for i in range(3)]
        ts = [x.clone() for x in xs]
        w0 = api.all_reduce(ts[0], "requant-dq4", async_op=True, timeout=30)
        w1 = api.all_reduce(ts[1], "requant-dq4", async_op=True, timeout=30)
        api.all_reduce(ts[2], "requant-dq4", timeout=30)  # waits for both: issue order kept
        done = (w0.is_completed(), w1.is_completed())
        return [_np(t) for t in ts], done, w0.wait(), w1.wait()

    _record(out, "async", asynchronous)

    xn = _inputs(n, SIZES["nan"], 8)[rank]
    if rank == 0:
        xn[5] = float("nan")
    for name in ("passthrough-fp32", "requant-dq4"):
        _record(out, f"nan/{name}", lambda name=name: _reduced(xn, name))

    def failing(name, size, dtype=torch.float32):
        t = _inputs(n, size, 9)[rank].to(dtype)
        before = t.clone()
        try:
            api.all_reduce(t, name, timeout=30)
            return ("no error", None, torch.equal(t, before))
        except Exception as e:
            return (type(e).__name__, str(e), torch.equal(t, before))

    out["spec"] = failing("requant-dq4" if rank == 0 else "requant-dq8", SIZES["spec"])
    out["numel"] = failing("requant-dq4", SIZES["numel"][rank % 2])
    out["dtype"] = failing("requant-dq4", SIZES["dtype"],
                           torch.bfloat16 if rank == 0 else torch.float32)
    xs = _inputs(n, SIZES["after"], 10)[rank]
    _record(out, "after", lambda: _reduced(xs, "passthrough-fp32"))

    def stats_filled():
        """A refused call leaves the caller's stats alone; an asynchronous one fills them
        once ``wait()`` returns."""
        stats = p2p.P2PStats()
        t = _inputs(n, SIZES["stats"][rank % 2], 13)[rank]
        try:
            api.all_reduce(t, "requant-dq4", timeout=30, stats=stats)
            error = None
        except Exception as e:
            error = type(e).__name__
        unchanged = stats == p2p.P2PStats()
        t = _inputs(n, SIZES["stats"][0], 14)[rank]
        api.all_reduce(t, "requant-dq4", async_op=True, timeout=30, stats=stats).wait()
        return error, unchanged, (stats.rank, stats.world_size, stats.numel, stats.call,
                                  stats.bytes_sent, stats.messages_sent)

    _record(out, "stats", stats_filled)


def _plan_group(rank: int, n: int, out: dict) -> None:
    """Two disjoint subgroups (even and odd ranks) reduce at the same time."""
    groups = [dist.new_group(list(range(parity, n, 2))) for parity in (0, 1)]
    x = _inputs(n, D, 12)[rank]

    def reduce_in_group():
        t = x.clone()
        api.all_reduce(t, "requant-dq4", group=groups[rank % 2], timeout=30)
        return _np(t), dist.get_rank(groups[rank % 2])

    _record(out, "group", reduce_in_group)


def _plan_stall(rank: int, n: int, out: dict) -> None:
    """Rank n-1 joins the metadata check of a call, then sends nothing."""
    size = SIZES["stall"]
    if rank == n - 1:
        agreement.check_call(None, rank, n, torch.device("cpu"), 30, numel=size,
                             dtype=torch.float32, pipeline=str(get_pipeline("requant-dq4")),
                             op="sum", call=0,
                             tile_elems=default_tile(get_pipeline("requant-dq4"), size, n))
        out["stall"] = ("absent",)
        return
    out["stall"] = _timed_failure(rank, n, size)


def _plan_absent(rank: int, n: int, out: dict) -> None:
    """Rank n-1 never calls all_reduce."""
    out["absent"] = ("absent",) if rank == n - 1 else _timed_failure(rank, n, SIZES["stall"] + 1)


def _timed_failure(rank: int, n: int, size: int):
    t = _inputs(n, size, 11)[rank]
    before = t.clone()
    t0 = time.perf_counter()
    try:
        api.all_reduce(t, "requant-dq4", timeout=SHORT)
        return ("no error", None, 0.0, True)
    except Exception as e:
        return (type(e).__name__, str(e), time.perf_counter() - t0, torch.equal(t, before))


_PLANS = {"main": _plan_main, "features": _plan_features, "group": _plan_group,
          "stall": _plan_stall, "absent": _plan_absent}


def _run_plans(rank: int, n: int, barriers: list, plans: tuple[str, ...]) -> dict:
    out: dict = {}
    for plan in plans:
        _PLANS[plan](rank, n, out)
        # keeps an absent rank alive (its link open) until the others have timed out
        barriers[0].wait(timeout=120)
    return out


@functools.cache
def _world(n: int, plans: tuple[str, ...]) -> list[dict]:
    """Every rank's results of running ``plans`` in a fresh gloo world of ``n`` processes."""
    return world_results(n, _run_plans, (plans,), barriers=(n,))


WORLDS = {1: ("main", "features"), 2: ("main", "features", "stall"), 3: ("main", "absent"),
          4: ("main", "group"), 8: ("main",)}
SIZES_N = [1, 2, 3, 4, pytest.param(8, marks=pytest.mark.slow)]


def _ok(res: dict, key: str):
    status, *rest = res[key]
    assert status == "ok", f"{key}: {rest[0]}: {rest[1]}"
    return rest[0]


def _same_bits(a: np.ndarray, b) -> bool:
    b = np.asarray(b, dtype=np.float32)
    return a.shape == b.shape and np.array_equal(a.view(np.int32), b.view(np.int32))


# ---- tests ------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", SIZES_N)
def test_passthrough_matches_torch_within_fp32_rounding(n):
    res = _world(n, WORLDS[n])
    x = _inputs(n, D)
    exact = x.double().sum(0).numpy()
    # Both executors add the same n float32 terms in some order with float32 roundings; any
    # such recursive sum obeys |computed - exact| <= gamma_{n-1} * sum_i |x_i| with
    # gamma_k = k*u/(1 - k*u) and u = 2**-24 (Higham, Accuracy and Stability, eq. 4.4). The two
    # results may then differ by twice that.
    u = 2.0**-24
    gamma = (n - 1) * u / (1 - (n - 1) * u)
    bound = gamma * x.double().abs().sum(0).numpy()
    ref = res[0]["torch"][1]
    for r in range(n):
        ours = _ok(res[r], "passthrough-fp32")[0]
        assert _same_bits(ours, _ok(res[0], "passthrough-fp32")[0])
        assert np.all(np.abs(ours - exact) <= bound)
        assert np.all(np.abs(ours - ref) <= 2 * bound)
    assert np.all(np.abs(ref - exact) <= bound)


@pytest.mark.parametrize("n", SIZES_N)
def test_requant_equals_simulator_bit_for_bit(n):
    res = _world(n, WORLDS[n])
    x = _inputs(n, D)
    keys = [f"{name}/0" for name in _pipelines(n)] + ["requant-dq4/1"]
    for key in keys:
        name, call = key.split("/")
        sim = simulate(name, x, call=int(call))
        for r in range(n):
            y, sent = _ok(res[r], key)
            assert _same_bits(y, sim.results[r].numpy()), f"{key}, rank {r}"
            assert _same_bits(y, _ok(res[0], key)[0])
            assert sent == sim.bytes_sent[r]
            assert 8 * sent / D == sim.bits_per_coord[r]
    if n > 1:  # the call counter draws fresh random numbers
        assert not _same_bits(_ok(res[0], "requant-dq4/0")[0], _ok(res[0], "requant-dq4/1")[0])


@pytest.mark.parametrize("n", SIZES_N)
def test_metadata_statistics_reach_every_rank(n):
    res = _world(n, WORLDS[n])
    x = _inputs(n, D)
    sim = simulate(PROBE, x)
    for r in range(n):
        y, stats = _ok(res[r], "probe")
        assert _same_bits(y, sim.results[r].numpy())
        if n == 1:
            continue  # world size 1 is a copy: no exchange, no metadata
        assert set(stats) == {"absmax", "sum", "sumsq"}
        for name, v in stats.items():
            want = sim.stats[name].numpy()
            # max is exact; float64 sums of n float32 terms differ only by summation order
            assert np.allclose(v, want, rtol=1e-12, atol=1e-9), name
            assert np.array_equal(v, _ok(res[0], "probe")[1][name]), "ranks disagree"


@pytest.mark.parametrize("n", SIZES_N)
def test_tiled_messages_equal_simulator(n):
    res = _world(n, WORLDS[n])
    x = _inputs(n, D)
    for name in _pipelines(n):
        sim = simulate(name, x, call=7)
        for r in range(n):
            y, sent, messages = _ok(res[r], f"{name}/tiled")
            assert _same_bits(y, sim.results[r].numpy()), f"{name}, rank {r}"
            assert sent == sim.bytes_sent[r]
            if n > 1:
                assert messages > res[r][f"{name}/messages"]  # really cut into tiles


@pytest.mark.parametrize("n", SIZES_N)
def test_direct_passthrough_equals_simulator_when_tiled(n):
    res = _world(n, WORLDS[n])
    sim = simulate("passthrough-fp32", _inputs(n, D), call=7)
    for r in range(n):
        y, sent, messages = _ok(res[r], "passthrough-fp32/tiled")
        assert _same_bits(y, sim.results[r].numpy()), f"rank {r}"
        assert sent == sim.bytes_sent[r]
        if n > 1:
            assert messages >= 2 * (n - 1) * (D // n // TILE)  # really cut into tiles


@pytest.mark.parametrize("n", SIZES_N)
def test_fingerprint_is_exchanged_once_per_kind_and_time_is_split(n):
    res = _world(n, WORLDS[n])
    seen = _ok(res[0], "checks")
    # sum (new), sum (agreed), avg (new), sum (agreed), sum after reset_call_counters (new),
    # then the second call of a pipeline with statistics (agreed)
    assert [c for c, *_ in seen] == ([True, False, True, False, True, False] if n > 1 else
                                     [False] * 6)
    for i, (checked, meta, codec, wire, waiting, total, _) in enumerate(seen):
        assert min(meta, codec, wire, waiting) >= 0
        assert meta + codec + wire + waiting <= total
        if n > 1:
            # passthrough has no statistics: only the fingerprint check takes metadata time;
            # the probe exchanges its statistics on every call
            assert (meta > 0) == (checked or i == len(seen) - 1)
            assert wire > 0 and waiting > 0
    xc = _inputs(n, SIZES["checks"], 15)
    want = simulate("passthrough-fp32", xc).results
    for r in range(n):
        ys = [v[-1] for v in _ok(res[r], "checks")[:4]]
        assert all(_same_bits(y, want[r].numpy()) for y in (ys[0], ys[1], ys[3]))
        assert _same_bits(ys[2], (want[r] / n).numpy())


@pytest.mark.parametrize("n", SIZES_N)
def test_steady_state_calls_allocate_no_tensor_memory(n):
    res = _world(n, WORLDS[n])
    for r in range(n):
        assert _ok(res[r], "allocations") == 0


def test_programs_of_identity_codecs_receive_into_the_accumulator():
    from dynamiq.collectives.buffers import build_program, is_identity
    from dynamiq.collectives.tiling import build_layout

    assert is_identity(get_pipeline("passthrough-fp32"))
    assert not is_identity(get_pipeline("passthrough-bf16"))
    assert not is_identity(get_pipeline(PROBE))  # a subclass may code differently
    for name, direct in (("passthrough-fp32", True), ("requant-dq4", False)):
        layout = build_layout(get_pipeline(name), 4, 4096, 512)
        for rank in range(4):
            prog = build_program(layout, rank, torch.device("cpu"))
            assert prog.direct == direct
            gathers = [b for st in prog.steps for t, b in zip(st.recvs, st.bufs)
                       if t.phase == "gather"]
            assert gathers and all((b is None) == direct for b in gathers)
            assert (prog.pools[2].numel() == 0) == direct
            for prev, st in zip(prog.steps, prog.steps[1:]):
                # a send waits for the receive of its own chunk in the step before
                for t, need in zip(st.sends, st.ready):
                    got = [k + 1 for k, u in enumerate(prev.recvs) if u.chunk == t.chunk]
                    assert need >= max(got, default=0)
                assert st.ready == sorted(st.ready)


@pytest.mark.parametrize("n", [1, 2])
def test_low_precision_avg_and_async(n):
    res = _world(n, WORLDS[n])
    for key, dtype, seed, name in (("bf16", torch.bfloat16, 2, "requant-dq4"),
                                   ("fp16", torch.float16, 3, "passthrough-fp32")):
        shape = SIZES[key]
        x = _inputs(n, math.prod(shape), seed).to(dtype)
        want = simulate(name, x).results.to(dtype).float().numpy()
        for r in range(n):
            y, got_dtype, got_shape = _ok(res[r], key)
            assert got_dtype == str(dtype) and got_shape == shape
            assert _same_bits(y, want[r])
    xa = _inputs(n, SIZES["avg"], 4)
    for call in (0, 1):
        want = simulate("requant-dq4", xa, op="avg", call=call).results
        for r in range(n):
            assert _same_bits(_ok(res[r], f"avg/{call}"), want[r].numpy())
    xs = [_inputs(n, SIZES["async"], 5 + i) for i in range(3)]
    for r in range(n):
        ys, done, ok0, ok1 = _ok(res[r], "async")
        assert done == (True, True) and ok0 and ok1
        for call, (x, y) in enumerate(zip(xs, ys)):
            assert _same_bits(y, simulate("requant-dq4", x, call=call).results[r].numpy())


@pytest.mark.parametrize("n", [1, 2])
def test_nan_reaches_every_rank(n):
    res = _world(n, WORLDS[n])
    xn = _inputs(n, SIZES["nan"], 8)
    xn[0, 5] = float("nan")
    for name in ("passthrough-fp32", "requant-dq4"):
        want = simulate(name, xn).results
        block = get_pipeline(name).block_size
        for r in range(n):
            y = _ok(res[r], f"nan/{name}")
            assert not np.isfinite(y[5])
            assert np.all(np.isfinite(y[max(block, 6):]))  # only NaN's own block is hit
            assert _same_bits(y, want[r].numpy())


def test_subgroups_map_ranks_and_count_calls_apart():
    res = _world(4, WORLDS[4])
    x = _inputs(4, D, 12)
    for parity in (0, 1):
        members = list(range(parity, 4, 2))
        want = simulate("requant-dq4", x[members]).results  # each group's first call: call 0
        for group_rank, r in enumerate(members):
            y, got_rank = _ok(res[r], "group")
            assert got_rank == group_rank
            assert _same_bits(y, want[group_rank].numpy())


@pytest.mark.parametrize("n", [1, 2])
def test_stats_are_filled_by_successful_calls_only(n):
    res = _world(n, WORLDS[n])
    d = SIZES["stats"][0]
    sim = simulate("requant-dq4", _inputs(n, d, 14))
    for r in range(n):
        error, unchanged, got = _ok(res[r], "stats")
        if n == 1:  # nothing to disagree with: the first call went through, as call 0
            assert (error, unchanged) == (None, False)
            assert got == (0, 1, d, 1, 0, 0)
        else:
            assert error == "CallMismatchError" and unchanged
            rank, world, numel, call, sent, messages = got
            assert (rank, world, numel, call) == (r, 2, d, 0)  # the refused call not counted
            assert sent == sim.bytes_sent[r] and messages > 0


def test_stats_of_a_bad_type_are_refused_up_front():
    with pytest.raises(TypeError, match="stats must be"):
        api.all_reduce(torch.ones(3), "requant-dq4", stats={})
    with pytest.raises(TypeError, match="stats must be"):
        p2p.run_p2p(torch.ones(3), "requant-dq4", call=0, timeout=1, stats={})
    assert p2p.P2PStats().bits_per_coord == 0.0


def test_disagreeing_ranks_raise_everywhere_and_leave_tensors_untouched():
    res = _world(2, WORLDS[2])
    for r in range(2):
        kind, msg, untouched = res[r]["spec"]
        assert kind == "CallMismatchError" and untouched  # a RuntimeError
        assert "rank 0 has 'requant(quantizer=dq4_hier)@ring'" in msg
        assert "rank 1 has 'requant(quantizer=dq8_hier)@ring'" in msg
        kind, msg, untouched = res[r]["numel"]
        assert kind == "CallMismatchError" and untouched  # a RuntimeError
        assert "rank 0 has 1500 elements" in msg and "rank 1 has 1400 elements" in msg
        kind, msg, untouched = res[r]["dtype"]
        assert kind == "CallMismatchError" and untouched  # a RuntimeError
        assert "rank 0 has bfloat16" in msg and "rank 1 has float32" in msg
    # a refused call leaves the group usable
    xs = _inputs(2, SIZES["after"], 10)
    for r in range(2):
        assert _same_bits(_ok(res[r], "after"), simulate("passthrough-fp32", xs).results[r])


def test_stalled_peer_times_out_naming_step_and_peer():
    res = _world(2, WORLDS[2])
    kind, msg, seconds, _ = res[0]["stall"]
    assert kind == "TimeoutError", msg
    assert "step 0" in msg and "rank 1" in msg
    assert SHORT - 0.5 <= seconds < SHORT + 10
    # the steps had begun: the tensor (reduced in place) is not promised to be untouched
    assert msg.endswith(api.UNSPECIFIED)


def test_absent_rank_times_out_everywhere():
    res = _world(3, WORLDS[3])
    for r in range(2):
        kind, msg, seconds, untouched = res[r]["absent"]
        assert kind == "TimeoutError", msg
        # the metadata check is a collective: it knows that a rank is missing, not which
        assert "before step 0" in msg and f"within {SHORT}s" in msg
        assert SHORT - 0.5 <= seconds < SHORT + 10
        assert untouched and api.UNSPECIFIED not in msg  # nothing written before step 0


def test_argument_errors_need_no_process_group():
    with pytest.raises(TypeError, match="float32, bfloat16 and float16"):
        api.all_reduce(torch.ones(3, dtype=torch.int64))
    with pytest.raises(TypeError, match="float32, bfloat16 and float16"):
        api.all_reduce(torch.ones(3, dtype=torch.float64))
    with pytest.raises(ValueError, match="empty"):
        api.all_reduce(torch.ones(0))
    with pytest.raises(ValueError, match="Numba"):
        api.all_reduce(torch.ones(3, device="meta"))
    with pytest.raises(UnknownNameError, match="passthrough-fp32"):
        api.all_reduce(torch.ones(3), "no-such-pipeline")
    with pytest.raises(ValueError, match="op must be"):
        api.all_reduce(torch.ones(3), op="max")
    if not dist.is_initialized():
        with pytest.raises(RuntimeError, match="init_process_group"):
            api.all_reduce(torch.ones(3))
