"""Render the JSON of ``dynamiq bench nmse`` / ``scale`` / ``kernels`` / ``allreduce --testbed``
as reStructuredText tables.

Usage (from the repository root)::

    python docs/results/render.py docs/results/*-ring.json docs/results/*-butterfly.json \\
        docs/results/scale.json \\
        > docs/results/tables.rst
    python docs/results/render.py docs/results/kernels.json > docs/results/kernels.rst
    python docs/results/render.py docs/results/allreduce_testbed.json \\
        > docs/results/allreduce_testbed.rst

Each table gets a label ``<file stem>-<kind>`` that :doc:`../benchmarks` includes.

The figures are drawn from the same JSON (:func:`render_figures`, no benchmark reruns) and the
schedule diagrams from the topologies themselves (:func:`render_schedules`). The Sphinx build
calls both at its start, into ``docs/generated/figures/``, so the site's figures always show
the committed numbers; by hand::

    python docs/results/render.py --figures [OUTDIR]
    python docs/results/render.py --schedules OUTDIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

#: This folder: the JSON of every result.
RESULTS = Path(__file__).resolve().parent

#: The schedules :func:`render_schedules` draws: topology spec and world size.
SCHEDULES: tuple[tuple[str, int], ...] = (
    ("ring", 4), ("butterfly", 8), ("hierarchical(ranks_per_node=2)", 8))


def _table(rows: list[dict], ref: float | None, scale: bool) -> list[str]:
    out = [".. list-table::", "   :header-rows: 1", ""]
    if scale:
        # each row against MXFP8 at its own world size and topology; time and the process's
        # peak memory where the run recorded them
        mx = {(r["world_size"], r["topology"]): r["vnmse"] for r in rows
              if r["method"] == "mxfp8"}
        out.append("   * - ranks\n     - topology\n     - method\n     - bits/coord\n     - vNMSE"
                   "\n     - vs MXFP8\n     - seconds\n     - peak GiB")
        for r in rows:
            ref_r = mx.get((r["world_size"], r["topology"]))
            ratio = f"{ref_r / r['vnmse']:.3g}×" if ref_r and r["vnmse"] > 0 else ""
            peak = f"{r['peak_memory_gb']:.1f}" if r.get("peak_memory_gb") else ""
            out.append(f"   * - {r['world_size']}\n     - {r['topology']}\n     - {r['method']}\n"
                       f"     - {r['bits_per_coord']:.3f}\n     - {r['vnmse']:.4g}\n"
                       f"     - {ratio}\n     - {r.get('seconds', 0.0):.1f}\n     - {peak}")
        return out
    from dynamiq.bench.nmse import target_value

    targeted = any(r.get("kind") == "target" for r in rows)
    out.append("   * - method\n     - bits/coord\n     - vNMSE\n     - vs MXFP8\n     - unbiased"
               + ("\n     - vs target" if targeted else ""))
    for r in rows:
        ratio = f"{ref / r['vnmse']:.2f}×" if ref and r["vnmse"] > 0 else ""
        line = (f"   * - {r['method']}\n     - {r['bits_per_coord']:.3f}\n"
                f"     - {r['vnmse']:.4g}\n     - {ratio}\n"
                f"     - {'yes' if r.get('unbiased') else 'no'}")
        if targeted:
            goal = target_value(r.get("target"), ref)
            line += f"\n     - {r['vnmse'] / goal:.2f}×" if goal else "\n     -"
        out.append(line)
    return out


def _kernels(report: dict) -> list[str]:
    """``dynamiq bench kernels``: throughput as a fraction of the same run's memory copy."""
    # JSON written before the CPU was recorded has no "cpu"
    on = f" on {report['cpu']}" if "cpu" in report else ""
    if "copy_gbps_range" in report:  # the copy timed before each operation
        lo, hi = report["copy_gbps_range"]
        copy = (f"the memory copy (read + write) timed right before each operation, "
                f"{lo:.2f}–{hi:.2f} GB/s (median {report['copy_gbps']:.2f})")
    else:
        copy = f"memory copy {report['copy_gbps']:.2f} GB/s (read + write) in the same run"
    out = [f"float32 tensors of {report['n']:,} coordinates, {report['threads']} threads{on}; "
           f"{copy}. Each cell: throughput over the copy's (million coordinates per second "
           "per thread).", "",
           ".. list-table::", "   :header-rows: 1", "",
           "   * - kernel\n     - bits/coord\n     - encode\n     - decode\n     - recompress"]
    for r in report["rows"]:
        cells = []
        for op in ("encode", "decode", "recompress"):
            if f"{op}_vs_copy" in r:
                cells.append(f"{r[f'{op}_vs_copy']:.3f} ({r[f'{op}_mcoords_per_core']:.0f} Mc/s)")
            else:
                cells.append("")
        out.append(f"   * - {r['name']}\n     - {r['bits_per_coord']:.3f}\n"
                   + "\n".join(f"     - {c}" for c in cells))
    return out


def _span(values: list[float], fmt: str) -> str:
    lo, hi = format(min(values), fmt), format(max(values), fmt)
    return lo if lo == hi else f"{lo}–{hi}"


def _testbed(rows: list[dict]) -> list[str]:
    """``dynamiq bench allreduce --testbed``: times, ratios and bytes; then where the time of
    the dynamiq pipelines went."""
    out = ["Best time per call (median in brackets) and its ratio to torch's FP32 and BF16 "
           "all-reduce and to the ``bf16`` pipeline (below 1: faster); bits per coordinate "
           "each rank sent, by dynamiq's count (torch: a ring's) and on its veth; the veth's "
           "bytes over dynamiq's count (ranges: over the ranks).", "",
           ".. list-table::", "   :header-rows: 1", "",
           "   * - rate\n     - MB\n     - method\n     - best (median) ms\n     - /torch-fp32"
           "\n     - /torch-bf16\n     - /bf16\n     - bits\n     - veth bits\n     - veth/count"]
    several = len({r["world_size"] for r in rows}) > 1

    def where(r: dict) -> str:  # the world size too when the file holds several
        return f"{r['rate']}, {r['world_size']} ranks" if several else r["rate"]

    for r in rows:
        pb = f"{r['pipeline_bf16_ratio']:.3f}" if r["pipeline_bf16_ratio"] else ""
        out.append(f"   * - {where(r)}\n     - {r['size_mb']:g}\n     - {r['method']}\n"
                   f"     - {r['seconds'] * 1e3:.0f} ({r['median_seconds'] * 1e3:.0f})\n"
                   f"     - {r['ratio']:.3f}\n     - {r['bf16_ratio']:.3f}\n     - {pb}\n"
                   f"     - {_span(r['bits_per_coord'], '.2f')}\n"
                   f"     - {_span(r['wire_bits_per_coord'], '.2f')}\n"
                   f"     - {_span(r['veth_ratio'], '.3f')}")
    out += ["", "Where rank 0's best call went, ms (:class:`~dynamiq.P2PStats`; *other*: the "
            "rest of the total); *link*: the time rank 0's veth bytes take at the rate; "
            "*cpu/cores*: the CPU time of all ranks per call over the cores they share (every "
            "method; torch's have no split).",
            "", ".. list-table::", "   :header-rows: 1", "",
            "   * - rate\n     - MB\n     - method\n     - total\n     - codec\n     - wire"
            "\n     - wait\n     - metadata\n     - other\n     - link\n     - cpu/cores"]
    for r in rows:
        split = [r[f"{k}_seconds"] for k in ("codec", "wire", "wait", "metadata")]
        cells = [r["seconds"], *split, r["seconds"] - sum(split), r["link_seconds"],
                 r["cpu_bound_seconds"]]
        if not r["pipeline"]:
            cells[1:6] = [None] * 5
        out.append(f"   * - {where(r)}\n     - {r['size_mb']:g}\n     - {r['method']}\n"
                   + "\n".join(f"     - {v * 1e3:.0f}" if v is not None else "     -"
                                for v in cells))
    return out


def _loopback(rows: list[dict]) -> list[str]:
    """``dynamiq bench allreduce`` on loopback: a lone call's time, and per call of calls in a
    row, each with its ratios to torch's FP32 all-reduce."""
    out = ["Best time of a lone call (median in brackets), and per call of calls issued in a "
           "row, each with its ratio to torch's FP32 all-reduce (best to best, median to "
           "median; below 1: faster); bits per coordinate each rank sent (torch: a ring's); "
           "the largest difference to torch's FP32 result.", "",
           ".. list-table::", "   :header-rows: 1", "",
           "   * - ranks\n     - MB\n     - method\n     - lone call ms\n     - /torch-fp32"
           "\n     - in a row ms\n     - /torch-fp32\n     - bits\n     - max abs diff"]
    for r in rows:
        row = (f"{r['burst_seconds'] * 1e3:.2f}",
               f"{r['burst_ratio']:.2f} ({r['burst_median_ratio']:.2f})") \
            if r.get("burst_seconds") else ("", "")
        out.append(f"   * - {r['world_size']}\n     - {r['size_mb']:g}\n     - {r['method']}\n"
                   f"     - {r['seconds'] * 1e3:.2f} ({r['median_seconds'] * 1e3:.2f})\n"
                   f"     - {r['ratio']:.2f} ({r['median_ratio']:.2f})\n"
                   f"     - {row[0]}\n     - {row[1]}\n"
                   f"     - {_span(r['bits_per_coord'], '.2f')}\n"
                   f"     - {r['max_abs_diff']:.3g}")
    return out


def render(paths: list[str]) -> str:
    """All tables of the given JSON files, one titled block per (file, kind)."""
    lines: list[str] = []
    for path in paths:
        rows = json.loads(Path(path).read_text())
        stem = Path(path).stem
        if isinstance(rows, dict) and "copy_gbps" in rows:
            lines += [f".. _{stem}-kernels:", "", f"**{stem}**", "", *_kernels(rows), ""]
            continue
        if "rate" in rows[0]:
            worlds = sorted({r["world_size"] for r in rows})
            lines += [f".. _{stem}-testbed:", "",
                      f"**{stem}, {' and '.join(map(str, worlds))} ranks**", "",
                      *_testbed(rows), ""]
            continue
        if "median_ratio" in rows[0]:
            worlds = sorted({r["world_size"] for r in rows})
            lines += [f".. _{stem}-loopback:", "",
                      f"**{stem}, {' and '.join(map(str, worlds))} ranks, loopback**", "",
                      *_loopback(rows), ""]
            continue
        scale = "kind" not in rows[0]
        ref = None if scale else next((r["vnmse"] for r in rows if r["method"] == "mxfp8"), None)
        kinds = ["scale"] if scale else sorted({r["kind"] for r in rows},
                                               key=["methods", "ablation", "sweep", "match",
                                                    "target"].index)
        for kind in kinds:
            rs = rows if scale else [r for r in rows if r["kind"] == kind]
            lines += [f".. _{stem}-{kind}:", "", f"**{stem}, {kind}**", ""]
            lines += [*_table(rs, ref, scale), ""]
    return "\n".join(lines)


#: The accuracy results drawn as vNMSE against bits: JSON stem of ``dynamiq bench nmse``.
NMSE_FIGURES: tuple[str, ...] = ("gpt-stdlib-ring", "gpt-stdlib-butterfly", "minilm-mlm-ring",
                                 "cnn-digits-ring", "lstm-stdlib-ring", "bag-pydoc-ring")


def render_figures(results: str | Path = RESULTS, outdir: str | Path | None = None
                   ) -> list[Path]:
    """Draw the results' figures from their JSON, with the functions the commands' ``--plot``
    uses, so a figure can never disagree with the numbers next to it.

    One ``<stem>.svg`` per JSON file: vNMSE against bits for each of :data:`NMSE_FIGURES`
    (``dynamiq bench nmse``), vNMSE against ranks (``scale``, ``dynamiq bench scale``), time
    against tensor size (``allreduce_testbed``, ``dynamiq bench allreduce --testbed``) and loss
    curves (``train``, ``dynamiq train``). A missing JSON file is skipped.

    Args:
        results: The folder of the JSON files.
        outdir: Where the figures go (created if missing); ``results`` when ``None``.

    Returns:
        The figures written.
    """
    from dynamiq.bench.allreduce_testbed import NetworkRow
    from dynamiq.bench.nmse import Row, plot_rows
    from dynamiq.bench.plots import scatter_plot
    from dynamiq.bench.timeplot import plot_times
    from dynamiq.bench.train_plot import plot

    d = Path(results)
    o = Path(outdir) if outdir is not None else d
    o.mkdir(parents=True, exist_ok=True)

    def load(stem: str):
        f = d / f"{stem}.json"
        return json.loads(f.read_text()) if f.is_file() else None

    out = []
    for stem in NMSE_FIGURES:
        data = load(stem)
        if data:
            rows = [Row(**r) for r in data]
            first = rows[0]
            out.append(plot_rows(rows, o / f"{stem}.svg", title=f"{first.workload}, "
                                 f"n={first.world_size}, {first.topology}"))
    scale = load("scale")
    if scale:
        series: dict[str, list[tuple[float, float]]] = {}
        for r in scale:
            series.setdefault(f"{r['method']} {r['topology']}", []).append(
                (r["world_size"], r["vnmse"]))
        out.append(scatter_plot(series, o / "scale.svg", xlabel="ranks n",
                                title="synthetic model: vNMSE against ranks"))
    testbed = load("allreduce_testbed")
    if testbed:
        out.append(plot_times([NetworkRow(**r) for r in testbed], o / "allreduce_testbed.svg"))
    train = load("train")
    if train:
        out.append(plot(train["curves"], o / "train.svg", train["target_loss"],
                        title=train["network"]))
    return out


def render_schedules(outdir: str | Path) -> list[Path]:
    """Draw the all-reduce schedule of each of :data:`SCHEDULES`, ranks against steps.

    Args:
        outdir: The folder to write ``schedule-ring.svg``, ``schedule-butterfly.svg`` and
            ``schedule-hierarchical.svg`` to (created if missing).

    Returns:
        The files written, in :data:`SCHEDULES` order.
    """
    from dynamiq.bench.plots import schedule_diagram

    return [schedule_diagram(spec, n, Path(outdir) / f"schedule-{spec.split('(')[0]}.svg")
            for spec, n in SCHEDULES]


if __name__ == "__main__":
    if sys.argv[1:2] == ["--figures"]:
        print("\n".join(map(str, render_figures(RESULTS, *sys.argv[2:3]))))
    elif sys.argv[1:2] == ["--schedules"] and len(sys.argv) == 3:
        print("\n".join(map(str, render_schedules(sys.argv[2]))))
    else:
        sys.stdout.write(render(sys.argv[1:]))
