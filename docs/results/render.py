"""Render the JSON of ``dynamiq bench nmse`` / ``scale`` / ``kernels`` as reStructuredText tables.

Usage (from the repository root)::

    python docs/results/render.py docs/results/{gpt,minilm}-*.json docs/results/scale.json \\
        > docs/results/tables.rst
    python docs/results/render.py docs/results/kernels.json > docs/results/kernels.rst

Each table gets a label ``<file stem>-<kind>`` that :doc:`../benchmarks` includes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _table(rows: list[dict], ref: float | None, scale: bool) -> list[str]:
    out = [".. list-table::", "   :header-rows: 1", ""]
    if scale:
        out.append("   * - ranks\n     - topology\n     - method\n     - bits/coord\n     - vNMSE")
        for r in rows:
            out.append(f"   * - {r['world_size']}\n     - {r['topology']}\n     - {r['method']}\n"
                       f"     - {r['bits_per_coord']:.3f}\n     - {r['vnmse']:.4g}")
        return out
    out.append("   * - method\n     - bits/coord\n     - vNMSE\n     - vs MXFP8\n     - unbiased")
    for r in rows:
        ratio = f"{ref / r['vnmse']:.2f}×" if ref and r["vnmse"] > 0 else ""
        out.append(f"   * - {r['method']}\n     - {r['bits_per_coord']:.3f}\n"
                   f"     - {r['vnmse']:.4g}\n     - {ratio}\n"
                   f"     - {'yes' if r.get('unbiased') else 'no'}")
    return out


def _kernels(report: dict) -> list[str]:
    """``dynamiq bench kernels``: throughput as a fraction of the same run's memory copy."""
    out = [f"float32 tensors of {report['n']:,} coordinates, {report['threads']} threads; "
           f"memory copy {report['copy_gbps']:.2f} GB/s (read + write) in the same run. Each "
           "cell: throughput over the copy's (million coordinates per second per thread).", "",
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


def render(paths: list[str]) -> str:
    """All tables of the given JSON files, one titled block per (file, kind)."""
    lines: list[str] = []
    for path in paths:
        rows = json.loads(Path(path).read_text())
        stem = Path(path).stem
        if isinstance(rows, dict) and "copy_gbps" in rows:
            lines += [f".. _{stem}-kernels:", "", f"**{stem}**", "", *_kernels(rows), ""]
            continue
        scale = "kind" not in rows[0]
        ref = None if scale else next((r["vnmse"] for r in rows if r["method"] == "mxfp8"), None)
        kinds = ["scale"] if scale else sorted({r["kind"] for r in rows},
                                               key=["methods", "ablation", "sweep"].index)
        for kind in kinds:
            rs = rows if scale else [r for r in rows if r["kind"] == kind]
            lines += [f".. _{stem}-{kind}:", "", f"**{stem}, {kind}**", ""]
            lines += [*_table(rs, ref, scale), ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(render(sys.argv[1:]))
