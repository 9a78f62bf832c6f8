"""The ``dynamiq bench allreduce`` command: its arguments, checked before any process starts,
and the choice between the loopback benchmark (:mod:`dynamiq.bench.allreduce`) and the testbed
one (:mod:`dynamiq.bench.allreduce_testbed`), whose defaults differ."""

from __future__ import annotations

import argparse
import sys

from dynamiq.bench import allreduce
from dynamiq.bench import allreduce_testbed as tb
from dynamiq.bench.timeplot import check_plot_path
from dynamiq.testbed import LinkShape, TestbedError, TestbedUnavailable

__all__ = ["add_allreduce_parser", "run_allreduce_command"]


def add_allreduce_parser(subparsers) -> argparse.ArgumentParser:
    """Add ``allreduce`` to the ``dynamiq bench`` subcommands."""
    ba = subparsers.add_parser(
        "allreduce",
        help="dynamiq.all_reduce pipelines vs torch.distributed.all_reduce (FP32 and BF16) on "
             "loopback gloo or, with --testbed, across shaped links, with the time split of "
             "each pipeline",
    )
    ba.add_argument("--world-sizes", "--world-size",
                    help="comma-separated, e.g. 2,4 (default 2,4; with --testbed 4)")
    ba.add_argument("--sizes-mb", "--sizes",
                    help="tensor sizes in MB (float32; default 4,16,64; with --testbed "
                         "1,16,64)")
    ba.add_argument("--pipelines", "--pipeline",
                    help="comma-separated registered pipelines (';'-separated when giving "
                         f"specs; default {','.join(allreduce.DEFAULT_PIPELINES)}; with --testbed "
                         f"{','.join(tb.TESTBED_PIPELINES)})")
    ba.add_argument("--repeat", type=int,
                    help="timed rounds after a warm-up; the best counts (default 3; with "
                         "--testbed 2)")
    ba.add_argument("--burst", type=int,
                    help="per round, also time this many calls in a row and report the time "
                         f"per call (loopback only; default {allreduce.BURST}, 0: not)")
    ba.add_argument("--testbed", action="store_true",
                    help="run every world across a network testbed, ranks in network "
                         "namespaces over tc-shaped links (needs root and iproute2), and "
                         "count the bytes each link sent")
    ba.add_argument("--rate", "--rates",
                    help="with --testbed: comma-separated link rates (default 100mbit,1gbit)")
    ba.add_argument("--prefix", default="dynamiq",
                    help="with --testbed: the namespaces' name prefix")
    ba.add_argument("--json", help="write the rows to this JSON file")
    ba.add_argument("--plot", help="plot time per call against tensor size here (.svg or "
                    ".png; needs matplotlib), one panel per rate (or world size)")
    ba.set_defaults(func=run_allreduce_command)
    return ba


def run_allreduce_command(args: argparse.Namespace) -> int:
    """Check the arguments, then run the loopback or the testbed benchmark.

    Returns:
        The exit status: 0, 2 for a bad argument (nothing ran) or a testbed that failed, 3 when
        no testbed can be built here (the reason goes to standard error).
    """
    def listed(text: str | None, default: tuple) -> tuple:
        if text is None:
            return default
        return tuple(v for v in text.split(";" if ";" in text else ",") if v)

    testbed = args.testbed
    try:  # every argument is checked before a process starts
        world_sizes = tuple(int(v) for v in listed(args.world_sizes,
                                                   ("4",) if testbed else ("2", "4")))
        if any(n < 1 for n in world_sizes):
            raise ValueError("world sizes must be positive")
        sizes_mb = tuple(float(v) for v in listed(
            args.sizes_mb, tb.TESTBED_SIZES_MB if testbed else (4, 16, 64)))
        if any(not mb > 0 for mb in sizes_mb):
            raise ValueError("tensor sizes must be positive")
        pipelines = listed(args.pipelines, tb.TESTBED_PIPELINES if testbed
                           else allreduce.DEFAULT_PIPELINES)
        repeat = args.repeat if args.repeat is not None else 2 if testbed else 3
        allreduce.methods_of(pipelines, repeat)
        if args.plot:
            check_plot_path(args.plot)
        if not testbed and args.rate is not None:
            raise ValueError("--rate needs --testbed (loopback has no link rate)")
        if testbed and args.burst is not None:
            raise ValueError("--burst is measured on loopback only")
        burst = allreduce.BURST if args.burst is None else args.burst
        if burst < 0:
            raise ValueError("burst must be >= 0")
        rates = listed(args.rate, ("100mbit", "1gbit"))
        if testbed:
            for rate in rates:
                LinkShape(rate)
    except ValueError as e:
        print(f"dynamiq bench allreduce: {e}", file=sys.stderr)
        return 2
    if not testbed:
        allreduce.run(world_sizes=world_sizes, sizes_mb=sizes_mb, pipelines=pipelines,
                      repeat=repeat, burst=burst, json_path=args.json,
                      plot_path=args.plot)
        return 0
    try:
        tb.run_testbed(rates=rates, world_sizes=world_sizes, sizes_mb=sizes_mb,
                       pipelines=pipelines, repeat=repeat, json_path=args.json,
                       plot_path=args.plot, prefix=args.prefix)
    except TestbedUnavailable as e:
        print(f"dynamiq bench allreduce --testbed: {e}", file=sys.stderr)
        return 3
    except TestbedError as e:
        print(f"dynamiq bench allreduce --testbed: {e}", file=sys.stderr)
        return 2
    return 0
