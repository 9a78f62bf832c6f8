"""The per-rank logic of a compressed multi-hop all-reduce, shared by every executor.

An executor (the in-process simulator, the ``torch.distributed`` P2P executor) only moves
bytes; *what* a rank sends and does with what it receives is decided here, so all executors
give bit-identical results. For each chunk, a rank plays one of the roles of the method
page's hops (docs/method.rst):

* **own values**: a codec with ``rounds_own`` (THC's levels) rounds every chunk of the rank's
  own vector once, before the schedule starts;
* **leaf** (no children in the chunk's tree): compresses its local chunk when it sends;
* **internal node**: ``decompress_accumulate`` for every incoming partial sum but the last,
  ``decompress_accumulate_recompress`` (fresh scales, this hop's widths) for the last;
* **sink** (owner): as an internal node, but the last incoming message is followed by the
  compress-once rule: the owner keeps the decoded copy of exactly the bytes it sends, so every
  rank ends with identical values;
* **all-gather**: the owner's bytes are forwarded unchanged; receivers only decompress.

Incoming partial sums are processed in schedule order (step, then sender), which fixes the
floating-point summation order on every executor.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from dynamiq.codecs import HopContext, PartialSumCodec
from dynamiq.collectives.prepare import prepare_codecs
from dynamiq.collectives.statistics import local_statistics
from dynamiq.metadata import STATISTICS
from dynamiq.pipeline import Pipeline
from dynamiq.topologies import Schedule, Transfer

__all__ = [
    "Plan",
    "RankState",
    "apply_transforms",
    "center_and_prepare",
    "chunk_bounds",
    "local_metadata",
    "undo_transforms",
]


def chunk_bounds(weights: tuple[float, ...], length: int, align: int) -> list[tuple[int, int]]:
    """Cut ``[0, length)`` into chunks of the given weights, boundaries on multiples of ``align``.

    Every rank computes the same bounds. Chunks may be empty when the vector has fewer blocks
    than the schedule has chunks; empty chunks are skipped by every executor.
    """
    nblocks = -(-length // align)
    cum, bounds, start = 0.0, [], 0
    for i, w in enumerate(weights):
        cum += w
        end_block = nblocks if i == len(weights) - 1 else min(nblocks, round(cum * nblocks))
        end = min(length, end_block * align)
        bounds.append((start, max(start, end)))
        start = max(start, end)
    return bounds


@dataclass
class Plan:
    """Everything about one all-reduce call that all ranks agree on.

    Args:
        pipeline: The pipeline.
        world_size: Number of ranks.
        length: Length of the (transformed) vector being summed.
        call: Call counter, part of every random-number stream (fresh randomness per call).
        backend: Kernel backend of the hops (``"auto"``: Triton for CUDA tensors, Numba for CPU
            tensors; or ``"numba"`` / ``"triton"``), passed to every :class:`HopContext`.
    """

    pipeline: Pipeline
    world_size: int
    length: int
    call: int = 0
    backend: str = "auto"
    schedule: Schedule = field(init=False)
    bounds: list[tuple[int, int]] = field(init=False)
    #: global statistics from the metadata phase (set by :meth:`set_metadata`), as the codecs
    #: see them (after statistical transforms such as centering adjusted them)
    stats: dict[str, torch.Tensor] | None = field(init=False, default=None)
    #: the global statistics as exchanged, before any adjustment
    raw_stats: dict[str, torch.Tensor] | None = field(init=False, default=None)
    #: per-call decisions of the codecs (codec → prepared value)
    prepared: dict[Any, Any] | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.schedule = self.pipeline.topology.schedule(self.world_size)
        self.bounds = chunk_bounds(self.schedule.chunk_weights, self.length,
                                   self.pipeline.block_size)
        levels = self.schedule.levels or (None,) * len(self.schedule.transfers)
        self._level = dict(zip(self.schedule.transfers, levels))
        self._send: dict[tuple[int, int], Transfer] = {
            (t.chunk, t.src): t for t in self.schedule.transfers if t.phase == "reduce"
        }

    def set_metadata(self, stats: Mapping[str, torch.Tensor], states: dict) -> None:
        """Install the global metadata of this call and let the codecs decide (``prepare``).

        Args:
            stats: Global statistics by name, as combined across ranks.
            states: Per-tensor state the executor keeps between calls: codec → dict (created
                here when missing).
        """
        self.raw_stats = dict(stats)
        self.stats, self.prepared = prepare_codecs(
            self.pipeline, stats, self.length, self.world_size, states,
            self.schedule.compression_factors, self._hop_profile)

    def _hop_profile(self) -> tuple[tuple[int, float, float], ...]:
        # the schedule is fixed for the plan's life: its profile is computed once
        prof = self.__dict__.get("_profile")
        if prof is None:
            prof = self.__dict__["_profile"] = self.schedule.hop_profile()
        return prof

    def size(self, chunk: int) -> int:
        """Coordinates in ``chunk``."""
        a, b = self.bounds[chunk]
        return b - a

    def codec(self, t: Transfer) -> PartialSumCodec:
        """Codec on the wire of transfer ``t`` (gathers carry the owner's main-codec bytes)."""
        if t.phase == "gather":
            return self.pipeline.codec  # type: ignore[return-value]
        return self.pipeline.codec_for(self._level[t])

    def wire_bytes(self, t: Transfer) -> int:
        """Bytes carried by transfer ``t`` in this call."""
        # a gathered message is the owner's, forwarded unchanged
        src = self.schedule.owners[t.chunk] if t.phase == "gather" else t.src
        return self.codec(t).wire_bytes(self.size(t.chunk), self.context(src, t.chunk))

    def active(self, t: Transfer) -> bool:
        """Whether ``t`` carries anything (its chunk is not empty)."""
        return self.size(t.chunk) > 0

    def context(self, rank: int, chunk: int, source: HopContext | None = None) -> HopContext:
        """Random-number context of ``rank`` compressing ``chunk`` in this call (``source``: the
        context of the message it takes in, if any)."""
        return HopContext(stream=(self.call, self.stream_chunk(chunk), self.height(chunk, rank)),
                          rank=rank, world_size=self.world_size, index_offset=self.bounds[chunk][0],
                          stats=self.stats, prepared=self.prepared, backend=self.backend,
                          summands=self.summands(chunk, rank), source=source)

    def stream_chunk(self, chunk: int) -> int:
        """The chunk whose random stream ``chunk`` draws from: itself. An executor that cuts
        chunks into tiles maps each tile to its parent chunk, so tiling leaves every random
        number as it was."""
        return chunk

    def receive_context(self, rank: int, t: Transfer) -> HopContext:
        """Context of ``rank`` taking in transfer ``t``: its own, with the message's producer
        as :attr:`~dynamiq.codecs.HopContext.source` (the sender in the reduce phase, the
        chunk's owner in the all-gather, whose bytes are forwarded unchanged)."""
        producer = self.schedule.owners[t.chunk] if t.phase == "gather" else t.src
        return self.context(rank, t.chunk, source=self.context(producer, t.chunk))

    def height(self, chunk: int, rank: int) -> int:
        """``rank``'s height in ``chunk``'s tree. It is part of the random stream: ranks of one
        height share correlated rounding's permutation, ranks of different heights draw
        independently, so no rounding depends on the randomness that shaped its input (each
        stays unbiased; along a chain no unbiased scheme can correlate the hops anyway)."""
        cache = self.__dict__.setdefault("_heights", {})
        hs = cache.get(chunk)
        if hs is None:
            hs = cache[chunk] = self.schedule.heights(chunk)
        return hs[rank]

    def summands(self, chunk: int, rank: int) -> int:
        """Contributions in what ``rank`` sends (or, as the owner, holds) of ``chunk``: its
        subtree size in the chunk's tree."""
        cache = self.__dict__.setdefault("_sizes", {})
        sizes = cache.get(chunk)
        if sizes is None:
            sizes = cache[chunk] = self.schedule.subtree_sizes(chunk)
        return sizes[rank]

    def outgoing_codec(self, rank: int, chunk: int) -> PartialSumCodec:
        """Codec of ``rank``'s reduce send of ``chunk`` (the main codec for the owner)."""
        t = self._send.get((chunk, rank))
        return self.pipeline.codec if t is None else self.codec(t)  # type: ignore[return-value]


class RankState:
    """One rank's view of the all-reduce: local accumulator, pending messages, final bytes.

    Args:
        plan: The shared plan.
        rank: This rank.
        acc: float32[plan.length] local (transformed) contribution; used in place as the
            accumulator and, at the end, holds the all-reduced result.
        buffers: Optional ``chunk -> uint8 tensor`` pool for the bytes this rank compresses
            (each rank compresses a chunk at most once per call, so one buffer per chunk
            suffices). An executor that keeps the dict between calls reuses the buffers instead
            of allocating new ones; they are (re)allocated here when missing or of another size.
    """

    def __init__(self, plan: Plan, rank: int, acc: torch.Tensor,
                 buffers: dict[int, torch.Tensor] | None = None) -> None:
        if acc.dtype != torch.float32 or acc.numel() != plan.length:
            raise ValueError("accumulator must be float32 of the plan's length")
        self.plan = plan
        self.rank = rank
        self.acc = acc
        sched = plan.schedule
        self._remaining = [sched.child_counts[c][rank] for c in range(sched.num_chunks)]
        self._outbox: dict[int, torch.Tensor] = {}
        self.final: dict[int, torch.Tensor] = {}
        self.bytes_sent = 0
        self._buffers = {} if buffers is None else buffers
        for c in range(sched.num_chunks):
            # a codec that rounds a rank's own values once (THC's levels) does it here, while
            # they are still alone: no hop could round them out of a partial sum
            codec = plan.outgoing_codec(rank, c)
            if codec.rounds_own and plan.size(c) > 0:
                codec.round_own(self._view(c), plan.context(rank, c))

    def _buffer(self, chunk: int, codec: PartialSumCodec) -> torch.Tensor:
        size = codec.wire_bytes(self.plan.size(chunk), self.plan.context(self.rank, chunk))
        buf = self._buffers.get(chunk)
        if buf is None or buf.numel() != size:
            buf = torch.empty(size, dtype=torch.uint8, device=self.acc.device)
            self._buffers[chunk] = buf
        return buf

    def _view(self, chunk: int) -> torch.Tensor:
        a, b = self.plan.bounds[chunk]
        return self.acc[a:b]

    def message(self, t: Transfer) -> torch.Tensor:
        """The bytes this rank sends for transfer ``t`` (``t.src == rank``)."""
        c = t.chunk
        if t.phase == "gather":
            data = self.final[c]
        elif self._remaining[c] == 0 and c not in self._outbox:
            # a leaf: compress the local chunk as it is sent
            codec = self.plan.codec(t)
            data = codec.compress(self._view(c), self.plan.context(self.rank, c),
                                  out=self._buffer(c, codec))
        else:
            data = self._outbox.pop(c)
        self.bytes_sent += data.numel()
        return data

    def values(self, chunk: int) -> torch.Tensor:
        """float32 view of this rank's accumulator over ``chunk`` (after the all-gather: the
        decoded result, identical on every rank)."""
        return self._view(chunk)

    def receive_decoded(self, t: Transfer, data: torch.Tensor, decoded: torch.Tensor) -> None:
        """Take in the all-gather transfer ``t`` whose bytes ``data`` another rank has already
        decoded into ``decoded``: what :meth:`receive` would write, without decoding again
        (every rank decodes the owner's bytes to the same values)."""
        if t.phase != "gather":
            raise ValueError("only an all-gather transfer's values can be copied")
        self.final[t.chunk] = data
        self._view(t.chunk).copy_(decoded)

    def receive(self, t: Transfer, data: torch.Tensor) -> None:
        """Take in the bytes of transfer ``t`` (``t.dst == rank``)."""
        c = t.chunk
        plan = self.plan
        incoming = plan.codec(t)
        view = self._view(c)
        ctx = plan.receive_context(self.rank, t)
        if t.phase == "gather":
            self.final[c] = data
            incoming.decompress(data, view, ctx)
            return
        self._remaining[c] -= 1
        if self._remaining[c] > 0:
            incoming.decompress_accumulate(data, view, ctx)
            return
        owner = plan.schedule.owners[c] == self.rank
        out_codec = plan.outgoing_codec(self.rank, c)
        writeback = "decoded" if owner else "none"
        buf = self._buffer(c, out_codec)
        if incoming == out_codec:
            out = out_codec.decompress_accumulate_recompress(data, view, ctx, out=buf,
                                                             writeback=writeback)
        else:
            incoming.decompress_accumulate(data, view, ctx)
            own = plan.context(self.rank, c)
            out = out_codec.compress(view, own, out=buf)
            if owner:
                out_codec.decompress(out, view, own)
        if owner:
            self.final[c] = out
        else:
            self._outbox[c] = out


# ---- the call around the schedule, shared by the executors ------------------------------------
def _with_backend(fn: Any, backend: str) -> dict[str, str]:
    """``{"backend": backend}`` when the transform method ``fn`` takes a ``backend`` keyword."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return {}
    return {"backend": backend} if "backend" in params else {}


def apply_transforms(p: Pipeline, y: torch.Tensor, call: int, backend: str = "auto"
                     ) -> tuple[torch.Tensor, list[int]]:
    """Apply the pipeline's data-independent transforms (those without ``statistics``).

    ``backend`` goes to the transforms that take one (e.g. ``rht``).

    Returns:
        The transformed vector and the lengths before each transform (for
        :func:`undo_transforms`).
    """
    lengths = [y.numel()]
    for t in p.transforms:
        if not getattr(t, "statistics", ()):
            y = t.forward(y, step=call, **_with_backend(t.forward, backend))
            lengths.append(y.numel())
    return y, lengths


def local_metadata(p: Pipeline, y: torch.Tensor, states: dict, backend: str = "auto"
                   ) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """One rank's metadata: the declared statistics and the codecs' own values.

    ``backend`` chooses the statistics kernel (see
    :func:`~dynamiq.collectives.statistics.local_statistics`) and the kernels of any coding
    a codec does for its metadata.

    Returns:
        ``(values, reduces)``: name → float64 tensor, and name → ``"sum" | "max"``.
    """
    values = local_statistics(p.statistics, y, backend)
    reduces = {n: STATISTICS[n].reduce for n in p.statistics}
    for c in p.codecs:
        for name, (t, kind) in c.local_metadata(y, states.setdefault(c, {}), backend).items():
            if name in values:
                raise ValueError(f"codec {c} redefines metadata {name!r}")
            values[name] = t.to(torch.float64)
            reduces[name] = kind
    return values, reduces


def center_and_prepare(plan: Plan, y: torch.Tensor) -> torch.Tensor:
    """Apply the statistical transforms (e.g. centering) to one rank's vector.

    Call after :meth:`Plan.set_metadata`; returns the vector the schedule reduces.
    """
    for t in plan.pipeline.transforms:
        if getattr(t, "statistics", ()):
            y = t.forward(y, step=plan.call, stats=plan.raw_stats,
                          world_size=plan.world_size)
    return y


def undo_transforms(plan: Plan, y: torch.Tensor, lengths: list[int], states: dict | None = None
                    ) -> torch.Tensor:
    """Undo every transform of the pipeline on the reduced vector (a sum over ranks).

    With ``states``, the codecs first :meth:`~dynamiq.codecs.PartialSumCodec.observe` the
    result (identical on every rank), e.g. to adapt an auto-scale factor for the next call.
    Transforms that take a ``backend`` get ``plan.backend``.
    """
    p = plan.pipeline
    if states is not None and plan.prepared is not None:
        for c in p.codecs:
            c.observe(y, plan.prepared.get(c), plan.world_size, states.setdefault(c, {}))
    for t in reversed(p.transforms):
        if getattr(t, "statistics", ()):
            y = t.inverse(y, y.numel(), step=plan.call, stats=plan.raw_stats,
                          world_size=plan.world_size)
    k = len(lengths) - 1
    for t in reversed(p.transforms):
        if not getattr(t, "statistics", ()):
            k -= 1
            y = t.inverse(y, lengths[k], step=plan.call,
                          **_with_backend(t.inverse, plan.backend))
    return y
