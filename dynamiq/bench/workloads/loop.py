"""The DDP-emulated training loop of the from-scratch workloads, with their progress reporting.

``cnn-digits``, ``lstm-stdlib`` and ``bag-pydoc`` all train the same way: :func:`emulate_ddp`
over their own model and data, a progress bar on a terminal and a plain line every tenth of the
run otherwise. :func:`train_ddp` is that loop once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from dynamiq.bench.progress import progress_bar, quiet
from dynamiq.bench.workloads.base import Progress, emulate_ddp

__all__ = ["train_ddp", "warmup_lr"]


def warmup_lr(lr: float, warmup: int) -> Callable[[int], float]:
    """The learning rate of a linear warm-up over ``warmup`` steps to ``lr``, then constant."""
    return lambda step: lr * min(1.0, (step + 1) / max(1, warmup))


def train_ddp(
    name: str,
    params: Sequence[torch.nn.Parameter],
    worker_loss: Callable[[int, int], torch.Tensor],
    optimizer: torch.optim.Optimizer,
    world_size: int,
    points: tuple[int, ...],
    *,
    progress: Progress | None,
    lr_at: Callable[[int], float] | None = None,
    before_update: Callable[[int], None] | None = None,
    on_point: Callable[[int, torch.Tensor], None] | None = None,
) -> dict[int, torch.Tensor]:
    """:func:`emulate_ddp` through ``max(points)`` with a progress bar labelled ``name``.

    Args:
        name: Workload named in the bar and the progress lines.
        params: Trainable parameters, in the order of the gradient vector.
        worker_loss: ``(step, rank) -> scalar loss`` of worker ``rank``'s micro-batch.
        optimizer: Optimizer over ``params``.
        world_size: Number of emulated workers.
        points: Recorded steps, increasing.
        progress: Receives plain progress lines when no bar is drawn; ``None`` is silent
            (no bar either).
        lr_at: Learning rate of a step (see :func:`warmup_lr`).
        before_update: Called with the step before each optimizer step (e.g. clipping).
        on_point: Called with ``(step, grads)`` at each recorded step, before its update.

    Returns:
        ``{step: float32 [world_size, d]}`` for each recorded step.
    """
    last = points[-1]
    every = max(1, last // 10)
    say = progress or (lambda _msg: None)
    bar = progress_bar(last, name, enabled=None if progress else False)

    def on_step(step: int, loss: float) -> None:
        bar.update(step - bar.n)
        bar.set_postfix_str(f"loss {loss:.3f}", refresh=False)
        if quiet(bar) and (step % every == 0 or step in points):
            say(f"{name}: training step {step}/{last} loss {loss:.3f}")

    with bar:
        return emulate_ddp(params, worker_loss, optimizer, world_size, points, lr_at=lr_at,
                           on_step=on_step, on_point=on_point, before_update=before_update)
