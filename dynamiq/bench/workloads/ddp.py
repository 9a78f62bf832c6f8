"""Data-parallel training emulated in one process: per-worker seeds, flat gradients, DDP steps.

:func:`emulate_ddp` steps the optimizer on the mean of the workers' gradients, as DDP's averaging
all-reduce would, and records the individual gradients at chosen steps; :func:`mix_seed` gives
each (seed, rank, step) its own random stream.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence

import torch

__all__ = ["emulate_ddp", "flat_grad", "mix_seed"]


def mix_seed(*parts: int) -> int:
    """A 63-bit seed derived from integers, stable across processes and Python versions.

    Hashing (rather than e.g. ``seed + rank``) keeps the streams of different (seed, rank, step)
    tuples unrelated: ``(seed=0, rank=1)`` and ``(seed=1, rank=0)`` do not collide.
    """
    data = ",".join(str(int(p)) for p in parts).encode()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") >> 1


def flat_grad(params: Sequence[torch.nn.Parameter]) -> torch.Tensor:
    """Concatenate the ``.grad`` of ``params`` in order into one float32 vector.

    A parameter without a gradient (not reached by this micro-batch) contributes zeros, which is
    what DDP all-reduces for it.

    Returns:
        float32 ``[sum(p.numel())]``.
    """
    out = torch.empty(sum(p.numel() for p in params), dtype=torch.float32)
    i = 0
    for p in params:
        n = p.numel()
        if p.grad is None:
            out[i : i + n].zero_()
        else:
            out[i : i + n].copy_(p.grad.reshape(-1))
        i += n
    return out


def emulate_ddp(
    params: Sequence[torch.nn.Parameter],
    worker_loss: Callable[[int, int], torch.Tensor],
    optimizer: torch.optim.Optimizer,
    world_size: int,
    record: Iterable[int],
    *,
    lr_at: Callable[[int], float] | None = None,
    on_step: Callable[[int, float], None] | None = None,
    on_point: Callable[[int, torch.Tensor], None] | None = None,
    before_update: Callable[[int], None] | None = None,
) -> dict[int, torch.Tensor]:
    """Train as DDP with ``world_size`` workers would, recording per-worker gradients.

    Every step, each worker's loss is backpropagated separately and the optimizer is stepped on
    the mean of the workers' gradients, exactly what DDP's averaging all-reduce hands it. At a
    recorded step the individual gradients are kept, before that step's update.

    Args:
        params: Trainable parameters in the order their gradients are concatenated.
        worker_loss: ``(step, rank) -> scalar loss`` of worker ``rank``'s micro-batch at
            ``step``, computed with the current parameters.
        optimizer: Optimizer over ``params``.
        world_size: Number of emulated workers.
        record: Steps at which to record; training runs through ``max(record)`` (the update of
            that last step is skipped since nothing would observe it).
        lr_at: Optional learning rate for a step, set on every parameter group before it.
        on_step: Called with ``(step, mean loss)`` after each step's backward passes.
        on_point: Called with ``(step, grads)`` at each recorded step, before the update, while
            the parameters still hold that step's values.
        before_update: Called with the step once every ``.grad`` holds the workers' mean, just
            before ``optimizer.step()`` (e.g. to clip it, as DDP users do after the all-reduce);
            the recorded gradients are the raw ones.

    Returns:
        ``{step: float32 [world_size, d]}`` for each recorded step.
    """
    wanted = sorted(set(int(s) for s in record))
    if not wanted or wanted[0] < 0:
        raise ValueError(f"recorded steps must be non-negative and non-empty, got {wanted}")
    keep = set(wanted)
    out: dict[int, torch.Tensor] = {}
    for step in range(wanted[-1] + 1):
        if lr_at is not None:
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step)
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        if step in keep:
            grads = torch.empty(world_size, sum(p.numel() for p in params))
            for rank in range(world_size):
                for p in params:
                    p.grad = None
                loss = worker_loss(step, rank)
                loss.backward()
                total += float(loss.detach())
                grads[rank] = flat_grad(params)
            out[step] = grads
            if on_point is not None:
                on_point(step, grads)
            if step == wanted[-1]:
                if on_step is not None:
                    on_step(step, total / world_size)
                break
            mean = grads.mean(0)
            i = 0
            for p in params:
                n = p.numel()
                p.grad = mean[i : i + n].view_as(p).clone()
                i += n
        else:
            # Accumulating loss / W is the same mean without holding W gradient copies.
            for rank in range(world_size):
                loss = worker_loss(step, rank)
                (loss / world_size).backward()
                total += float(loss.detach())
        if on_step is not None:
            on_step(step, total / world_size)
        if before_update is not None:
            before_update(step)
        optimizer.step()
    return out
