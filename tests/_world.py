"""Small gloo worlds on localhost for multi-process tests, over :mod:`dynamiq.collectives.launch`.

:func:`spawn_world` / :func:`world_results`: every rank is a fresh ``spawn`` process that joins a
gloo process group on a free local port, runs a plan function and sends back what it returns
(plain Python/numpy values). Processes are the expensive part on a small machine (each imports
torch and dynamiq): give one world as many checks as it can take.

:func:`fork_worlds`: many short worlds in a row, for checks that need many fresh processes
(e.g. how processes exit). One helper interpreter imports everything once and forks the ranks
of each world; every rank ends through the interpreter's normal shutdown, as a script does.
"""

from __future__ import annotations

import faulthandler
import importlib
import json
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

import torch.multiprocessing as mp

from dynamiq.collectives.launch import free_port, joined_group, launch, run_world

# n processes on few cores: one thread each
_FEW_THREADS = {"NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}


@dataclass
class World:
    """What a world left behind.

    Attributes:
        results: Per reporting rank, the dict its plan returned (a rank that raised reports
            ``{"crash": traceback}``; a rank that died reports nothing).
        exitcodes: Every process's exit code (negative: killed by that signal, e.g. -6 for
            an abort).
    """

    results: dict[int, dict]
    exitcodes: list[int | None]


def _call_plan(rank: int, n: int, plan: Callable, barriers: list, args: tuple):
    return plan(rank, n, barriers, *args)


def _plan_args(plan: Callable, barriers: tuple[int, ...], args: tuple) -> tuple:
    ctx = mp.get_context("spawn")
    return (plan, [ctx.Barrier(k) for k in barriers], tuple(args))


def spawn_world(n: int, plan: Callable, args: tuple = (), *, report: set[int] | None = None,
                barriers: tuple[int, ...] = (), deadline: float = 240.0,
                group_timeout: float = 60.0) -> World:
    """Run ``plan(rank, n, barriers, *args)`` on every rank of a fresh gloo world of ``n``.

    Args:
        n: Number of processes.
        plan: A module-level function (the spawned processes import it by name) returning a
            dict of picklable values.
        args: Further arguments of ``plan``.
        report: Ranks expected to report (default: all); the others may die on purpose.
        barriers: Sizes of ``multiprocessing`` barriers handed to the plan, for syncing
            ranks outside torch.distributed (e.g. the survivors of a killed rank).
        deadline: Seconds to wait for the reports and the exits.
        group_timeout: The process group's own timeout, in seconds.

    Returns:
        The ranks' reports and every process's exit code.
    """
    out = run_world(_call_plan, n, _plan_args(plan, barriers, args), timeout=deadline,
                    group_timeout=group_timeout, env=_FEW_THREADS, num_threads=1, expect=report)
    results = dict(out.results)
    results.update({r: {"crash": tb} for r, tb in out.errors.items()})
    return World(results, out.exitcodes)


def world_results(n: int, plan: Callable, args: tuple = (), *, barriers: tuple[int, ...] = (),
                  deadline: float = 240.0, group_timeout: float = 60.0) -> list[dict]:
    """The reports of a world in which every rank completes ``plan``, in rank order (as
    :func:`spawn_world`; a rank that crashes fails the call, naming the rank)."""
    return launch(_call_plan, n, _plan_args(plan, barriers, args), timeout=deadline,
                  group_timeout=group_timeout, env=_FEW_THREADS, num_threads=1)


# ---- many worlds forked from one interpreter --------------------------------------------------
# No thread pools in the helper (a process with threads cannot fork safely), and Numba's
# workqueue layer, which is fork-safe: its OpenMP layer, set up when dynamiq is imported,
# terminates a forked child that runs a parallel kernel.
_FORK_SAFE = {"NUMBA_NUM_THREADS": "1", "NUMBA_THREADING_LAYER": "workqueue",
              "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def fork_worlds(n: int, plan: Callable, worlds: list[tuple], *,
                deadline: float = 300.0) -> list[World]:
    """Run ``plan(rank, n, [], *args)`` for each ``args`` of ``worlds`` in a fresh gloo world of
    ``n`` processes, one world after the other.

    Args:
        n: Ranks per world.
        plan: A module-level function (of a test module, imported by name from its folder),
            returning a JSON-serializable dict.
        worlds: Per world, the further (JSON-serializable) arguments of ``plan``.
        deadline: Seconds for all the worlds together.

    Returns:
        Per world, the ranks' reports and exit codes (negative: killed by that signal, e.g.
        -6 for an abort).
    """
    here = os.path.dirname(os.path.abspath(__file__))
    # the helper imports the plan's module by name: its folder goes on the helper's path
    where = os.path.dirname(os.path.abspath(sys.modules[plan.__module__].__file__))
    path = os.pathsep.join(p for p in (where, os.environ.get("PYTHONPATH")) if p)
    cmd = [sys.executable, os.path.abspath(__file__), plan.__module__, plan.__name__, str(n),
           json.dumps([list(args) for args in worlds]), str(deadline)]
    proc = subprocess.Popen(cmd, cwd=here, env={**os.environ, **_FORK_SAFE, "PYTHONPATH": path},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=deadline + 30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the helper and every rank it forked
        stdout, stderr = proc.communicate()
        raise AssertionError(
            f"worlds did not finish within {deadline}s:\n{stderr[-3000:]}") from None
    done = [json.loads(line[6:]) for line in stdout.splitlines() if line.startswith("WORLD ")]
    if proc.returncode != 0 or len(done) != len(worlds):
        raise AssertionError(f"helper exited with {proc.returncode} after {len(done)} of "
                             f"{len(worlds)} worlds:\n{stderr[-3000:]}")
    return [World({int(r): out for r, out in w["results"].items()}, w["codes"]) for w in done]


def _forked_rank(rank: int, n: int, port: int, plan: Callable, args: list, report,
                 deadline: float) -> None:
    faulthandler.dump_traceback_later(deadline, exit=True)  # a hung rank ends, with a trace
    try:
        with joined_group(rank, n, port, timeout=60):
            out = plan(rank, n, [], *args)
    except Exception:
        out = {"crash": traceback.format_exc()}
    report.write(json.dumps([rank, out]) + "\n")
    report.close()
    # leave through the interpreter's normal shutdown, as a script does: what the check is about
    sys.exit(0)


def _helper(module: str, name: str, n: int, worlds: list[list], deadline: float) -> None:
    plan = getattr(importlib.import_module(module), name)
    end = time.monotonic() + deadline
    for args in worlds:
        port = free_port()
        read_end, write_end = os.pipe()
        pids = []
        for rank in range(n):
            pid = os.fork()
            if pid == 0:
                os.close(read_end)
                _forked_rank(rank, n, port, plan, args, os.fdopen(write_end, "w"),
                             max(1.0, end - time.monotonic()))
            pids.append(pid)
        os.close(write_end)
        with os.fdopen(read_end) as reports:
            results = dict(json.loads(line) for line in reports)
        codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]
        print("WORLD " + json.dumps({"results": results, "codes": codes}), flush=True)


if __name__ == "__main__":
    _module, _name, _n, _worlds, _deadline = sys.argv[1:]
    _helper(_module, _name, int(_n), json.loads(_worlds), float(_deadline))
