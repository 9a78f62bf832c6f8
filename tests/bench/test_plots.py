"""The figures of :mod:`dynamiq.bench.plots`: valid SVG and PNG files, byte-identical SVG on
reruns, refusals, and schedule diagrams of every built-in topology."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

from matplotlib.image import imread

from dynamiq.bench import plots

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SVG_NS = "{http://www.w3.org/2000/svg}"

SCATTER = {"dynamiq": [(5.0, 1e-3), (6.0, 3e-4), (4.0, 0.0)], "mxfp8": [(8.25, 2e-3)]}
PANELS = {"100mbit, 4 ranks": {"dynamiq": [(16, 0.5), (64, 2.0)],
                               "torch-fp32": [(16, 2.0), (64, 8.0)]},
          "1gbit, 4 ranks": {"dynamiq": [(16, 0.2), (64, 0.7)]}}
CHART = [{"series": {"a": [(0, 3.0), (1, 2.0)], "b": [(0, 3.1), (2, 1.9)]},
          "xlabel": "s", "ylabel": "loss", "title": "against time", "hline": (2.0, "target")},
         {"series": {"a": [(0, 3.0), (5, 2.0), (9, float("nan"))]}, "xlabel": "step",
          "ylabel": "loss", "ylim": (1.5, 3.5)}]


def _scatter(path: Path) -> Path:
    return plots.scatter_plot(SCATTER, path, title="gpt-stdlib, n=8, ring")


def _panels(path: Path) -> Path:
    return plots.line_panels(PANELS, path, title="time", xlabel="MB", ylabel="s",
                             dashed=("torch-fp32",))


def _chart(path: Path) -> Path:
    return plots.line_chart(CHART, path, title="loss")


def _ring(path: Path) -> Path:
    return plots.schedule_diagram("ring", 4, path)


DRAW = {"scatter_plot": _scatter, "line_panels": _panels, "line_chart": _chart,
        "schedule_diagram": _ring}


def _check_svg(path: Path) -> str:
    text = path.read_text()
    root = ET.fromstring(text)
    assert root.tag == f"{SVG_NS}svg" and len(root) > 0
    return text


def _check_png(path: Path) -> None:
    assert path.read_bytes()[:8] == PNG_MAGIC
    img = imread(path)
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100
    assert img[..., :3].std() > 0  # something is drawn on the white


@pytest.mark.parametrize("name", DRAW)
def test_writes_svg_and_png(name, tmp_path):
    draw = DRAW[name]
    svg = draw(tmp_path / "sub" / "f.svg")  # folders are created
    assert svg == tmp_path / "sub" / "f.svg"
    _check_svg(svg)
    _check_png(draw(tmp_path / "f.png"))


@pytest.mark.parametrize("name", DRAW)
def test_svg_is_deterministic(name, tmp_path):
    a = DRAW[name](tmp_path / "a.svg").read_bytes()
    b = DRAW[name](tmp_path / "b.svg").read_bytes()
    assert a == b


def test_text_labels_and_legend_are_in_the_svg(tmp_path):
    """Text stays text in the SVG (searchable; the benchmarks' tests read it)."""
    text = _check_svg(_panels(tmp_path / "p.svg"))
    for s in ("100mbit, 4 ranks", "1gbit, 4 ranks", "torch-fp32", "dynamiq", "time"):
        assert s in text
    text = _check_svg(_chart(tmp_path / "c.svg"))
    assert "target" in text and "against time" in text


@pytest.mark.parametrize("draw", [
    lambda p: plots.scatter_plot({"a": [(1.0, 0.0), (2.0, -1.0), (3.0, float("nan"))]}, p),
    lambda p: plots.scatter_plot({}, p),
    lambda p: plots.line_panels({"p": {"a": [(0.0, 1.0), (1.0, float("inf"))]}}, p),
    lambda p: plots.line_chart([], p),
    lambda p: plots.line_chart([{"series": {"a": [(float("nan"), 1.0)]}, "xlabel": "",
                                 "ylabel": ""}], p),
], ids=["scatter-nonpositive", "scatter-empty", "panels", "chart-empty", "chart-nan"])
def test_nothing_to_plot_is_refused(draw, tmp_path):
    with pytest.raises(ValueError, match="nothing to plot"):
        draw(tmp_path / "x.svg")
    assert not (tmp_path / "x.svg").exists()


@pytest.mark.parametrize("name", DRAW)
def test_bad_suffix_is_refused(name, tmp_path):
    with pytest.raises(ValueError, match=r"write \.svg or \.png"):
        DRAW[name](tmp_path / "f.pdf")
    assert not (tmp_path / "f.pdf").exists()


def test_missing_matplotlib_names_the_extra(monkeypatch, tmp_path):
    import builtins

    real = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    for suffix in (".svg", ".png"):
        with pytest.raises(ValueError, match=r"pip install 'dynamiq\[bench\]'"):
            plots.check_plot_path(tmp_path / f"f{suffix}")
    with pytest.raises(ValueError, match="matplotlib"):
        _scatter(tmp_path / "f.svg")


@pytest.mark.parametrize("spec, n, chunk_label", [
    ("ring", 4, "c3"),
    ("butterfly", 4, "c2–3"),
    ("butterfly", 8, "c4–7"),
    ("hierarchical(ranks_per_node=2)", 8, "c4–7"),
    ("hierarchical(ranks_per_node=2,inner=butterfly,outer=butterfly)", 8, "c4–7"),
])
def test_schedule_diagram_of_each_topology(spec, n, chunk_label, tmp_path):
    from dynamiq.topologies import get_topology

    topo = get_topology(spec)
    text = _check_svg(plots.schedule_diagram(topo, n, tmp_path / "s.svg"))
    steps = topo.schedule(n).steps()
    assert f"{topo.spec()} all-reduce: {n} ranks, {steps} steps" in text
    assert f"rank {n - 1}" in text and chunk_label in text
    assert "reduce-scatter" in text and "all-gather" in text
    assert ("inter link" in text) == spec.startswith("hierarchical")
    _check_png(plots.schedule_diagram(spec, n, tmp_path / "s.png", title="custom"))


def test_schedule_diagram_refuses_a_world_size_the_topology_cannot_serve(tmp_path):
    with pytest.raises(ValueError, match="power-of-two"):
        plots.schedule_diagram("butterfly", 6, tmp_path / "s.svg")


def test_chunk_labels_join_runs():
    assert plots._chunks_label([3]) == "c3"
    assert plots._chunks_label([7, 4, 5, 6]) == "c4–7"
    assert plots._chunks_label([0, 1, 3, 5, 6]) == "c0–1,3,5–6"
