"""``dynamiq train``: data-parallel training of ``gpt-stdlib`` through DDP, one method after
another, on the network testbed; time to the BF16 run's loss and where each step's time goes.

Every method trains the same model from the same initialisation on the same data order, for
the same number of steps, in a fresh world of ``world_size`` processes (see
:func:`~dynamiq.bench.train_rank.train_rank` for what a rank does). On a
:class:`~dynamiq.testbed.Testbed` (when this process can build one: root and iproute2) every
rank sits behind its own link shaped to ``rate``; otherwise, or with ``testbed=False``, the
ranks meet on loopback (:func:`~dynamiq.collectives.launch.launch`), where the wire is memory.

What is reported per method (:class:`TrainRow`):

* the curves of validation and training loss against training wall-clock and steps (the
  clock runs during the steps only: evaluation, timing probes and checkpoints are excluded);
* the **target**: the reference method's (``bf16``) final validation loss, loosened by
  ``target_tol`` (0.5 %), and the **time to target**: the training wall-clock of the first
  evaluation at which the method's validation loss is at or below it;
* the **time split** of an average step: *compute* is a forward and backward pass without
  communication (DDP's ``no_sync``, timed at every evaluation with all ranks computing at
  once, median taken) plus the optimizer step; what the step takes beyond that is the
  communication's cost, of which the hook's *codec* seconds (encoding and decoding on the
  hook's thread, at most that cost) are one part and *exposed communication* (the wire and
  waiting that the backward pass did not hide) the rest. The three add up to the step.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from dynamiq.bench.output import stderr_log
from dynamiq.bench.plots import check_plot_path
from dynamiq.bench.train_plot import plot
from dynamiq.bench.train_rank import (
    LR_SCHEDULES,
    TORCH_METHODS,
    TrainConfig,
    check_method,
    train_rank,
)

__all__ = ["DEFAULT_METHODS", "DEFAULT_RATE", "DEFAULT_WORLD_SIZE", "TrainRow", "add_arguments",
           "plot", "run", "run_from_args", "summarize"]

#: The methods trained by default: the reference, DynamiQ and the baselines.
DEFAULT_METHODS = ("bf16", "dynamiq", "mxfp8", "thc", "omnireduce")
#: Every rank's link rate by default (see :doc:`/training` for why).
DEFAULT_RATE = "50mbit"
#: Ranks by default.
DEFAULT_WORLD_SIZE = 4
_FEW_THREADS = {"OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"}


@dataclass
class TrainRow:
    """One method's training run, summarised.

    Attributes:
        method: ``fp32``, ``bf16`` or the dynamiq pipeline given.
        pipeline: The pipeline's spec string (``""`` for torch's hooks).
        bits_per_coord: Bits per gradient coordinate, ``b̄`` (each rank sends
            ``2(n-1)/n · b̄``): 32 and 16 for torch's hooks; for dynamiq's, measured by the
            hook over its compressed buckets, metadata included.
        steps: Steps trained.
        seconds: Training wall-clock of the run.
        step_s: Mean seconds per step.
        compute_s, codec_s, comm_s: The split of ``step_s`` (see the module's docstring).
        wire_mb_per_step: Megabytes (10**6) a rank's testbed link sent per step (``None`` off
            the testbed).
        final_val: Validation loss after the last step.
        final_vs_ref_pct: ``final_val`` relative to the reference's, in percent (``+``:
            worse).
        time_to_target: Training seconds to the target (``None``: not reached).
        steps_to_target: The step at which it was reached.
        speedup: The reference's time to target over this one's.
    """

    method: str
    pipeline: str
    bits_per_coord: float
    steps: int
    seconds: float
    step_s: float
    compute_s: float
    codec_s: float
    comm_s: float
    wire_mb_per_step: float | None
    final_val: float
    final_vs_ref_pct: float | None = None
    time_to_target: float | None = None
    steps_to_target: int | None = None
    speedup: float | None = None


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def summarize(method: str, records: list[dict]) -> TrainRow:
    """A :class:`TrainRow` from every rank's record of one method (targets not yet set)."""
    r0 = records[0]
    steps = max(1, r0["step"])
    n = r0["world_size"]
    step_s = _mean([r["step_s"] for r in records]) / steps
    compute = _mean([statistics.median(r["probe_s"]) if r["probe_s"] else r["fwd_s"] / steps
                     + r["bwd_s"] / steps for r in records])
    compute += _mean([r["opt_s"] for r in records]) / steps
    extra = max(0.0, step_s - compute)
    codec = min(_mean([r["codec_s"] for r in records]) / steps, extra)
    if method in TORCH_METHODS:
        bits = 32.0 if method == "fp32" else 16.0
    else:
        # a ring moves 2(n-1)/n b̄ per coordinate; the metadata is all-reduced (b̄ = its size)
        bits = _mean([8 * (h["bytes_sent"] * n / (2 * (n - 1)) + h["metadata_bytes"])
                      / h["compressed_numel"] if h and h["compressed_numel"] else 0.0
                      for h in (r["hook"] for r in records)])
    wire = None
    if r0["wire_tx_bytes"] is not None:
        wire = _mean([r["wire_tx_bytes"] for r in records]) / steps / 1e6
    return TrainRow(method=method, pipeline=r0["pipeline"], bits_per_coord=bits, steps=steps,
                    seconds=r0["time"], step_s=step_s, compute_s=min(compute, step_s),
                    codec_s=codec, comm_s=extra - codec, wire_mb_per_step=wire,
                    final_val=r0["val"][-1][2])


def _set_targets(rows: list[TrainRow], curves: dict[str, dict], reference: str,
                 tol: float) -> float | None:
    ref = next((r for r in rows if r.method == reference), None)
    if ref is None:
        return None
    target = ref.final_val * (1 + tol)
    for row in rows:
        row.final_vs_ref_pct = 100.0 * (row.final_val / ref.final_val - 1)
        hit = next((p for p in curves[row.method]["val"] if p[0] > 0 and p[2] <= target), None)
        if hit is not None:
            row.steps_to_target, row.time_to_target = int(hit[0]), float(hit[1])
    for row in rows:
        if row.time_to_target and ref.time_to_target:
            row.speedup = ref.time_to_target / row.time_to_target
    return target


def _table(rows: list[TrainRow], reference: str, out: Callable[[str], None]) -> None:
    head = (f"{'method':<12} {'b̄ bits':>7} {'s/step':>7} {'compute':>8} {'codec':>7} "
            f"{'exp.comm':>8} {'MB/step':>8} {'to target':>10} {'speed-up':>8} "
            f"{'final val':>9} {'Δ vs ' + reference:>10}")
    out(head)
    out("-" * len(head))
    for r in rows:
        ttt = (f"{tqdm.format_interval(r.time_to_target)} @{r.steps_to_target}"
               if r.time_to_target is not None else "not reached")
        sp = f"{r.speedup:.2f}x" if r.speedup is not None else "—"
        wire = f"{r.wire_mb_per_step:.2f}" if r.wire_mb_per_step is not None else "—"
        delta = f"{r.final_vs_ref_pct:+.2f}%" if r.final_vs_ref_pct is not None else "—"
        out(f"{r.method:<12} {r.bits_per_coord:>7.2f} {r.step_s:>7.3f} {r.compute_s:>8.3f} "
            f"{r.codec_s:>7.3f} {r.comm_s:>8.3f} {wire:>8} {ttt:>10} {sp:>8} "
            f"{r.final_val:>9.4f} {delta:>10}")


def run(
    methods: Sequence[str] = DEFAULT_METHODS,
    *,
    config: TrainConfig | None = None,
    world_size: int = DEFAULT_WORLD_SIZE,
    rate: str = DEFAULT_RATE,
    testbed: bool = True,
    resume: str | Path | None = None,
    reference: str = "bf16",
    target_tol: float = 0.005,
    threads: int = 1,
    json_path: str | Path | None = None,
    plot_path: str | Path | None = None,
    timeout: float | None = None,
    out: Callable[[str], None] = print,
    log: Callable[[str], None] | None = None,
) -> dict:
    """Train with every method in turn and compare them.

    Args:
        methods: ``fp32``, ``bf16`` and dynamiq pipelines (names or specs), in run order.
        config: Model, data and schedule (default :class:`TrainConfig`).
        world_size: Ranks.
        rate: Every testbed link's rate (``"50mbit"``, ``"1gbit"``).
        testbed: Run on the testbed when this process can build one (``False``: loopback).
        resume: Checkpoint folder: each method starts from its checkpoint there when one
            exists, and checkpoints every ``config.checkpoint_every`` steps.
        reference: The method that defines the target (its final validation loss).
        target_tol: The target is the reference's final validation loss times
            ``1 + target_tol``.
        threads: Torch and Numba threads per rank.
        json_path: Also write the results here.
        plot_path: Also write the loss curves here (``.svg`` or ``.png``; needs matplotlib).
        timeout: Seconds allowed per method (default: 120 plus 30 per step).
        out: Where the table goes.
        log: Where progress lines go (default: standard error).

    Returns:
        ``{"config", "network", "reference", "target_loss", "rows", "curves",
        "hook_stats", "load_average"}``: the rows as dicts (:class:`TrainRow`), the curves
        per method (``val`` and ``train``, lists of ``[step, seconds, loss]``), per dynamiq
        method every rank's :class:`~dynamiq.ddp.HookStats` totals, and per method the
        machine's 1-minute load average before and after its run (other work on the same
        cores slows the steps).

    Raises:
        ValueError: an unknown method or bad setting (before anything runs).
    """
    from dynamiq.testbed import LinkShape, Testbed, unavailable_reason

    log = log or stderr_log
    cfg = config or TrainConfig()
    methods = list(dict.fromkeys(methods))
    if not methods:
        raise ValueError("no methods to train")
    for m in methods:
        check_method(m)
    if plot_path:
        check_plot_path(plot_path)
    if world_size < 2:
        raise ValueError(f"world_size must be >= 2, got {world_size}")
    shape = LinkShape(rate)
    why = unavailable_reason() if testbed else "loopback asked for"
    network = f"testbed, {world_size} ranks at {shape.describe()}" if why is None else (
        f"loopback, {world_size} ranks ({why})")
    timeout = timeout or 120.0 + 30.0 * cfg.steps
    ckdir = str(Path(resume).resolve()) if resume else None
    log(f"dynamiq train: {cfg.workload.name} for {cfg.steps} steps per method on {network}; "
        f"methods {', '.join(methods)}")
    records: dict[str, list[dict]] = {}
    load: dict[str, list[float]] = {}  # the machine's 1-minute load average around each run
    bed = Testbed(world_size, shape).up() if why is None else None
    try:
        for m in methods:
            load[m] = [os.getloadavg()[0]]
            args = (cfg, m, ckdir)
            if bed is not None:
                records[m] = bed.run(train_rank, args, timeout=timeout, env=_FEW_THREADS,
                                     num_threads=threads)
            else:
                from dynamiq.collectives.launch import launch

                records[m] = launch(train_rank, world_size, args, timeout=timeout,
                                    env=_FEW_THREADS, num_threads=threads)
            load[m].append(os.getloadavg()[0])
    finally:
        if bed is not None:
            bed.teardown()
    rows = [summarize(m, records[m]) for m in methods]
    curves = {m: {"val": records[m][0]["val"], "train": records[m][0]["train"],
                  "resumed_at": records[m][0]["resumed_at"]} for m in methods}
    hooks = {m: [r["hook"] for r in records[m]] for m in methods if records[m][0]["hook"]}
    target = _set_targets(rows, curves, reference, target_tol)
    out(f"\n{cfg.workload.name}, {cfg.steps} steps, {network}")
    if target is not None:
        out(f"target: {reference}'s final validation loss + {100 * target_tol:g} % = "
            f"{target:.4f}")
    _table(rows, reference, out)
    result = {"config": {**_config_dict(cfg), "world_size": world_size, "rate": rate,
                         "threads": threads, "target_tol": target_tol},
              "network": network, "reference": reference, "target_loss": target,
              "rows": [dataclasses.asdict(r) for r in rows], "curves": curves,
              "hook_stats": hooks, "load_average": load}
    if json_path:
        p = Path(json_path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(result, indent=1, default=_jsonable))
        log(f"wrote {p}")
    if plot_path:
        log(f"wrote {plot(curves, plot_path, target, title=network)}")
    return result


def _config_dict(cfg: TrainConfig) -> dict:
    d = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
    d["workload"] = dataclasses.asdict(cfg.workload)
    return d


def _jsonable(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, tuple):
        return list(x)
    raise TypeError(f"not JSON serialisable: {x!r}")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``dynamiq train``."""
    p.add_argument("--steps", type=int, default=TrainConfig.steps, help="steps per method")
    p.add_argument("--rate", default=DEFAULT_RATE,
                   help="every rank's link rate on the testbed, e.g. 50mbit, 1gbit")
    p.add_argument("--methods", default=",".join(DEFAULT_METHODS),
                   help="comma-separated: bf16 (torch's hook, the reference), fp32 (DDP's "
                        "default) and dynamiq pipelines (';'-separated when giving specs)")
    p.add_argument("--world-size", type=int, default=DEFAULT_WORLD_SIZE)
    p.add_argument("--resume", metavar="DIR", help="checkpoint folder: continue each method "
                   "from its checkpoint there, and checkpoint into it")
    p.add_argument("--no-testbed", action="store_true",
                   help="run the ranks on loopback (no shaped links)")
    p.add_argument("--eval-every", type=int, default=TrainConfig.eval_every,
                   help="steps between validation losses")
    p.add_argument("--checkpoint-every", type=int, default=TrainConfig.checkpoint_every)
    p.add_argument("--workload", default="gpt-stdlib",
                   help="gpt-stdlib or a spec overriding its fields, e.g. "
                        "'gpt-stdlib(d_model=128,n_layers=2)'")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=TrainConfig.lr,
                   help="peak learning rate (the workload's own lr is not used in training)")
    p.add_argument("--schedule", choices=LR_SCHEDULES, default=TrainConfig.schedule,
                   help="learning rate after the warm-up: cosine decay to --min-lr-ratio of "
                        "the peak at the last step, or constant")
    p.add_argument("--min-lr-ratio", type=float, default=TrainConfig.min_lr_ratio,
                   help="the cosine schedule's last learning rate over its peak")
    p.add_argument("--bucket-mb", type=float, default=TrainConfig.bucket_mb,
                   help="DDP's bucket_cap_mb")
    p.add_argument("--target-tol", type=float, default=0.5,
                   help="the target is the reference's final validation loss plus this many "
                        "percent")
    p.add_argument("--threads", type=int, default=1, help="torch and Numba threads per rank")
    p.add_argument("--json", help="write the rows and curves to this JSON file")
    p.add_argument("--plot", help="write the loss curves here (.svg or .png; needs "
                   "matplotlib)")


def run_from_args(args: argparse.Namespace) -> int:
    """Run ``dynamiq train`` with parsed options; returns the exit status (2: bad settings or
    testbed failure, 1: a rank failed or timed out)."""
    from dynamiq.bench.workloads import get_workload
    from dynamiq.bench.workloads.gpt_stdlib import GptStdlib
    from dynamiq.collectives.launch import RankFailedError
    from dynamiq.testbed import TestbedError

    try:
        wl = get_workload(args.workload)
        if not isinstance(wl, GptStdlib):
            raise ValueError(f"dynamiq train trains gpt-stdlib models, not {args.workload!r}")
        cfg = TrainConfig(workload=wl, steps=args.steps, eval_every=args.eval_every,
                          seed=args.seed, bucket_mb=args.bucket_mb,
                          checkpoint_every=args.checkpoint_every, lr=args.lr,
                          schedule=args.schedule,
                          min_lr_ratio=args.min_lr_ratio)
        sep = ";" if ";" in args.methods else ","
        run(tuple(m for m in args.methods.split(sep) if m), config=cfg,
            world_size=args.world_size, rate=args.rate, testbed=not args.no_testbed,
            resume=args.resume, target_tol=args.target_tol / 100, threads=args.threads,
            json_path=args.json, plot_path=args.plot)
    except (ValueError, TestbedError) as e:
        print(f"dynamiq train: {e}", file=sys.stderr)
        return 2
    except (RankFailedError, TimeoutError) as e:
        print(f"dynamiq train: {e}", file=sys.stderr)
        return 1
    return 0
