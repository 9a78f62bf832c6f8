"""``dynamiq bench codec``: Numba encode/decode throughput against memory-copy bandwidth."""

from __future__ import annotations

import numba
import torch

from dynamiq.bench.timing import best_time, copy_bandwidth
from dynamiq.quantizers import get_quantizer

__all__ = ["DEFAULT_QUANTIZERS", "run"]

DEFAULT_QUANTIZERS = ("mxfp8", "int8_sr", "dq8_hier", "mxfp4", "int4_sr", "dq4_hier")


def run(
    n: int = 1 << 24,
    quantizers: tuple[str, ...] = DEFAULT_QUANTIZERS,
    repeat: int = 5,
    log=print,
) -> dict:
    """Measure encode, decode and fused recompress throughput of each quantizer.

    Throughput counts bytes read plus bytes written (float32 input and payload for encode,
    payload and float32 output for decode; payload in, float32 in/out and payload out for
    recompress), the same accounting as the copy bandwidth it is compared with.

    Args:
        n: Coordinates per tensor.
        quantizers: Registered quantizer names.
        repeat: Timed repetitions (best is kept) after one warm-up (which compiles).
        log: Progress/print function.

    Returns:
        ``{"copy_gbps": ..., "threads": ..., "rows": [{quantizer, bits, encode_gbps, ...}]}``.
    """
    x = torch.randn(n)
    copy = copy_bandwidth(4 * n, repeat)
    log(f"n = {n:,} float32, {numba.get_num_threads()} threads, "
        f"memory copy {copy / 1e9:.2f} GB/s (read + write)")
    rows = []
    for name in quantizers:
        q = get_quantizer(name)
        log(f"  {name}: compiling / warming up ...")
        p = q.encode(x)
        y = torch.empty(n)
        acc = torch.randn(n)
        out = torch.empty_like(p.data)
        pb = p.nbytes
        te = best_time(lambda q=q, p=p: q.encode(x, out=p.data), repeat)
        td = best_time(lambda q=q, p=p, y=y: q.decode(p, out=y), repeat)
        tr = best_time(lambda q=q, p=p, a=acc, o=out: q.recompress(p, a, out=o), repeat)
        row = {
            "quantizer": name,
            "bits_per_coord": q.bits_per_coord(n),
            "encode_gbps": (4 * n + pb) / te / 1e9,
            "decode_gbps": (4 * n + pb) / td / 1e9,
            "recompress_gbps": (2 * pb + 4 * n) / tr / 1e9,
        }
        for k in ("encode", "decode", "recompress"):
            row[f"{k}_vs_copy"] = row[f"{k}_gbps"] * 1e9 / copy
        rows.append(row)
    log("")
    log(f"{'quantizer':<10} {'bits':>6} {'encode GB/s':>12} {'ratio':>6} {'decode GB/s':>12} "
        f"{'ratio':>6} {'recomp GB/s':>12} {'ratio':>6}")
    for r in rows:
        log(f"{r['quantizer']:<10} {r['bits_per_coord']:>6.3f} {r['encode_gbps']:>12.2f} "
            f"{r['encode_vs_copy']:>6.3f} {r['decode_gbps']:>12.2f} {r['decode_vs_copy']:>6.3f} "
            f"{r['recompress_gbps']:>12.2f} {r['recompress_vs_copy']:>6.3f}")
    log(f"(ratio = throughput / memory-copy bandwidth {copy / 1e9:.2f} GB/s; goal >= 0.5)")
    return {"n": n, "threads": numba.get_num_threads(), "copy_gbps": copy / 1e9, "rows": rows}
