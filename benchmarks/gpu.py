"""Achieved memory bandwidth of the fused Triton hop kernels on one GPU.

Run ``python benchmarks/gpu.py`` on a machine with a CUDA device (a few minutes on one GPU). For
every codec below and every tensor size (float32 tensors of 64 MB, 256 MB and 1 GB), each hop
operation of the codec interface is timed with CUDA events after a warm-up:

* ``compress`` (reads ``x``, writes the message),
* ``decompress`` (reads the message, writes ``out``),
* ``decompress_accumulate`` (reads the message and ``acc``, writes ``acc``),
* ``decompress_accumulate_recompress`` (reads the message and ``acc``, writes the outgoing
  message; ``writeback="none"``, an internal node's hop),

and reported as achieved bandwidth: the bytes the operation must read and write (the counts
above) divided by its time, next to a device-to-device copy of the tensor
(``torch.empty_like(x).copy_(x)``, 2 × size bytes) as the roofline.

Codecs: ``requant(quantizer=dq4_hier)`` and ``requant(quantizer=dq8_hier)`` (4- and 8-bit
ε-level elements, UINT8 group scales under BF16 super-group scales), ``shared_scale`` (MXFP8:
E4M3 elements under shared E8M0 block scales, from a fixed plan) and ``dynamiq`` (widths
2/4/8 under a fixed width plan cycling through the widths, so every hop runs the width gather,
one quantizer per width and the scatter; its time is the whole hop's).

With ``--allreduce`` it also spawns one process per visible GPU (NCCL) and times, for float32
tensors of 64 and 256 MB, ``torch.distributed.all_reduce`` in FP32 and in BF16 next to
``dynamiq.all_reduce`` with the pipelines ``passthrough-fp32``, ``bf16``, ``mxfp8`` and
``dynamiq`` (the slowest rank's time, best of the timed calls, with each pipeline's split into
codec, wire and wait time from ``P2PStats``). It needs at least two GPUs; on a single-GPU machine
the section is skipped with a message.

The table goes to stdout and a JSON report to ``--json`` (default ``gpu-bench.json``).
``--quick`` runs tiny sizes with few repetitions; with ``TRITON_INTERPRET=1`` it also runs on
CPU tensors (Triton's interpreter), which is how this script is smoke-tested without a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

MB = 1 << 20
#: Tensor sizes in bytes of float32 data (full run, --quick).
SIZES = (64 * MB, 256 * MB, 1024 * MB)
QUICK_SIZES = (4096, 16384)
OPS = ("compress", "decompress", "decompress_accumulate", "decompress_accumulate_recompress")


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on", "yes")


def pick_device(quick: bool) -> torch.device:
    """The CUDA device, or the CPU for ``--quick`` under ``TRITON_INTERPRET=1``; else exit."""
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    if quick and _interpreting():
        return torch.device("cpu")
    sys.exit("benchmarks/gpu.py needs a CUDA device (torch.cuda.is_available() is False); "
             "for a smoke test on the CPU run it with --quick and TRITON_INTERPRET=1")


class Timer:
    """Seconds per call of a function: ``triton.testing.do_bench`` (CUDA events, L2 flushed
    between calls, median) on a GPU, :func:`dynamiq.bench.timing.best_time`
    (``torch.utils.benchmark``) on the CPU."""

    def __init__(self, device: torch.device, warmup: int, repeat: int) -> None:
        self.device = device
        self.warmup = warmup
        self.repeat = repeat

    def __call__(self, fn: Callable[[], object]) -> float:
        if self.device.type != "cuda":
            from dynamiq.bench.timing import best_time

            return best_time(fn, repeat=max(1, self.repeat), warmup=self.warmup)
        from triton.testing import do_bench

        for _ in range(self.warmup):  # compilation and autotuning are not the steady state
            fn()
        return do_bench(fn, warmup=25, rep=100, return_mode="median") / 1e3


def codecs(length: int) -> list[tuple[str, object, object]]:
    """``(label, codec, prepared plan or None)`` of the benchmarked codecs for ``length``."""
    from dynamiq.codecs import DynamiQ, Requant, SharedScale, WidthPlan
    from dynamiq.codecs.shared_scale import SharedScalePlan

    out: list[tuple[str, object, object]] = [
        ("dq4_hier", Requant("dq4_hier"), None),
        ("dq8_hier", Requant("dq8_hier"), None),
    ]
    mx = SharedScale("e4m3", 32, "e8m0")
    blocks = -(-length // 32)
    scales = torch.full((blocks,), 2.0**-6, dtype=torch.float32)
    out.append(("mxfp8 (shared scale)", mx,
                SharedScalePlan(scales, scales * 448.0, 1.0)))
    dq = DynamiQ(bits=6.0, widths=(2, 4, 8))
    sgs = -(-length // 256)
    choice = np.arange(sgs, dtype=np.int64) % 3  # every width, interleaved: a real reorder
    out.append(("dynamiq 2/4/8", dq, WidthPlan(choice, dq.width_list, 0.0, 0.0)))
    return out


def bench_codec(label: str, codec, plan, x: torch.Tensor, timer: Timer) -> list[dict]:
    """Bandwidth of the four hop operations of one codec on ``x``."""
    from dynamiq.codecs import HopContext

    n = x.numel()
    ctx = HopContext(seed=1, stream=(0, 0), rank=0, world_size=2, index_offset=0,
                     prepared=None if plan is None else {codec: plan}, backend="triton")
    msg = codec.compress(x, ctx)
    w = msg.numel()
    out = torch.empty_like(x)
    acc = x.clone()
    buf = torch.empty_like(msg)
    runs = {
        "compress": (lambda: codec.compress(x, ctx, out=buf), 4 * n + w),
        "decompress": (lambda: codec.decompress(msg, out, ctx), w + 4 * n),
        "decompress_accumulate": (lambda: codec.decompress_accumulate(msg, acc, ctx),
                                  w + 8 * n),
        "decompress_accumulate_recompress": (
            lambda: codec.decompress_accumulate_recompress(msg, acc, ctx, out=buf), w + 4 * n + w),
    }
    rows = []
    for op in OPS:
        fn, nbytes = runs[op]
        sec = timer(fn)
        rows.append({"codec": label, "op": op, "bytes_float32": 4 * n, "wire_bytes": w,
                     "bits_per_coord": 8.0 * w / n, "bytes_moved": nbytes, "seconds": sec,
                     "gbps": nbytes / sec / 1e9})
    return rows


def run(sizes: tuple[int, ...], device: torch.device, warmup: int, repeat: int) -> dict:
    """Benchmark every codec at every size; returns the JSON report."""
    timer = Timer(device, warmup, repeat)
    rows = []
    for size in sizes:
        n = size // 4
        g = torch.Generator(device=device).manual_seed(0)
        x = torch.randn(n, generator=g, device=device)
        copy_sec = timer(lambda x=x: torch.empty_like(x).copy_(x))
        rows.append({"codec": "copy (torch)", "op": "copy", "bytes_float32": 4 * n,
                     "wire_bytes": 4 * n, "bits_per_coord": 32.0, "bytes_moved": 8 * n,
                     "seconds": copy_sec, "gbps": 8 * n / copy_sec / 1e9})
        for label, codec, plan in codecs(n):
            rows.extend(bench_codec(label, codec, plan, x, timer))
        del x
        if device.type == "cuda":
            torch.cuda.empty_cache()
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
    return {"device": name or str(device), "torch": torch.__version__,
            "interpreted": device.type != "cuda", "warmup": warmup, "repeat": repeat,
            "rows": rows}


def table(report: dict) -> str:
    """The report as a fixed-width text table, one block per tensor size."""
    lines = [f"device: {report['device']}  (warm-up {report['warmup']}, "
             f"{report['repeat']} timed calls each)"]
    by_size: dict[int, list[dict]] = {}
    for r in report["rows"]:
        by_size.setdefault(r["bytes_float32"], []).append(r)
    head = f"{'codec':<22}{'op':<34}{'bits/coord':>11}{'ms':>10}{'GB/s':>10}{'% copy':>8}"
    for size, rows in by_size.items():
        copy = next(r["gbps"] for r in rows if r["op"] == "copy")
        lines += ["", f"float32 tensor of {size / MB:g} MB", head, "-" * len(head)]
        for r in rows:
            lines.append(f"{r['codec']:<22}{r['op']:<34}{r['bits_per_coord']:>11.3f}"
                         f"{r['seconds'] * 1e3:>10.3f}{r['gbps']:>10.1f}"
                         f"{100.0 * r['gbps'] / copy:>7.0f}%")
    return "\n".join(lines)


ALLREDUCE_PIPELINES = ("passthrough-fp32", "bf16", "mxfp8", "dynamiq")
ALLREDUCE_SIZES = (64 * MB, 256 * MB)


def _allreduce_worker(rank: int, world: int, port: int, sizes: tuple[int, ...], repeat: int,
                      queue) -> None:
    """One NCCL rank: time torch's all-reduce and dynamiq's pipelines at every size."""
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    dev = torch.device("cuda", rank)

    def slowest(fn: Callable[[], object], reset: Callable[[], object]) -> float:
        best = float("inf")
        for k in range(repeat + 1):  # the first call warms up (buffers, kernels)
            reset()
            torch.cuda.synchronize(dev)
            dist.barrier()
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize(dev)
            t = torch.tensor([time.perf_counter() - t0], device=dev, dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            if k:
                best = min(best, float(t))
        return best

    rows = []
    for size in sizes:
        rows += _allreduce_size(size, rank, dev, slowest)
    if rank == 0:
        queue.put(rows)
    dist.destroy_process_group()


def _allreduce_size(size: int, rank: int, dev: torch.device, slowest) -> list[dict]:
    """One tensor size of :func:`_allreduce_worker` (``slowest(fn, reset)`` times a call)."""
    import torch.distributed as dist

    import dynamiq

    n = size // 4
    x = torch.randn(n, device=dev, generator=torch.Generator(device=dev).manual_seed(rank))
    y = torch.empty_like(x)
    yb = torch.empty(n, device=dev, dtype=torch.bfloat16)
    rows = [{"size": size, "what": "torch fp32",
             "seconds": slowest(lambda: dist.all_reduce(y), lambda: y.copy_(x))},
            {"size": size, "what": "torch bf16",
             "seconds": slowest(lambda: dist.all_reduce(yb), lambda: yb.copy_(x))}]
    for name in ALLREDUCE_PIPELINES:
        st = dynamiq.P2PStats()
        t = slowest(lambda name=name, st=st: dynamiq.all_reduce(y, name, stats=st),
                    lambda: y.copy_(x))
        rows.append({"size": size, "what": f"dynamiq {name}", "seconds": t,
                     "bits_per_coord": st.bits_per_coord,
                     "split": {k: getattr(st, k) for k in
                               ("codec_seconds", "wire_seconds", "wait_seconds",
                                "metadata_seconds") if hasattr(st, k)}})
    return rows


def run_allreduce(sizes: tuple[int, ...], repeat: int) -> dict:
    """NCCL all-reduce of torch and dynamiq over every visible GPU (needs two or more)."""
    import socket

    import torch.multiprocessing as mp

    world = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if world < 2:
        return {"skipped": f"needs at least two GPUs for NCCL, found {world}"}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_allreduce_worker, args=(r, world, port, sizes, repeat, queue))
             for r in range(world)]
    for p in procs:
        p.start()
    rows = queue.get(timeout=1800)
    for p in procs:
        p.join(60)
    for r in rows:
        ref = next(q["seconds"] for q in rows if q["size"] == r["size"]
                   and q["what"] == "torch fp32")
        r["vs_torch_fp32"] = r["seconds"] / ref
    return {"world_size": world, "repeat": repeat, "rows": rows}


def allreduce_table(report: dict) -> str:
    """The all-reduce section as text."""
    if "skipped" in report:
        return f"all-reduce: skipped ({report['skipped']})"
    lines = [f"all-reduce over {report['world_size']} GPUs (NCCL), best of {report['repeat']}"]
    head = f"{'MB':>6} {'what':<26}{'ms':>10}{'x torch':>9}{'bits':>7}  split (codec/wire/wait)"
    lines += [head, "-" * len(head)]
    for r in report["rows"]:
        sp = r.get("split") or {}
        split = "/".join(f"{sp[k] * 1e3:.1f}" for k in ("codec_seconds", "wire_seconds",
                                                        "wait_seconds") if k in sp)
        bits = f"{r['bits_per_coord']:.2f}" if "bits_per_coord" in r else "-"
        lines.append(f"{r['size'] / MB:>6g} {r['what']:<26}{r['seconds'] * 1e3:>10.2f}"
                     f"{r['vs_torch_fp32']:>9.2f}{bits:>7}  {split}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Command line entry point: run, print the table, write the JSON report."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default="gpu-bench.json", help="output JSON path")
    ap.add_argument("--quick", action="store_true",
                    help="tiny sizes, few repetitions (runs on CPU under TRITON_INTERPRET=1)")
    ap.add_argument("--sizes-mb", type=float, nargs="*",
                    help="tensor sizes in MB (default 64 256 1024)")
    ap.add_argument("--repeat", type=int, default=None, help="timed calls per measurement")
    ap.add_argument("--allreduce", action="store_true",
                    help="also time NCCL all-reduce: torch vs dynamiq pipelines (2+ GPUs)")
    args = ap.parse_args(argv)
    device = pick_device(args.quick)
    if args.sizes_mb:
        sizes = tuple(int(s * MB) // 4 * 4 for s in args.sizes_mb)
    else:
        sizes = QUICK_SIZES if args.quick else SIZES
    repeat = args.repeat or (2 if args.quick else 20)
    report = run(sizes, device, warmup=1 if args.quick else 3, repeat=repeat)
    print(table(report))
    if args.allreduce:
        report["allreduce"] = run_allreduce(ALLREDUCE_SIZES, 3 if args.quick else 10)
        print()
        print(allreduce_table(report["allreduce"]))
    Path(args.json).write_text(json.dumps(report, indent=2))
    print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
