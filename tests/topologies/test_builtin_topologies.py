"""Ring, butterfly and hierarchical: which world sizes they serve, validity, cost, step
conventions, and an exact sum when their schedules are run on integer-valued data."""

from __future__ import annotations

import math

import numpy as np
import pytest
from _topology_samples import CASES, MAX_N, SAMPLES, applies, ids, schedule
from hypothesis import given, settings
from hypothesis import strategies as st

from dynamiq.registry import DuplicateNameError
from dynamiq.topologies import (
    TOPOLOGIES,
    Butterfly,
    Hierarchical,
    Ring,
    Schedule,
    Topology,
    Transfer,
)

SETTINGS = settings(max_examples=50, deadline=None)


# ---- coverage and validity ----------------------------------------------------------------------


def test_samples_cover_every_builtin_topology() -> None:
    # Other tests (and guides) may register topologies of their own in this process.
    builtin = {name for name, cls in TOPOLOGIES.items() if cls.__module__.startswith("dynamiq.")}
    covered = {TOPOLOGIES.name_of(type(t)) for t in SAMPLES}
    assert covered == builtin == {"ring", "butterfly", "hierarchical"}


def test_registering_a_name_twice_raises() -> None:
    with pytest.raises(DuplicateNameError):
        TOPOLOGIES.register("ring", Ring)


@pytest.mark.parametrize("topo", SAMPLES, ids=ids)
def test_supports_matches_expected_world_sizes(topo: Topology) -> None:
    for n in range(1, MAX_N + 1):
        assert topo.supports(n) == applies(topo, n), n
        if not applies(topo, n):
            with pytest.raises(ValueError):
                topo.schedule(n)
    assert not topo.supports(0)


@pytest.mark.parametrize("topo", SAMPLES, ids=ids)
def test_every_schedule_is_valid(topo: Topology) -> None:
    for n in range(1, MAX_N + 1):
        if not applies(topo, n):
            continue
        s = schedule(topo, n)
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
        if applies(topo, 1):
            s = schedule(topo, 1)
            assert s.transfers == () and s.steps() == 0 and s.depth(0) == 0


def test_bad_world_sizes() -> None:
    with pytest.raises(ValueError, match="power-of-two world size, got 6; use 'ring'"):
        Butterfly().schedule(6)
    with pytest.raises(ValueError, match="divisible by ranks_per_node=4, got 6"):
        Hierarchical(4).schedule(6)
    with pytest.raises(ValueError, match="outer level over 3 ranks: butterfly needs"):
        Hierarchical(2, outer="butterfly").schedule(6)
    with pytest.raises(ValueError, match="positive int"):
        Ring().schedule(0)


# ---- cost and shape -----------------------------------------------------------------------------


@pytest.mark.parametrize("topo", SAMPLES, ids=ids)
def test_bytes_per_rank_matches_ring_bandwidth(topo: Topology) -> None:
    chunk_bytes = 12
    for n in range(1, MAX_N + 1):
        if not applies(topo, n):
            continue
        s = schedule(topo, n)
        payload = chunk_bytes * s.num_chunks
        assert len(set(s.chunk_weights)) == 1
        sent = s.bytes_per_rank(chunk_bytes)
        # 2(n-1)/n of the vector, compared in integers.
        assert all(b * n == 2 * (n - 1) * payload for b in sent), (n, sent)
        assert s.bytes_per_rank([chunk_bytes] * s.num_chunks) == sent


@pytest.mark.parametrize("n", range(1, MAX_N + 1))
def test_ring_depth_and_steps(n: int) -> None:
    s = schedule(Ring(), n)
    assert [s.depth(c) for c in range(n)] == [n - 1] * n
    assert s.steps() == 2 * (n - 1)
    assert all(sum(t.src == r for t in s.transfers) == 2 * (n - 1) for r in range(n))


@pytest.mark.parametrize("m", range(7))
def test_butterfly_depth_and_steps(m: int) -> None:
    n = 1 << m
    s = schedule(Butterfly(), n)
    assert [s.depth(c) for c in range(n)] == [m] * n
    assert s.steps() == 2 * m


@pytest.mark.parametrize("p", [1, 2, 4])
def test_hierarchical_ring_ring_depth_and_steps(p: int) -> None:
    for n in range(p, MAX_N + 1, p):
        s = schedule(Hierarchical(p), n)
        nodes = n // p
        assert max(s.depth(c) for c in range(n)) == (p - 1) + (nodes - 1)
        assert s.steps() == 2 * (p - 1) + 2 * (nodes - 1)


# ---- step conventions ---------------------------------------------------------------------------


def test_ring_step_convention() -> None:
    n = 5
    s = schedule(Ring(), n)
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
    s = schedule(Butterfly(), n)
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


@pytest.mark.parametrize("topo", SAMPLES, ids=ids)
def test_simulated_sum_is_exact(topo: Topology) -> None:
    for n in (1, 2, 3, 4, 6, 8, 12, 16, 32):
        if applies(topo, n):
            _check_exact_sum(schedule(topo, n), seed=n, length=3 * n + 5)


@SETTINGS
@given(
    case=st.sampled_from(CASES),
    seed=st.integers(0, 2**32 - 1),
    length=st.integers(0, 200),
)
def test_simulated_sum_is_exact_random(case: tuple[Topology, int], seed: int, length: int) -> None:
    _check_exact_sum(schedule(*case), seed, length)
