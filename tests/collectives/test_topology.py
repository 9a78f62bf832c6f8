"""All-reduce schedules and topologies: validity, cost, conventions, simulation and spec strings."""

from __future__ import annotations

import functools
import math
import re
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynamiq.collectives.topology import (
    TOPOLOGIES,
    Butterfly,
    Hierarchical,
    Ring,
    Schedule,
    ScheduleError,
    Topology,
    Transfer,
    get_topology,
)
from dynamiq.registry import DuplicateNameError, UnknownNameError

SETTINGS = settings(max_examples=50, deadline=None)
MAX_N = 64
BASIC = ("ring", "butterfly")

SAMPLES: list[Topology] = [
    Ring(),
    Butterfly(),
    *(Hierarchical(p, inner, outer) for p in (1, 2, 4) for inner in BASIC for outer in BASIC),
]


def _is_pow2(k: int) -> bool:
    return k & (k - 1) == 0


def _applies(t: Topology, n: int) -> bool:
    # Written independently of Topology.supports so that the two can be checked against each other.
    if isinstance(t, Ring):
        return n >= 1
    if isinstance(t, Butterfly):
        return n >= 1 and _is_pow2(n)
    if isinstance(t, Hierarchical):
        p = t.ranks_per_node
        return n % p == 0 and _applies(t.inner_topology, p) and _applies(t.outer_topology, n // p)
    raise AssertionError(f"no expectation for {t!r}; add it to SAMPLES and _applies")


CASES = [(t, n) for t in SAMPLES for n in range(1, MAX_N + 1) if _applies(t, n)]


@functools.cache
def _schedule(t: Topology, n: int) -> Schedule:
    return t.schedule(n)


def _ids(t: Topology) -> str:
    return t.spec()


# ---- coverage and validity ----------------------------------------------------------------------


def test_samples_cover_every_registered_topology() -> None:
    covered = {TOPOLOGIES.name_of(type(t)) for t in SAMPLES}
    assert covered == set(TOPOLOGIES.names())


def test_registering_a_name_twice_raises() -> None:
    with pytest.raises(DuplicateNameError):
        TOPOLOGIES.register("ring", Ring)


@pytest.mark.parametrize("topo", SAMPLES, ids=_ids)
def test_supports_matches_expected_world_sizes(topo: Topology) -> None:
    for n in range(1, MAX_N + 1):
        assert topo.supports(n) == _applies(topo, n), n
        if not _applies(topo, n):
            with pytest.raises(ValueError):
                topo.schedule(n)
    assert not topo.supports(0)


@pytest.mark.parametrize("topo", SAMPLES, ids=_ids)
def test_every_schedule_is_valid(topo: Topology) -> None:
    for n in range(1, MAX_N + 1):
        if not _applies(topo, n):
            continue
        s = _schedule(topo, n)
        s.validate()
        assert s.world_size == n
        assert s.name == topo.spec()
        assert s.num_chunks == n
        assert math.isclose(math.fsum(s.chunk_weights), 1.0)
        assert sorted(s.owners) == list(range(n))
        assert s.transfers == tuple(sorted(s.transfers, key=Transfer.sort_key))
        if isinstance(topo, Hierarchical):
            p = topo.ranks_per_node
            assert len(s.levels) == len(s.transfers)
            for t, level in zip(s.transfers, s.levels):
                assert level == ("intra" if t.src // p == t.dst // p else "inter")
        else:
            assert s.levels == ()


def test_single_rank_has_no_transfers() -> None:
    for topo in SAMPLES:
        if _applies(topo, 1):
            s = _schedule(topo, 1)
            assert s.transfers == () and s.steps() == 0 and s.depth(0) == 0


# ---- cost and shape -----------------------------------------------------------------------------


@pytest.mark.parametrize("topo", SAMPLES, ids=_ids)
def test_bytes_per_rank_matches_ring_bandwidth(topo: Topology) -> None:
    chunk_bytes = 12
    for n in range(1, MAX_N + 1):
        if not _applies(topo, n):
            continue
        s = _schedule(topo, n)
        payload = chunk_bytes * s.num_chunks
        assert len(set(s.chunk_weights)) == 1
        sent = s.bytes_per_rank(chunk_bytes)
        # 2(n-1)/n of the vector, compared in integers.
        assert all(b * n == 2 * (n - 1) * payload for b in sent), (n, sent)
        assert s.bytes_per_rank([chunk_bytes] * s.num_chunks) == sent


def test_bytes_per_rank_weighs_chunks_by_their_payload() -> None:
    s = _schedule(Ring(), 4)
    sizes = [1, 10, 100, 1000]
    got = s.bytes_per_rank(sizes)
    for r in range(4):
        assert got[r] == sum(sizes[t.chunk] for t in s.transfers if t.src == r)
    with pytest.raises(ValueError, match="one payload size per chunk"):
        s.bytes_per_rank([1, 2])


@pytest.mark.parametrize("n", range(1, MAX_N + 1))
def test_ring_depth_and_steps(n: int) -> None:
    s = _schedule(Ring(), n)
    assert [s.depth(c) for c in range(n)] == [n - 1] * n
    assert s.steps() == 2 * (n - 1)
    assert all(sum(t.src == r for t in s.transfers) == 2 * (n - 1) for r in range(n))


@pytest.mark.parametrize("m", range(7))
def test_butterfly_depth_and_steps(m: int) -> None:
    n = 1 << m
    s = _schedule(Butterfly(), n)
    assert [s.depth(c) for c in range(n)] == [m] * n
    assert s.steps() == 2 * m


@pytest.mark.parametrize("p", [1, 2, 4])
def test_hierarchical_ring_ring_depth_and_steps(p: int) -> None:
    for n in range(p, MAX_N + 1, p):
        s = _schedule(Hierarchical(p), n)
        nodes = n // p
        assert max(s.depth(c) for c in range(n)) == (p - 1) + (nodes - 1)
        assert s.steps() == 2 * (p - 1) + 2 * (nodes - 1)


# ---- step conventions ---------------------------------------------------------------------------


def test_ring_step_convention() -> None:
    n = 5
    s = _schedule(Ring(), n)
    for step in range(n - 1):
        expected = {(r, (r + 1) % n, (r - step - 1) % n) for r in range(n)}
        got = {(t.src, t.dst, t.chunk) for t in s.transfers_at(step)}
        assert got == expected
        assert {t.phase for t in s.transfers_at(step)} == {"reduce"}
    for c in range(n):
        reduce = [t for t in s.transfers if t.chunk == c and t.phase == "reduce"]
        assert max(reduce, key=lambda t: t.step).dst == c == s.owners[c]
        assert [t.src for t in reduce] == [(c + 1 + k) % n for k in range(n - 1)]
    assert {t.phase for step in range(n - 1, 2 * (n - 1)) for t in s.transfers_at(step)} == {
        "gather"
    }


def test_butterfly_step_convention() -> None:
    n = 16
    s = _schedule(Butterfly(), n)
    for k in range(4):
        ts = s.transfers_at(k)
        assert {(t.src, t.dst) for t in ts} == {(r, r ^ (n >> (k + 1))) for r in range(n)}
        for r in range(n):
            assert sum(t.src == r for t in ts) == n >> (k + 1)
        # The partner keeps exactly the chunks whose bit matches its own.
        h = n >> (k + 1)
        assert all((t.chunk & h) == (t.dst & h) for t in ts)
    for j in range(4):
        ts = s.transfers_at(4 + j)
        assert {(t.src, t.dst) for t in ts} == {(r, r ^ (1 << j)) for r in range(n)}
        assert all(t.phase == "gather" for t in ts)


def test_transfers_at_partitions_the_schedule() -> None:
    s = _schedule(Hierarchical(4, "butterfly", "ring"), 24)
    joined = tuple(t for step in range(s.steps()) for t in s.transfers_at(step))
    assert joined == s.transfers
    assert s.transfers_at(s.steps()) == ()


def test_children_and_text() -> None:
    s = _schedule(Butterfly(), 8)
    assert s.children(0, 0) == (1, 2, 4)
    assert s.children(0, 7) == ()
    text = s.to_text()
    assert "step 0:" in text and "chunk 0 (owner 0" in text and "7->3" in text
    assert str(s).startswith("Schedule 'butterfly': 8 ranks, 8 chunks, 6 steps")
    assert "[intra]" in _schedule(Hierarchical(2), 4).to_text()


# ---- validate() catches broken schedules ---------------------------------------------------------


def _ring4() -> Schedule:
    return _schedule(Ring(), 4)


def _moved(s: Schedule, old: Transfer, step: int) -> Schedule:
    ts = list(s.transfers)
    ts[ts.index(old)] = Transfer(step, old.src, old.dst, old.chunk, old.phase)
    return s.with_transfers(ts)


def test_validate_catches_a_missing_transfer() -> None:
    s = _ring4()
    broken = s.with_transfers([t for t in s.transfers if t != Transfer(0, 1, 2, 0, "reduce")])
    with pytest.raises(ScheduleError, match=r"chunk 0: reduce transfer 1->2 .* is missing"):
        broken.validate()
    gone = s.with_transfers([t for t in s.transfers if t != Transfer(5, 2, 3, 0, "gather")])
    with pytest.raises(ScheduleError, match=r"chunk 0: ranks \[3\] never receive the gather"):
        gone.validate()


def test_validate_catches_a_cycle() -> None:
    s = _ring4()
    parents = list(s.parents)
    parents[0] = (-1, 2, 3, 1)
    with pytest.raises(ScheduleError, match=r"chunk 0: parents contain a cycle"):
        replace(s, parents=tuple(parents)).validate()


def test_validate_catches_a_second_root() -> None:
    s = _ring4()
    parents = list(s.parents)
    parents[0] = (-1, 2, -1, 0)
    with pytest.raises(ScheduleError, match="has no parent but is not the owner"):
        replace(s, parents=tuple(parents)).validate()


def test_validate_catches_a_child_sending_after_its_parent() -> None:
    broken = _moved(_ring4(), Transfer(0, 1, 2, 0, "reduce"), 1)
    with pytest.raises(ScheduleError, match="a child must send strictly before its parent"):
        broken.validate()


def test_validate_catches_a_gather_before_the_reduce_ends() -> None:
    broken = _moved(_ring4(), Transfer(3, 0, 1, 0, "gather"), 2)
    with pytest.raises(ScheduleError, match="is not after the chunk's last reduce step 2"):
        broken.validate()


def test_validate_catches_a_gather_forwarded_too_early() -> None:
    broken = _moved(_ring4(), Transfer(4, 1, 2, 0, "gather"), 3)
    with pytest.raises(ScheduleError, match="rank 1 forwards the gather to 2 at step 3 before"):
        broken.validate()


def test_validate_catches_duplicates_and_disorder() -> None:
    s = _ring4()
    twice = s.with_transfers([*s.transfers, Transfer(1, 1, 2, 0, "reduce")])
    with pytest.raises(ScheduleError, match="rank 1 sends its partial sum twice"):
        twice.validate()
    dup = replace(s, transfers=(s.transfers[0], *s.transfers))
    with pytest.raises(ScheduleError, match="duplicate transfer"):
        dup.validate()
    unsorted = replace(s, transfers=s.transfers[::-1])
    with pytest.raises(ScheduleError, match="not sorted"):
        unsorted.validate()
    off_tree = s.with_transfers([*s.transfers[1:], Transfer(0, 1, 3, 0, "reduce")])
    with pytest.raises(ScheduleError, match="is not a tree edge"):
        off_tree.validate()


def test_validate_catches_bad_shapes() -> None:
    s = _ring4()
    with pytest.raises(ScheduleError, match="sum to"):
        replace(s, chunk_weights=(0.5, 0.5, 0.5, 0.5)).validate()
    with pytest.raises(ScheduleError, match="owners has 3 entries"):
        replace(s, owners=(0, 1, 2)).validate()
    with pytest.raises(ScheduleError, match="levels has 1 entries"):
        replace(s, levels=("intra",)).validate()
    with pytest.raises(ScheduleError, match="phase must be one of"):
        Transfer(0, 0, 1, 0, "scatter")


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
    _star((0, 1, 2, 3)).validate()
    with pytest.raises(ScheduleError, match="rank 0 receives from both 1 and 2 at step 0"):
        _star((0, 0, 2, 3)).validate()
    with pytest.raises(ScheduleError, match="rank 0 sends to both 1 and 2 at step 2"):
        _star((0, 1, 2, 2)).validate()


# Small worlds keep each example cheap; every kind of edge already occurs there.
_DROPPABLE = [(t, n) for t, n in CASES if 2 <= n <= 16]


@SETTINGS
@given(case=st.sampled_from(_DROPPABLE), data=st.data())
def test_dropping_any_transfer_is_caught(case: tuple[Topology, int], data: st.DataObject) -> None:
    s = _schedule(*case)
    i = data.draw(st.integers(0, len(s.transfers) - 1))
    levels = s.levels[:i] + s.levels[i + 1 :] if s.levels else ()
    broken = s.with_transfers(s.transfers[:i] + s.transfers[i + 1 :], levels)
    with pytest.raises(
        ScheduleError, match=r"is missing|never receive|before it has the final bytes"
    ):
        broken.validate()


# ---- simulation: an exact sum over the schedule -------------------------------------------------


def _simulate(s: Schedule, vectors: np.ndarray) -> list[np.ndarray]:
    n, length = vectors.shape
    bounds = np.rint(np.cumsum((0.0, *s.chunk_weights)) * length).astype(int)
    bounds[-1] = length
    partial = [
        [vectors[r, bounds[c] : bounds[c + 1]].copy() for c in range(s.num_chunks)]
        for r in range(n)
    ]
    final: list[dict[int, np.ndarray]] = [{} for _ in range(n)]
    for step in range(s.steps()):
        ts = s.transfers_at(step)
        # Everything sent in a step is what the sender held when the step began.
        sent = []
        for t in ts:
            if t.phase == "reduce":
                sent.append((t, partial[t.src][t.chunk].copy()))
            elif t.src == s.owners[t.chunk]:
                sent.append((t, partial[t.src][t.chunk].copy()))
            else:
                sent.append((t, final[t.src][t.chunk].copy()))
        for t, payload in sent:
            if t.phase == "reduce":
                partial[t.dst][t.chunk] += payload
            else:
                final[t.dst][t.chunk] = payload
    return [
        np.concatenate(
            [partial[r][c] if s.owners[c] == r else final[r][c] for c in range(s.num_chunks)]
        )
        for r in range(n)
    ]


def _check_exact_sum(s: Schedule, seed: int, length: int) -> None:
    rng = np.random.default_rng(seed)
    # Integer-valued floats make every summation order exact, so results compare with ==.
    vectors = rng.integers(-1000, 1000, size=(s.world_size, length)).astype(np.float64)
    expected = vectors.sum(axis=0)
    for r, out in enumerate(_simulate(s, vectors)):
        np.testing.assert_array_equal(out, expected, err_msg=f"{s.name} rank {r}")


@pytest.mark.parametrize("topo", SAMPLES, ids=_ids)
def test_simulated_sum_is_exact(topo: Topology) -> None:
    for n in (1, 2, 3, 4, 6, 8, 12, 16, 32):
        if _applies(topo, n):
            _check_exact_sum(_schedule(topo, n), seed=n, length=3 * n + 5)


@SETTINGS
@given(
    case=st.sampled_from(CASES),
    seed=st.integers(0, 2**32 - 1),
    length=st.integers(0, 200),
)
def test_simulated_sum_is_exact_random(case: tuple[Topology, int], seed: int, length: int) -> None:
    _check_exact_sum(_schedule(*case), seed, length)


# ---- spec strings -------------------------------------------------------------------------------


@pytest.mark.parametrize("topo", SAMPLES, ids=_ids)
def test_spec_round_trip(topo: Topology) -> None:
    assert get_topology(topo.spec()) == topo
    assert " " not in topo.spec()
    assert get_topology(topo) is topo


_specs = st.recursive(
    st.sampled_from(BASIC),
    lambda sub: st.builds(
        lambda p, i, o: Hierarchical(p, i, o).spec(), st.integers(1, 8), sub, sub
    ),
    max_leaves=4,
)


@SETTINGS
@given(spec=_specs)
def test_spec_round_trip_random(spec: str) -> None:
    topo = get_topology(spec)
    assert topo.spec() == spec
    assert get_topology(topo.spec()) == topo


def test_spec_examples() -> None:
    assert get_topology("ring") == Ring()
    assert get_topology("butterfly") == Butterfly()
    assert Hierarchical(2).spec() == "hierarchical(ranks_per_node=2)"
    assert get_topology("hierarchical(ranks_per_node=2)") == Hierarchical(2)
    full = get_topology("hierarchical(ranks_per_node=4,inner=ring,outer=butterfly)")
    assert full == Hierarchical(4, outer="butterfly")
    assert full.spec() == "hierarchical(ranks_per_node=4,outer=butterfly)"
    assert get_topology(" hierarchical( outer = butterfly , ranks_per_node = 4 ) ") == full
    assert Hierarchical(2, inner=" ring ") == Hierarchical(2)


@pytest.mark.parametrize(
    ("spec", "error", "fragment"),
    [
        ("tree", UnknownNameError, "Known: butterfly, hierarchical, ring"),
        ("hierarchical(ranks_per_node=2,inner=nope)", UnknownNameError, "Known:"),
        ("hierarchical", ValueError, "needs parameter 'ranks_per_node'"),
        ("hierarchical(ranks_per_node=two)", ValueError, "ranks_per_node must be an integer"),
        ("hierarchical(ranks_per_node=0)", ValueError, "positive int"),
        ("hierarchical(ranks_per_node=2,ranks_per_node=2)", ValueError, "given twice"),
        ("hierarchical(ranks_per_node)", ValueError, "expected key=value"),
        ("hierarchical(ranks_per_node=2", ValueError, "malformed topology spec"),
        ("hierarchical(ranks_per_node=(2)", ValueError, "unbalanced parentheses"),
        ("ring(size=4)", ValueError, "has no parameter 'size'; accepted: none"),
        ("", ValueError, "empty topology spec"),
    ],
)
def test_bad_specs(spec: str, error: type[Exception], fragment: str) -> None:
    with pytest.raises(error, match=re.escape(fragment)):
        get_topology(spec)


def test_bad_world_sizes() -> None:
    with pytest.raises(ValueError, match="power-of-two world size, got 6; use 'ring'"):
        Butterfly().schedule(6)
    with pytest.raises(ValueError, match="divisible by ranks_per_node=4, got 6"):
        Hierarchical(4).schedule(6)
    with pytest.raises(ValueError, match="outer level over 3 ranks: butterfly needs"):
        Hierarchical(2, outer="butterfly").schedule(6)
    with pytest.raises(ValueError, match="positive int"):
        Ring().schedule(0)
    with pytest.raises(TypeError):
        get_topology(3)  # type: ignore[arg-type]
