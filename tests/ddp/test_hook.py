"""The DDP communication hook, in real multi-process DDP worlds over gloo.

Each test is one world (processes are the expensive part here); its plan trains a small MLP
with several buckets, every bucket compressed (``min_compress_numel=0``), and reports what the
test asserts. ``u`` below is float32's unit roundoff, ``2**-24``.
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from _world import world_results
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from dynamiq.ddp import DynamiQState, HookStats, dynamiq_hook

U = 2.0**-24
LR = 0.05
BUCKET_MB = 0.25  # the 512x256 weight alone, then the rest: several buckets
pytestmark = pytest.mark.timeout(900)


def _net(seed: int = 0, dtype: torch.dtype = torch.float32) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(32, 512), nn.Tanh(), nn.Linear(512, 256), nn.Tanh(),
                         nn.Linear(256, 8)).to(dtype)


def _batch(rank: int, step: int, dtype: torch.dtype = torch.float32):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return (torch.randn(16, 32, generator=g).to(dtype), torch.randn(16, 8, generator=g).to(dtype))


def _loss(model: nn.Module, rank: int, step: int, dtype: torch.dtype = torch.float32):
    x, y = _batch(rank, step, dtype)
    return ((model(x) - y) ** 2).mean()


def _ddp(model: nn.Module, pipeline: str | None, **kw) -> tuple[DDP, DynamiQState | None]:
    opts = {k: kw.pop(k) for k in ("gradient_as_bucket_view", "static_graph") if k in kw}
    m = DDP(model, bucket_cap_mb=BUCKET_MB, **opts)
    state = None
    if pipeline is not None:
        state = DynamiQState(pipeline=pipeline, min_compress_numel=0, **kw)
        m.register_comm_hook(state, dynamiq_hook)
    return m, state


def _grads(m: nn.Module) -> list[torch.Tensor]:
    return [p.grad.detach().clone() for p in m.parameters()]


def _digest(m: nn.Module) -> str:
    h = hashlib.sha256()
    for p in m.parameters():
        h.update(p.detach().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _same_on_every_rank(value) -> bool:
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, value)
    return all(v == every[0] for v in every)


# ---------------------------------------------------------------- passthrough == DDP's default
def _passthrough_plan(rank, n, _barriers):
    """Lockstep: both models hold the same parameters before every step, so their averaged
    gradients differ only by the reduction. The default hook rounds ``g_r / n`` and sums in
    its order, the hook sums in the ring's order and divides: each is within ``(n + 1) u S / n``
    of the exact mean (``S = Σ_r |g_r|``, ``n - 1`` additions and one division), so they are
    within ``2 (n + 1) u S / n`` of each other."""
    ref, _ = _ddp(_net(), None)
    hooked, state = _ddp(_net(), "passthrough-fp32", start_iter=0)
    local = _net()
    worst = 0.0
    for step in range(4):
        hooked.module.load_state_dict(ref.module.state_dict())
        local.load_state_dict(ref.module.state_dict())
        for m in (ref, hooked, local):
            m.zero_grad()
            _loss(m, rank, step).backward()
        for a, b, g in zip(_grads(ref), _grads(hooked), _grads(local), strict=True):
            s = g.abs()
            dist.all_reduce(s)
            bound = 2 * (n + 1) * U * s / n + 1e-38
            worst = max(worst, float(((a - b).abs() / bound).max()))
        with torch.no_grad():
            for p in ref.parameters():
                p -= LR * p.grad
    return {"worst": worst, "compressed": state.stats.compressed_calls,
            "plain": state.stats.plain_calls, "bits": state.stats.bits_per_coord}


def test_passthrough_averages_as_ddp_default_does():
    for r in world_results(3, _passthrough_plan, deadline=600):
        assert r["worst"] <= 1.0, r
        # one bucket in step 0 (DDP caps its first bucket at 1 MiB), >= 2 after the rebuild
        assert r["compressed"] >= 7 and r["plain"] == 0
        assert r["bits"] == pytest.approx(32.0 * 2 * 2 / 3, rel=0.01)  # a ring's 2(n-1)/n words


def _train_both_plan(rank, n, _barriers):
    """Two ranks: the default hook rounds ``g0 / 2 + g1 / 2``, the hook ``(g0 + g1) / 2``;
    halving is exact (short of subnormals), so independent training gives the same bits."""
    out = []
    for pipeline in (None, "passthrough-fp32"):
        model, _ = _ddp(_net(), pipeline, start_iter=0)
        opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
        _train(model, opt, rank, range(5))
        out.append(_digest(model))
    return {"same": out[0] == out[1]}


def test_passthrough_trains_to_ddp_defaults_parameters_on_two_ranks():
    assert all(r["same"] for r in world_results(2, _train_both_plan, deadline=600))


# ---------------------------------------------------------------- dynamiq: identical replicas
def _dynamiq_plan(rank, n, _barriers, options):
    dtype = getattr(torch, options.pop("dtype", "float32"))
    accumulate = options.pop("accumulate", 1)
    model, state = _ddp(_net(dtype=dtype), "dynamiq", start_iter=1, **options)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    first = _digest(model)
    identical, plain_steps, per_step = [], [], []
    for step in range(5):
        opt.zero_grad()
        for micro in range(accumulate - 1):  # gradient accumulation without communication
            with model.no_sync():
                _loss(model, rank, 100 * step + micro, dtype).backward()
        _loss(model, rank, step, dtype).backward()
        taken = state.stats.reset()
        per_step.append(taken.bits_per_coord)
        plain_steps.append(taken.plain_calls)
        identical.append(_same_on_every_rank(_digest(model) + str(_grads(model)[0].sum())))
        opt.step()
        identical.append(_same_on_every_rank(_digest(model)))
    return {"identical": identical, "moved": _digest(model) != first, "plain": plain_steps,
            "bits": per_step, "iter": state.iter, "calls": state.calls}


@pytest.mark.parametrize("options", [
    {},
    {"gradient_as_bucket_view": True, "accumulate": 2},
    {"static_graph": True, "private_group": False},
    {"dtype": "bfloat16"},
], ids=["fp32", "bucket-view+no_sync", "static-graph+shared-group", "bf16"])
def test_dynamiq_keeps_replicas_bit_identical(options):
    out = world_results(2, _dynamiq_plan, (options,), deadline=600)
    for r in out:
        assert all(r["identical"]), r
        assert r["moved"] and r["iter"] == 5
        # step 0 (one bucket: DDP rebuilds after it) is plain (start_iter=1); every later
        # bucket is compressed at about 5 bits
        assert r["plain"][0] == 1 and r["plain"][1:] == [0] * 4, r
        assert r["bits"][0] == 0.0 and all(3.0 < b < 8.0 for b in r["bits"][1:]), r
    assert out[0]["calls"] == out[1]["calls"] > 0


# ---------------------------------------------------------------- GradScaler skips everywhere
def _scaler_plan(rank, n, _barriers):
    model, _ = _ddp(_net(), "dynamiq", start_iter=0)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)
    out = []
    for step in range(3):
        opt.zero_grad()
        loss = _loss(model, rank, step)
        if step == 1 and rank == 1:
            loss = loss * float("inf")  # only this rank's gradients are non-finite
        before = _digest(model)
        scaler.scale(loss).backward()
        finite = all(bool(torch.isfinite(g).all()) for g in _grads(model))
        scaler.step(opt)
        scaler.update()
        out.append({"finite": finite, "stepped": _digest(model) != before,
                    "scale": scaler.get_scale()})
    return {"steps": out, "same": _same_on_every_rank(_digest(model))}


def test_an_inf_on_one_rank_makes_gradscaler_skip_on_every_rank():
    out = world_results(2, _scaler_plan, deadline=600)
    for r in out:
        s = r["steps"]
        assert [x["finite"] for x in s] == [True, False, True], s
        assert [x["stepped"] for x in s] == [True, False, True], s
        assert s[1]["scale"] == s[0]["scale"] / 2, s
        assert r["same"]


# ---------------------------------------------------------------- checkpoint and resume
def _train(model, opt, rank, steps):
    for step in steps:
        opt.zero_grad()
        _loss(model, rank, step).backward()
        opt.step()


def _resume_plan(rank, n, _barriers):
    straight, _ = _ddp(_net(), "dynamiq", start_iter=1)
    opt = torch.optim.SGD(straight.parameters(), lr=LR, momentum=0.9)
    _train(straight, opt, rank, range(6))

    first, state = _ddp(_net(), "dynamiq", start_iter=1)
    opt = torch.optim.SGD(first.parameters(), lr=LR, momentum=0.9)
    _train(first, opt, rank, range(3))
    buf = io.BytesIO()
    torch.save({"model": first.module.state_dict(), "opt": opt.state_dict(),
                "hook": pickle.dumps(state)}, buf)

    buf.seek(0)
    ck = torch.load(buf, weights_only=False)
    net = _net(seed=7)  # other initial values: everything comes from the checkpoint
    net.load_state_dict(ck["model"])
    resumed = DDP(net, bucket_cap_mb=BUCKET_MB)
    restored = pickle.loads(ck["hook"])
    resumed.register_comm_hook(restored, dynamiq_hook)
    opt = torch.optim.SGD(resumed.parameters(), lr=LR, momentum=0.9)
    opt.load_state_dict(ck["opt"])
    _train(resumed, opt, rank, range(3, 6))
    return {"same": _digest(resumed) == _digest(straight), "iter": restored.iter,
            "calls": (state.calls, restored.calls), "keys": len(restored.bucket_states)}


def test_a_resumed_checkpoint_continues_bit_identically():
    for r in world_results(2, _resume_plan, deadline=600):
        assert r["same"], r
        assert r["iter"] == 6 and r["calls"][1] > r["calls"][0] > 0 and r["keys"] >= 2


# ---------------------------------------------------------------- state, errors, world of one
def _state_plan(rank, n, _barriers):
    out = {}
    for kw in ({"start_iter": -1}, {"min_compress_numel": 1.5}, {"backend": "cuda"},
               {"pipeline": "no-such-pipeline"}):
        try:
            DynamiQState(**kw)
            out[str(kw)] = "accepted"
        except (ValueError, KeyError) as e:
            out[str(kw)] = type(e).__name__
    model, state = _ddp(_net(), "dynamiq", start_iter=0)
    before = [p.detach().clone() for p in model.parameters()]
    _loss(model, rank, 0).backward()
    local = _net()
    _loss(local, rank, 0).backward()
    out["one_rank_is_local"] = all(torch.equal(a, b) for a, b in
                                   zip(_grads(model), _grads(local), strict=True))
    out["untouched"] = all(torch.equal(a, b) for a, b in zip(before, model.parameters(),
                                                             strict=True))
    out["iter"] = state.iter
    out["repr"] = repr(state)
    return out


def test_state_refuses_bad_settings_and_a_world_of_one_is_local():
    (r,) = world_results(1, _state_plan, deadline=300)
    assert r.pop("one_rank_is_local") and r.pop("untouched") and r.pop("iter") == 1
    assert "DynamiQState(pipeline=" in r.pop("repr")
    assert all(v != "accepted" for v in r.values()), r


def test_hook_stats_add_up_and_reset():
    s = HookStats()
    s.add_plain(100, 400, 4, 0.5)
    assert s.plain_bytes == 600 and s.plain_calls == 1
    before = s.reset()
    assert before.plain_numel == 100 and s.plain_numel == 0 and s.bits_per_coord == 0.0


def test_split_puts_a_resumed_first_bucket_in_the_recorded_layout():
    """After a resume DDP's first bucket holds every parameter in its first-step order; the
    state splits it into the recorded buckets, or reorders it as the one recorded bucket."""
    state = DynamiQState.__new__(DynamiQState)  # split needs no process group
    state.layout = None
    assert state.split((0, 1, 2)) is None
    state.layout = ((2, 0, 1),)
    assert state.split((0, 1, 2)) == [0]  # one bucket, rebuilt in another order
    assert state.split((2, 0, 1)) is None  # already that bucket
    state.layout = ((1,), (0, 2))
    assert state.split((0, 1, 2)) == [0, 1]
    assert state.split((0, 1)) is None  # not a union of recorded buckets


# ---------------------------------------------------------------- under torchrun
def test_the_example_trains_under_torchrun():
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         str(root / "examples" / "ddp_hook.py"), "--steps", "6", "--width", "128"],
        capture_output=True, text=True, timeout=600,
        env={**os.environ, "NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert "replicas bit-identical: True" in out.stdout, out.stdout
    assert "bits/coord" in out.stdout
