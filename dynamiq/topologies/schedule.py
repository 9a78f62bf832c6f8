"""All-reduce schedules as plain data: the :class:`Transfer` and :class:`Schedule` format.

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

Port model (checked by :func:`~dynamiq.topologies.validate.validate_schedule`): *single-port,
full-duplex*. At each step a rank sends to at most one peer and receives from at most one peer;
all transfers with the same ``(step, src, dst)`` form one *message*, which may carry any number of
chunks (of either phase). Ring, butterfly and hierarchical schedules all satisfy it: hierarchical
runs its intra-node and inter-node stages one after the other, and within a stage the groups of
ranks are disjoint.

Schedules are pure data, so they can be validated, printed, simulated and executed (e.g. by a P2P
executor over ``torch.distributed``) without knowing which topology produced them.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cached_property

from dynamiq.topologies.render import schedule_summary, schedule_text
from dynamiq.topologies.transfer import PHASES, ScheduleError, Transfer
from dynamiq.topologies.validate import validate_schedule

__all__ = ["PHASES", "Schedule", "ScheduleError", "Transfer"]

@dataclass(frozen=True)
class Schedule:
    """A complete all-reduce schedule: chunking, aggregation trees and timed transfers.

    Construction does not check consistency; call :meth:`validate` (every
    :class:`~dynamiq.topologies.base.Topology` does before returning a schedule).

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

        Raises:
            ScheduleError: ``levels`` is neither empty nor as long as ``transfers``.
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

    @cached_property
    def child_counts(self) -> tuple[tuple[int, ...], ...]:
        """``child_counts[c][r] == len(children(c, r))``, for every chunk and rank at once (one
        pass over the parents, where asking :meth:`children` of every rank is O(n²) per
        chunk)."""
        out = []
        for parents in self.parents:
            counts = [0] * self.world_size
            for p in parents:
                if p >= 0:
                    counts[p] += 1
            out.append(tuple(counts))
        return tuple(out)

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
        # Iterative post-order from every root: a ring's chains are world_size deep, too deep
        # for recursion at large world sizes.
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

    def subtree_sizes(self, chunk: int) -> tuple[int, ...]:
        """Each rank's number of contributions in what it sends (or, for the owner, holds) in
        chunk ``chunk``'s reduce phase: 1 for a leaf, 1 plus its children's for an internal
        node, ``world_size`` for the owner. A compressed partial sum of ``s`` contributions
        carries about ``s`` (independent gradients) to ``s²`` (equal gradients) times one
        rank's energy, which is what an error model of the whole tree weighs.

        Assumes the parents form a tree (see :meth:`validate`)."""
        parents = self.parents[chunk]
        h = self.heights(chunk)
        size = [1] * self.world_size
        # children before parents: increasing height
        for r in sorted(range(self.world_size), key=h.__getitem__):
            p = parents[r]
            if p >= 0 and p != r:
                size[p] += size[r]
        return tuple(size)

    def compression_factors(self) -> tuple[float, float]:
        """How one compression's relative error grows over the reduce trees (the error model
        of DynamiQ's accuracy-targeted budgets, docs/method.rst).

        Returns:
            ``(Σ_r s_r / n, Σ_r s_r² / n²)`` with ``s_r`` the :meth:`subtree_sizes`, averaged
            over the chunks weighted by their share of the vector: the vNMSE of a sum whose
            every rank compresses once with relative error ``v`` is about ``v`` times the first
            when the ranks' values are independent, the second when they are equal. A ring of
            ``n`` gives ``(n + 1) / 2`` and ``(n + 1)(2n + 1) / (6n)``.
        """
        n = self.world_size
        ind = eq = total = 0.0
        for c, w in enumerate(self.chunk_weights):
            if w <= 0:
                continue
            s = self.subtree_sizes(c)
            ind += w * sum(s) / n
            eq += w * sum(v * v for v in s) / (n * n)
            total += w
        return (ind / total, eq / total) if total > 0 else (1.0, 1.0)

    def hop_profile(self) -> tuple[tuple[int, float, float], ...]:
        """Where a chunk's messages are compressed and how often each is sent: the shape a
        per-hop width allocation (DynamiQ's ``per_hop``) weighs.

        Returns:
            ``(s, coded, sent)`` triples by increasing ``s``: per chunk, how many compressions
            code a partial sum of ``s`` contributions (:meth:`subtree_sizes`), and how many
            transfers carry what they code, averaged over the chunks weighted by their share
            of the vector. A reduce message is sent once; the owner's compression of the whole
            sum (``s = world_size``) is carried by every all-gather transfer of its chunk. A
            ring of ``n`` gives ``(s, 1, 1)`` for ``s = 1 … n − 1`` and ``(n, 1, n − 1)``.
        """
        gathers = [0] * self.num_chunks
        reduce_from: list[set[int]] = [set() for _ in range(self.num_chunks)]
        for t in self.transfers:
            if t.phase == "gather":
                gathers[t.chunk] += 1
            else:
                reduce_from[t.chunk].add(t.src)
        shapes: list[tuple[float, dict[int, tuple[int, int]]]] = []
        for c, w in enumerate(self.chunk_weights):
            if w <= 0:
                continue
            sizes = self.subtree_sizes(c)
            shape: dict[int, tuple[int, int]] = {}
            for s, k in [(sizes[r], 1) for r in reduce_from[c]] + [
                    (sizes[self.owners[c]], gathers[c])]:
                a, b = shape.get(s, (0, 0))
                shape[s] = (a + 1, b + k)
            shapes.append((w, shape))
        if not shapes:
            return ()
        if all(sh == shapes[0][1] for _, sh in shapes):
            # every chunk has the same tree (rings, butterflies, and their tiles): its counts
            # exactly, so a tiled schedule weighs its hops like the untiled one, bit for bit
            return tuple((s, float(a), float(b)) for s, (a, b) in sorted(shapes[0][1].items()))
        total = sum(w for w, _ in shapes)
        keys = sorted({s for _, sh in shapes for s in sh})
        return tuple((s, sum(w * sh.get(s, (0, 0))[0] for w, sh in shapes) / total,
                      sum(w * sh.get(s, (0, 0))[1] for w, sh in shapes) / total) for s in keys)

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

        Raises:
            ValueError: A sequence of sizes does not have one entry per chunk.
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

    # ---- checking and printing ----------------------------------------------------------------
    def validate(self) -> None:
        """Check that the schedule computes an all-reduce under the documented time and port model.

        Equivalent to :func:`~dynamiq.topologies.validate.validate_schedule` ``(self)``.

        Raises:
            ScheduleError: Naming the first problem found.
        """
        # Imported here: the validator builds on this module's types.
        validate_schedule(self)

    def __str__(self) -> str:
        return schedule_summary(self)

    def to_text(self) -> str:
        """A readable table: each step's messages, then each chunk's aggregation tree.

        Equivalent to :func:`~dynamiq.topologies.render.schedule_text` ``(self)``.
        """
        return schedule_text(self)
