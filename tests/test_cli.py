"""The dynamiq command line: every command runs and reports what it measured."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from dynamiq.cli import main


def test_formats_lists_every_registered_component(capsys, tmp_path):
    from dynamiq import FORMATS, QUANTIZERS

    out = tmp_path / "f.json"
    assert main(["formats", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    for name in FORMATS.names() + QUANTIZERS.names():
        assert name in text
    rows = json.loads(out.read_text())
    mx = next(r for r in rows if r["name"] == "mxfp8")
    assert mx["bits_per_coord"] == 8.25


def test_quantize_synthetic_and_file(capsys, tmp_path):
    out = tmp_path / "q.json"
    assert main(["quantize", "--format", "mxfp8", "--n", "4096", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["bits_per_coord"] == 8.25 and 0 < res["nmse"] < 1e-2
    arr = tmp_path / "x.npy"
    np.save(arr, np.linspace(-1, 1, 1000, dtype=np.float32).reshape(10, 100))
    assert main(["quantize", "--format", "e2m1", "--input", str(arr),
                 "--rounding", "stochastic"]) == 0
    assert "bits/coord" in capsys.readouterr().out


def test_quantize_unknown_name():
    with pytest.raises(SystemExit, match="unknown quantizer or format"):
        main(["quantize", "--format", "e9m9"])


def test_bench_codec_reports_ratios(tmp_path, capsys):
    out = tmp_path / "b.json"
    assert main(["bench", "kernels", "--n", "65536", "--quantizers", "mxfp8,dq4_hier",
                 "--repeat", "1", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["copy_gbps_range"][0] <= res["copy_gbps"] <= res["copy_gbps_range"][1]
    assert res["copy_gbps"] > 0 and len(res["rows"]) == 7
    # the CPU the timings were taken on: LLVM's name for it and its vector instructions
    assert res["cpu"] and res["cpu"].endswith(")") and " (" in res["cpu"]
    assert [r["name"] for r in res["rows"]] == ["mxfp8", "dq4_hier", "bf16 hop", "mxfp8 hop",
                                                "thc hop", "omnireduce hop", "dynamiq hop"]
    for r in res["rows"]:
        for k in ("encode", "decode", "recompress"):
            assert r[f"{k}_gbps"] > 0
            # each operation against the copy timed right before it
            assert r[f"{k}_vs_copy"] == pytest.approx(r[f"{k}_gbps"] / r[f"{k}_copy_gbps"])
            lo, hi = res["copy_gbps_range"]
            assert lo <= r[f"{k}_copy_gbps"] <= hi
            assert r[f"{k}_mcoords_per_core"] == pytest.approx(
                r["n"] / r[f"{k}_s"] / res["threads"] / 1e6)
    # the hops' messages: BF16, MXFP8's 8-bit elements (scales travel as metadata) and
    # DynamiQ's budget (5 bits, metadata apart)
    assert [r["bits_per_coord"] for r in res["rows"][2:4]] == [16.0, 8.0]
    assert 3.0 < res["rows"][-1]["bits_per_coord"] < 6.0
    assert "memory copy" in capsys.readouterr().out


def test_simulate_compares_pipelines(tmp_path, capsys):
    out = tmp_path / "s.json"
    pipes = "passthrough-fp32;requant-dq4;requant(quantizer=mxfp8)@butterfly"
    assert main(["simulate", "--world-size", "4", "--n", "4096", "--json", str(out),
                 "--pipeline", pipes]) == 0
    rows = json.loads(out.read_text())
    assert [r["pipeline"] for r in rows] == [
        "passthrough@ring", "requant(quantizer=dq4_hier)@ring", "requant(quantizer=mxfp8)@butterfly"
    ]
    assert rows[0]["vnmse"] < 1e-12 and 0 < rows[1]["vnmse"] < 0.05
    # b̄: an uncompressed FP32 ring costs 32 bits per coordinate (each rank sends 2(n-1)/n·b̄)
    assert rows[0]["bits_per_coord"] == 32.0
    assert main(["simulate", "--world-size", "3", "--n", "1024",
                 "--pipeline", "requant-dq4-butterfly"]) == 0
    assert "does not support 3 ranks" in capsys.readouterr().out


def test_bad_n():
    assert main(["quantize", "--n", "0"]) == 2
    assert main(["simulate", "--world-size", "0"]) == 2


def test_bench_scale_rejects_unknown_dynamiq_options(capsys):
    assert main(["bench", "scale", "--world-sizes", "4", "--d", "4096",
                 "--options", "no_such=1"]) == 2
    assert "has no parameter 'no_such'" in capsys.readouterr().err


def test_testbed_commands_report_without_building(capsys):
    from dynamiq.testbed import unavailable_reason

    # a bad shape is refused before anything is built (no root needed)
    assert main(["testbed", "check", "--rate", "100mbps"]) == 2
    assert "bytes per second to tc" in capsys.readouterr().err
    code = main(["testbed", "status", "--prefix", "dqcli"])
    if unavailable_reason() is None or code == 0:
        assert code == 0 and "no dqcli testbeds" in capsys.readouterr().out
    else:
        assert code == 3 and "iproute2" in capsys.readouterr().err


def test_import_option_registers_a_plugin(tmp_path, monkeypatch, capsys):
    (tmp_path / "cli_plugin_fmt.py").write_text(
        "from dynamiq import FORMATS, FloatFormat\n"
        "FORMATS.register('e2m5_cli_test', FloatFormat(ebits=2, mbits=5, special='none'))\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    from dynamiq import FORMATS

    try:
        assert main(["--import", "cli_plugin_fmt", "formats"]) == 0
        assert "e2m5_cli_test" in capsys.readouterr().out
    finally:
        FORMATS.unregister("e2m5_cli_test")
        sys.modules.pop("cli_plugin_fmt", None)
    assert main(["--import", "no_such_module_here", "formats"]) == 2
    assert "no_such_module_here" in capsys.readouterr().err


def test_log_level_option_configures_logging(capsys):
    import logging

    root = logging.getLogger()
    saved = (root.level, list(root.handlers))
    try:
        root.handlers.clear()
        assert main(["--log-level", "INFO", "formats"]) == 0
        assert logging.getLogger("dynamiq").getEffectiveLevel() == logging.INFO
    finally:
        root.handlers[:] = saved[1]
        root.setLevel(saved[0])
