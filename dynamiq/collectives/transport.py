"""Deadlines and readable errors for the ``torch.distributed`` calls of the P2P executor.

Every wait of the executor has a deadline, and a backend error becomes an exception that names
where the call was and which peer was on the other end: a peer that does not show up within
``timeout`` seconds raises ``TimeoutError``; a peer whose connection closes (it crashed, or it
gave up waiting for this rank) raises ``RuntimeError``. After either, the process group is
unusable (gloo closes every link of the group on a timeout); destroy it, or reduce over a new
group of the surviving ranks.
"""

from __future__ import annotations

import contextlib
import datetime
import math
import numbers
from collections.abc import Iterator

import torch
import torch.distributed as dist

__all__ = ["MAX_TIMEOUT", "check_timeout", "deadline", "global_rank", "grace", "peer_name",
           "start_all_reduce", "translate", "translated", "wait"]

#: Largest accepted ``timeout``, in seconds (about 31.7 years). c10d gives gloo a deadline of
#: "system clock now + timeout" in int64 nanoseconds, which overflows once the timeout passes
#: about ``2**63`` ns minus the Unix time (about 7.4e9 s in 2026): 1e10 s then times out at once
#: and 7.5e9 s never returns. 1e9 s stays clear of that for the next two centuries.
MAX_TIMEOUT = 1e9


def check_timeout(timeout: float | datetime.timedelta) -> float:
    """Validate a timeout and return it in seconds.

    Args:
        timeout: A real number of seconds (not a bool) or a ``timedelta``.

    Returns:
        The timeout in seconds.

    Raises:
        TypeError: ``timeout`` is neither a real number nor a ``timedelta``.
        ValueError: it is not finite, not positive, or above :data:`MAX_TIMEOUT`.
    """
    if isinstance(timeout, datetime.timedelta):
        seconds = timeout.total_seconds()
    elif isinstance(timeout, numbers.Real) and not isinstance(timeout, bool):
        seconds = float(timeout)
    else:
        raise TypeError(f"timeout must be a number of seconds or a datetime.timedelta, got "
                        f"{type(timeout).__name__} {timeout!r}")
    if not (math.isfinite(seconds) and 0 < seconds <= MAX_TIMEOUT):
        raise ValueError(f"timeout must be finite, positive and at most {MAX_TIMEOUT:.0e} "
                         f"seconds (what the gloo and NCCL deadlines can represent), got "
                         f"{timeout!r}")
    return seconds


def deadline(timeout: float) -> datetime.timedelta:
    """``timeout`` seconds as c10d takes them."""
    # whole milliseconds, rounded up: c10d takes milliseconds and reads 0 as "no timeout"
    return datetime.timedelta(milliseconds=math.ceil(timeout * 1000))


def grace(timeout: float) -> float:
    """Seconds between a collective's timeout on the caller's side and on gloo's (see
    :func:`start_all_reduce`): enough for the ranks' waits to start apart, short enough for a
    ``destroy_process_group`` right after the timeout (it waits for gloo's worker)."""
    return min(5.0, max(1.0, 0.1 * timeout))


def start_all_reduce(t: torch.Tensor, group: dist.ProcessGroup | None, timeout: float,
                     op: dist.ReduceOp.RedOpType | None = None) -> dist.Work:
    """Start an asynchronous all-reduce of ``t``; off CUDA, one that the backend itself gives
    up after ``timeout``.

    ``dist.all_reduce`` runs the collective under the group's own timeout (30 minutes by
    default), whatever the caller waits: a rank that stopped waiting would keep the collective
    running in gloo's worker thread, a latecomer would still complete it and go on alone, and
    the work (holding ``t``) could still be running at interpreter exit. With the timeout in
    the options, gloo fails the collective after ``timeout`` and closes the group's links, so a
    latecomer fails at once, naming the step. NCCL keeps the group's timeout: its watchdog
    tears the process down when a collective times out.

    The backend's deadline comes a grace period after the caller's (:func:`wait`): every rank
    that waits in vain sees its own ``TimeoutError``, not the closing of links by a rank that
    started waiting a moment earlier.

    Args:
        t: The tensor, reduced in place.
        group: The process group (``None``: the world).
        timeout: Seconds the caller will wait (see :func:`wait`).
        op: The reduction (default: sum).

    Returns:
        The backend's work handle.
    """
    if t.device.type == "cuda":
        return dist.all_reduce(t, op=dist.ReduceOp.SUM if op is None else op, group=group,
                               async_op=True)
    pg = dist.group.WORLD if group is None else group
    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.SUM if op is None else op
    opts.timeout = deadline(timeout + grace(timeout))
    if hasattr(opts, "asyncOp"):
        opts.asyncOp = True
    return pg.allreduce([t], opts)


def global_rank(group: dist.ProcessGroup | None, r: int) -> int:
    """The global rank of rank ``r`` of ``group`` (what ``P2POp`` takes)."""
    # the default group's ranks already are global
    if group is None or group is dist.group.WORLD:
        return r
    return dist.get_global_rank(group, r)


def peer_name(group: dist.ProcessGroup | None, r: int) -> str:
    """``rank r``, with its global rank when the group numbers ranks differently."""
    g = global_rank(group, r)
    return f"rank {r}" if g == r else f"rank {r} (global rank {g})"


# gloo's words for a link that the other side closed or reset
_CLOSED = ("connection closed", "connection reset", "broken pipe", "connection refused",
           "socket closed", "pair closure")


def translate(e: Exception, where: str, late: str, failed: str, who: str) -> Exception:
    """The error to raise for a backend error ``e`` at ``where``.

    A timeout becomes ``TimeoutError(where: late)``; a closed link ``RuntimeError`` naming
    ``who`` was on the other end and the likely reasons; anything else ``RuntimeError(where:
    failed)``. The backend's own text is kept at the end.

    Args:
        e: The backend's error.
        where: Where the executor was, e.g. ``"step 3"``.
        late: What a timeout means there, e.g. ``"no message from rank 1 within 2.0s"``.
        failed: What failed, e.g. ``"receiving from rank 1 failed"``.
        who: The peer on the other end (``"a peer"`` in a collective).
    """
    text = str(e)
    low = text.lower()
    if "application timeout" in low:
        # this rank's own earlier wait timed out, and gloo closed the group's links for it
        return RuntimeError(f"dynamiq all_reduce: {where}: {failed}: the process group was "
                            f"closed after an earlier timeout on this rank; destroy it ({text})")
    if "timed out" in low or "timeout" in low:
        return TimeoutError(f"dynamiq all_reduce: {where}: {late} ({text})")
    if any(word in low for word in _CLOSED):
        return RuntimeError(
            f"dynamiq all_reduce: {where}: {failed}: {who} closed the connection; it probably "
            f"timed out (waiting for this rank, or for another one) and gave up, or it crashed. "
            f"The process group is unusable now: destroy it, or reduce over a new group of the "
            f"live ranks ({text})"
        )
    return RuntimeError(f"dynamiq all_reduce: {where}: {failed}: {text}")


@contextlib.contextmanager
def translated(where: str, late: str, failed: str, who: str) -> Iterator[None]:
    """Raise backend errors of the block as :func:`translate` says, given the same arguments
    (issuing an operation on a closed link fails at once, before there is anything to wait
    for)."""
    try:
        yield
    except Exception as e:
        raise translate(e, where, late, failed, who) from e


def wait(work: dist.Work, timeout: float, where: str, late: str, failed: str,
         who: str) -> None:
    """``work.wait`` with a deadline of ``timeout`` seconds, errors translated by
    :func:`translate` (which takes the other arguments)."""
    with translated(where, late, failed, who):
        work.wait(timeout=deadline(timeout))
