"""Every topology's step arrays and chunking equal its built schedule's, transfer for transfer
(the closed forms of ring and butterfly included), for every sampled world size."""

from __future__ import annotations

import numpy as np
import pytest
from _topology_samples import CASES, ids, schedule

from dynamiq.topologies import Butterfly, Ring
from dynamiq.topologies.arrays import schedule_chunking, schedule_step_arrays

# the closed forms at every sampled size; schedule-derived arrays (hierarchical) on small ones
STEP_CASES = [(t, n) for t, n in CASES if n <= 16 or isinstance(t, (Ring, Butterfly))]


@pytest.mark.parametrize(("topo", "n"), STEP_CASES,
                         ids=[f"{ids(t)}-{n}" for t, n in STEP_CASES])
def test_step_arrays_equal_the_schedule(topo, n) -> None:
    sched = schedule(topo, n)
    got = list(topo.step_arrays(n))
    want = list(schedule_step_arrays(sched))
    assert [(a.step, a.phase) for a in got] == [(b.step, b.phase) for b in want]
    for a, b in zip(got, want):
        for f in ("src", "dst", "chunk"):
            assert np.array_equal(getattr(a, f), getattr(b, f)), (a.step, f)
    mine, theirs = topo.chunking(n), schedule_chunking(sched)
    assert np.array_equal(mine.owners, theirs.owners)
    assert mine.weights == theirs.weights
    # every transfer once: the arrays hold exactly the schedule's records
    assert sum(a.src.size for a in got) == len(sched.transfers)


def test_closed_forms_refuse_what_the_schedule_refuses() -> None:
    with pytest.raises(ValueError, match="power-of-two"):
        list(Butterfly().step_arrays(6))
    with pytest.raises(ValueError, match="power-of-two"):
        Butterfly().chunking(6)
