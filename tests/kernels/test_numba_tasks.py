"""The host side of the Numba block kernels' threads: every task once, errors, forks, bits."""

from __future__ import annotations

import itertools
import multiprocessing
import threading

import numba
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as hs

from dynamiq.kernels.numba.tasks import run_tasks


@pytest.fixture
def threads():
    """Set Numba's thread count for one test (restored afterwards)."""
    before = numba.get_num_threads()
    yield numba.set_num_threads
    numba.set_num_threads(before)


@settings(max_examples=40, deadline=None)
@given(ntasks=hs.integers(0, 50), nthreads=hs.integers(1, 2))
def test_every_task_runs_once_in_ranges_of_its_own(ntasks, nthreads):
    before = numba.get_num_threads()
    numba.set_num_threads(min(nthreads, numba.config.NUMBA_NUM_THREADS))
    try:
        seen = np.zeros(ntasks, np.int64)
        ranges = []
        lock = threading.Lock()

        def fn(c0, c1, out):
            with lock:
                ranges.append((c0, c1))
            out[c0:c1] += 1

        run_tasks(fn, ntasks, seen)
    finally:
        numba.set_num_threads(before)
    assert (seen == 1).all()
    # contiguous, ordered ranges that tile 0 .. ntasks, at most one per thread
    ranges.sort()
    assert len(ranges) <= max(1, min(nthreads, ntasks))
    assert ranges[0][0] == 0 and ranges[-1][1] == ntasks
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))


def test_an_error_is_raised_after_every_range_is_done(threads):
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("needs two Numba threads")
    threads(2)
    done = []
    release = threading.Event()

    def fn(c0, c1):
        if c0 == 0:
            raise ValueError("range 0")
        release.wait(5)  # still running when the calling thread's range has failed
        done.append(c0)

    timer = threading.Timer(0.2, release.set)
    timer.start()
    with pytest.raises(ValueError, match="range 0"):
        run_tasks(fn, 2)
    when_raised = list(done)
    timer.join()
    assert when_raised == [1]


def _child(q):
    from dynamiq.kernels.numba.tasks import run_tasks

    out = np.zeros(8, np.int64)

    def fn(c0, c1, a):
        a[c0:c1] += 1

    run_tasks(fn, 8, out)
    q.put(out.tolist())


def test_a_forked_child_runs_its_tasks(threads):
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("needs two Numba threads")
    threads(2)
    run_tasks(lambda c0, c1: None, 4)  # the parent's pool exists before the fork
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_child, args=(q,))
    p.start()
    p.join(30)
    alive = p.is_alive()
    if alive:
        p.kill()
    # the child inherits the parent's pool object but none of its threads: a task handed to
    # that pool would never run
    assert not alive, "the forked child hung"
    assert q.get(timeout=5) == [1] * 8


def test_codes_do_not_depend_on_the_thread_count(threads):
    from dynamiq.quantizers import get_quantizer

    q = get_quantizer("int8_sr")
    x = torch.randn(1 << 18)  # above SERIAL_BELOW: the kernels run on every thread
    threads(1)
    one = q.encode(x, backend="numba").data.clone()
    threads(min(2, numba.config.NUMBA_NUM_THREADS))
    many = q.encode(x, backend="numba").data
    assert torch.equal(one, many)
