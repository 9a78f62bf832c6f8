"""The validator catches broken schedules and names what is wrong."""

from __future__ import annotations

from dataclasses import replace

import pytest
from _topology_samples import CASES, schedule
from hypothesis import given, settings
from hypothesis import strategies as st

from dynamiq.topologies import Ring, Schedule, ScheduleError, Topology, Transfer, validate_schedule

SETTINGS = settings(max_examples=50, deadline=None)


def _ring4() -> Schedule:
    return schedule(Ring(), 4)


def _moved(s: Schedule, old: Transfer, step: int) -> Schedule:
    ts = list(s.transfers)
    ts[ts.index(old)] = Transfer(step, old.src, old.dst, old.chunk, old.phase)
    return s.with_transfers(ts)


def test_method_and_function_agree() -> None:
    s = _ring4()
    validate_schedule(s)
    s.validate()
    broken = replace(s, owners=(0, 1, 2))
    for check in (validate_schedule, Schedule.validate):
        with pytest.raises(ScheduleError, match="owners has 3 entries"):
            check(broken)


def test_validate_catches_a_missing_transfer() -> None:
    s = _ring4()
    broken = s.with_transfers([t for t in s.transfers if t != Transfer(0, 1, 2, 0, "reduce")])
    with pytest.raises(ScheduleError, match=r"chunk 0: reduce transfer 1->2 .* is missing"):
        validate_schedule(broken)
    gone = s.with_transfers([t for t in s.transfers if t != Transfer(5, 2, 3, 0, "gather")])
    with pytest.raises(ScheduleError, match=r"chunk 0: ranks \[3\] never receive the gather"):
        validate_schedule(gone)


def test_validate_catches_a_cycle() -> None:
    s = _ring4()
    parents = list(s.parents)
    parents[0] = (-1, 2, 3, 1)
    with pytest.raises(ScheduleError, match=r"chunk 0: parents contain a cycle"):
        validate_schedule(replace(s, parents=tuple(parents)))


def test_validate_catches_a_second_root() -> None:
    s = _ring4()
    parents = list(s.parents)
    parents[0] = (-1, 2, -1, 0)
    with pytest.raises(ScheduleError, match="has no parent but is not the owner"):
        validate_schedule(replace(s, parents=tuple(parents)))


def test_validate_catches_a_child_sending_after_its_parent() -> None:
    broken = _moved(_ring4(), Transfer(0, 1, 2, 0, "reduce"), 1)
    with pytest.raises(ScheduleError, match="a child must send strictly before its parent"):
        validate_schedule(broken)


def test_validate_catches_a_gather_before_the_reduce_ends() -> None:
    broken = _moved(_ring4(), Transfer(3, 0, 1, 0, "gather"), 2)
    with pytest.raises(ScheduleError, match="is not after the chunk's last reduce step 2"):
        validate_schedule(broken)


def test_validate_catches_a_gather_forwarded_too_early() -> None:
    broken = _moved(_ring4(), Transfer(4, 1, 2, 0, "gather"), 3)
    with pytest.raises(ScheduleError, match="rank 1 forwards the gather to 2 at step 3 before"):
        validate_schedule(broken)


def test_validate_catches_duplicates_and_disorder() -> None:
    s = _ring4()
    twice = s.with_transfers([*s.transfers, Transfer(1, 1, 2, 0, "reduce")])
    with pytest.raises(ScheduleError, match="rank 1 sends its partial sum twice"):
        validate_schedule(twice)
    dup = replace(s, transfers=(s.transfers[0], *s.transfers))
    with pytest.raises(ScheduleError, match="duplicate transfer"):
        validate_schedule(dup)
    unsorted = replace(s, transfers=s.transfers[::-1])
    with pytest.raises(ScheduleError, match="not sorted"):
        validate_schedule(unsorted)
    off_tree = s.with_transfers([*s.transfers[1:], Transfer(0, 1, 3, 0, "reduce")])
    with pytest.raises(ScheduleError, match="is not a tree edge"):
        validate_schedule(off_tree)


def test_validate_catches_bad_shapes() -> None:
    s = _ring4()
    with pytest.raises(ScheduleError, match="sum to"):
        validate_schedule(replace(s, chunk_weights=(0.5, 0.5, 0.5, 0.5)))
    with pytest.raises(ScheduleError, match="owners has 3 entries"):
        validate_schedule(replace(s, owners=(0, 1, 2)))
    with pytest.raises(ScheduleError, match="levels has 1 entries"):
        validate_schedule(replace(s, levels=("intra",)))


def _star(steps: tuple[int, int, int, int]) -> Schedule:
    a, b, g1, g2 = steps
    empty = Schedule(3, 1, (0,), ((-1, 0, 0),), (1.0,), (), name="star")
    return empty.with_transfers(
        [
            Transfer(a, 1, 0, 0, "reduce"),
            Transfer(b, 2, 0, 0, "reduce"),
            Transfer(g1, 0, 1, 0, "gather"),
            Transfer(g2, 0, 2, 0, "gather"),
        ]
    )


def test_port_model() -> None:
    validate_schedule(_star((0, 1, 2, 3)))
    with pytest.raises(ScheduleError, match="rank 0 receives from both 1 and 2 at step 0"):
        validate_schedule(_star((0, 0, 2, 3)))
    with pytest.raises(ScheduleError, match="rank 0 sends to both 1 and 2 at step 2"):
        validate_schedule(_star((0, 1, 2, 2)))


# Small worlds keep each example cheap; every kind of edge already occurs there.
_DROPPABLE = [(t, n) for t, n in CASES if 2 <= n <= 16]


@SETTINGS
@given(case=st.sampled_from(_DROPPABLE), data=st.data())
def test_dropping_any_transfer_is_caught(case: tuple[Topology, int], data: st.DataObject) -> None:
    s = schedule(*case)
    i = data.draw(st.integers(0, len(s.transfers) - 1))
    levels = s.levels[:i] + s.levels[i + 1 :] if s.levels else ()
    broken = s.with_transfers(s.transfers[:i] + s.transfers[i + 1 :], levels)
    with pytest.raises(
        ScheduleError, match=r"is missing|never receive|before it has the final bytes"
    ):
        validate_schedule(broken)
