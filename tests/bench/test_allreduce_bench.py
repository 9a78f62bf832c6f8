"""``dynamiq bench allreduce`` on a tiny tensor and two ranks (one world: processes are the
expensive part on a 2-core machine), on loopback and, as root with iproute2, across a shaped
testbed (skipped with the reason elsewhere)."""

from __future__ import annotations

import json

import pytest

from dynamiq.bench import allreduce
from dynamiq.cli import main
from dynamiq.testbed import netns, unavailable_reason
from dynamiq.testbed.netns import list_namespaces

REASON = unavailable_reason()
needs_root = pytest.mark.skipif(REASON is not None, reason=f"testbed unavailable: {REASON}")


def test_methods_side_by_side_with_time_split(tmp_path, capsys):
    path = tmp_path / "allreduce.json"
    code = main(["bench", "allreduce", "--world-sizes", "2", "--sizes-mb", "0.01",
                 "--pipelines", "passthrough-fp32,bf16", "--repeat", "1", "--burst", "2",
                 "--json", str(path),
                 "--plot", str(tmp_path / "allreduce.svg")])
    assert code == 0
    assert "loopback, 2 ranks" in (tmp_path / "allreduce.svg").read_text()
    rows = json.loads(path.read_text())
    methods = ["torch-fp32", "torch-bf16", "passthrough-fp32", "bf16"]
    assert [r["method"] for r in rows] == methods
    by = {r["method"]: r for r in rows}
    assert all(r["world_size"] == 2 and r["size_mb"] == 0.01 for r in rows)
    assert by["torch-fp32"]["ratio"] == by["torch-fp32"]["median_ratio"] == 1.0
    for m in methods:
        r, base = by[m], by["torch-fp32"]
        assert 0 < r["seconds"] <= r["median_seconds"]
        assert r["ratio"] == r["seconds"] / base["seconds"]
        assert r["median_ratio"] == r["median_seconds"] / base["median_seconds"]
        # one round of two calls in a row: its time per call is the best and the median
        assert r["burst_seconds"] > 0
        assert r["burst_ratio"] == r["burst_median_ratio"] == (r["burst_seconds"]
                                                               / base["burst_seconds"])
    assert by["passthrough-fp32"]["bits_per_coord"] == [32.0, 32.0]
    assert by["torch-fp32"]["bits_per_coord"] == [32.0, 32.0]  # a ring's, on 2 ranks
    assert by["torch-bf16"]["bits_per_coord"] == [16.0, 16.0]
    assert by["bf16"]["bits_per_coord"] == [16.0, 16.0]
    assert by["passthrough-fp32"]["pipeline"] == "passthrough@ring"
    assert by["torch-fp32"]["codec_seconds"] == 0.0
    for m in ("passthrough-fp32", "bf16"):
        split = [by[m][f"{part}_seconds"] for part in ("codec", "wire", "wait", "metadata")]
        assert min(split) >= 0 and 0 < sum(split) <= by[m]["seconds"]
    # two ranks add two float32 values: both orders give the same bits as torch
    assert by["passthrough-fp32"]["max_abs_diff"] == 0.0
    out = capsys.readouterr().out
    assert "ratio to torch-fp32" in out and "codec / wire / wait / metadata" in out
    assert "other" in out
    assert "time per call, 2 calls in a row" in out
    assert all(m in out for m in methods)


def test_defaults_name_registered_pipelines():
    from dynamiq.pipeline import get_pipeline

    assert allreduce.DEFAULT_PIPELINES == ("passthrough-fp32", "bf16", "mxfp8", "dynamiq")
    for name in allreduce.DEFAULT_PIPELINES:
        get_pipeline(name)


def test_testbed_defaults_name_registered_pipelines():
    from dynamiq.bench import allreduce_testbed
    from dynamiq.pipeline import get_pipeline

    assert allreduce_testbed.TESTBED_PIPELINES == ("bf16", "mxfp8", "thc", "omnireduce",
                                                   "dynamiq")
    for name in allreduce_testbed.TESTBED_PIPELINES:
        get_pipeline(name)


@pytest.mark.parametrize("argv, message", [
    (["--rate", "100mbit"], "--rate needs --testbed"),
    (["--testbed", "--rate", "100mbps"], "bytes per second to tc"),
    (["--testbed", "--plot", "times.pdf"], "write .svg or .png"),
    (["--testbed", "--pipelines", "nope"], "unknown pipeline 'nope'"),
    (["--testbed", "--repeat", "0"], "repeat must be >= 1"),
    (["--testbed", "--sizes", "0"], "tensor sizes must be positive"),
    (["--world-sizes", "2,x"], "invalid literal"),
    (["--burst", "-1"], "burst must be >= 0"),
    (["--testbed", "--burst", "2"], "--burst is measured on loopback only"),
])
def test_bad_arguments_are_refused_before_anything_runs(argv, message, capsys):
    assert main(["bench", "allreduce", *argv]) == 2
    assert message in capsys.readouterr().err


def test_testbed_without_root_says_what_is_needed(monkeypatch, capsys):
    monkeypatch.setattr(netns, "_capabilities", lambda: 0)
    assert main(["bench", "allreduce", "--testbed", "--world-size", "2", "--sizes", "1"]) == 3
    assert "--testbed: the testbed needs root" in capsys.readouterr().err


@needs_root
def test_across_a_testbed_the_links_count_the_bytes(tmp_path, capsys):
    path, plot = tmp_path / "tb.json", tmp_path / "tb.svg"
    code = main(["bench", "allreduce", "--testbed", "--rate", "100mbit", "--world-size", "2",
                 "--sizes", "1", "--pipelines", "bf16,dynamiq", "--repeat", "1",
                 "--prefix", "dqbench", "--json", str(path), "--plot", str(plot)])
    assert code == 0
    assert not [n for n in list_namespaces() if n.startswith("dqbench-")]  # torn down
    rows = json.loads(path.read_text())
    assert [r["method"] for r in rows] == ["torch-fp32", "torch-bf16", "bf16", "dynamiq"]
    by = {r["method"]: r for r in rows}
    for r in rows:
        assert r["rate"] == "100mbit" and r["rate_bps"] == 10**8
        assert r["world_size"] == 2 and r["size_mb"] == 1.0 and r["numel"] == 1 << 18
        assert r["bf16_ratio"] == r["seconds"] / by["torch-bf16"]["seconds"]
        assert r["pipeline_bf16_ratio"] == r["seconds"] / by["bf16"]["seconds"]
        # the links carried at least what dynamiq counted (torch: a ring's payload), and
        # not much more: headers, gloo's framing, the metadata, a barrier and a timing
        assert len(r["veth_tx_bytes"]) == 2
        for veth, sent, meta in zip(r["veth_tx_bytes"], r["bytes_sent"], r["metadata_bytes"]):
            assert sent <= veth <= 1.1 * (sent + meta) + 32 * 1024, (r["method"], veth, sent)
        assert r["veth_ratio"] == [v / s for v, s in zip(r["veth_tx_bytes"], r["bytes_sent"])]
        assert r["link_seconds"] == r["veth_tx_bytes"][0] * 8 / 1e8
        # the rate holds: no call beats the time its bytes take on the link (one burst free)
        assert r["seconds"] >= r["link_seconds"] - 2 * 32768 * 8 / 1e8
        assert len(r["cpu_seconds"]) == 2 and min(r["cpu_seconds"]) >= 0
        assert r["cpu_bound_seconds"] == sum(r["cpu_seconds"]) / min(r["cores"], 2)
        assert r["load_average"] >= 0
    assert by["torch-fp32"]["bytes_sent"] == [1 << 20] * 2
    assert by["bf16"]["bytes_sent"] == [1 << 19] * 2
    assert by["dynamiq"]["bits_per_coord"][0] < 6
    assert by["dynamiq"]["veth_tx_bytes"][0] < 0.25 * by["torch-fp32"]["veth_tx_bytes"][0]
    assert by["dynamiq"]["metadata_bytes"][0] > 0 and by["dynamiq"]["codec_seconds"] > 0
    assert min(by["dynamiq"]["cpu_seconds"]) > 0
    assert plot.read_text().rstrip().endswith("</svg>") and "100mbit, 2 ranks" in plot.read_text()
    out = capsys.readouterr().out
    assert "veth/count" in out and "cpu/cores" in out and "x the speed of bf16" in out
