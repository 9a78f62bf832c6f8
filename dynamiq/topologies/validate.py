"""The schedule validator: does a :class:`Schedule` compute an all-reduce under the time and port
model of :mod:`dynamiq.topologies.schedule`?"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from dynamiq.topologies.transfer import PHASES, ScheduleError, Transfer

if TYPE_CHECKING:
    from dynamiq.topologies.schedule import Schedule

__all__ = ["validate_schedule"]

# Chunk weights are products of 1/n fractions, so their sum is 1 only up to rounding.
_WEIGHT_TOLERANCE = 1e-9


def validate_schedule(s: Schedule) -> None:
    """Check that ``s`` computes an all-reduce under the documented time and port model.

    Equivalent to ``s.validate()``; every topology runs it before returning a schedule.

    Args:
        s: The schedule to check.

    Raises:
        ScheduleError: Naming the first problem found, among: inconsistent sizes or weights; a
            chunk's parents not forming a tree on all ranks rooted at its owner; a transfer out
            of range, out of order or duplicated; reduce transfers that are not exactly the tree
            edges, or a rank sending its partial sum before a child's has arrived; a gather
            before the chunk's last reduce step, from a rank that does not have the final bytes
            yet, or a rank receiving a chunk's gather twice or never; a rank sending to (or
            receiving from) two peers in one step.
    """
    _check_shape(s)
    for c in range(s.num_chunks):
        _check_tree(s, c)
    _check_transfer_fields(s)
    ready, last_reduce = _check_reduce(s)
    _check_gather(s, ready, last_reduce)
    _check_ports(s)


def _check_shape(s: Schedule) -> None:
    n, nc = s.world_size, s.num_chunks
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ScheduleError(f"world_size must be a positive int, got {n!r}")
    if isinstance(nc, bool) or not isinstance(nc, int) or nc < 1:
        raise ScheduleError(f"num_chunks must be a positive int, got {nc!r}")
    for label, seq in (
        ("owners", s.owners),
        ("parents", s.parents),
        ("chunk_weights", s.chunk_weights),
    ):
        if len(seq) != nc:
            raise ScheduleError(f"{label} has {len(seq)} entries for {nc} chunks")
    for c, w in enumerate(s.chunk_weights):
        if not (math.isfinite(w) and w >= 0):
            raise ScheduleError(f"chunk {c}: weight must be finite and >= 0, got {w!r}")
    total = math.fsum(s.chunk_weights)
    if abs(total - 1.0) > _WEIGHT_TOLERANCE:
        raise ScheduleError(f"chunk weights sum to {total!r}, not 1")
    if s.levels and len(s.levels) != len(s.transfers):
        raise ScheduleError(
            f"levels has {len(s.levels)} entries for {len(s.transfers)} transfers; "
            "it must be empty or aligned with transfers"
        )
    for i, lv in enumerate(s.levels):
        if not isinstance(lv, str) or not lv:
            raise ScheduleError(f"level of transfer {i} must be a non-empty str, got {lv!r}")


def _check_tree(s: Schedule, c: int) -> None:
    n, owner, parents = s.world_size, s.owners[c], s.parents[c]
    if not 0 <= owner < n:
        raise ScheduleError(f"chunk {c}: owner {owner} is not a rank of world size {n}")
    if len(parents) != n:
        raise ScheduleError(f"chunk {c}: parents has {len(parents)} entries for {n} ranks")
    for r, p in enumerate(parents):
        if r == owner:
            if p != -1:
                raise ScheduleError(f"chunk {c}: owner {owner} must have parent -1, got {p}")
        elif p == -1:
            raise ScheduleError(
                f"chunk {c}: rank {r} has no parent but is not the owner ({owner}); "
                "the parents must form a single tree"
            )
        elif not 0 <= p < n:
            raise ScheduleError(f"chunk {c}: parent {p} of rank {r} is not a rank")
    # 0 = unseen, 1 = on the current walk, 2 = known to reach the owner.
    state = [0] * n
    state[owner] = 2
    for start in range(n):
        path, r = [], start
        while state[r] == 0:
            state[r] = 1
            path.append(r)
            r = parents[r]
        if state[r] == 1:
            cycle = path[path.index(r) :]
            raise ScheduleError(
                f"chunk {c}: parents contain a cycle through ranks {cycle}, which never "
                f"reaches the owner {owner}"
            )
        for x in path:
            state[x] = 2


def _check_transfer_fields(s: Schedule) -> None:
    n, nc = s.world_size, s.num_chunks
    prev: Transfer | None = None
    for t in s.transfers:
        if t.phase not in PHASES:
            raise ScheduleError(f"transfer {t!r}: phase must be one of {PHASES}")
        if isinstance(t.step, bool) or not isinstance(t.step, int) or t.step < 0:
            raise ScheduleError(f"transfer {t!r}: step must be an int >= 0")
        if not (0 <= t.src < n and 0 <= t.dst < n):
            raise ScheduleError(f"transfer {t!r}: ranks must lie in [0, {n})")
        if t.src == t.dst:
            raise ScheduleError(f"transfer {t!r}: a rank cannot send to itself")
        if not 0 <= t.chunk < nc:
            raise ScheduleError(f"transfer {t!r}: chunk must lie in [0, {nc})")
        if prev is not None:
            if t.sort_key() < prev.sort_key():
                raise ScheduleError(
                    f"transfers are not sorted by (step, phase, src, dst, chunk): {t!r} "
                    f"follows {prev!r}"
                )
            if t == prev:
                raise ScheduleError(f"duplicate transfer {t!r}")
        prev = t


def _check_reduce(s: Schedule) -> tuple[list[int], list[int]]:
    """Check the reduce phase; returns, per chunk, the step from which the owner has the final
    bytes and the last reduce step (-1 when there is none)."""
    sends: list[dict[int, int]] = [{} for _ in range(s.num_chunks)]
    for t in s.transfers:
        if t.phase != "reduce":
            continue
        c, parents = t.chunk, s.parents[t.chunk]
        if t.src == s.owners[c]:
            raise ScheduleError(
                f"chunk {c}: reduce transfer {t.src}->{t.dst} at step {t.step} is sent by "
                "the owner, which is the sink of the tree"
            )
        if t.dst != parents[t.src]:
            raise ScheduleError(
                f"chunk {c}: reduce transfer {t.src}->{t.dst} at step {t.step} is not a tree "
                f"edge (the parent of {t.src} is {parents[t.src]})"
            )
        if t.src in sends[c]:
            raise ScheduleError(
                f"chunk {c}: rank {t.src} sends its partial sum twice (steps "
                f"{sends[c][t.src]} and {t.step})"
            )
        sends[c][t.src] = t.step
    ready, last = [], []
    for c in range(s.num_chunks):
        owner, parents, sent = s.owners[c], s.parents[c], sends[c]
        for r in range(s.world_size):
            if r != owner and r not in sent:
                raise ScheduleError(
                    f"chunk {c}: reduce transfer {r}->{parents[r]} (a tree edge) is missing"
                )
        for r, step in sent.items():
            p = parents[r]
            if p != owner and step >= sent[p]:
                raise ScheduleError(
                    f"chunk {c}: rank {p} sends its partial sum at step {sent[p]} but its "
                    f"child {r} only sends at step {step}; a child must send strictly before "
                    "its parent"
                )
        last_step = max(sent.values(), default=-1)
        last.append(last_step)
        # Every reduce step precedes its ancestors' edges, so the last one enters the owner.
        ready.append(last_step + 1)
    return ready, last


def _check_gather(s: Schedule, ready: list[int], last_reduce: list[int]) -> None:
    # has[c][r]: the first step at which rank r can forward chunk c's final bytes.
    has = [{s.owners[c]: ready[c]} for c in range(s.num_chunks)]
    for t in s.transfers:
        if t.phase != "gather":
            continue
        c = t.chunk
        if t.step <= last_reduce[c]:
            raise ScheduleError(
                f"chunk {c}: gather {t.src}->{t.dst} at step {t.step} is not after the "
                f"chunk's last reduce step {last_reduce[c]}"
            )
        if t.dst == s.owners[c]:
            raise ScheduleError(
                f"chunk {c}: gather {t.src}->{t.dst} at step {t.step} sends to the owner, "
                "which computed the final bytes itself"
            )
        if t.dst in has[c]:
            raise ScheduleError(
                f"chunk {c}: rank {t.dst} receives the gather twice (again at step {t.step})"
            )
        if has[c].get(t.src, math.inf) > t.step:
            raise ScheduleError(
                f"chunk {c}: rank {t.src} forwards the gather to {t.dst} at step {t.step} "
                "before it has the final bytes"
            )
        has[c][t.dst] = t.step + 1
    for c in range(s.num_chunks):
        missing = [r for r in range(s.world_size) if r not in has[c]]
        if missing:
            raise ScheduleError(f"chunk {c}: ranks {missing} never receive the gather")


def _check_ports(s: Schedule) -> None:
    out_peer: dict[tuple[int, int], int] = {}
    in_peer: dict[tuple[int, int], int] = {}
    for t in s.transfers:
        dst = out_peer.setdefault((t.step, t.src), t.dst)
        if dst != t.dst:
            raise ScheduleError(
                f"port model: rank {t.src} sends to both {dst} and {t.dst} at step {t.step}; "
                "a rank sends to at most one peer per step"
            )
        src = in_peer.setdefault((t.step, t.dst), t.src)
        if src != t.src:
            raise ScheduleError(
                f"port model: rank {t.dst} receives from both {src} and {t.src} at step "
                f"{t.step}; a rank receives from at most one peer per step"
            )
