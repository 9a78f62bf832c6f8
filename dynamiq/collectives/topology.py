"""All-reduce schedules as plain data, and the topologies that build them.

An all-reduce over ``world_size`` ranks splits the vector into chunks (``chunk_weights`` gives the
fraction of the vector in each, in vector order). It runs in two phases:

* **reduce** (reduce-scatter): each chunk is summed along its *aggregation tree*, a tree on all
  ranks whose edges point toward the chunk's *owner* (the sink). A rank adds every partial sum it
  receives for the chunk to its own contribution and, once the last one has arrived, sends the
  result to its parent.
* **gather** (all-gather): the owner's final bytes of the chunk travel to every other rank and are
  forwarded unchanged (so every rank ends with bit-identical results even under lossy codecs).

Time model. A :class:`Schedule` is a sequence of numbered steps. A transfer at step ``s`` carries
what the sender holds at the start of step ``s``; the receiver can use it from step ``s + 1`` on.
Hence a rank sends a chunk's partial sum strictly after every child's send of that chunk, and a
rank forwards a gather strictly after the step in which it received it.

Port model (checked by :meth:`Schedule.validate`): *single-port, full-duplex*. At each step a rank
sends to at most one peer and receives from at most one peer; all transfers with the same
``(step, src, dst)`` form one *message*, which may carry any number of chunks (of either phase).
Ring, butterfly and hierarchical schedules all satisfy it: hierarchical runs its intra-node and
inter-node stages one after the other, and within a stage the groups of ranks are disjoint.

Schedules are pure data, so they can be validated, printed, simulated and executed (e.g. by a P2P
executor over ``torch.distributed``) without knowing which topology produced them.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import MISSING, dataclass, fields, replace
from functools import cached_property

from dynamiq.registry import Registry
from dynamiq.spec import build

__all__ = [
    "PHASES",
    "TOPOLOGIES",
    "Butterfly",
    "Hierarchical",
    "Ring",
    "Schedule",
    "ScheduleError",
    "Topology",
    "Transfer",
    "get_topology",
]

#: The two phases of an all-reduce, in execution order.
PHASES: tuple[str, ...] = ("reduce", "gather")
_PHASE_ORDER = {p: i for i, p in enumerate(PHASES)}

# Chunk weights are products of 1/n fractions, so their sum is 1 only up to rounding.
_WEIGHT_TOLERANCE = 1e-9


class ScheduleError(ValueError):
    """Raised when a schedule is malformed; the message names the chunk, ranks and step at fault."""


@dataclass(frozen=True)
class Transfer:
    """One chunk moving over one link at one step.

    Args:
        step: The time step (0-based) at which the transfer happens.
        src: The sending rank.
        dst: The receiving rank.
        chunk: Index of the chunk being sent.
        phase: ``"reduce"`` (``src`` sends its current partial sum of the chunk, which ``dst``
            accumulates) or ``"gather"`` (``src`` forwards the owner's final bytes unchanged).

    Raises:
        ScheduleError: ``phase`` is not one of :data:`PHASES`.
    """

    step: int
    src: int
    dst: int
    chunk: int
    phase: str

    def __post_init__(self) -> None:
        if self.phase not in _PHASE_ORDER:
            raise ScheduleError(f"transfer phase must be one of {PHASES}, got {self.phase!r}")

    def sort_key(self) -> tuple[int, int, int, int, int]:
        """The canonical order of transfers in a schedule: step, phase (reduce first), src, dst,
        chunk."""
        return (self.step, _PHASE_ORDER[self.phase], self.src, self.dst, self.chunk)

    def __str__(self) -> str:
        return f"{self.src}->{self.dst} c{self.chunk}"


@dataclass(frozen=True)
class Schedule:
    """A complete all-reduce schedule: chunking, aggregation trees and timed transfers.

    Construction does not check consistency; call :meth:`validate` (every :class:`Topology`
    does before returning a schedule).

    Args:
        world_size: Number of ranks.
        num_chunks: Number of chunks the vector is split into.
        owners: ``owners[c]`` is the rank that ends the reduce phase with chunk ``c``'s total (the
            sink of its aggregation tree).
        parents: ``parents[c][r]`` is rank ``r``'s parent in chunk ``c``'s aggregation tree, ``-1``
            for the owner.
        chunk_weights: Fraction of the vector in each chunk, in vector order; they sum to 1.
        transfers: Every transfer, sorted by :meth:`Transfer.sort_key`.
        name: The spec of the topology that built the schedule (free text otherwise).
        levels: Optional link level of each transfer (e.g. ``"intra"``/``"inter"``), aligned with
            ``transfers``, so that an executor can pick a codec per level; empty when the schedule
            has a single level.
    """

    world_size: int
    num_chunks: int
    owners: tuple[int, ...]
    parents: tuple[tuple[int, ...], ...]
    chunk_weights: tuple[float, ...]
    transfers: tuple[Transfer, ...]
    name: str
    levels: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # Normalise to tuples so that schedules built from lists still hash and compare by value.
        object.__setattr__(self, "owners", tuple(self.owners))
        object.__setattr__(self, "parents", tuple(tuple(p) for p in self.parents))
        object.__setattr__(self, "chunk_weights", tuple(float(w) for w in self.chunk_weights))
        object.__setattr__(self, "transfers", tuple(self.transfers))
        object.__setattr__(self, "levels", tuple(self.levels))

    # ---- building -----------------------------------------------------------------------------
    def with_transfers(self, transfers: Sequence[Transfer], levels: Sequence[str] = ()) -> Schedule:
        """A copy with other transfers (and levels), put in canonical order.

        Args:
            transfers: The new transfers, in any order.
            levels: Their link levels, aligned with ``transfers``, or empty.

        Returns:
            The new schedule (not validated).
        """
        transfers = list(transfers)
        if levels:
            if len(levels) != len(transfers):
                raise ScheduleError(
                    f"got {len(levels)} levels for {len(transfers)} transfers; they must align"
                )
            pairs = sorted(zip(transfers, levels), key=lambda tl: tl[0].sort_key())
            return replace(
                self, transfers=tuple(t for t, _ in pairs), levels=tuple(lv for _, lv in pairs)
            )
        return replace(self, transfers=tuple(sorted(transfers, key=Transfer.sort_key)), levels=())

    # ---- queries ------------------------------------------------------------------------------
    def steps(self) -> int:
        """Number of time steps (one more than the last step; 0 without transfers)."""
        return max((t.step for t in self.transfers), default=-1) + 1

    @cached_property
    def _step_index(self) -> list[int]:
        return [t.step for t in self.transfers]

    def transfers_at(self, step: int) -> tuple[Transfer, ...]:
        """The transfers of one step, in canonical order (assumes sorted transfers)."""
        lo = bisect.bisect_left(self._step_index, step)
        hi = bisect.bisect_right(self._step_index, step)
        return self.transfers[lo:hi]

    def children(self, chunk: int, rank: int) -> tuple[int, ...]:
        """The ranks whose parent is ``rank`` in chunk ``chunk``'s aggregation tree, ascending."""
        return tuple(r for r, p in enumerate(self.parents[chunk]) if p == rank)

    def heights(self, chunk: int) -> tuple[int, ...]:
        """Each rank's height in chunk ``chunk``'s aggregation tree: 0 for a leaf, else one more
        than its highest child. Nodes of equal height have disjoint subtrees, so their inputs
        never depend on each other's rounding (what correlated rounding needs to stay
        unbiased). Assumes the parents form a tree (see :meth:`validate`)."""
        parents = self.parents[chunk]
        kids: list[list[int]] = [[] for _ in range(self.world_size)]
        for r, p in enumerate(parents):
            if p >= 0 and p != r:
                kids[p].append(r)
        h = [0] * self.world_size
        # post-order from every root (iterative: chains are world_size deep)
        for root in (r for r, p in enumerate(parents) if p < 0 or p == r):
            stack = [(root, False)]
            while stack:
                r, done = stack.pop()
                if done:
                    h[r] = 1 + max(h[k] for k in kids[r]) if kids[r] else 0
                    continue
                stack.append((r, True))
                stack.extend((k, False) for k in kids[r])
        return tuple(h)

    def depth(self, chunk: int) -> int:
        """Height of chunk ``chunk``'s aggregation tree: the most edges from any rank to the owner.

        Assumes the parents form a tree (see :meth:`validate`).
        """
        parents = self.parents[chunk]
        depth = [-1] * self.world_size
        depth[self.owners[chunk]] = 0
        for r in range(self.world_size):
            path = []
            while depth[r] < 0:
                path.append(r)
                r = parents[r]
            d = depth[r]
            for x in reversed(path):
                d += 1
                depth[x] = d
        return max(depth)

    def bytes_per_rank(self, payload_bytes_per_chunk: Sequence[int] | int) -> list[int]:
        """Bytes each rank sends over the whole schedule.

        Args:
            payload_bytes_per_chunk: The encoded size of each chunk (a sequence of length
                ``num_chunks``), or one size for every chunk.

        Returns:
            ``out[r]`` = the sum of the payload sizes of the chunks rank ``r`` sends, both phases.
        """
        try:
            sizes = [int(payload_bytes_per_chunk)] * self.num_chunks  # type: ignore[arg-type]
        except TypeError:
            sizes = [int(b) for b in payload_bytes_per_chunk]  # type: ignore[union-attr]
        if len(sizes) != self.num_chunks:
            raise ValueError(
                f"need one payload size per chunk ({self.num_chunks}), got {len(sizes)}"
            )
        out = [0] * self.world_size
        for t in self.transfers:
            out[t.src] += sizes[t.chunk]
        return out

    # ---- validation ---------------------------------------------------------------------------
    def validate(self) -> None:
        """Check that the schedule computes an all-reduce under the documented time and port model.

        Raises:
            ScheduleError: Naming the first problem found, among: inconsistent sizes or weights; a
                chunk's parents not forming a tree on all ranks rooted at its owner; a transfer out
                of range, out of order or duplicated; reduce transfers that are not exactly the tree
                edges, or a rank sending its partial sum before a child's has arrived; a gather
                before the chunk's last reduce step, from a rank that does not have the final bytes
                yet, or a rank receiving a chunk's gather twice or never; a rank sending to (or
                receiving from) two peers in one step.
        """
        self._check_shape()
        for c in range(self.num_chunks):
            self._check_tree(c)
        self._check_transfer_fields()
        ready, last_reduce = self._check_reduce()
        self._check_gather(ready, last_reduce)
        self._check_ports()

    def _check_shape(self) -> None:
        n, nc = self.world_size, self.num_chunks
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ScheduleError(f"world_size must be a positive int, got {n!r}")
        if isinstance(nc, bool) or not isinstance(nc, int) or nc < 1:
            raise ScheduleError(f"num_chunks must be a positive int, got {nc!r}")
        for label, seq in (
            ("owners", self.owners),
            ("parents", self.parents),
            ("chunk_weights", self.chunk_weights),
        ):
            if len(seq) != nc:
                raise ScheduleError(f"{label} has {len(seq)} entries for {nc} chunks")
        for c, w in enumerate(self.chunk_weights):
            if not (math.isfinite(w) and w >= 0):
                raise ScheduleError(f"chunk {c}: weight must be finite and >= 0, got {w!r}")
        total = math.fsum(self.chunk_weights)
        if abs(total - 1.0) > _WEIGHT_TOLERANCE:
            raise ScheduleError(f"chunk weights sum to {total!r}, not 1")
        if self.levels and len(self.levels) != len(self.transfers):
            raise ScheduleError(
                f"levels has {len(self.levels)} entries for {len(self.transfers)} transfers; "
                "it must be empty or aligned with transfers"
            )
        for i, lv in enumerate(self.levels):
            if not isinstance(lv, str) or not lv:
                raise ScheduleError(f"level of transfer {i} must be a non-empty str, got {lv!r}")

    def _check_tree(self, c: int) -> None:
        n, owner, parents = self.world_size, self.owners[c], self.parents[c]
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

    def _check_transfer_fields(self) -> None:
        n, nc = self.world_size, self.num_chunks
        prev: Transfer | None = None
        for t in self.transfers:
            if t.phase not in _PHASE_ORDER:
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

    def _check_reduce(self) -> tuple[list[int], list[int]]:
        """Check the reduce phase; returns, per chunk, the step from which the owner has the final
        bytes and the last reduce step (-1 when there is none)."""
        sends: list[dict[int, int]] = [{} for _ in range(self.num_chunks)]
        for t in self.transfers:
            if t.phase != "reduce":
                continue
            c, parents = t.chunk, self.parents[t.chunk]
            if t.src == self.owners[c]:
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
        for c in range(self.num_chunks):
            owner, parents, sent = self.owners[c], self.parents[c], sends[c]
            for r in range(self.world_size):
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

    def _check_gather(self, ready: list[int], last_reduce: list[int]) -> None:
        # has[c][r]: the first step at which rank r can forward chunk c's final bytes.
        has = [{self.owners[c]: ready[c]} for c in range(self.num_chunks)]
        for t in self.transfers:
            if t.phase != "gather":
                continue
            c = t.chunk
            if t.step <= last_reduce[c]:
                raise ScheduleError(
                    f"chunk {c}: gather {t.src}->{t.dst} at step {t.step} is not after the "
                    f"chunk's last reduce step {last_reduce[c]}"
                )
            if t.dst == self.owners[c]:
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
        for c in range(self.num_chunks):
            missing = [r for r in range(self.world_size) if r not in has[c]]
            if missing:
                raise ScheduleError(f"chunk {c}: ranks {missing} never receive the gather")

    def _check_ports(self) -> None:
        out_peer: dict[tuple[int, int], int] = {}
        in_peer: dict[tuple[int, int], int] = {}
        for t in self.transfers:
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

    # ---- printing -----------------------------------------------------------------------------
    def _max_depth(self) -> int:
        return max(self.depth(c) for c in range(self.num_chunks))

    def __str__(self) -> str:
        return (
            f"Schedule {self.name!r}: {self.world_size} ranks, {self.num_chunks} chunks, "
            f"{self.steps()} steps, {len(self.transfers)} transfers, max tree depth "
            f"{self._max_depth()}"
        )

    def to_text(self) -> str:
        """A readable table: each step's messages, then each chunk's aggregation tree.

        A message line reads ``src->dst phase [level]: chunks``; a tree line lists its edges
        ``child->parent`` ordered by the step in which they are used.
        """
        lines = [str(self), "steps:"]
        for step in range(self.steps()):
            lo = bisect.bisect_left(self._step_index, step)
            hi = bisect.bisect_right(self._step_index, step)
            messages: dict[tuple[int, int, str, str], list[int]] = {}
            for i in range(lo, hi):
                t = self.transfers[i]
                level = self.levels[i] if self.levels else ""
                messages.setdefault((t.src, t.dst, t.phase, level), []).append(t.chunk)
            if not messages:
                lines.append(f"  step {step}: (idle)")
                continue
            lines.append(f"  step {step}:")
            for (src, dst, phase, level), chunks in messages.items():
                tag = f" [{level}]" if level else ""
                lines.append(f"    {src}->{dst} {phase}{tag}: {', '.join(map(str, chunks))}")
        sends = {(t.chunk, t.src): t.step for t in self.transfers if t.phase == "reduce"}
        lines.append("trees (child->parent, in reduce order):")
        for c in range(self.num_chunks):
            edges = sorted(
                (sends.get((c, r), -1), r, p) for r, p in enumerate(self.parents[c]) if p >= 0
            )
            body = " ".join(f"{r}->{p}" for _, r, p in edges) or "(single rank)"
            lines.append(
                f"  chunk {c} (owner {self.owners[c]}, weight {self.chunk_weights[c]:.6g}, "
                f"depth {self.depth(c)}): {body}"
            )
        return "\n".join(lines)


# ---- topologies ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Topology:
    """Base class of all-reduce topologies: a recipe for a :class:`Schedule` given a world size.

    Subclasses are frozen dataclasses registered in :data:`TOPOLOGIES`; their fields are the
    parameters that appear in :meth:`spec`.
    """

    def check_world_size(self, world_size: int) -> None:
        """Raise ``ValueError`` (saying what to use instead) if the topology cannot serve
        ``world_size`` ranks."""
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size must be a positive int, got {world_size!r}")

    def supports(self, world_size: int) -> bool:
        """Whether :meth:`schedule` accepts ``world_size``."""
        try:
            self.check_world_size(world_size)
        except ValueError:
            return False
        return True

    def levels(self) -> tuple[str, ...]:
        """Names of the link levels its schedules tag transfers with (none for flat ones)."""
        return ()

    def schedule(self, world_size: int) -> Schedule:
        """Build and validate the schedule for ``world_size`` ranks.

        Raises:
            ValueError: The topology does not apply to ``world_size`` (see
                :meth:`check_world_size`).
        """
        self.check_world_size(world_size)
        sched = self._build(world_size)
        sched.validate()
        return sched

    def _build(self, world_size: int) -> Schedule:  # pragma: no cover - abstract
        raise NotImplementedError

    def spec(self) -> str:
        """The canonical spec string, e.g. ``ring`` or ``hierarchical(ranks_per_node=2)``.

        Parameters equal to their defaults are left out, and there are no spaces, so that
        ``get_topology(t.spec()) == t``.
        """
        name = TOPOLOGIES.name_of(type(self)) or type(self).__name__.lower()
        params = []
        for f in fields(self):
            value = getattr(self, f.name)
            if f.default is not MISSING and value == f.default:
                continue
            params.append(f"{f.name}={value}")
        return f"{name}({','.join(params)})" if params else name

    def __str__(self) -> str:
        return self.spec()


#: Topology classes by name; :func:`get_topology` builds instances from spec strings.
TOPOLOGIES: Registry[type[Topology]] = Registry("topology")


def _equal_weights(k: int) -> tuple[float, ...]:
    return (1.0 / k,) * k


@TOPOLOGIES.register("ring")
@dataclass(frozen=True)
class Ring(Topology):
    """Ring all-reduce: n chunks of weight 1/n, chunk ``c`` owned by rank ``c``.

    Reduce step ``s`` (``0 <= s < n - 1``): rank ``r`` sends chunk ``(r - s - 1) mod n`` to
    ``(r + 1) mod n``, so chunk ``c`` starts at rank ``c + 1`` and travels ``c+1 -> c+2 -> ... ->
    c``, the owner receiving it last (a chain of depth ``n - 1``). Gather step ``n - 1 + s``: rank
    ``r`` forwards chunk ``(r - s) mod n`` to ``(r + 1) mod n``. Any ``n >= 1``; each rank sends
    ``2(n - 1)`` chunks, i.e. ``2(n - 1)/n`` of the vector.
    """

    def _build(self, world_size: int) -> Schedule:
        n = world_size
        transfers = [
            Transfer(s, r, (r + 1) % n, (r - s - 1) % n, "reduce")
            for s in range(n - 1)
            for r in range(n)
        ]
        transfers += [
            Transfer(n - 1 + s, r, (r + 1) % n, (r - s) % n, "gather")
            for s in range(n - 1)
            for r in range(n)
        ]
        parents = tuple(tuple(-1 if r == c else (r + 1) % n for r in range(n)) for c in range(n))
        return _chunk_per_rank(n, parents, transfers, self.spec())


@TOPOLOGIES.register("butterfly")
@dataclass(frozen=True)
class Butterfly(Topology):
    """Recursive halving reduce-scatter, then recursive doubling all-gather (Rabenseifner).

    Needs ``n = 2**m`` ranks (other sizes raise ``ValueError`` pointing at ``ring`` and
    ``hierarchical``). n chunks of weight 1/n, chunk ``c`` owned by rank ``c``. Before reduce step
    ``k`` (``0 <= k < m``) rank ``r`` holds partial sums of the ``2h`` chunks that agree with ``r``
    on the bits above ``h = n >> (k + 1)``; it sends the half its partner ``r XOR h`` keeps (the
    ``h`` chunks whose ``h`` bit matches the partner's), all in one message. Gather step ``m + j``
    mirrors it: rank ``r`` sends the ``2**j`` final chunks it holds to ``r XOR 2**j``.

    Per chunk ``c`` the aggregation tree sends rank ``r``'s partial sum to ``r XOR b``, ``b`` the
    highest bit in which ``r`` and ``c`` differ: a binomial tree of depth ``m``. Each rank sends
    ``n - 1`` chunks per phase, the same ``2(n - 1)/n`` of the vector as the ring, in ``2m``
    instead of ``2(n - 1)`` steps.
    """

    def check_world_size(self, world_size: int) -> None:
        """See :meth:`Topology.check_world_size`; additionally requires a power of two."""
        super().check_world_size(world_size)
        if world_size & (world_size - 1):
            raise ValueError(
                f"butterfly needs a power-of-two world size, got {world_size}; use 'ring', or "
                "'hierarchical(ranks_per_node=...,outer=butterfly)' with a power-of-two node count"
            )

    def _build(self, world_size: int) -> Schedule:
        n = world_size
        m = n.bit_length() - 1
        transfers = []
        for k in range(m):
            h = n >> (k + 1)
            for r in range(n):
                partner = r ^ h
                first = (r & ~(2 * h - 1)) | (partner & h)
                transfers += [Transfer(k, r, partner, c, "reduce") for c in range(first, first + h)]
        for j in range(m):
            h = 1 << j
            for r in range(n):
                first = r & ~(h - 1)
                transfers += [
                    Transfer(m + j, r, r ^ h, c, "gather") for c in range(first, first + h)
                ]
        parents = tuple(
            tuple(-1 if r == c else r ^ (1 << ((r ^ c).bit_length() - 1)) for r in range(n))
            for c in range(n)
        )
        return _chunk_per_rank(n, parents, transfers, self.spec())


def _chunk_per_rank(
    n: int, parents: tuple[tuple[int, ...], ...], transfers: list[Transfer], name: str
) -> Schedule:
    """A schedule of ``n`` equal chunks, chunk ``c`` owned by rank ``c`` (ring, butterfly)."""
    return Schedule(
        world_size=n,
        num_chunks=n,
        owners=tuple(range(n)),
        parents=parents,
        chunk_weights=_equal_weights(n),
        transfers=tuple(sorted(transfers, key=Transfer.sort_key)),
        name=name,
    )


def _phase_steps(sched: Schedule, phase: str) -> tuple[list[Transfer], int, int]:
    """A schedule's transfers of one phase, their first step and how many steps they span."""
    ts = [t for t in sched.transfers if t.phase == phase]
    if not ts:
        return ts, 0, 0
    first = min(t.step for t in ts)
    return ts, first, max(t.step for t in ts) - first + 1


@TOPOLOGIES.register("hierarchical")
@dataclass(frozen=True)
class Hierarchical(Topology):
    """Two-level all-reduce: inside nodes, then across nodes, then back.

    Ranks ``node * ranks_per_node + local`` form nodes of ``ranks_per_node`` consecutive ranks.
    Stages, run one after the other: (1) the ``inner`` topology's reduce inside every node, (2)
    the ``outer`` topology's reduce across nodes among the ranks that own the same inner chunk,
    (3) the outer gather, (4) the inner gather. Transfers of stages 1 and 4 have level ``"intra"``,
    those of 2 and 3 ``"inter"``.

    Chunk ``ci * C_out + co`` is sub-chunk ``co`` of inner chunk ``ci`` (``C_in``/``C_out``: the
    chunk counts of the inner and outer schedules), weight ``w_in[ci] * w_out[co]``. Its
    aggregation tree joins, in every node, inner chunk ``ci``'s tree to the outer tree of chunk
    ``co`` over the ranks with local index ``owner_in[ci]``; its owner is rank ``owner_out[co] *
    ranks_per_node + owner_in[ci]``. With rings or butterflies at both levels each rank sends
    ``2(n - 1)/n`` of the vector, as a flat ring does.

    Args:
        ranks_per_node: Ranks per node; must divide the world size.
        inner: Spec of the topology used inside a node (normalised to its canonical spec).
        outer: Spec of the topology used across nodes (normalised to its canonical spec).

    Raises:
        ValueError: ``ranks_per_node`` is not a positive int.
        UnknownNameError: ``inner`` or ``outer`` names no registered topology.
    """

    ranks_per_node: int
    inner: str = "ring"
    outer: str = "ring"

    def __post_init__(self) -> None:
        p = self.ranks_per_node
        if isinstance(p, bool) or not isinstance(p, int) or p < 1:
            raise ValueError(f"hierarchical: ranks_per_node must be a positive int, got {p!r}")
        # Canonical sub-specs make equal topologies compare equal and spec() round-trip.
        object.__setattr__(self, "inner", get_topology(self.inner).spec())
        object.__setattr__(self, "outer", get_topology(self.outer).spec())

    def levels(self) -> tuple[str, ...]:
        """``("intra", "inter")``: links inside a node, and between nodes."""
        return ("intra", "inter")

    @property
    def inner_topology(self) -> Topology:
        """The topology used inside each node."""
        return get_topology(self.inner)

    @property
    def outer_topology(self) -> Topology:
        """The topology used across nodes."""
        return get_topology(self.outer)

    def check_world_size(self, world_size: int) -> None:
        """See :meth:`Topology.check_world_size`; additionally ``ranks_per_node`` must divide
        ``world_size`` and both levels must accept their sizes."""
        super().check_world_size(world_size)
        p = self.ranks_per_node
        if world_size % p:
            raise ValueError(
                f"{self.spec()} needs a world size divisible by ranks_per_node={p}, got "
                f"{world_size}"
            )
        for level, topo, size in (
            ("inner", self.inner_topology, p),
            ("outer", self.outer_topology, world_size // p),
        ):
            try:
                topo.check_world_size(size)
            except ValueError as exc:
                raise ValueError(f"{self.spec()}: {level} level over {size} ranks: {exc}") from exc

    def _build(self, world_size: int) -> Schedule:
        p = self.ranks_per_node
        nodes = world_size // p
        inner = self.inner_topology.schedule(p)
        outer = self.outer_topology.schedule(nodes)
        c_out = outer.num_chunks

        owners, parents, weights = [], [], []
        for ci in range(inner.num_chunks):
            lead = inner.owners[ci]
            for co in range(c_out):
                owners.append(outer.owners[co] * p + lead)
                weights.append(inner.chunk_weights[ci] * outer.chunk_weights[co])
                par = []
                for node in range(nodes):
                    for local in range(p):
                        if local != lead:
                            par.append(node * p + inner.parents[ci][local])
                        else:
                            up = outer.parents[co][node]
                            par.append(-1 if up < 0 else up * p + local)
                parents.append(tuple(par))

        pairs: list[tuple[Transfer, str]] = []
        offset = 0

        def intra(ts: list[Transfer], shift: int) -> None:
            pairs.extend(
                (
                    Transfer(
                        t.step + shift,
                        node * p + t.src,
                        node * p + t.dst,
                        t.chunk * c_out + co,
                        t.phase,
                    ),
                    "intra",
                )
                for t in ts
                for node in range(nodes)
                for co in range(c_out)
            )

        def inter(ts: list[Transfer], shift: int) -> None:
            pairs.extend(
                (
                    Transfer(
                        t.step + shift,
                        t.src * p + inner.owners[ci],
                        t.dst * p + inner.owners[ci],
                        ci * c_out + t.chunk,
                        t.phase,
                    ),
                    "inter",
                )
                for t in ts
                for ci in range(inner.num_chunks)
            )

        # Each stage keeps its source schedule's relative step order, rebased to start right
        # after the previous stage; that preserves every ordering validate() relies on.
        for level, sched, phase in (
            (intra, inner, "reduce"),
            (inter, outer, "reduce"),
            (inter, outer, "gather"),
            (intra, inner, "gather"),
        ):
            ts, first, span = _phase_steps(sched, phase)
            level(ts, offset - first)
            offset += span

        pairs.sort(key=lambda tl: tl[0].sort_key())
        return Schedule(
            world_size=world_size,
            num_chunks=len(owners),
            owners=tuple(owners),
            parents=tuple(parents),
            chunk_weights=tuple(weights),
            transfers=tuple(t for t, _ in pairs),
            name=self.spec(),
            levels=tuple(lv for _, lv in pairs),
        )


# ---- spec strings -------------------------------------------------------------------------------


def get_topology(spec: str | Topology) -> Topology:
    """Return ``spec`` itself, or the topology a spec string describes.

    The syntax is ``name`` or ``name(key=value,...)`` (whitespace ignored), e.g. ``ring``,
    ``butterfly``, ``hierarchical(ranks_per_node=4,inner=ring,outer=butterfly)``; values may be
    nested specs. ``get_topology(t.spec()) == t`` for every topology ``t``.

    Raises:
        UnknownNameError: The name is not in :data:`TOPOLOGIES` (the message lists known names).
        ValueError: The spec is malformed, names an unknown parameter, misses a required one or
            gives a parameter a value of the wrong type or range.
        TypeError: ``spec`` is neither a string nor a :class:`Topology`.
    """
    if isinstance(spec, Topology):
        return spec
    if not isinstance(spec, str):
        raise TypeError(f"expected a Topology or a spec string, got {type(spec).__name__}")
    return build(TOPOLOGIES, spec, "topology")
