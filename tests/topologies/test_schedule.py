"""The schedule format: transfers, queries, cost and the text views."""

from __future__ import annotations

import pytest
from _topology_samples import schedule

from dynamiq.topologies import (
    Butterfly,
    Hierarchical,
    Ring,
    Schedule,
    ScheduleError,
    Transfer,
)
from dynamiq.topologies.render import schedule_summary, schedule_text


def test_transfer_phase_and_order() -> None:
    with pytest.raises(ScheduleError, match="phase must be one of"):
        Transfer(0, 0, 1, 0, "scatter")
    # reduce sorts before gather within a step, whatever the ranks
    assert Transfer(3, 5, 6, 0, "reduce").sort_key() < Transfer(3, 0, 1, 0, "gather").sort_key()
    assert str(Transfer(0, 2, 3, 1, "reduce")) == "2->3 c1"


def test_schedules_built_from_lists_compare_by_value() -> None:
    a = Schedule(2, 1, [0], [[-1, 0]], [1], [Transfer(0, 1, 0, 0, "reduce")], name="x")
    b = Schedule(2, 1, (0,), ((-1, 0),), (1.0,), (Transfer(0, 1, 0, 0, "reduce"),), name="x")
    assert a == b and hash(a) == hash(b)


def test_with_transfers_sorts_and_keeps_levels_aligned() -> None:
    s = schedule(Hierarchical(2), 4)
    shuffled = s.transfers[::-1]
    assert s.with_transfers(shuffled, s.levels[::-1]) == s
    assert s.with_transfers(s.transfers).levels == ()
    with pytest.raises(ScheduleError, match="they must align"):
        s.with_transfers(s.transfers, ("intra",))


def test_bytes_per_rank_weighs_chunks_by_their_payload() -> None:
    s = schedule(Ring(), 4)
    sizes = [1, 10, 100, 1000]
    got = s.bytes_per_rank(sizes)
    for r in range(4):
        assert got[r] == sum(sizes[t.chunk] for t in s.transfers if t.src == r)
    with pytest.raises(ValueError, match="one payload size per chunk"):
        s.bytes_per_rank([1, 2])


def test_transfers_at_partitions_the_schedule() -> None:
    s = schedule(Hierarchical(4, "butterfly", "ring"), 24)
    joined = tuple(t for step in range(s.steps()) for t in s.transfers_at(step))
    assert joined == s.transfers
    assert s.transfers_at(s.steps()) == ()


def test_children_heights_and_depth() -> None:
    s = schedule(Butterfly(), 8)
    assert s.children(0, 0) == (1, 2, 4)
    assert s.children(0, 7) == ()
    assert s.heights(0) == (3, 2, 1, 1, 0, 0, 0, 0)  # children: 0:1,2,4 1:3,5 2:6 3:7
    assert s.depth(0) == 3
    ring = schedule(Ring(), 5)
    assert ring.heights(0) == (4, 0, 1, 2, 3) and ring.depth(0) == 4


def test_text_views() -> None:
    s = schedule(Butterfly(), 8)
    text = s.to_text()
    assert text == schedule_text(s)
    assert "step 0:" in text and "chunk 0 (owner 0" in text and "7->3" in text
    assert str(s) == schedule_summary(s)
    assert str(s).startswith("Schedule 'butterfly': 8 ranks, 8 chunks, 6 steps")
    assert "[intra]" in schedule(Hierarchical(2), 4).to_text()
    assert "(single rank)" in schedule(Ring(), 1).to_text()


def test_text_marks_idle_steps() -> None:
    s = Schedule(2, 1, (0,), ((-1, 0),), (1.0,), (), name="gap").with_transfers(
        [Transfer(0, 1, 0, 0, "reduce"), Transfer(2, 0, 1, 0, "gather")]
    )
    s.validate()
    lines = s.to_text().splitlines()
    assert lines[1:5] == [
        "steps:",
        "  step 0:",
        "    1->0 reduce: 0",
        "  step 1: (idle)",
    ]


@pytest.mark.parametrize("n", [2, 3, 8])
def test_ring_hop_profile_codes_every_partial_sum_once(n: int) -> None:
    """A ring's chunk is coded once from each partial sum of 1 … n − 1 contributions, each sent
    once, and once from the whole sum, which every all-gather transfer carries."""
    prof = schedule(Ring(), n).hop_profile()
    assert prof == (*tuple((s, 1.0, 1.0) for s in range(1, n)), (n, 1.0, float(n - 1)))


@pytest.mark.parametrize("topology", [Ring(), Butterfly(), Hierarchical(2)])
def test_hop_profile_counts_every_transfer_and_every_rank(topology) -> None:
    """Per chunk, the profile's sends are the schedule's transfers of that chunk and its codings
    are one per rank; the subtree sizes it lists are those of the chunks' trees."""
    s = schedule(topology, 8)
    prof = s.hop_profile()
    assert sum(sent for _, _, sent in prof) == pytest.approx(len(s.transfers) / s.num_chunks)
    assert sum(coded for _, coded, _ in prof) == pytest.approx(8)
    sizes = {v for c in range(s.num_chunks) for v in s.subtree_sizes(c)}
    assert {k for k, _, _ in prof} == sizes
    assert prof[-1][0] == 8
