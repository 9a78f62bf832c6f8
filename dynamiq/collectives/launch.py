"""Run a function on a small ``torch.distributed`` world of local processes.

:func:`launch` starts ``world_size`` processes with ``torch.multiprocessing.spawn``, joins them
in a process group on a free localhost port, runs the function on every rank and returns what
each rank returned, in rank order; a rank that raises or dies becomes a :class:`RankFailedError`
naming the rank. It is how the multi-process tests and ``dynamiq bench allreduce`` get their
worlds, and a quick way to try :func:`dynamiq.all_reduce` without a launcher:

.. code-block:: python

   # try_all_reduce.py
   import torch
   import dynamiq
   from dynamiq.collectives.launch import launch

   def reduce(rank, world_size):
       t = torch.full((1000,), float(rank))
       dynamiq.all_reduce(t, "requant-dq4")
       return t[:3].tolist()

   if __name__ == "__main__":
       print(launch(reduce, 2))  # [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]] up to rounding

:func:`run_world` is the same without the checks, for callers that expect ranks to fail or die
(it reports every rank's result, traceback and exit code).

Only torch and the standard library are imported here.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import pickle
import socket
import time
import traceback
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

__all__ = ["FAIL_FAST_GRACE", "RankFailedError", "WorldOutcome", "free_port", "joined_group",
           "launch", "run_world"]

#: Seconds the other ranks get to end once a rank of a :func:`launch` has failed.
FAIL_FAST_GRACE = 5.0


class RankFailedError(RuntimeError):
    """A rank of a launched world raised, or ended without returning a result.

    Attributes:
        rank: The rank (the first one that failed; the message lists the others).
        exitcode: Its process's exit code (negative: killed by that signal).
        traceback: The traceback of its exception, or ``None`` when it died without raising.
    """

    def __init__(self, message: str, rank: int, exitcode: int | None,
                 traceback: str | None) -> None:
        super().__init__(message)
        self.rank = rank
        self.exitcode = exitcode
        self.traceback = traceback


@dataclass
class WorldOutcome:
    """What every rank of a world left behind (see :func:`run_world`).

    Attributes:
        world_size: Number of ranks.
        results: Per rank that returned, its return value.
        errors: Per rank that raised, the formatted traceback.
        exitcodes: Every process's exit code (negative: killed by that signal, e.g. -6 for an
            abort, -9 for a process killed at the deadline or after another rank failed).
        failed: The ranks that raised or ended without a result, in the order they failed
            (the first is usually the cause, the others its consequences).
    """

    world_size: int
    results: dict[int, Any]
    errors: dict[int, str]
    exitcodes: list[int | None]
    failed: list[int]

    def check(self) -> list[Any]:
        """Every rank's result, in rank order.

        Raises:
            RankFailedError: a rank raised or ended without a result (the first one that
                failed).
        """
        failed = self.failed + [r for r in range(self.world_size)
                                if r not in self.results and r not in self.failed]
        if failed:
            rank, others = failed[0], failed[1:]
            also = (f" (also without a result: rank{'s' if len(others) > 1 else ''} "
                    f"{', '.join(map(str, others))})") if others else ""
            tb = self.errors.get(rank)
            code = self.exitcodes[rank]
            what = (f"raised:\n{tb}" if tb is not None
                    else f"ended with exit code {code} without returning a result")
            raise RankFailedError(f"rank {rank} of {self.world_size}{also} {what}", rank, code,
                                  tb)
        return [self.results[r] for r in range(self.world_size)]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def joined_group(rank: int, world_size: int, port: int, *, backend: str = "gloo",
                 timeout: float = 300.0, host: str = "127.0.0.1") -> Iterator[None]:
    """Make this process rank ``rank`` of a default process group on ``host:port``.

    The group is destroyed on leaving the block, unless the block destroyed it already.

    Args:
        rank: This process's rank.
        world_size: Number of ranks.
        port: The rendezvous port (rank 0 listens on it).
        backend: ``"gloo"``, ``"nccl"`` (rank ``r`` then uses CUDA device ``r`` modulo the
            device count) or any backend string ``init_process_group`` takes.
        timeout: The group's own timeout, in seconds.
        host: The address rank 0 listens on (another machine's, or a testbed namespace's).
    """
    if "nccl" in backend and torch.cuda.is_available():
        torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group(backend, init_method=f"tcp://{host}:{port}", rank=rank,
                            world_size=world_size,
                            timeout=datetime.timedelta(seconds=timeout))
    try:
        yield
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _rank_main(rank: int, fn: Callable[..., Any], world_size: int, args: tuple, port: int,
               backend: str, group_timeout: float, num_threads: int | None,
               reports: list[Connection]) -> None:
    """What every spawned process runs: join, call ``fn``, leave, report.

    A report is ``("ok", pickled value)`` or ``("error", traceback, time of the failure)``.
    """
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    conn = reports[rank]
    message = None
    try:
        with joined_group(rank, world_size, port, backend=backend, timeout=group_timeout):
            try:
                value = fn(rank, world_size, *args)
            except Exception:
                # sent before the group is destroyed, which fails the ranks waiting for this
                # one: the cause should reach the parent before its consequences
                message = ("error", traceback.format_exc(), time.monotonic())
                conn.send(message)
                raise
        # pickled here, in full: tensors then travel by value, not as shared memory that this
        # process (about to exit) would have to keep serving
        message = ("ok", pickle.dumps(value))
    except Exception:
        if message is not None:
            return
        message = ("error", traceback.format_exc(), time.monotonic())
    conn.send(message)


@contextlib.contextmanager
def _environment(env: Mapping[str, str] | None) -> Iterator[None]:
    """``os.environ`` updated with ``env`` inside the block (children inherit it at start)."""
    saved = {k: os.environ.get(k) for k in env or {}}
    os.environ.update(env or {})
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run_world(
    fn: Callable[..., Any],
    world_size: int,
    args: tuple = (),
    *,
    backend: str = "gloo",
    timeout: float = 300.0,
    group_timeout: float | None = None,
    env: Mapping[str, str] | None = None,
    num_threads: int | None = None,
    expect: Collection[int] | None = None,
    fail_fast: bool = False,
) -> WorldOutcome:
    """Run ``fn(rank, world_size, *args)`` on every rank of a fresh local world, like
    :func:`launch`, but report a rank's failure instead of raising it.

    Args:
        fn, world_size, args, backend, timeout, group_timeout, env, num_threads: As for
            :func:`launch`.
        expect: The ranks whose end is awaited (default: all). The others may die on purpose
            (e.g. to test how the survivors cope); the call returns once the expected ranks
            have reported or ended, and the remaining processes have ended (or the deadline
            passed: they are then killed).
        fail_fast: Once a rank has failed, give the others :data:`FAIL_FAST_GRACE` seconds
            to report and end, then kill them (they are typically blocked waiting for the
            failed rank) instead of waiting for them until ``timeout``.

    Returns:
        Every rank's result or traceback, and every process's exit code.

    Raises:
        TimeoutError: an expected rank neither reported nor ended within ``timeout`` (every
            process is killed first).
    """
    expect = set(range(world_size)) if expect is None else set(expect)
    ctx = mp.get_context("spawn")
    pipes = [ctx.Pipe(duplex=False) for _ in range(world_size)]
    readers = {conn: r for r, (conn, _) in enumerate(pipes)}
    port = free_port()
    group_timeout = timeout if group_timeout is None else group_timeout
    with _environment(env):
        spawned = mp.spawn(_rank_main, nprocs=world_size, join=False,
                           args=(fn, world_size, tuple(args), port, backend, group_timeout,
                                 num_threads, [w for _, w in pipes]))
    procs = spawned.processes
    for _, w in pipes:
        w.close()  # the children hold the write ends
    results: dict[int, Any] = {}
    errors: dict[int, str] = {}
    failed: dict[int, float] = {}  # rank -> when it failed (CLOCK_MONOTONIC is system-wide)
    ended: set[int] = set()

    def take(conn: Connection) -> None:
        r = readers.pop(conn)
        try:
            kind, *payload = conn.recv()
        except EOFError:  # closed without a report: the process died
            return
        if kind == "ok":
            results[r] = pickle.loads(payload[0])
        else:
            errors[r], failed[r] = payload

    end = time.monotonic() + timeout
    sentinels = {p.sentinel: r for r, p in enumerate(procs)}
    hurried = False
    try:
        while not expect <= set(results) | set(errors) | ended:
            if fail_fast and failed and not hurried:
                end = min(end, time.monotonic() + FAIL_FAST_GRACE)
                hurried = True
            left = end - time.monotonic()
            if left <= 0:
                if hurried:
                    break
                missing = sorted(expect - set(results) - set(errors) - ended)
                raise TimeoutError(f"world of {world_size}: ranks {missing} did not finish "
                                   f"within {timeout}s; exit codes "
                                   f"{[p.exitcode for p in procs]}")
            for obj in wait([*readers, *sentinels], timeout=left):
                if obj in readers:
                    take(obj)
                elif obj in sentinels:
                    r = sentinels.pop(obj)
                    conn = next((c for c, rr in readers.items() if rr == r), None)
                    if conn is not None and conn.poll():
                        take(conn)  # what the rank sent just before it ended
                    ended.add(r)
                    if r in expect and r not in results and r not in errors:
                        failed[r] = time.monotonic()
        for p in procs:
            p.join(timeout=max(0.0, end - time.monotonic()))
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
        for conn in readers:
            conn.close()
    for r, path in enumerate(spawned.error_files):
        # torch's own report of an exception that escaped _rank_main (e.g. a failed send)
        if os.path.exists(path):
            with open(path, "rb") as f:
                errors.setdefault(r, pickle.load(f))
            os.unlink(path)
    return WorldOutcome(world_size, results, errors, [p.exitcode for p in procs],
                        sorted(failed, key=failed.__getitem__))


def launch(
    fn: Callable[..., Any],
    world_size: int,
    args: tuple = (),
    *,
    backend: str = "gloo",
    timeout: float = 300.0,
    group_timeout: float | None = None,
    env: Mapping[str, str] | None = None,
    num_threads: int | None = None,
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` local processes in one group.

    Each rank is a fresh process (``torch.multiprocessing.spawn``) that joins the default
    process group on a free localhost port, calls ``fn`` and destroys the group (unless ``fn``
    did), then sends back what ``fn`` returned.

    Args:
        fn: A module-level function (the processes import it by name), called with the rank,
            the world size and ``args``; what it returns must be picklable.
        world_size: Number of processes.
        args: Further (picklable) arguments of ``fn``; ``multiprocessing`` objects made from
            the ``"spawn"`` context (barriers, queues) may be among them.
        backend: The process group's backend: ``"gloo"`` (CPU) or ``"nccl"`` (rank ``r`` uses
            CUDA device ``r`` modulo the device count).
        timeout: Seconds for the whole run, process start included; at the deadline every
            process is killed.
        group_timeout: The process group's own timeout, in seconds (default: ``timeout``).
        env: Environment variables set for the processes (e.g. thread counts read when a
            library is imported); this process's environment is restored afterwards.
        num_threads: ``torch.set_num_threads`` in every process (default: torch's choice).

    Returns:
        What ``fn`` returned on each rank, in rank order.

    Raises:
        RankFailedError: a rank raised (its traceback is in the message) or ended without a
            result; the first one that failed is named, usually the cause of the others. The
            other ranks get :data:`FAIL_FAST_GRACE` seconds to end before they are killed.
        TimeoutError: the ranks did not all finish within ``timeout``.
    """
    return run_world(fn, world_size, args, backend=backend, timeout=timeout,
                     group_timeout=group_timeout, env=env, num_threads=num_threads,
                     fail_fast=True).check()
