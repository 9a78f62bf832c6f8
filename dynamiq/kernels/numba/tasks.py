"""Running a block kernel's tasks on several threads at once.

The block kernels (:mod:`dynamiq.kernels.numba._blocks`) are serial functions that release the
GIL and code a range ``c0 .. c1`` of a call's tasks. :func:`run_tasks` cuts the tasks into one
contiguous range per thread and runs the ranges at once: the calling thread takes the first, a
process-wide pool of threads the others. The thread count is ``numba.get_num_threads()``, so
``numba.set_num_threads`` keeps its meaning for these kernels. Tasks are independent, so which
thread codes a task changes no bit.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numba

__all__ = ["run_tasks"]

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_pool_size = 0
_pool_pid = 0


def _workers(n: int) -> ThreadPoolExecutor:
    """A pool of at least ``n`` threads that belongs to this process."""
    global _pool, _pool_size, _pool_pid
    with _lock:
        # a forked child inherits the parent's pool object but none of its threads
        if _pool is None or _pool_pid != os.getpid() or _pool_size < n:
            if _pool is not None and _pool_pid == os.getpid():
                _pool.shutdown(wait=False)
            _pool = ThreadPoolExecutor(max_workers=n, thread_name_prefix="dynamiq-kernels")
            _pool_size, _pool_pid = n, os.getpid()
        return _pool


def run_tasks(fn: Callable[..., None], ntasks: int, *args) -> None:
    """``fn(c0, c1, *args)`` over the tasks ``0 .. ntasks``, cut into one range per thread.

    Equivalent to ``fn(0, ntasks, *args)``. Returns once every range is done, also when one
    of them raises (the others write into the caller's arrays); the first error is re-raised.
    """
    k = min(numba.get_num_threads(), ntasks)
    if k <= 1:
        fn(0, ntasks, *args)
        return
    cuts = [ntasks * i // k for i in range(k + 1)]
    pool = _workers(k - 1)
    futures = [pool.submit(fn, cuts[i], cuts[i + 1], *args) for i in range(1, k)]
    try:
        fn(cuts[0], cuts[1], *args)
    finally:
        errors = [f.exception() for f in futures]
    for e in errors:
        if e is not None:
            raise e
