"""``dynamiq bench nmse`` and ``dynamiq bench scale`` on small synthetic inputs."""

from __future__ import annotations

import itertools
import json

import pytest
import torch

from dynamiq.bench import nmse, scale
from dynamiq.cli import main
from dynamiq.pipeline import get_pipeline

WL = "lognormal(d=32768)"


def test_rows_carry_the_measured_values(tmp_path):
    lines: list[str] = []
    rows = nmse.run(WL, world_size=4, methods=("dynamiq", "passthrough(wire=bf16)@ring"),
                    json_path=str(tmp_path / "r.json"), plot_path=str(tmp_path / "r.svg"),
                    out=lines.append, log=lambda s: None)
    assert [r.method for r in rows] == ["dynamiq", "passthrough(wire=bf16)@ring"]
    dq, bf = rows
    assert 4.9 < dq.bits_per_coord <= 5.0 and bf.bits_per_coord == pytest.approx(16.0)
    assert dq.unbiased and not bf.unbiased
    assert 0 < dq.vnmse and 0 < bf.vnmse < 1e-4
    data = json.loads((tmp_path / "r.json").read_text())
    for row in data:
        assert {"workload", "method", "topology", "world_size", "bits_per_coord",
                "vnmse"} <= set(row)
        assert row["workload"] == "lognormal" and row["world_size"] == 4
    assert (tmp_path / "r.svg").read_text().rstrip().endswith("</svg>")
    assert any("vNMSE" in s for s in lines)


def test_budget_flag_and_topology_reach_the_dynamiq_codec():
    p = nmse.method_pipeline("dynamiq", "butterfly", 6.5)
    assert p.codec.bits == 6.5 and p.topology.spec() == "butterfly"
    # codecs with their own budgets are left alone
    q = nmse.method_pipeline("passthrough-bf16", None, 3.0)
    assert str(q) == "passthrough(wire=bf16)@ring"


def test_ablation_and_sweep_rows(tmp_path, monkeypatch):
    # two steps of the ablation (the whole one simulates every width and variant: that is the
    # benchmark's job, not the test's)
    steps = (nmse.ABLATION[0], nmse.ABLATION[-1])
    monkeypatch.setattr(nmse, "ABLATION", steps)
    lines: list[str] = []
    # on the reference backend, which gives the numbers of every backend and compiles no
    # kernel for the ablation's and the sweep's codings
    rows = nmse.run(WL, world_size=4, methods=("dynamiq",), ablation=True, sweep=True,
                    backend="reference", out=lines.append, log=lambda s: None)
    abl = [r for r in rows if r.kind == "ablation"]
    sw = [r for r in rows if r.kind == "sweep"]
    assert [r.method for r in abl] == [label for label, _ in steps + nmse.ABLATION_SIDE]
    assert not abl[-1].unbiased  # the paper's path-correlated rounding, beside the steps
    assert all(r.bits_per_coord <= 5.0 + 1e-9 for r in abl)
    assert [round(r.bits_per_coord) for r in sw] == [round(b) for b in nmse.SWEEP_BITS]
    assert all(r.bits_per_coord <= b + 1e-9 for r, b in zip(sw, nmse.SWEEP_BITS))
    # more bits never hurt on this input up to 7 bits (the property the sweep reports); from 7
    # to 8 bits this small synthetic input sits on its error floor (about 7e-5, the scales'),
    # where the two measurements differ by noise
    assert all(b.vnmse < a.vnmse for a, b in itertools.pairwise(sw[:5]))
    assert sw[5].vnmse < 1.2 * sw[4].vnmse
    assert any(s.startswith("vNMSE falls with every added bit: ") for s in lines)


def test_cli_writes_json(tmp_path, capsys):
    out = tmp_path / "rows.json"
    rc = main(["bench", "nmse", "--workload", WL, "--world-size", "2",
               "--methods", "dynamiq;dynamiq-paper", "--json", str(out)])
    assert rc == 0
    rows = json.loads(out.read_text())
    assert [r["method"] for r in rows] == ["dynamiq", "dynamiq-paper"]
    assert "bits/coord" in capsys.readouterr().out
    # the reference backend measures the same numbers
    assert main(["bench", "nmse", "--workload", WL, "--world-size", "2", "--methods",
                 "dynamiq;dynamiq-paper", "--backend", "reference", "--json", str(out)]) == 0
    ref = json.loads(out.read_text())
    assert [r["vnmse_points"] for r in ref] == [r["vnmse_points"] for r in rows]


def test_an_unknown_backend_fails_before_the_gradients_are_computed():
    def no_gradients(*a, **k):
        raise AssertionError("reached the gradients")

    with pytest.raises(ValueError, match="backend"):
        nmse.run(WL, world_size=2, methods=("bf16",), backend="no-such-backend",
                 out=lambda s: None, log=no_gradients)


def test_unknown_method_is_a_clear_error():
    with pytest.raises(ValueError, match="pipeline"):
        nmse.method_pipeline("no-such-method")


def test_scale_streams_slices(tmp_path):
    rows = scale.run(world_sizes=(4,), topologies=("ring",), budgets=(5.0,), d=3 * 4096,
                     slice_coords=4096, json_path=str(tmp_path / "s.json"), out=lambda s: None,
                     log=lambda s: None)
    assert [r.method for r in rows] == ["dynamiq 5b", "mxfp8", "bf16"]
    assert rows[0].bits_per_coord <= 5.0 + 1e-9 and rows[0].d == 3 * 4096
    assert rows[2].bits_per_coord == pytest.approx(16.0)
    assert all(r.vnmse > 0 and r.peak_memory_gb > 0 for r in rows)
    assert json.loads((tmp_path / "s.json").read_text())[0]["world_size"] == 4


def test_scale_takes_dynamiq_options():
    (_, p), *_ = scale.scale_pipelines((5.0,), "ring", "midrise=False, super_scale=bf16")
    assert p.codec.midrise is False and p.codec.super_scale == "bf16"
    (_, q), *_ = scale.scale_pipelines((5.0,), "ring")
    assert q.codec.midrise is True and q.codec.super_scale == "e8m0"
    with pytest.raises(ValueError, match="bad DynamiQ options 'no_such=1'"):
        scale.run(world_sizes=(4,), topologies=("ring",), budgets=(5.0,), d=4096,
                  options="no_such=1", out=lambda s: None, log=lambda s: None)


def test_scale_equals_the_per_message_simulator():
    """One slice per method: the batched run's error is the per-message simulator's."""
    from dynamiq.bench.workloads import get_workload
    from dynamiq.collectives.simulator import simulate

    rows = scale.run(world_sizes=(8,), topologies=("ring",), budgets=(5.0,), d=2048,
                     out=lambda s: None, log=lambda s: None)
    model = get_workload("lognormal")
    x = torch.stack([model.rank_vector(r, 0, 2048, world_size=8) for r in range(8)])
    for row, (_, p) in zip(rows, scale.scale_pipelines((5.0,), "ring")):
        assert row.vnmse == pytest.approx(simulate(p, x, track_hops=False).vnmse, rel=1e-12)


# ---- derived views: bits to match a reference, bias, targets ---------------------------------

def test_bits_to_match_interpolates_in_log_vnmse():
    from dynamiq.bench.accuracy import bits_to_match, vnmse_at

    sweep = [(5.0, 1e-3), (3.0, 1e-1), (4.0, 1e-2)]
    assert bits_to_match(sweep, 1e-2) == pytest.approx(4.0)
    assert bits_to_match(sweep, 10 ** -1.5) == pytest.approx(3.5)
    assert bits_to_match(sweep, 1.0) == 3.0  # already below at the smallest budget
    assert bits_to_match(sweep, 1e-6) is None  # never reached
    assert bits_to_match([], 1e-3) is None
    assert vnmse_at(sweep, 4.5) == pytest.approx(10 ** -2.5)
    assert vnmse_at(sweep, 9.0) is None


def test_bias_ratio_tells_biased_from_unbiased():
    from dynamiq.bench.accuracy import bias_ratio
    from dynamiq.bench.workloads import GradientSet

    g = torch.Generator().manual_seed(0)
    sets = [GradientSet("t", 0, torch.randn(4, 1 << 13, generator=g))]
    unbiased = bias_ratio(get_pipeline("dynamiq"), sets, 4)
    # BF16 rounds to nearest: every call makes the same error, which no mean removes
    biased = bias_ratio(get_pipeline("bf16"), sets, 4)
    assert 0.6 < unbiased < 1.6
    assert biased == pytest.approx(4.0)
    with pytest.raises(ValueError, match="at least 2"):
        bias_ratio(get_pipeline("dynamiq"), sets, 1)


def test_run_reports_match_target_and_bias_rows(tmp_path):
    rows = nmse.run("lognormal(d=65536)", world_size=4, methods=("dynamiq", "mxfp8"),
                    sweep=True, targets=(1e-3, "mxfp8"), bias=2, json_path=tmp_path / "r.json",
                    plot_path=tmp_path / "r.svg", out=lambda _s: None, log=lambda _s: None)
    kinds = {r.kind for r in rows}
    assert {"methods", "sweep", "match", "target"} <= kinds
    assert all(r.bias is not None for r in rows if r.kind == "methods")
    match = [r for r in rows if r.kind == "match" and "to match" in r.method]
    sweep = sorted((r.bits_per_coord, r.vnmse) for r in rows if r.kind == "sweep")
    mx = next(r for r in rows if r.method == "mxfp8")
    if match:
        lo = max(b for b, v in sweep if v >= mx.vnmse)
        hi = min(b for b, v in sweep if v <= mx.vnmse)
        assert lo <= match[0].bits_per_coord <= hi
    targets = [r for r in rows if r.kind == "target"]
    assert [r.target for r in targets] == [1e-3, "mxfp8"]
    assert json.loads((tmp_path / "r.json").read_text())[-1]["target"] == "mxfp8"
    assert (tmp_path / "r.svg").stat().st_size > 0


def test_ablation_check_lets_correlated_rounding_be_neutral():
    def row(method, v):
        return nmse.Row("w", method, "", "ring", 8, 5.0, v)

    step = "+ correlated rounding"
    assert nmse._ablation_ok([row("a", 1.0), row(step, 1.005), row("c", 0.9)])
    assert not nmse._ablation_ok([row("a", 1.0), row(step, 1.02)])  # it raised the error
    assert not nmse._ablation_ok([row("a", 1.0), row("b", 1.0)])  # other steps must lower it
