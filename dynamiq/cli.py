"""The ``dynamiq`` command line: list components, quantize tensors, run benchmarks, train."""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

__all__ = ["main"]


def _synthetic_gradient(n: int, seed: int) -> torch.Tensor:
    """A gradient-like vector: Gaussian entries whose scale varies log-normally per 256-block
    (the paper's super-group norm model, simplified), so blocks span many orders of magnitude."""
    g = torch.Generator().manual_seed(seed)
    blocks = -(-n // 256)
    scale = torch.exp(torch.randn(blocks, generator=g) * 1.5 - 4.0).repeat_interleave(256)[:n]
    return torch.randn(n, generator=g) * scale


def _cmd_formats(args: argparse.Namespace) -> int:
    from dynamiq import FORMATS, QUANTIZERS, TRANSFORMS
    from dynamiq.topologies import TOPOLOGIES

    rows = []
    print(f"{'format':<12} {'bits':>4}  description")
    for name in FORMATS.names():
        f = FORMATS[name]
        print(f"{name:<12} {f.bits:>4}  {f.describe()}")
        rows.append({"kind": "format", "name": name, "bits": f.bits, "about": f.describe()})
    print(f"\n{'quantizer':<12} {'bits/coord':>10}  description (metadata included)")
    for name in QUANTIZERS.names():
        q = QUANTIZERS[name]
        print(f"{name:<12} {q.bits_per_coord():>10.4g}  {q.describe()}")
        rows.append({"kind": "quantizer", "name": name, "bits_per_coord": q.bits_per_coord(),
                     "about": q.describe()})
    print(f"\ntransforms: {', '.join(TRANSFORMS.names())}")
    print(f"topologies: {', '.join(TOPOLOGIES.names())}")
    aliases = {**{f"{a}": t for a, t in FORMATS.aliases().items()},
               **{f"{a}": t for a, t in QUANTIZERS.aliases().items()}}
    print("aliases: " + ", ".join(f"{a}->{t}" for a, t in sorted(aliases.items())))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


def _resolve_quantizer(name: str, rounding: str | None):
    from dynamiq import FORMATS, QUANTIZERS, BlockQuantizer

    if name in QUANTIZERS:
        q = QUANTIZERS[name]
        if rounding is not None:
            q = BlockQuantizer(q.element, q.group_size, q.scale, rounding, q.scale_rounding,
                               q.super_group_size, q.super_scale)
        return q
    if name in FORMATS:
        # a bare element format: groups of 32 under a BF16 scale rounded up (no clipping)
        return BlockQuantizer(name, group_size=32, scale="bf16", rounding=rounding or "nearest")
    known = sorted(QUANTIZERS.names() + FORMATS.names())
    raise SystemExit(f"unknown quantizer or format {name!r}; known: {', '.join(known)}")


def _cmd_quantize(args: argparse.Namespace) -> int:
    q = _resolve_quantizer(args.format, args.rounding)
    if args.input:
        x = torch.from_numpy(np.load(args.input).astype(np.float32).reshape(-1).copy())
        source = args.input
    else:
        x = _synthetic_gradient(args.n, args.seed)
        source = f"synthetic gradient-like vector, n={args.n:,}, seed={args.seed}"
    print(f"quantizer : {q.describe()}")
    print(f"input     : {source}")
    t0 = time.perf_counter()
    p = q.encode(x, seed=args.seed)
    t1 = time.perf_counter()
    y = q.decode(p)
    t2 = time.perf_counter()
    xd, yd = x.double(), y.double()
    fin = torch.isfinite(xd)
    err = (yd - xd)[fin]
    nmse = float((err**2).sum() / (xd[fin] ** 2).sum().clamp_min(1e-300))
    print(f"bits/coord: {p.bits_per_coord:.4f}  ({p.nbytes:,} bytes for {p.n:,} coordinates, "
          "metadata included)")
    print(f"NMSE      : {nmse:.4e}   (||x_hat - x||^2 / ||x||^2)")
    sqnr = -10 * np.log10(max(nmse, 1e-300))
    print(f"max |err| : {float(err.abs().max()):.4e}   SQNR {sqnr:.2f} dB")
    print(f"time      : encode {1e3 * (t1 - t0):.1f} ms, decode {1e3 * (t2 - t1):.1f} ms "
          "(first call includes kernel compilation)")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "quantizer": q.describe(), "n": p.n, "bits_per_coord": p.bits_per_coord,
            "nmse": nmse, "max_abs_err": float(err.abs().max())}, indent=2))
    return 0


def _cmd_simulate(args: argparse.Namespace) -> int:
    from dynamiq import PIPELINES, get_pipeline, simulate

    names = args.pipeline.split(";") if args.pipeline else [
        "bf16", "mxfp8", "dynamiq", "dynamiq-paper", "dynamiq-butterfly", "mxfp8-butterfly"
    ]
    n, d = args.world_size, args.n
    # data-parallel gradients: a shared component plus each worker's own noise
    common = _synthetic_gradient(d, args.seed)
    g = torch.Generator().manual_seed(args.seed + 1)
    scale = common.abs().mean()
    inputs = torch.stack([common + args.noise * scale * torch.randn(d, generator=g)
                          for _ in range(n)])
    print(f"{n} virtual ranks, {d:,} coordinates each (gradient-like, noise {args.noise})")
    print(f"{'pipeline':<24} {'b̄ bits':>10} {'vNMSE':>11} {'worst hop':>11} {'seconds':>8}")
    rows = []
    for name in names:
        p = get_pipeline(name)
        if not p.topology.supports(n):  # type: ignore[union-attr]
            print(f"{name:<24} (topology {p.topology} does not support {n} ranks; skipped)")
            continue
        r = simulate(p, inputs)
        label = name if name in PIPELINES else str(p)
        # the budget b̄ (metadata included) as docs/method.rst (How methods are measured) counts it
        bits = r.bits
        worst = max(r.hop_vnmse) if r.hop_vnmse else 0.0
        print(f"{label:<24} {bits:>10.3f} {r.vnmse:>11.3e} {worst:>11.3e} {r.seconds:>8.2f}")
        rows.append({"pipeline": str(p), "world_size": n, "bits_per_coord": bits,
                     "vnmse": r.vnmse, "hop_vnmse": r.hop_vnmse, "seconds": r.seconds})
    print("b̄ = bits per coordinate, metadata included: each rank sends 2(n-1)/n · b̄ per "
          "coordinate")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
        print(f"wrote {args.json}")
    return 0


def _cmd_bench_codec(args: argparse.Namespace) -> int:
    from dynamiq.bench import codec

    names = tuple(args.quantizers.split(",")) if args.quantizers else codec.DEFAULT_QUANTIZERS
    res = codec.run(n=args.n, quantizers=names, repeat=args.repeat, hop=not args.no_hop)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
        print(f"wrote {args.json}")
    return 0


def _cmd_bench_nmse(args: argparse.Namespace) -> int:
    from dynamiq.bench import nmse
    from dynamiq.bench.workloads import WorkloadUnavailable

    methods = tuple(m for m in args.methods.split(";" if ";" in args.methods else ",") if m)
    try:
        nmse.run(args.workload, world_size=args.world_size, topology=args.topology,
                 methods=methods, bits=args.bits, ablation=args.ablation, sweep=args.sweep,
                 targets=_targets(args.targets), bias=args.bias, points=args.points,
                 json_path=args.json, plot_path=args.plot, cache_dir=args.cache_dir,
                 backend=args.backend)
    except WorkloadUnavailable as e:
        print(f"dynamiq bench nmse: {e}", file=sys.stderr)
        return 3
    return 0


def _targets(text: str | None) -> tuple[float | str, ...]:
    """``--targets 1e-3,mxfp8`` as numbers and names (checked by the codec)."""
    out: list[float | str] = []
    for t in (text or "").split(","):
        t = t.strip()
        if t:
            try:
                out.append(float(t))
            except ValueError:
                out.append(t)
    return tuple(out)


def _cmd_testbed(args: argparse.Namespace) -> int:
    from dynamiq.testbed import (
        LinkShape,
        TestbedError,
        TestbedUnavailable,
        clean_stale,
        list_testbeds,
    )

    try:
        if args.testbed == "check":
            from dynamiq.testbed.check import run_check

            shape = LinkShape(args.rate, delay_ms=args.delay_ms, loss_pct=args.loss_pct)
            sep = ";" if ";" in args.pipelines else ","
            rows = run_check(args.world_size, shape, args.n,
                             tuple(m for m in args.pipelines.split(sep) if m),
                             prefix=args.prefix, gso=not args.no_gso)
            if args.json:
                from dynamiq.bench.output import stderr_log, write_rows

                write_rows(rows, args.json, stderr_log)
            agree = all(len({r.digest for r in rows if r.pipeline == p}) == 1
                        for p in {r.pipeline for r in rows})
            return 0 if agree and all(r.within_bounds for r in rows) else 1
        if args.testbed == "clean":
            removed = clean_stale(args.prefix)
            print(f"removed {len(removed)} stale namespace(s)"
                  + (f": {', '.join(removed)}" if removed else ""))
            return 0
        beds = list_testbeds(args.prefix)
        if not beds:
            print(f"no {args.prefix} testbeds")
        for bed_id, bed in sorted(beds.items()):
            state = "live" if bed["alive"] else "stale (owner gone; `dynamiq testbed clean`)"
            print(f"{bed_id}: owner pid {bed['pid']}, {state}, namespaces: "
                  f"{', '.join(bed['namespaces']) or '(none)'}")
        return 0
    except TestbedUnavailable as e:
        print(f"dynamiq testbed: {e}", file=sys.stderr)
        return 3
    except (TestbedError, ValueError) as e:
        print(f"dynamiq testbed: {e}", file=sys.stderr)
        return 2


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``dynamiq`` command."""
    from dynamiq.bench import scale, train
    from dynamiq.bench.allreduce_cmd import add_allreduce_parser
    from dynamiq.bench.nmse import DEFAULT_METHODS

    p = argparse.ArgumentParser(prog="dynamiq", description=__doc__)
    p.add_argument("--log-level", default="WARNING",
                   choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                   help="what the library reports on standard error through logging "
                        "(default: WARNING)")
    p.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                   help="import this module first (repeatable), e.g. one that registers your "
                        "own formats, quantizers, codecs or pipelines; the current folder is "
                        "searched first")
    sub = p.add_subparsers(dest="command", required=True)

    f = sub.add_parser("formats", help="list registered formats, quantizers, transforms")
    f.add_argument("--json", help="also write the list to this JSON file")
    f.set_defaults(func=_cmd_formats)

    q = sub.add_parser("quantize", help="quantize a tensor and report error and bits")
    q.add_argument("--format", default="dq4_hier",
                   help="registered quantizer (e.g. mxfp8) or element format (e.g. e4m3)")
    q.add_argument("--input", help=".npy file to quantize (flattened); default: synthetic")
    q.add_argument("--n", type=int, default=1 << 20, help="length of the synthetic input")
    q.add_argument("--seed", type=int, default=0)
    q.add_argument("--rounding", choices=["nearest", "stochastic", "correlated"])
    q.add_argument("--json", help="write the results to this JSON file")
    q.set_defaults(func=_cmd_quantize)

    sm = sub.add_parser("simulate",
                        help="run pipelines over virtual ranks and report error and bits")
    sm.add_argument("--pipeline", help="';'-separated registered names or spec strings "
                    "(default: a comparison of the registered ones)")
    sm.add_argument("--world-size", type=int, default=8)
    sm.add_argument("--n", type=int, default=1 << 18, help="coordinates per rank")
    sm.add_argument("--noise", type=float, default=0.5,
                    help="per-rank noise relative to the mean gradient magnitude")
    sm.add_argument("--seed", type=int, default=0)
    sm.add_argument("--json", help="write the results to this JSON file")
    sm.set_defaults(func=_cmd_simulate)

    b = sub.add_parser("bench", help="benchmarks")
    bsub = b.add_subparsers(dest="bench", required=True)
    bc = bsub.add_parser(
        "codec", aliases=["kernels"],
        help="Numba encode, decode and fused decompress-accumulate-recompress throughput, "
             "and the BF16, MXFP8, THC, OmniReduce and DynamiQ codecs' hops, vs the memory copy",
    )
    bc.add_argument("--n", type=int, default=1 << 24, help="coordinates per tensor")
    bc.add_argument("--quantizers", help="comma-separated names (default: 4- and 8-bit set)")
    bc.add_argument("--repeat", type=int, default=5)
    bc.add_argument("--no-hop", action="store_true",
                    help="skip the pipelines' codecs (bf16, mxfp8, thc, omnireduce, dynamiq)")
    bc.add_argument("--json", help="write the results to this JSON file")
    bc.set_defaults(func=_cmd_bench_codec)

    add_allreduce_parser(bsub)

    bn = bsub.add_parser("nmse", help="vNMSE and measured bits/coordinate of every method on "
                         "real gradients (DynamiQ vs the paper's baselines)")
    bn.add_argument("--workload", default="gpt-stdlib",
                    help="a registered workload (gpt-stdlib, minilm-mlm, cnn-digits, "
                         "lstm-stdlib, bag-pydoc, lognormal, ...) or a spec, e.g. "
                         "'lognormal(d=65536)'")
    bn.add_argument("--world-size", type=int, default=8)
    bn.add_argument("--topology", default="ring", help="ring, butterfly, ...")
    bn.add_argument("--methods", default=",".join(DEFAULT_METHODS),
        help="comma-separated registered pipelines (';'-separated when giving specs)")
    bn.add_argument("--bits", type=float, default=5.0,
                    help="budget of the DynamiQ methods, bits/coordinate incl. metadata")
    bn.add_argument("--ablation", action="store_true",
                    help="also run the ablation (uniform levels -> ... -> correlated rounding)")
    bn.add_argument("--sweep", action="store_true",
                    help="also sweep DynamiQ's budget 3..8.5 bits and report the bits it needs "
                         "to match MXFP8's vNMSE")
    bn.add_argument("--targets", help="also run DynamiQ's accuracy-targeted mode at these "
                    "comma-separated vNMSE targets (or 'mxfp8'), e.g. 1e-3,3e-4,mxfp8")
    bn.add_argument("--bias", type=int, default=0, metavar="K",
                    help="also report, per method, the vNMSE of the mean of K independent "
                         "calls relative to vNMSE/K (1 = unbiased)")
    bn.add_argument("--points", type=int, help="training points (default: the workload's)")
    bn.add_argument("--cache-dir", help="gradient cache (default: ~/.cache/dynamiq/gradients)")
    bn.add_argument("--backend", default="auto",
                    help="kernel backend of the simulations: auto (Numba on CPU), reference "
                         "(compiles nothing; the same bits), triton")
    bn.add_argument("--json", help="write every row to this JSON file")
    bn.add_argument("--plot", help="write an SVG chart of vNMSE against bits here")
    bn.set_defaults(func=_cmd_bench_nmse)

    bs = bsub.add_parser("scale", help="the synthetic large-scale model: DynamiQ vs MXFP8 "
                         "as the number of ranks grows, ring vs butterfly")
    scale.add_arguments(bs)
    bs.set_defaults(func=scale.run_from_args)

    tr = sub.add_parser("train", help="data-parallel training of gpt-stdlib through the DDP "
                        "hook, each method in turn, on the network testbed: time to BF16's "
                        "loss and the split of a step")
    train.add_arguments(tr)
    tr.set_defaults(func=train.run_from_args)

    t = sub.add_parser("testbed", help="ranks in network namespaces over tc-shaped links "
                       "(needs root and iproute2)")
    tsub = t.add_subparsers(dest="testbed", required=True)
    tc = tsub.add_parser("check", help="build a testbed, all-reduce across it, compare the "
                         "veth byte counters with dynamiq's count, tear it down")
    tc.add_argument("--world-size", type=int, default=2)
    tc.add_argument("--rate", default="100mbit", help="each link's rate, e.g. 100mbit, 1gbit")
    tc.add_argument("--delay-ms", type=float, default=0.0,
                    help="one-way delay of each link (needs the kernel's netem)")
    tc.add_argument("--loss-pct", type=float, default=0.0,
                    help="packet loss of each link, percent (needs the kernel's netem)")
    tc.add_argument("--n", type=int, default=1 << 20, help="coordinates all-reduced")
    tc.add_argument("--pipelines", "--pipeline", default="requant-dq4,passthrough-fp32",
                    help="comma-separated registered pipelines (';'-separated when giving "
                         "specs)")
    tc.add_argument("--no-gso", action="store_true",
                    help="frames of one TCP segment each (headers as on a wire; more CPU)")
    tc.add_argument("--prefix", default="dynamiq", help="the namespaces' name prefix")
    tc.add_argument("--json", help="write the rows to this JSON file")
    for name, text in (("status", "list the testbeds on this machine, live or stale"),
                       ("clean", "remove stale testbeds (their owner process is gone)")):
        ts = tsub.add_parser(name, help=text)
        ts.add_argument("--prefix", default="dynamiq", help="the namespaces' name prefix")
    t.set_defaults(func=_cmd_testbed)
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``dynamiq`` console command."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(name)s: %(levelname)s: %(message)s")
    if args.imports:
        sys.path.insert(0, os.getcwd())
        for module in args.imports:
            try:
                importlib.import_module(module)
            except ImportError as e:
                print(f"dynamiq: --import {module}: {e}", file=sys.stderr)
                return 2
    for opt in ("n", "world_size"):
        if getattr(args, opt, 1) is not None and getattr(args, opt, 1) <= 0:
            print(f"dynamiq: --{opt.replace('_', '-')} must be positive", file=sys.stderr)
            return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
