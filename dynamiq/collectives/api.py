"""``dynamiq.all_reduce``: a drop-in for ``torch.distributed.all_reduce`` with compressed hops.

It runs the P2P executor (:mod:`dynamiq.collectives.p2p`) on the tensor itself when it is
contiguous float32 (otherwise on a float32 copy, written back at the end). Each process counts
its calls per (group, pipeline, size) (:mod:`dynamiq.collectives.agreement`); the count keys
the random numbers, so successive calls draw fresh randomness and every rank agrees on it
without communication.

The first call of each kind (group, pipeline, size, dtype, op) compares a fingerprint of the
call, call count included, across the ranks; later calls of that kind skip the comparison (it
costs a collective round trip) and rely on every rank counting the same calls. A call that
the ranks disagree on is refused on every rank before any data moves and is not counted, so
the next matching call works (unless later calls of the same group, pipeline and size were
already queued with ``async_op``: then the counters may differ, and the error of that mismatch
says to call :func:`reset_call_counters` on every rank).
"""

from __future__ import annotations

import concurrent.futures
import datetime
import threading
from collections.abc import Callable
from typing import TypeVar

import torch
import torch.distributed as dist

from dynamiq.collectives.agreement import (
    AGREED_CALLS,
    CALL_COUNTERS,
    CallMismatchError,
    reset_call_counters,
)
from dynamiq.collectives.buffers import PROGRAM_CACHE
from dynamiq.collectives.p2p import ACCUMULATOR_WRITTEN, P2PStats, run_p2p
from dynamiq.collectives.transport import MAX_TIMEOUT, check_timeout
from dynamiq.kernels.backend import resolve_backend
from dynamiq.pipeline import Pipeline, get_pipeline

__all__ = ["MAX_TIMEOUT", "UNSPECIFIED", "AllReduceWork", "CallMismatchError", "P2PStats",
           "all_reduce", "reset_call_counters", "submit_in_order"]

T = TypeVar("T")

_FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

# a counter and the agreed calls go with their group
PROGRAM_CACHE.on_group_freed(CALL_COUNTERS.forget_group)
PROGRAM_CACHE.on_group_freed(AGREED_CALLS.forget_group)

#: Appended to the message of an error raised after the call began writing the result into
#: the caller's tensor.
UNSPECIFIED = ("The tensor's values are unspecified now: the call had begun writing the result "
               "into it (an error before that leaves it untouched).")

# one worker thread: asynchronous calls run one at a time, in the order they were issued, which
# is the order every rank issues them in (collectives must not be reordered)
_executor: concurrent.futures.ThreadPoolExecutor | None = None
_pending_lock = threading.Lock()
# unfinished asynchronous calls only: a finished one leaves (its exception's traceback would
# keep the group and the tensors alive)
_pending: list[concurrent.futures.Future] = []


class AllReduceWork:
    """Handle of an asynchronous :func:`all_reduce` (``async_op=True``).

    The collective runs on a background thread of this process; the tensor is written when it
    finishes, so do not read or modify it before :meth:`wait` returns.
    """

    def __init__(self, future: concurrent.futures.Future) -> None:
        self._future = future

    def wait(self, timeout: float | datetime.timedelta | None = None) -> bool:
        """Block until the all-reduce has finished and the tensor holds the result.

        Args:
            timeout: Seconds (or a ``timedelta``) to wait at most; ``None`` waits until the
                collective's own timeout.

        Returns:
            ``True``.

        Raises:
            TimeoutError: ``timeout`` passed first (the collective keeps running), or the
                collective timed out.
            RuntimeError: the collective failed (e.g. the ranks disagree on the call:
                :class:`CallMismatchError`); the tensor is then unchanged, unless the message
                says that its values are unspecified (see :func:`all_reduce`).
        """
        if isinstance(timeout, datetime.timedelta):
            timeout = timeout.total_seconds()
        try:
            self._future.result(timeout=timeout)
        except concurrent.futures.TimeoutError as e:
            if not self._future.done():
                raise TimeoutError(f"all_reduce still running after {timeout}s") from e
            raise
        return True

    def is_completed(self) -> bool:
        """Whether the collective has finished (successfully or not)."""
        return self._future.done()

    def exception(self) -> BaseException | None:
        """The collective's error once finished, or ``None``."""
        return self._future.exception() if self._future.done() else None


_OP_HELP = "op must be 'sum', 'avg', ReduceOp.SUM or ReduceOp.AVG"


def _parse_op(op) -> str:
    if isinstance(op, str):
        if op.lower() in ("sum", "avg"):
            return op.lower()
        raise ValueError(f"{_OP_HELP}, got {op!r}")
    # Type checks, not ==: ReduceOp.AVG == 1 holds, so an int would pass for an op.
    reduce_op = getattr(dist, "ReduceOp", None)
    code = None
    if reduce_op is not None:
        if isinstance(op, reduce_op.RedOpType):
            code = op
        elif isinstance(op, reduce_op):  # the wrapper class; its .op is the RedOpType
            code = getattr(op, "op", None)
    if not (reduce_op is not None and isinstance(code, reduce_op.RedOpType)):
        raise TypeError(f"{_OP_HELP}, got {type(op).__name__} {op!r}")
    for name in ("SUM", "AVG"):
        if code == getattr(reduce_op.RedOpType, name):
            return name.lower()
    raise ValueError(f"{_OP_HELP}, got {op!r}")


def _track(future: concurrent.futures.Future) -> None:
    with _pending_lock:
        _pending.append(future)
    future.add_done_callback(_untrack)


def _untrack(future: concurrent.futures.Future) -> None:
    with _pending_lock:
        if future in _pending:
            _pending.remove(future)


def _drain() -> None:
    with _pending_lock:
        waiting = list(_pending)
    concurrent.futures.wait(waiting)


def _say_unspecified(e: BaseException) -> None:
    """Append :data:`UNSPECIFIED` to ``e``'s message (as a note when it has no plain one)."""
    if len(e.args) == 1 and isinstance(e.args[0], str):
        e.args = (f"{e.args[0]}. {UNSPECIFIED}",)
    else:
        e.add_note(UNSPECIFIED)


def all_reduce(
    tensor: torch.Tensor,
    pipeline: str | Pipeline = "passthrough-fp32",
    group=None,
    op="sum",
    async_op: bool = False,
    timeout: float | datetime.timedelta = 300.0,
    backend: str = "auto",
    stats: P2PStats | None = None,
) -> AllReduceWork | None:
    """All-reduce ``tensor`` in place across ``group`` with a compressed multi-hop pipeline.

    Equivalent to ``torch.distributed.all_reduce(tensor, op, group)`` up to the pipeline's
    compression: with a lossless pipeline (``passthrough-fp32``) the result is the float32 sum
    (in the schedule's summation order); with a lossy one it is the decompressed sum that
    :func:`dynamiq.simulate` reports for the same inputs and call count, bit for bit. Every rank
    ends with bit-identical values.

    Args:
        tensor: Any shape; float32, bfloat16 or float16; on the CPU (gloo; Numba kernels) or a
            CUDA device (NCCL; Triton kernels); at least one element; contiguity is not
            required. A contiguous float32 tensor is reduced in place (no copy); any other is
            flattened and widened to a float32 copy, reduced, and the result is cast back to
            the tensor's dtype and written into it. If the call raises, ``tensor`` is
            untouched, unless the error's message ends with
            :data:`~dynamiq.collectives.api.UNSPECIFIED`: then the call had begun writing the
            result into a tensor reduced in place (in a step of the exchange, or centering it
            just before), and its values are unspecified. Calls refused up front (bad
            arguments, :class:`CallMismatchError`) and failures of the metadata exchange
            before step 0 always leave it untouched.
        pipeline: Pipeline, registered name (e.g. ``"requant-dq4"``) or spec string; the same
            on every rank.
        group: Process group (default: the world). All its ranks must call with the same
            pipeline, size, dtype and op, in the same order (see ``CallMismatchError`` for
            what is checked when).
        op: ``"sum"`` / ``ReduceOp.SUM``, or ``"avg"`` / ``ReduceOp.AVG`` (the float32 sum
            divided by the group size); strings in any case. Plain ints are refused, though
            ``ReduceOp.AVG == 1``.
        async_op: Return an :class:`AllReduceWork` at once and run the collective on a
            background thread of this process (one thread: asynchronous calls run in issue
            order; a later synchronous call first waits for them). The tensor holds the result
            once ``wait()`` returns.
        timeout: Seconds (an int or float, or a ``timedelta``) to wait for any one peer
            before raising ``TimeoutError``: finite, positive and at most :data:`MAX_TIMEOUT`
            (1e9 s, about 31.7 years; c10d's gloo deadlines overflow not far above it).
        backend: Kernel backend: ``"auto"`` (Triton for CUDA tensors, Numba for CPU tensors),
            ``"numba"`` or ``"triton"`` (on CPU tensors only under ``TRITON_INTERPRET=1``, for
            tests). Every backend gives the same bits, so ranks need not agree on it.
        stats: A :class:`~dynamiq.collectives.p2p.P2PStats` to fill with this rank's
            statistics of the call (bytes and messages sent and received, metadata cost, call
            number, wall time and its split into codec, wire, waiting and metadata time) once
            it succeeds: on return, or for ``async_op`` once ``wait()`` returns. Left
            unchanged when the call raises.

    Returns:
        ``None``, or an :class:`AllReduceWork` when ``async_op``.

    Raises:
        TypeError: not a tensor, or not floating point of a supported dtype; ``op`` neither a
            string nor a ``ReduceOp``; ``timeout`` neither a number nor a ``timedelta``;
            ``stats`` not a ``P2PStats``.
        ValueError: empty tensor, unknown op or backend, a backend that cannot run on the
            tensor's device, a timeout out of range, a pipeline whose topology does not fit
            the group size (also at size 1), or an unknown pipeline name (the message lists
            the registered ones).
        ImportError: the Triton backend is needed but triton is not installed.
        CallMismatchError: ranks disagree on pipeline, size, dtype, op or call count (a
            ``RuntimeError``, raised on every rank before any data moves; the call is not
            counted, so the next matching call works; the message says how to recover).
            Detected when every rank's call is the first of its kind (group, pipeline, size,
            dtype, op) in this process since :func:`reset_call_counters`, which covers a first
            call and every call that differs from all earlier ones on every rank. When some
            ranks' calls are of kinds they already completed, those ranks skip the check:
            the ranks time out instead (``TimeoutError`` naming the metadata exchange or a
            step), and the group is unusable afterwards.
        RuntimeError: ``torch.distributed`` not initialized; a peer failed or closed its
            connection (names the step and peer).
        TimeoutError: a peer did not take part within ``timeout`` (names the step and peer).
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"all_reduce needs a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"dynamiq.all_reduce supports float32, bfloat16 and float16 tensors, "
                        f"got {tensor.dtype}")
    try:
        resolve_backend(backend, tensor.device)
    except ValueError as e:
        raise ValueError(f"dynamiq.all_reduce: {e} (the Numba kernels run on CPU tensors, "
                         "the Triton kernels on CUDA tensors)") from None
    if tensor.numel() == 0:
        raise ValueError("dynamiq.all_reduce: cannot all-reduce an empty tensor")
    p = get_pipeline(pipeline)
    spec = str(p)
    mode = _parse_op(op)
    timeout = check_timeout(timeout)
    if stats is not None and not isinstance(stats, P2PStats):
        raise TypeError(f"stats must be a dynamiq.collectives.p2p.P2PStats, got "
                        f"{type(stats).__name__}")
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("torch.distributed is not initialized; call "
                           "torch.distributed.init_process_group first")
    if dist.get_rank(group) < 0:
        raise ValueError("this process is not a member of the given process group")
    # every rank refuses the same group size here, before the call is counted
    p.topology.check_world_size(dist.get_world_size(group))
    key = (PROGRAM_CACHE.group_key(group), spec, tensor.numel())
    call = CALL_COUNTERS.next(key)
    in_place = tensor.dtype == torch.float32 and tensor.is_contiguous()
    if in_place:
        # the tensor is the executor's accumulator: no copy at all (and no backup: a failure
        # once it is being written says so instead, see UNSPECIFIED)
        flat = tensor.detach().view(-1)
    else:
        # the private float32 copy doubles as the executor's accumulator (taken at issue time)
        flat = tensor.detach().reshape(-1).to(torch.float32, copy=True).contiguous()

    def job() -> None:
        # the caller's stats change only once the tensor holds the result
        done = None if stats is None else P2PStats()
        try:
            # the counters above number every call of a kind alike on every rank, so the
            # fingerprint is compared on the first call of each kind only
            y = run_p2p(flat, p, group=group, call=call, timeout=timeout, dtype=tensor.dtype,
                        op=mode, consume=True, backend=backend, stats=done, check="first")
            with torch.no_grad():
                if mode == "avg":
                    y = y.div_(dist.get_world_size(group))
                if y.data_ptr() != tensor.data_ptr() or y.dtype != tensor.dtype:
                    tensor.copy_(y.view(tensor.shape))
            if stats is not None:
                stats.update(done)
        except BaseException as e:
            if in_place and getattr(e, ACCUMULATOR_WRITTEN, False):
                _say_unspecified(e)
            # every rank refused this call before sending anything: uncounting it keeps the
            # counters where they were, so the next matching call agrees; when a later call
            # was queued already, its count has moved on, and checking it says so
            if isinstance(e, CallMismatchError) and not CALL_COUNTERS.undo(key, call):
                AGREED_CALLS.forget(key)
            raise

    if not async_op:
        _drain()
        job()
        return None
    return AllReduceWork(submit_in_order(job))


def submit_in_order(job: Callable[[], T]) -> concurrent.futures.Future[T]:
    """Run ``job()`` on the background thread of asynchronous :func:`all_reduce` calls.

    Jobs and asynchronous all-reduces run one at a time in the order they were submitted, so
    collectives issued this way keep the same order on every rank (a communication hook uses
    it for its buckets; see :mod:`dynamiq.ddp`). A later synchronous :func:`all_reduce`
    waits for them first.

    Args:
        job: A callable without arguments.

    Returns:
        A ``concurrent.futures.Future`` holding ``job()``'s result or exception.
    """
    global _executor
    if _executor is None:
        _executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="dynamiq")
    future = _executor.submit(job)
    _track(future)
    return future
