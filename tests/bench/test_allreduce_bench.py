"""``dynamiq bench allreduce`` on a tiny tensor and two ranks (one world: processes are the
expensive part on a 2-core machine)."""

from __future__ import annotations

import json

from dynamiq.bench import allreduce
from dynamiq.cli import main


def test_methods_side_by_side_with_time_split(tmp_path, capsys):
    path = tmp_path / "allreduce.json"
    code = main(["bench", "allreduce", "--world-sizes", "2", "--sizes-mb", "0.01",
                 "--pipelines", "passthrough-fp32,bf16", "--repeat", "1", "--json", str(path)])
    assert code == 0
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
    assert all(m in out for m in methods)


def test_defaults_name_registered_pipelines():
    from dynamiq.pipeline import get_pipeline

    assert allreduce.DEFAULT_PIPELINES == ("passthrough-fp32", "bf16", "mxfp8", "dynamiq")
    for name in allreduce.DEFAULT_PIPELINES:
        get_pipeline(name)
