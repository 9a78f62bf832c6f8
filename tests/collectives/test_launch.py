"""The local launch harness: a failing rank is named, and the cause comes before its effects.

The worlds that complete are covered by every multi-process test (they all run on
:mod:`dynamiq.collectives.launch`); here one small world fails on purpose.
"""

from __future__ import annotations

import time

import pytest
import torch.distributed as dist

from dynamiq.collectives.launch import RankFailedError, WorldOutcome, launch


def _fail_on_one(rank: int, world_size: int, message: str) -> int:
    if rank == 1:
        raise ValueError(message)
    dist.barrier()  # waits for rank 1, which never comes: this rank fails in consequence
    return rank


def test_a_raising_rank_is_named_with_its_traceback():
    t0 = time.monotonic()
    with pytest.raises(RankFailedError) as info:
        launch(_fail_on_one, 3, ("rank one gives up",), timeout=120,
               env={"NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}, num_threads=1)
    e = info.value
    assert e.rank == 1 and e.exitcode == 0
    assert str(e).startswith("rank 1 of 3 (also without a result: ranks ")
    assert "ValueError: rank one gives up" in str(e) and "ValueError" in e.traceback
    # the others, blocked in a barrier, are not waited for until the timeout
    assert time.monotonic() - t0 < 100


def test_outcome_check_orders_and_names_failures():
    ok = WorldOutcome(2, {0: "a", 1: "b"}, {}, [0, 0], [])
    assert ok.check() == ["a", "b"]
    died = WorldOutcome(3, {0: "a"}, {2: "Traceback: boom"}, [0, -9, 0], [1, 2])
    with pytest.raises(RankFailedError, match=r"^rank 1 of 3 \(also without a result: rank 2\) "
                                              r"ended with exit code -9 without returning"):
        died.check()
    partial = WorldOutcome(2, {0: "a"}, {}, [0, 17], [])  # rank 1 was not awaited
    with pytest.raises(RankFailedError, match="rank 1 of 2 ended with exit code 17"):
        partial.check()
