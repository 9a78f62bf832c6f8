"""``dynamiq bench kernels``: Numba hop throughput against the memory copy of the same run.

Rows: every requested block quantizer's encode, decode and fused
decompress-accumulate-recompress, then the codec of each of :data:`HOP_PIPELINES` (the BF16,
MXFP8, THC and OmniReduce baselines and the default DynamiQ pipeline) on one ring chunk, as a
rank of a ring
runs it: ``compress``, ``decompress`` and the whole hop ``decompress_accumulate_recompress``,
with the codec's plan for the vector (MXFP8's block scales, DynamiQ's widths). Throughput
counts the bytes an operation must read and write, the same accounting as the memory copy it
is compared with (a ``torch.Tensor.copy_`` of the float32 tensor, read + write, on the same
threads). The copy is timed right before each operation: on a shared machine the bandwidth
left to a process drifts by a third and more over a run, so a ratio compares two timings taken
under the same conditions.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable

import numba
import torch

from dynamiq.bench.timing import best_time, copy_bandwidth, host_cpu
from dynamiq.quantizers import get_quantizer

__all__ = ["DEFAULT_QUANTIZERS", "HOP_PIPELINES", "run"]

DEFAULT_QUANTIZERS = ("mxfp8", "int8_sr", "dq8_hier", "mxfp4", "int4_sr", "dq4_hier")
#: The pipelines whose codecs are measured on a ring chunk (registered names; ``dynamiq`` is the
#: default DynamiQ, 5 bits).
HOP_PIPELINES = ("bf16", "mxfp8", "thc", "omnireduce", "dynamiq")
_OPS = ("encode", "decode", "recompress")


def _timed(ops: dict[str, Callable[[], object]], copy_bytes: int, repeat: int
           ) -> dict[str, tuple[float, float]]:
    """Per operation: the memory copy's bandwidth (bytes per second) measured right before it,
    and its best time in seconds."""
    return {k: (copy_bandwidth(copy_bytes, repeat), best_time(fn, repeat))
            for k, fn in ops.items()}


def _row(name: str, bits: float, n: int, threads: int,
         times: dict[str, tuple[float, float]], nbytes: dict[str, int]) -> dict:
    row: dict = {"name": name, "bits_per_coord": bits, "n": n}
    for k, (copy, t) in times.items():
        row[f"{k}_s"] = t
        row[f"{k}_gbps"] = nbytes[k] / t / 1e9
        row[f"{k}_copy_gbps"] = copy / 1e9
        row[f"{k}_vs_copy"] = nbytes[k] / t / copy
        row[f"{k}_mcoords_per_core"] = n / t / threads / 1e6
    return row


def _quantizer_row(name: str, x: torch.Tensor, threads: int, repeat: int) -> dict:
    n = x.numel()
    q = get_quantizer(name)
    p = q.encode(x)
    y = torch.empty(n)
    acc = torch.randn(n)
    out = torch.empty_like(p.data)
    pb = p.nbytes
    times = _timed({
        "encode": lambda: q.encode(x, out=p.data),
        "decode": lambda: q.decode(p, out=y),
        "recompress": lambda: q.recompress(p, acc, out=out),
    }, 4 * n, repeat)
    nbytes = {"encode": 4 * n + pb, "decode": 4 * n + pb, "recompress": 2 * pb + 4 * n}
    return _row(name, q.bits_per_coord(n), n, threads, times, nbytes)


def _pipeline_row(name: str, n: int, threads: int, repeat: int) -> dict:
    """Pipeline ``name``'s codec on chunk 0 of a two-rank ring over ``n`` coordinates: rank 1's
    leaf message coded, decoded, and taken in by rank 0's hop."""
    from dynamiq.collectives.engine import (
        Plan,
        apply_transforms,
        center_and_prepare,
        local_metadata,
    )
    from dynamiq.metadata import combine
    from dynamiq.pipeline import get_pipeline

    p = get_pipeline(name)
    gen = torch.Generator().manual_seed(0)
    ys = [apply_transforms(p, torch.randn(n, generator=gen), 0)[0] for _ in range(2)]
    states: dict = {}
    metas = [local_metadata(p, y, states) for y in ys]
    plan = Plan(p, 2, ys[0].numel())
    plan.set_metadata(combine([m for m, _ in metas], metas[0][1]), states)
    ys = [center_and_prepare(plan, y) for y in ys]
    a, b = plan.bounds[0]
    m = b - a
    codec = plan.outgoing_codec(1, 0)
    src = plan.context(1, 0)
    leaf = ys[1][a:b]
    data = codec.compress(leaf, src)
    ctx = dataclasses.replace(plan.context(0, 0), source=src)
    acc = ys[0][a:b].clone()
    decoded = torch.empty(m)
    # rank 0 receives rank 1's leaf message and sends its own partial sum, coded under its own
    # hop's plan (per-hop widths: the two messages may differ in size)
    out = torch.empty(codec.wire_bytes(m, plan.context(0, 0)), dtype=torch.uint8)
    coded = torch.empty_like(data)
    times = _timed({
        "encode": lambda: codec.compress(leaf, src, out=coded),
        "decode": lambda: codec.decompress(data, decoded, ctx),
        "recompress": lambda: codec.decompress_accumulate_recompress(
            data, acc, ctx, out=out, writeback="none"),
    }, 4 * n, repeat)
    pb = (data.numel() + out.numel()) / 2
    nbytes = {"encode": 4 * m + data.numel(), "decode": 4 * m + data.numel(),
              "recompress": 2 * pb + 4 * m}
    return _row(f"{name} hop", 8.0 * pb / m, m, threads, times, nbytes)


def _fmt(row: dict, op: str) -> str:
    if f"{op}_s" not in row:
        return f"{'-':>8} {'-':>6} {'-':>7}"
    return (f"{row[f'{op}_gbps']:>8.2f} {row[f'{op}_vs_copy']:>6.3f} "
            f"{row[f'{op}_mcoords_per_core']:>7.0f}")


def run(
    n: int = 1 << 24,
    quantizers: tuple[str, ...] = DEFAULT_QUANTIZERS,
    repeat: int = 5,
    hop: bool = True,
    log: Callable[[str], None] = print,
) -> dict:
    """Measure the Numba hop kernels against the memory copy of the same run.

    Args:
        n: Coordinates per tensor (float32).
        quantizers: Registered quantizer names.
        repeat: Timed repetitions (the best is kept) after one warm-up (which compiles).
        hop: Also measure the codecs of :data:`HOP_PIPELINES` on a ring chunk.
        log: Where progress lines and the table go.

    Returns:
        JSON-serialisable ``{"n", "threads", "cpu", "copy_gbps", "copy_gbps_range", "rows"}``
        (``cpu``: :func:`~dynamiq.bench.timing.host_cpu`; ``copy_gbps``: the median of the
        copies timed, ``copy_gbps_range`` their least and greatest); each row has, per
        operation, ``<op>_s``, ``<op>_gbps``, ``<op>_copy_gbps`` (the copy timed right before
        it), ``<op>_vs_copy`` (throughput over that copy's) and ``<op>_mcoords_per_core``
        (million coordinates per second per thread).
    """
    if n < 1 or repeat < 1:
        raise ValueError("n and repeat must be >= 1")
    threads = numba.get_num_threads()
    x = torch.randn(n)
    cpu = host_cpu()
    log(f"n = {n:,} float32, {threads} threads on {cpu}; the memory copy (read + write) timed "
        "before each operation")
    rows = []
    for name in quantizers:
        log(f"  {name}: compiling / warming up ...")
        rows.append(_quantizer_row(name, x, threads, repeat))
    for name in HOP_PIPELINES if hop else ():
        log(f"  {name} hop: compiling / warming up ...")
        rows.append(_pipeline_row(name, n, threads, repeat))
    copies = [r[f"{op}_copy_gbps"] for r in rows for op in _OPS if f"{op}_copy_gbps" in r]
    copy = statistics.median(copies) if copies else copy_bandwidth(4 * n, repeat) / 1e9
    span = (min(copies), max(copies)) if copies else (copy, copy)
    log("")
    head = f"{'':<14} {'':>6}" + "".join(f" {op:^23}" for op in _OPS)
    log(head)
    log(f"{'kernel':<14} {'bits':>6}" + " {:>8} {:>6} {:>7}".format("GB/s", "ratio", "Mc/s/c")
        * len(_OPS))
    for r in rows:
        log(f"{r['name']:<14} {r['bits_per_coord']:>6.3f} "
            + " ".join(_fmt(r, op) for op in _OPS))
    log(f"(ratio = throughput / the bandwidth of the memory copy timed right before the "
        f"operation, {span[0]:.2f}-{span[1]:.2f} GB/s in this run, median {copy:.2f}; "
        "Mc/s/c = million coordinates per second per thread)")
    return {"n": n, "threads": threads, "cpu": cpu, "copy_gbps": copy,
            "copy_gbps_range": list(span), "rows": rows}
