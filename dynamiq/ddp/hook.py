""":func:`dynamiq_hook`: a DDP communication hook that averages gradient buckets with dynamiq.

DDP calls the hook once per gradient bucket during the backward pass, in bucket order on every
rank, and waits for the returned future before the optimizer step. The hook takes the bucket's
flat gradient buffer, queues its reduction on dynamiq's background thread (one thread, so the
collectives of successive buckets keep the same order on every rank while the backward pass
goes on computing), and hands back a ``torch.futures.Future`` that the thread completes with
the averaged buffer.

Each bucket takes one of two paths, decided on every rank alike from the step counter and the
bucket's size (:meth:`DynamiQState.compresses`):

* compressed: :func:`~dynamiq.collectives.p2p.run_p2p` with the state's pipeline, call counter
  and the bucket's own codec state, then division by the group size; the result is
  bit-identical on every rank, so replicas stay identical;
* plain: ``torch.distributed.all_reduce`` of the buffer divided by the group size, as DDP's
  default hook does.

DDP builds its buckets anew in each process: the first step runs one bucket of every
parameter, later steps the buckets rebuilt in the order gradients became ready. The state
records the rebuilt layout; a process that resumed from a pickled state splits its first-step
bucket into the recorded buckets (or, when every parameter fits one bucket, puts it in the
recorded order) and reduces each as the uninterrupted run did (same vectors, call numbers and
codec state), so training continues bit for bit.

Non-finite gradients stay non-finite: a NaN or Inf in any rank's bucket makes the averaged
bucket non-finite on every rank (a plain sum carries it; the compressing codecs decode a block
that held one as non-finite, and every rank gets the same result), so AMP's ``GradScaler``
skips the step on every rank.
"""

# (no ``from __future__ import annotations``: DDP checks the hook's annotations as objects)
import logging
import time

import torch
import torch.distributed as dist

from dynamiq.collectives.api import submit_in_order
from dynamiq.collectives.p2p import P2PStats, run_p2p
from dynamiq.ddp.state import DynamiQState

_log = logging.getLogger(__name__)

__all__ = ["dynamiq_hook"]


def dynamiq_hook(state: DynamiQState, bucket: dist.GradBucket
                 ) -> torch.futures.Future[torch.Tensor]:
    """Average one DDP gradient bucket across the state's group with dynamiq.

    Register it with ``ddp_model.register_comm_hook(state, dynamiq_hook)``. Equivalent to
    DDP's default all-reduce hook (``bucket.buffer()`` summed over the ranks and divided by
    their number) up to the pipeline's compression.

    Args:
        state: The process's :class:`~dynamiq.ddp.state.DynamiQState`.
        bucket: DDP's bucket; its ``buffer()`` is a flat float32, bfloat16 or float16 tensor
            (on the CPU with gloo, on a CUDA device with NCCL).

    Returns:
        A future whose value is the averaged buffer (the bucket's own tensor, written in
        place), bit-identical on every rank for a compressed bucket. When the reduction
        fails the future holds the error, which DDP raises from the backward pass.
    """
    buf = bucket.buffer()
    last = bucket.is_last()
    if state.world_size == 1:
        fut: torch.futures.Future = torch.futures.Future()
        fut.set_result(buf)
        if last:
            state.end_step()
        return fut
    params = bucket.parameters()
    positions = state.positions(params)
    state.note_bucket(bucket.index(), positions)
    compress = state.compresses(buf.numel())
    dtype = str(buf.dtype).removeprefix("torch.")
    _log.debug("bucket %d: %d %s coordinates, %s", bucket.index(), buf.numel(), dtype,
               "compressed" if compress else "plain all-reduce")
    # (bucket key, call number, offsets of its pieces in buf) per compressed reduction
    parts: list[tuple[tuple, int, list[tuple[int, int]]]] = []
    if compress:
        split = state.split(positions)
        where = _offsets(params)
        if split is not None and where[-1][1] != buf.numel():
            split = None  # not laid out densely: reduce the bucket as it is
        if split is None:
            parts.append(((bucket.index(), buf.numel(), dtype), state.next_call(),
                          [(0, buf.numel())]))
        else:
            slot = {q: i for i, q in enumerate(positions)}
            for k in split:
                pieces = [where[slot[q]] for q in state.layout[k]]
                numel = sum(b - a for a, b in pieces)
                parts.append(((k, numel, dtype), state.next_call(), pieces))
    if last:
        state.end_step()
    devices = [buf.device] if buf.device.type == "cuda" else None
    fut = torch.futures.Future(devices=devices)
    ready = None
    if buf.device.type == "cuda":
        # the backward pass wrote the bucket on the current stream: the thread waits for it
        ready = torch.cuda.Event()
        ready.record(torch.cuda.current_stream(buf.device))

    def job() -> torch.Tensor:
        if ready is not None:
            torch.cuda.current_stream(buf.device).wait_event(ready)
        if compress:
            flat = buf.view(-1)
            for key, call, pieces in parts:
                if pieces == [(0, flat.numel())]:
                    _reduce_compressed(state, buf, call, state.codec_state(key))
                    continue
                # the bucket DDP would have built: its parameters' gradients, in its order
                vec = torch.cat([flat[a:b] for a, b in pieces])
                _reduce_compressed(state, vec, call, state.codec_state(key))
                at = 0
                for a, b in pieces:
                    flat[a:b].copy_(vec[at : at + b - a])
                    at += b - a
        else:
            _reduce_plain(state, buf)
        return buf

    def settle(done) -> None:
        err = done.exception()
        if err is not None:
            fut.set_exception(err)
        else:
            fut.set_result(done.result())

    submit_in_order(job).add_done_callback(settle)
    return fut


def _offsets(params: list[torch.Tensor]) -> list[tuple[int, int]]:
    """Each parameter's ``[start, end)`` in its bucket's flat buffer (DDP lays them out
    densely, in the bucket's order)."""
    out, at = [], 0
    for p in params:
        out.append((at, at + p.numel()))
        at += p.numel()
    return out


def _reduce_plain(state: DynamiQState, buf: torch.Tensor) -> None:
    t0 = time.perf_counter()
    buf.div_(state.world_size)
    dist.all_reduce(buf, group=state.group)
    state.stats.add_plain(buf.numel(), buf.numel() * buf.element_size(), state.world_size,
                          time.perf_counter() - t0)


def _reduce_compressed(state: DynamiQState, buf: torch.Tensor, call: int, codec_state: dict
                       ) -> None:
    s = P2PStats()
    in_place = buf.dtype == torch.float32 and buf.is_contiguous()
    flat = buf.view(-1) if in_place else buf.reshape(-1).to(torch.float32)
    y = run_p2p(flat, state.pipeline, group=state.group, call=call, timeout=state.timeout,
                dtype=buf.dtype, op="avg", consume=True, backend=state.backend, stats=s,
                check="first", states=codec_state)
    y.div_(state.world_size)
    if y.data_ptr() != buf.data_ptr() or y.dtype != buf.dtype:
        buf.copy_(y.view(buf.shape))
    state.stats.add_compressed(s)
