"""The ``torch.distributed`` calls of the P2P executor: posted, timed, with deadlines and
readable errors.

:class:`StepExchange` posts a program's sends and receives (calling the process group
directly: ``dist.isend`` would only translate the peer's rank back to the one the program
already holds) and waits for them. Every wait of the executor has a deadline, and a backend
error becomes an exception that names where the call was and which peer was on the other end:
a peer that does not show up within ``timeout`` seconds raises ``TimeoutError``; a peer whose
connection closes (it crashed, or it gave up waiting for this rank) raises ``RuntimeError``.
After either, the process group is unusable (gloo closes every link of the group on a
timeout); destroy it, or reduce over a new group of the surviving ranks.
"""

from __future__ import annotations

import contextlib
import datetime
import math
import numbers
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import AllgatherOptions

if TYPE_CHECKING:  # annotations only: those modules import this one
    from dynamiq.collectives.buffers import DirectState, Program, Step
    from dynamiq.collectives.engine import RankState
    from dynamiq.collectives.p2p import P2PStats
    from dynamiq.topologies import Transfer

__all__ = ["MAX_TIMEOUT", "StepExchange", "check_timeout", "deadline", "global_rank", "grace",
           "peer_name", "start_all_gather", "start_all_reduce", "translate", "translated",
           "wait"]

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
    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.SUM if op is None else op
    return _world(group).allreduce([t], _with_deadline(opts, timeout))


def _world(group: dist.ProcessGroup | None) -> dist.ProcessGroup:
    return dist.group.WORLD if group is None else group


def _with_deadline(opts, timeout: float):
    """``opts`` of a collective, asynchronous, with the backend's deadline a grace period after
    the caller's ``timeout`` (see :func:`start_all_reduce`)."""
    opts.timeout = deadline(timeout + grace(timeout))
    if hasattr(opts, "asyncOp"):
        opts.asyncOp = True
    return opts


def start_all_gather(t: torch.Tensor, out: list[torch.Tensor],
                     group: dist.ProcessGroup | None, timeout: float) -> dist.Work:
    """Start an asynchronous all-gather of ``t`` into ``out`` (one tensor per rank), with the
    backend's own deadline off CUDA, as :func:`start_all_reduce`."""
    if t.device.type == "cuda":
        return dist.all_gather(out, t, group=group, async_op=True)
    # AllgatherOptions is not re-exported by torch.distributed
    return _world(group).allgather([out], [t], _with_deadline(AllgatherOptions(), timeout))


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


class StepExchange:
    """One call's point-to-point operations over a program's steps, and the time they take.

    Receives of program step ``i`` are in ``recvs[i]`` as ``(bytes, work)``; ``sent[i]``
    counts the sends of step ``i`` posted so far (in schedule order: per peer, both ends
    post their messages in the same order, which is how the backend pairs them). Waits have
    deadlines and backend errors are translated (:func:`translate`) naming the step and peer;
    the texts are only built for an error, as the steady state posts and waits many times.

    Every work handle is kept until :meth:`release`, at the end of the call: releasing gloo
    works while messages are still moving lengthens the exchange (on 4 loopback ranks,
    releasing each one before the next send made a call 20-40% slower), while releasing them
    once everything has arrived costs nothing measurable.

    Args:
        prog: The rank's :class:`~dynamiq.collectives.buffers.Program`.
        state: Its per-call state (``message``, ``receive``, ``inbox`` for the transfers whose
            buffer is ``None``, and ``acc``).
        group: The process group (``None``: the world).
        timeout: Seconds to wait for any one message.
        stats: The :class:`~dynamiq.collectives.p2p.P2PStats` whose byte, message and time
            counters grow as operations run.
    """

    def __init__(self, prog: Program, state: RankState | DirectState,
                 group: dist.ProcessGroup | None, timeout: float, stats: P2PStats) -> None:
        self.steps = prog.steps
        self.state = state
        self.group = group
        self.pg = dist.group.WORLD if group is None else group
        self.timeout = timeout
        self.deadline = deadline(timeout)
        self.stats = stats
        # NCCL needs a round's send and receive in one group; elsewhere (gloo) batching would
        # issue them one by one anyway, and issuing them ourselves tells which link failed
        self.grouped = state.acc.device.type == "cuda"
        self.recvs: dict[int, list[tuple[torch.Tensor, dist.Work]]] = {}
        self.sends: dict[int, list[dist.Work]] = {}
        self.sent: dict[int, int] = {}
        self.waited: dict[int, int] = {}  # sends of each step known to have left
        self.keep: list[torch.Tensor] = []  # sent tensors, alive until release()

    def _error(self, e: Exception, st: Step, sending: bool) -> Exception:
        """:func:`translate` ``e``, raised by a send (or receive) of ``st``."""
        if sending:
            who = peer_name(self.group, st.send_peer)
            return translate(e, f"step {st.index}", f"{who} did not take our message within "
                             f"{self.timeout}s", f"sending to {who} failed", who)
        who = peer_name(self.group, st.recv_peer)
        return translate(e, f"step {st.index}", f"no message from {who} within "
                         f"{self.timeout}s", f"receiving from {who} failed", who)

    def _message(self, t: Transfer) -> torch.Tensor:
        t0 = time.perf_counter()
        data = self.state.message(t)
        self.stats.codec_seconds += time.perf_counter() - t0
        self.stats.bytes_sent += data.numel() * data.element_size()
        self.stats.messages_sent += 1
        self.keep.append(data)
        return data

    def post_recvs(self, i: int) -> None:
        """Post every receive of program step ``i``."""
        st, works = self.steps[i], []
        t0 = time.perf_counter()
        for t, buf in zip(st.recvs, st.bufs):
            data = self.state.inbox(t) if buf is None else buf
            try:
                works.append((data, self.pg.recv([data], st.recv_peer, 0)))
            except Exception as e:
                raise self._error(e, st, False) from e
        self.stats.wire_seconds += time.perf_counter() - t0
        self.recvs[i] = works

    def ready(self, i: int, taken: int | None = None) -> int:
        """Sends of program step ``i`` whose messages exist once ``taken`` receives of the
        previous step are in (``None``: all of them)."""
        st = self.steps[i]
        if taken is None:
            return len(st.sends)
        k = self.sent.get(i, 0)
        while k < len(st.sends) and st.ready[k] <= taken:
            k += 1
        return k

    def post_sends(self, i: int, end: int) -> None:
        """Post the sends of program step ``i`` up to (not including) send ``end``."""
        st, works = self.steps[i], self.sends.setdefault(i, [])
        for t in st.sends[self.sent.get(i, 0):end]:
            data = self._message(t)
            t0 = time.perf_counter()
            try:
                works.append(self.pg.send([data], st.send_peer, 0))
            except Exception as e:
                raise self._error(e, st, True) from e
            self.stats.wire_seconds += time.perf_counter() - t0
        self.sent[i] = max(end, self.sent.get(i, 0))

    def post_grouped(self, i: int) -> None:
        """Post step ``i`` round by round, each round's send and receive in one group: on
        every rank round ``k`` pairs up with round ``k`` of the peers (a rank hears from one
        peer per step), which keeps NCCL's grouped calls deadlock-free."""
        st = self.steps[i]
        names = [peer_name(self.group, r) for r in (st.recv_peer, st.send_peer) if r >= 0]
        peers = " and ".join(dict.fromkeys(names))
        src = global_rank(self.group, st.recv_peer) if st.recvs else -1
        dst = global_rank(self.group, st.send_peer) if st.sends else -1
        recvs, sends = self.recvs.setdefault(i, []), self.sends.setdefault(i, [])
        for k in range(max(len(st.sends), len(st.recvs))):
            ops = []
            if k < len(st.recvs):
                buf = st.bufs[k]
                data = self.state.inbox(st.recvs[k]) if buf is None else buf
                ops.append(dist.P2POp(dist.irecv, data, src, self.group))
            if k < len(st.sends):
                ops.append(dist.P2POp(dist.isend, self._message(st.sends[k]), dst,
                                      self.group))
            t0 = time.perf_counter()
            with translated(f"step {st.index}", f"exchanging with {peers} timed out",
                            f"exchanging with {peers} failed", peers):
                works = dist.batch_isend_irecv(ops)
            self.stats.wire_seconds += time.perf_counter() - t0
            per_op = works if len(works) == len(ops) else [works[-1]] * len(ops)
            if k < len(st.recvs):
                recvs.append((data, per_op[0]))
            if k < len(st.sends):
                sends.append(per_op[-1])
        self.sent[i] = len(st.sends)

    def take(self, i: int, k: int) -> None:
        """Wait for receive ``k`` of program step ``i`` and take it in."""
        st = self.steps[i]
        data, work = self.recvs[i][k]
        t0 = time.perf_counter()
        try:
            work.wait(timeout=self.deadline)
        except Exception as e:
            raise self._error(e, st, False) from e
        t1 = time.perf_counter()
        self.state.receive(st.recvs[k], data)
        self.stats.codec_seconds += time.perf_counter() - t1
        self.stats.wait_seconds += t1 - t0
        self.stats.bytes_received += data.numel()

    def finish_sends(self, i: int, count: int | None = None) -> None:
        """Wait until the first ``count`` sends of program step ``i`` (``None``: all posted so
        far) have left."""
        works = self.sends.get(i, [])
        end = len(works) if count is None else min(count, len(works))
        done = self.waited.get(i, 0)
        if end <= done:
            return
        t0 = time.perf_counter()
        try:
            for work in works[done:end]:
                work.wait(timeout=self.deadline)
        except Exception as e:
            raise self._error(e, self.steps[i], True) from e
        self.waited[i] = end
        self.stats.wait_seconds += time.perf_counter() - t0

    def release(self) -> None:
        """Drop every work and tensor reference of the call."""
        # After a failure the works left are abandoned: releasing them here, in the calling
        # thread, makes gloo drop its references to their buffers now (it never touches a
        # released buffer), instead of whenever the traceback holding this frame goes away.
        self.recvs.clear()
        self.sends.clear()
        self.keep.clear()
        self.waited.clear()
