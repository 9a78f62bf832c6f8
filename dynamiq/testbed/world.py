"""Run a function on every rank of a testbed, each rank a process inside its own namespace.

Rank ``k`` is ``ip netns exec <namespace k> python`` running :mod:`dynamiq.testbed.rank`. The
function and its arguments travel by pickle through a temporary folder, with what the child
needs to import them (the parent's ``sys.path``, working directory and main module, as
``multiprocessing``'s spawn start method passes them), so functions of a test module or of a
script's ``__main__`` work as with :func:`dynamiq.collectives.launch.launch`. The ranks join a
gloo group at rank 0's namespace address with ``GLOO_SOCKET_IFNAME`` set to their link, so all
their traffic crosses the shaped links.

Every rank process is killed when the parent dies (``PR_SET_PDEATHSIG``), at the deadline, or
:data:`~dynamiq.collectives.launch.FAIL_FAST_GRACE` seconds after another rank failed.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dynamiq.collectives.launch import FAIL_FAST_GRACE, WorldOutcome
from dynamiq.testbed.counters import IFNAME_ENV
from dynamiq.testbed.netns import find_tool

__all__ = ["RankPlacement", "run_ranks"]

_PR_SET_PDEATHSIG = 1
_POLL = 0.02

# the child finds this package where the parent found it (the package installed in the
# environment may be another checkout)
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_BOOT = ("import sys; sys.path.insert(0, sys.argv.pop(1)); "
         "from dynamiq.testbed.rank import main; sys.exit(main())")


@dataclass(frozen=True)
class RankPlacement:
    """Where a rank runs: its namespace, address and interface.

    Attributes:
        namespace: The network namespace.
        address: The IPv4 address of its link.
        ifname: Its link's interface name inside the namespace.
    """

    namespace: str
    address: str
    ifname: str


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _preparation() -> dict:
    """What a spawned child needs to unpickle the parent's functions (see
    ``multiprocessing.spawn.get_preparation_data``, which would also fix the parent's start
    method as a side effect)."""
    path = [os.getcwd() if p == "" else p for p in sys.path]
    data: dict[str, Any] = {"name": "dynamiq-testbed-rank", "sys_path": path,
                            "sys_argv": sys.argv, "dir": os.getcwd()}
    main = sys.modules.get("__main__")
    spec_name = getattr(getattr(main, "__spec__", None), "name", None)
    if spec_name is not None:
        data["init_main_from_name"] = spec_name
    elif getattr(main, "__file__", None):
        data["init_main_from_path"] = os.path.abspath(main.__file__)
    return data


def _take(jobdir: str, rank: int) -> tuple | None:
    try:
        with open(os.path.join(jobdir, f"result-{rank}.pkl"), "rb") as f:
            return pickle.load(f)
    except (OSError, EOFError, pickle.UnpicklingError):
        return None


def run_ranks(
    placements: Sequence[RankPlacement],
    fn: Callable[..., Any],
    args: tuple = (),
    *,
    port: int,
    timeout: float = 300.0,
    group_timeout: float | None = None,
    env: Mapping[str, str] | None = None,
    num_threads: int | None = None,
    fail_fast: bool = True,
    started: Callable[[subprocess.Popen], None] | None = None,
) -> WorldOutcome:
    """Run ``fn(rank, world_size, *args)`` on one process per placement, like
    :func:`dynamiq.collectives.launch.run_world`.

    Args:
        placements: Per rank, where it runs.
        fn: A module-level function (the children import it by name).
        args: Further picklable arguments.
        port: The rendezvous port on rank 0's address.
        timeout: Seconds for the whole run; at the deadline every process is killed.
        group_timeout: The process group's own timeout (default: ``timeout``).
        env: Extra environment variables of the ranks.
        num_threads: ``torch.set_num_threads`` in every rank.
        fail_fast: Once a rank failed, give the others
            :data:`~dynamiq.collectives.launch.FAIL_FAST_GRACE` seconds, then kill them.
        started: Called with every rank process once started (the testbed keeps them, to
            kill them when it is torn down).

    Returns:
        Every rank's result or traceback and every process's exit code.

    Raises:
        TimeoutError: ranks did not finish within ``timeout`` (every process is killed).
    """
    world_size = len(placements)
    ip = find_tool("ip") or "ip"
    jobdir = tempfile.mkdtemp(prefix="dynamiq-testbed-")
    procs: list[subprocess.Popen] = []
    try:
        with open(os.path.join(jobdir, "prepare.pkl"), "wb") as f:
            pickle.dump(_preparation(), f)
        with open(os.path.join(jobdir, "job.pkl"), "wb") as f:
            pickle.dump({"fn": fn, "args": tuple(args), "world_size": world_size,
                         "port": port, "host": placements[0].address,
                         "group_timeout": timeout if group_timeout is None else group_timeout,
                         "num_threads": num_threads}, f)
        for rank, where in enumerate(placements):
            child_env = {**os.environ, **(env or {}), "GLOO_SOCKET_IFNAME": where.ifname,
                         IFNAME_ENV: where.ifname, "MASTER_ADDR": placements[0].address,
                         "MASTER_PORT": str(port), "RANK": str(rank),
                         "WORLD_SIZE": str(world_size)}
            cmd = [ip, "netns", "exec", where.namespace, sys.executable, "-c", _BOOT, _ROOT,
                   jobdir, str(rank)]
            p = subprocess.Popen(cmd, env=child_env, stdin=subprocess.DEVNULL,
                                 preexec_fn=_die_with_parent)
            procs.append(p)
            if started is not None:
                started(p)
        return _collect(procs, jobdir, timeout, fail_fast)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(jobdir, ignore_errors=True)


def _collect(procs: list[subprocess.Popen], jobdir: str, timeout: float, fail_fast: bool
             ) -> WorldOutcome:
    world_size = len(procs)
    results: dict[int, Any] = {}
    errors: dict[int, str] = {}
    failed: dict[int, float] = {}
    end = time.monotonic() + timeout
    hurried = False
    running = set(range(world_size))
    while running:
        for r in sorted(running):
            if procs[r].poll() is None:
                report = _take(jobdir, r) if r not in errors else None
                if report is not None and report[0] == "error":
                    # reported before the process ended: the cause comes first
                    errors[r], failed[r] = report[1], report[2]
                continue
            running.discard(r)
            report = _take(jobdir, r)
            if report is None:
                failed.setdefault(r, time.monotonic())
            elif report[0] == "ok":
                results[r] = pickle.loads(report[1])
            else:
                errors[r], failed[r] = report[1], failed.get(r, report[2])
        if not running:
            break
        if fail_fast and failed and not hurried:
            end = min(end, time.monotonic() + FAIL_FAST_GRACE)
            hurried = True
        if time.monotonic() >= end:
            if hurried:
                break
            for p in procs:
                p.kill()
            raise TimeoutError(f"testbed world of {world_size}: ranks {sorted(running)} did "
                               f"not finish within {timeout}s; exit codes "
                               f"{[p.poll() for p in procs]}")
        time.sleep(_POLL)
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()
    return WorldOutcome(world_size, results, errors, [p.returncode for p in procs],
                        sorted(failed, key=failed.__getitem__))
