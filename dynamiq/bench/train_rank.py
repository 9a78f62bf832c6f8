"""One rank of ``dynamiq train``: data-parallel training of ``gpt-stdlib`` under one method.

:func:`train_rank` runs in every process of a world (a testbed's or a loopback one) with the
default gloo group joined. Each rank builds the same model, wraps it in
``DistributedDataParallel``, reduces its gradients with the method's communication hook, reads
its own shard of the corpus and steps AdamW with the workload's warm-up. Every
``eval_every`` steps the ranks evaluate the validation loss together (each a slice of a fixed
held-out set, summed with one all-reduce) and time one forward and backward pass without
communication (``no_sync``): the compute-only reference of the time split.

Methods (:func:`check_method`):

* ``fp32``: DDP's default hook (an FP32 all-reduce of every bucket);
* ``bf16``: torch's ``bf16_compress_hook`` (buckets cast to BF16, all-reduced, cast back);
* any registered dynamiq pipeline or spec string (``dynamiq``, ``mxfp8``, ``thc``,
  ``omnireduce``, ...): :func:`dynamiq.ddp.dynamiq_hook` with a
  :class:`~dynamiq.ddp.DynamiQState` of that pipeline.

With a checkpoint path a rank saves its model, optimizer, hook state (pickled) and the curves
recorded so far every ``checkpoint_every`` steps and at the end, and starts from that file
when it exists, so an interrupted run continues its curves (and its wall clock) where it
stopped.
"""

from __future__ import annotations

import math
import os
import pickle
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from dynamiq.bench.progress import progress_bar, quiet
from dynamiq.bench.workloads.gpt_stdlib import GptStdlib, stdlib_corpus
from dynamiq.ddp import DEFAULT_MIN_COMPRESS_NUMEL, DynamiQState, dynamiq_hook
from dynamiq.testbed.counters import IFNAME_ENV, interface_counters

__all__ = ["LR_SCHEDULES", "TORCH_METHODS", "TrainConfig", "check_method", "checkpoint_file",
           "split_corpus", "train_rank"]

#: Learning-rate schedules after the warm-up (see :class:`TrainConfig`).
LR_SCHEDULES = ("cosine", "constant")
#: Methods that are torch's own hooks: DDP's default FP32 all-reduce and its BF16 hook.
TORCH_METHODS = {"fp32": "DDP's default all-reduce (FP32)",
                 "bf16": "torch's bf16_compress_hook (BF16 all-reduce)"}
_CHECKPOINT_VERSION = 2


@dataclass(frozen=True)
class TrainConfig:
    """What every rank of every method trains with.

    Attributes:
        workload: The model, data and optimizer settings (``gpt-stdlib``; override fields
            such as ``d_model`` for a smaller model).
        steps: Optimizer steps per method.
        eval_every: Steps between validation losses (and compute-only timings).
        val_sequences: Held-out sequences of the validation loss (split among the ranks).
        val_fraction: Share of the corpus held out at its end for validation.
        seed: Seed of initialisation and data order (the same for every method).
        bucket_mb: DDP's ``bucket_cap_mb``.
        min_compress_numel: Buckets below this stay plain in the dynamiq hook.
        checkpoint_every: Steps between checkpoints (with a checkpoint folder).
        progress: Whether rank 0 draws a progress bar on standard error.
        lr: The peak learning rate (AdamW). Training reads this, not the workload's ``lr``
            (which sets how ``bench nmse`` collects its gradients): the default is the best
            final BF16 loss of a sweep over 3e-4 … 1.5e-3 at the default steps, so that methods
            are compared at a tuned rate (docs/training.rst).
        schedule: The learning rate after the workload's linear warm-up: ``"cosine"`` decays
            it to ``min_lr_ratio`` of the peak at the last step, ``"constant"`` keeps the peak.
            A decayed rate anneals the gradient noise away at the end, so final losses compare
            methods rather than where each noisy trajectory happened to stop.
        min_lr_ratio: The cosine schedule's last rate as a fraction of the peak, in [0, 1].
    """

    workload: GptStdlib = field(default_factory=GptStdlib)
    steps: int = 150
    eval_every: int = 10
    val_sequences: int = 128
    val_fraction: float = 1 / 32
    seed: int = 0
    bucket_mb: float = 25.0
    min_compress_numel: int = DEFAULT_MIN_COMPRESS_NUMEL
    checkpoint_every: int = 50
    progress: bool = True
    lr: float = 5e-4
    schedule: str = "cosine"
    min_lr_ratio: float = 0.1

    def __post_init__(self) -> None:
        for name in ("steps", "eval_every", "val_sequences", "checkpoint_every"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        if not 0.0 < self.val_fraction < 0.5:
            raise ValueError(f"val_fraction must lie in (0, 0.5), got {self.val_fraction!r}")
        if isinstance(self.lr, bool) or not (isinstance(self.lr, (int, float))
                                             and math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr must be a positive number, got {self.lr!r}")
        if self.schedule not in LR_SCHEDULES:
            raise ValueError(f"schedule must be one of {LR_SCHEDULES}, got {self.schedule!r}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"min_lr_ratio must lie in [0, 1], got {self.min_lr_ratio!r}")

    def rate(self, step: int) -> float:
        """The learning rate of optimizer step ``step`` (0-based): a linear warm-up to
        :attr:`lr` over the workload's ``warmup`` steps, then the schedule up to step
        ``steps - 1``."""
        warm = max(1, self.workload.warmup)
        if step < warm or self.schedule == "constant":
            return self.lr * min(1.0, (step + 1) / warm)
        frac = min(1.0, (step + 1 - warm) / max(1, self.steps - warm))
        floor = self.min_lr_ratio
        return self.lr * (floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * frac)))


def check_method(method: str) -> str:
    """The pipeline spec behind ``method`` (``""`` for torch's own hooks).

    Raises:
        ValueError: neither a torch method nor a dynamiq pipeline (name or spec).
    """
    if method in TORCH_METHODS:
        return ""
    from dynamiq.pipeline import get_pipeline

    try:
        return str(get_pipeline(method))
    except Exception as e:
        raise ValueError(f"unknown method {method!r}: not one of {sorted(TORCH_METHODS)} nor a "
                         f"dynamiq pipeline ({e})") from e


def checkpoint_file(folder: str | Path, method: str, rank: int) -> Path:
    """Where rank ``rank`` keeps its checkpoint of ``method`` in ``folder``."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", method).strip("_") or "method"
    return Path(folder) / f"{safe}.rank{rank}.pt"


def split_corpus(wl: GptStdlib, world_size: int, val_fraction: float
                 ) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The training shards (the corpus but its last ``val_fraction``, cut into ``world_size``
    contiguous shards) and the held-out tail."""
    data = stdlib_corpus(wl.max_bytes)
    n_val = max(int(len(data) * val_fraction), wl.context + 2)
    train, val = data[:-n_val], data[-n_val:]
    n = len(train) // world_size
    if n < wl.context + 2:
        raise ValueError(f"{len(train)} training bytes give shards of {n} bytes, too short for "
                         f"context {wl.context}")
    return [train[r * n : (r + 1) * n] for r in range(world_size)], val


def _val_windows(wl: GptStdlib, val: torch.Tensor, count: int) -> torch.Tensor:
    """``count`` fixed windows of ``context + 1`` bytes spread evenly over the held-out text."""
    starts = torch.linspace(0, len(val) - wl.context - 1, count).long()
    return val[starts[:, None] + torch.arange(wl.context + 1)].long()


def _val_loss(model: torch.nn.Module, wl: GptStdlib, windows: torch.Tensor, chunk: int
              ) -> float:
    """Mean cross-entropy over every rank's windows (each rank evaluates its own slice)."""
    total = torch.zeros(2, dtype=torch.float64)
    with torch.no_grad():
        for i in range(0, len(windows), chunk):
            b = windows[i : i + chunk]
            total[0] += float(wl.loss(model, b)) * len(b)
            total[1] += len(b)
    dist.all_reduce(total)
    return float(total[0] / total[1])


def _hook(ddp: DDP, method: str, spec: str, cfg: TrainConfig, timer: list[float]):
    """Register ``method``'s hook on ``ddp``; returns the dynamiq state (or ``None``)."""
    if method == "fp32":
        return None
    if method == "bf16":
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import (
            bf16_compress_hook,
        )

        def timed(state, bucket):
            t0 = time.perf_counter()
            fut = bf16_compress_hook(state, bucket)
            timer[0] += time.perf_counter() - t0
            return fut

        ddp.register_comm_hook(None, timed)
        return None
    state = DynamiQState(pipeline=spec, min_compress_numel=cfg.min_compress_numel)
    ddp.register_comm_hook(state, dynamiq_hook)
    return state


def _warm_up_codec(spec: str) -> None:
    """Compile the pipeline's kernels before the clock starts (Numba compiles on first use)."""
    from dynamiq.collectives.api import all_reduce

    g = torch.Generator().manual_seed(dist.get_rank())
    all_reduce(torch.randn(1 << 17, generator=g), spec)
    dist.barrier()


def _new_record(method: str, spec: str, world_size: int, n_params: int) -> dict:
    return {"method": method, "pipeline": spec, "world_size": world_size,
            "params": n_params, "step": 0, "time": 0.0, "val": [], "train": [],
            "fwd_s": 0.0, "bwd_s": 0.0, "opt_s": 0.0, "step_s": 0.0, "probe_s": [],
            "codec_s": 0.0, "wire_tx_bytes": None, "hook": None, "resumed_at": []}


def _load(path: Path | None, method: str, world_size: int, cfg: TrainConfig) -> dict | None:
    """This rank's checkpoint, checked against the run (``None`` when there is none); every
    rank must agree on the step."""
    ck = None
    if path is not None and path.exists():
        ck = torch.load(path, weights_only=False)
        want = {"version": _CHECKPOINT_VERSION, "method": method, "world_size": world_size,
                "workload": repr(cfg.workload), "seed": cfg.seed,
                "schedule": _schedule_key(cfg)}
        got = {k: ck.get(k) for k in want}
        if got != want:
            raise ValueError(f"checkpoint {path} is of another run: {got} (this run: {want})")
    steps = [None] * world_size
    dist.all_gather_object(steps, None if ck is None else ck["step"])
    if len(set(steps)) != 1:
        raise RuntimeError(f"the ranks' checkpoints of {method!r} are at different steps "
                           f"{steps}; remove them (or restore a consistent set)")
    if ck is not None and ck["step"] > cfg.steps:
        raise ValueError(f"checkpoint {path} is at step {ck['step']}, past steps={cfg.steps}")
    return ck


def _schedule_key(cfg: TrainConfig) -> tuple:
    """What a resumed run must share with its checkpoint's run for the rates to continue:
    a cosine schedule depends on the step count, so such a run cannot be extended."""
    if cfg.schedule == "constant":
        return (cfg.lr, "constant")
    return (cfg.lr, cfg.schedule, cfg.min_lr_ratio, cfg.steps)


def _save(path: Path, model: torch.nn.Module, opt, state, record: dict, method: str,
          world_size: int, cfg: TrainConfig) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save({"version": _CHECKPOINT_VERSION, "method": method, "world_size": world_size,
                "workload": repr(cfg.workload), "seed": cfg.seed, "step": record["step"],
                "schedule": _schedule_key(cfg),
                "model": model.state_dict(), "opt": opt.state_dict(),
                "hook": None if state is None else pickle.dumps(state),
                "record": record}, tmp)
    os.replace(tmp, path)


def train_rank(rank: int, world_size: int, cfg: TrainConfig, method: str,
               checkpoint_dir: str | None = None) -> dict:
    """Train ``cfg.workload`` for ``cfg.steps`` steps with ``method`` on this rank.

    Args:
        rank, world_size: This process's place in the default group (joined).
        cfg: The run's settings.
        method: ``"fp32"``, ``"bf16"`` or a dynamiq pipeline (name or spec).
        checkpoint_dir: Folder of the checkpoints (``None``: none are read or written).

    Returns:
        This rank's record: the curves ``val`` and ``train`` (lists of ``[step, seconds,
        loss]``; seconds are training wall-clock, evaluation excluded; ``train`` holds the
        mean training loss of all ranks over each interval), the summed ``fwd_s``,
        ``bwd_s``, ``opt_s`` and ``step_s`` of the steps, ``probe_s`` (the forward and
        backward times without communication), ``codec_s`` (the hook's codec seconds),
        ``wire_tx_bytes`` (bytes this rank's testbed link sent during the steps, ``None``
        off the testbed), ``hook`` (the dynamiq hook's statistics) and ``resumed_at``.
    """
    spec = check_method(method)
    wl = cfg.workload
    shards, val = split_corpus(wl, world_size, cfg.val_fraction)
    mine = _val_windows(wl, val, cfg.val_sequences)[rank::world_size]
    path = checkpoint_file(checkpoint_dir, method, rank) if checkpoint_dir else None
    ck = _load(path, method, world_size, cfg)
    model = wl.build_model(cfg.seed)
    if ck is not None:
        model.load_state_dict(ck["model"])
    n_params = sum(p.numel() for p in model.parameters())
    record = ck["record"] if ck is not None else _new_record(method, spec, world_size,
                                                             n_params)
    if spec:
        _warm_up_codec(spec)
    ddp = DDP(model, bucket_cap_mb=cfg.bucket_mb)
    timer = [0.0]
    if ck is not None and ck["hook"] is not None:
        state = pickle.loads(ck["hook"])  # binds to the world; creates its private group
        ddp.register_comm_hook(state, dynamiq_hook)
    else:
        state = _hook(ddp, method, spec, cfg, timer)
    opt = torch.optim.AdamW(ddp.parameters(), lr=cfg.lr, betas=(0.9, 0.95),
                            weight_decay=wl.weight_decay)
    if ck is not None:
        opt.load_state_dict(ck["opt"])
        record["resumed_at"].append(record["step"])
    on_testbed = bool(os.environ.get(IFNAME_ENV))
    if on_testbed and record["wire_tx_bytes"] is None:
        record["wire_tx_bytes"] = 0
    chunk = 4 * wl.micro_batch
    bar = None
    if cfg.progress and rank == 0:
        bar = progress_bar(cfg.steps, method, initial=record["step"])
    if not record["val"]:
        record["val"].append([0, 0.0, _val_loss(model, wl, mine, chunk)])
    loss_sum, loss_n = 0.0, 0
    step = record["step"]
    while step < cfg.steps:
        for group in opt.param_groups:
            group["lr"] = cfg.rate(step)
        batch = wl.batch(shards[rank], seed=cfg.seed, rank=rank, step=step)
        before = interface_counters() if on_testbed else None
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = wl.loss(ddp, batch)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        t3 = time.perf_counter()
        if before is not None:
            record["wire_tx_bytes"] += (interface_counters() - before).tx_bytes
        record["fwd_s"] += t1 - t0
        record["bwd_s"] += t2 - t1
        record["opt_s"] += t3 - t2
        record["step_s"] += t3 - t0
        record["time"] += t3 - t0
        loss_sum += float(loss.detach())
        loss_n += 1
        step += 1
        record["step"] = step
        if step % cfg.eval_every == 0 or step == cfg.steps:
            mean = torch.tensor([loss_sum, loss_n], dtype=torch.float64)
            dist.all_reduce(mean)
            record["train"].append([step, record["time"], float(mean[0] / mean[1])])
            loss_sum, loss_n = 0.0, 0
            v = _val_loss(model, wl, mine, chunk)
            record["val"].append([step, record["time"], v])
            record["probe_s"].append(_probe(ddp, wl, batch))
            if path is not None and (step % cfg.checkpoint_every == 0 or step == cfg.steps):
                _finish(record, state, timer)
                _save(path, model, opt, state, record, method, world_size, cfg)
            if bar is not None:
                bar.set_postfix_str(f"val {v:.4f}", refresh=False)
                if quiet(bar):  # a log, not a terminal: one plain line per evaluation
                    print(f"{method}: step {step}/{cfg.steps} val {v:.4f}", file=sys.stderr,
                          flush=True)
        if bar is not None:
            bar.update(step - bar.n)
    _finish(record, state, timer)
    if bar is not None:
        if record["resumed_at"][-1:] == [cfg.steps]:
            bar.set_postfix_str(f"val {record['val'][-1][2]:.4f} (from the checkpoint)")
            if quiet(bar):
                print(f"{method}: {cfg.steps} steps done (from the checkpoint)",
                      file=sys.stderr, flush=True)
        bar.close()
    return record


def _finish(record: dict, state, timer: list[float]) -> None:
    """Fold the codec seconds and the hook's statistics into ``record`` (the dynamiq state's
    statistics are totals since the run began: they travel in the pickled state)."""
    if state is None:
        record["codec_s"] += timer[0]
        timer[0] = 0.0
        return
    record["codec_s"] = state.stats.codec_seconds
    record["hook"] = {"bits_per_coord": state.stats.bits_per_coord,
                      "compressed_calls": state.stats.compressed_calls,
                      "plain_calls": state.stats.plain_calls,
                      "bytes_sent": state.stats.bytes_sent,
                      "metadata_bytes": state.stats.metadata_bytes,
                      "compressed_numel": state.stats.compressed_numel,
                      "seconds": state.stats.seconds,
                      "codec_seconds": state.stats.codec_seconds,
                      "wire_seconds": state.stats.wire_seconds,
                      "wait_seconds": state.stats.wait_seconds}


def _probe(ddp: DDP, wl: GptStdlib, batch: torch.Tensor) -> float:
    """Seconds of one forward and backward pass without communication, all ranks together."""
    dist.barrier()
    t0 = time.perf_counter()
    with ddp.no_sync():
        wl.loss(ddp, batch).backward()
    seconds = time.perf_counter() - t0
    for p in ddp.parameters():
        p.grad = None
    return seconds

