"""``dynamiq train`` on a tiny model: 2 loopback ranks, a few steps.

Worlds are the expensive part (about 20 s each on the development machine): one run of BF16
and DynamiQ with checkpoints, one resume of DynamiQ from its checkpoint, and one straight
DynamiQ run from the command line, which must match the resumed run bit for bit.
"""

from __future__ import annotations

import itertools
import json

import pytest

from dynamiq.bench.train import _set_targets, run, summarize
from dynamiq.bench.train_rank import (
    TrainConfig,
    _schedule_key,
    check_method,
    checkpoint_file,
)
from dynamiq.bench.workloads.gpt_stdlib import GptStdlib
from dynamiq.cli import main

pytestmark = pytest.mark.timeout(600)

# about 68k parameters: one bucket, above the hook's 65,536-coordinate threshold (compressed)
TINY = dict(d_model=64, n_layers=1, n_heads=2, context=32, micro_batch=4, max_bytes=1 << 18,
            warmup=2)
SPEC = "gpt-stdlib(" + ",".join(f"{k}={v}" for k, v in TINY.items()) + ")"


def _cfg(steps: int) -> TrainConfig:
    # a constant rate after the warm-up: a run of 4 steps extended to 6 is then the same as a
    # straight run of 6 (a cosine schedule depends on the step count)
    return TrainConfig(workload=GptStdlib(**TINY), steps=steps, eval_every=2,
                       checkpoint_every=2, progress=False, schedule="constant")


@pytest.fixture(scope="module")
def first(tmp_path_factory):
    d = tmp_path_factory.mktemp("train")
    lines: list[str] = []
    res = run(["bf16", "dynamiq"], config=_cfg(4), world_size=2, testbed=False,
              resume=d / "ck", json_path=d / "run.json", plot_path=d / "run.svg",
              out=lines.append, log=lambda _line: None)
    return d, res, lines


@pytest.fixture(scope="module")
def resumed(first):
    d, _, _ = first
    return run(["dynamiq"], config=_cfg(6), world_size=2, testbed=False, resume=d / "ck",
               reference="dynamiq", out=lambda _line: None, log=lambda _line: None)


def test_run_writes_rows_curves_json_and_plot(first):
    d, res, lines = first
    saved = json.loads((d / "run.json").read_text())
    assert saved["rows"] == res["rows"] and saved["curves"] == res["curves"]
    assert set(saved) >= {"config", "network", "reference", "target_loss", "rows", "curves",
                          "hook_stats", "load_average"}
    assert saved["network"].startswith("loopback, 2 ranks")
    assert saved["config"]["steps"] == 4 and saved["config"]["workload"]["d_model"] == 64
    rows = {r["method"]: r for r in res["rows"]}
    assert list(rows) == ["bf16", "dynamiq"]
    bf16, dq = rows["bf16"], rows["dynamiq"]
    assert res["target_loss"] == pytest.approx(bf16["final_val"] * 1.005)
    assert bf16["final_vs_ref_pct"] == 0.0 and bf16["speedup"] == 1.0
    assert bf16["bits_per_coord"] == 16.0 and 3.0 < dq["bits_per_coord"] < 8.0
    for r in rows.values():
        assert r["steps"] == 4 and r["seconds"] > 0 and r["wire_mb_per_step"] is None
        assert r["compute_s"] + r["codec_s"] + r["comm_s"] == pytest.approx(r["step_s"])
        assert min(r["compute_s"], r["codec_s"], r["comm_s"]) >= 0
        assert abs(r["final_vs_ref_pct"]) < 1.0  # 4 steps of a tiny model barely differ
        assert r["time_to_target"] is None or r["steps_to_target"] in (2, 4)
        curve = res["curves"][r["method"]]
        assert [p[0] for p in curve["val"]] == [0, 2, 4]
        assert [p[0] for p in curve["train"]] == [2, 4]
        times = [p[1] for p in curve["val"]]
        assert times[0] == 0.0 and times == sorted(times)
        assert curve["val"][-1][2] < curve["val"][0][2]  # it learns
        assert r["final_val"] == curve["val"][-1][2]
    assert res["hook_stats"]["dynamiq"][0]["compressed_calls"] > 0
    assert (d / "run.svg").read_text().rstrip().endswith("</svg>")
    for m in ("bf16", "dynamiq"):
        for rank in (0, 1):
            assert checkpoint_file(d / "ck", m, rank).exists()
    text = "\n".join(lines)
    assert "target: bf16's final validation loss + 0.5 %" in text
    assert "dynamiq" in text and "speed-up" in text


def test_resume_continues_the_curve(first, resumed):
    _, before, _ = first
    old = before["curves"]["dynamiq"]
    new = resumed["curves"]["dynamiq"]
    assert new["resumed_at"] == [4]
    assert new["val"][:3] == old["val"]  # the checkpointed curve, unchanged
    assert [p[0] for p in new["val"]] == [0, 2, 4, 6]
    times = [p[1] for p in new["val"]]
    assert times == sorted(times) and times[3] > times[2]
    (row,) = resumed["rows"]
    assert row["steps"] == 6


def test_cli_straight_run_matches_the_resumed_one(resumed, tmp_path, capsys):
    out = tmp_path / "cli.json"
    assert main(["train", "--no-testbed", "--methods", "dynamiq", "--world-size", "2",
                 "--steps", "6", "--eval-every", "2", "--workload", SPEC,
                 "--schedule", "constant", "--json", str(out)]) == 0
    text = capsys.readouterr()
    assert "dynamiq" in text.out and "s/step" in text.out
    assert "dynamiq" in text.err  # progress lines
    straight = json.loads(out.read_text())["curves"]["dynamiq"]["val"]
    # the hook's state, the optimizer and the model resume bit for bit
    assert [p[2] for p in straight] == [p[2] for p in resumed["curves"]["dynamiq"]["val"]]


def test_cli_refuses_unknown_methods_and_workloads(capsys):
    assert main(["train", "--no-testbed", "--methods", "bf16,no-such-method"]) == 2
    assert "unknown method 'no-such-method'" in capsys.readouterr().err
    assert main(["train", "--no-testbed", "--workload", "lognormal"]) == 2
    with pytest.raises(ValueError):
        check_method("fp64")
    with pytest.raises(ValueError, match="eval_every"):
        TrainConfig(eval_every=0)


def test_learning_rate_schedules():
    wl = GptStdlib(lr=0.5, warmup=10)  # training reads its own lr, not the workload's
    cos = TrainConfig(workload=wl, steps=110, lr=1e-3, min_lr_ratio=0.1)
    const = TrainConfig(workload=wl, steps=110, lr=1e-3, schedule="constant")
    # the same linear warm-up, then the peak (constant) or a cosine from the peak to 10 %
    for cfg in (cos, const):
        assert [cfg.rate(s) for s in (0, 4, 9)] == pytest.approx([1e-4, 5e-4, 1e-3])
    assert [const.rate(s) for s in (10, 60, 109, 500)] == pytest.approx([1e-3] * 4)
    lrs = [cos.rate(s) for s in range(9, 110)]
    assert lrs[0] == pytest.approx(1e-3) and lrs[-1] == pytest.approx(1e-4)
    assert all(a >= b for a, b in itertools.pairwise(lrs))  # never rises after the warm-up
    assert cos.rate(59) == pytest.approx(1e-4 + 0.9e-3 * 0.5)  # halfway: the middle rate
    assert TrainConfig(workload=wl, steps=110, min_lr_ratio=0.0).rate(109) == 0.0
    # a cosine run resumes only with its own step count; a constant one may be extended
    assert _schedule_key(cos) != _schedule_key(TrainConfig(workload=wl, steps=200, lr=1e-3))
    assert _schedule_key(const) == _schedule_key(
        TrainConfig(workload=wl, steps=200, lr=1e-3, schedule="constant"))
    assert _schedule_key(const) != _schedule_key(
        TrainConfig(workload=wl, steps=110, lr=2e-3, schedule="constant"))
    with pytest.raises(ValueError, match="schedule"):
        TrainConfig(schedule="linear")
    with pytest.raises(ValueError, match="lr must be"):
        TrainConfig(lr=0.0)
    with pytest.raises(ValueError, match="min_lr_ratio"):
        TrainConfig(min_lr_ratio=1.5)


def _record(val, steps=10, step_s=20.0, probe=1.0, opt=0.2, codec=3.0, hook=None):
    return {"method": "m", "pipeline": "", "world_size": 4, "step": steps, "time": val[-1][1],
            "val": val, "train": [], "fwd_s": 0.0, "bwd_s": 0.0, "opt_s": opt,
            "step_s": step_s, "probe_s": [probe, probe, 5.0], "codec_s": codec,
            "wire_tx_bytes": None, "hook": hook, "resumed_at": []}


def test_split_and_time_to_target_definitions():
    ref = summarize("bf16", [_record([[0, 0, 5.0], [5, 10, 3.0], [10, 20, 2.0]])])
    # step 2 s = compute (median probe 1 + optimizer 0.02) + codec 0.3 + exposed the rest
    assert ref.step_s == 2.0 and ref.compute_s == pytest.approx(1.02)
    assert ref.codec_s == pytest.approx(0.3) and ref.comm_s == pytest.approx(0.68)
    assert ref.bits_per_coord == 16.0
    hook = {"bytes_sent": 3 * 1000, "metadata_bytes": 100, "compressed_numel": 4000}
    fast = summarize("dynamiq", [_record([[0, 0, 5.0], [5, 6, 2.009], [10, 12, 1.99]],
                                         hook=hook)])
    assert fast.bits_per_coord == pytest.approx(8 * (3000 * 4 / 6 + 100) / 4000)
    slow = summarize("thc", [_record([[0, 0, 5.0], [10, 20, 2.02]])])
    curves = {r.method: {"val": v} for r, v in ((ref, [[0, 0, 5.0], [5, 10, 3.0], [10, 20, 2.0]]),
              (fast, [[0, 0, 5.0], [5, 6, 2.009], [10, 12, 1.99]]),
              (slow, [[0, 0, 5.0], [10, 20, 2.02]]))}
    target = _set_targets([ref, fast, slow], curves, "bf16", 0.005)
    assert target == pytest.approx(2.01)
    assert (ref.time_to_target, ref.steps_to_target, ref.speedup) == (20.0, 10, 1.0)
    # 2.009 <= 2.01 at step 5: reached at 6 s, 20/6 times sooner than bf16
    assert (fast.time_to_target, fast.steps_to_target) == (6.0, 5)
    assert fast.speedup == pytest.approx(20 / 6)
    assert fast.final_vs_ref_pct == pytest.approx(-0.5)
    assert slow.time_to_target is None and slow.speedup is None
    assert slow.final_vs_ref_pct == pytest.approx(1.0)
