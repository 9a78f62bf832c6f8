"""The per-rank logic of a compressed multi-hop all-reduce, shared by every executor.

An executor (the in-process simulator, the ``torch.distributed`` P2P executor) only moves
bytes; *what* a rank sends and does with what it receives is decided here, so all executors
give bit-identical results. For each chunk, a rank plays the roles of DYNAMIQ.md §2.9:

* **leaf** (no children in the chunk's tree): compresses its local chunk when it sends;
* **internal node**: ``decompress_accumulate`` for every incoming partial sum but the last,
  ``decompress_accumulate_recompress`` (fresh scales, same widths) for the last;
* **sink** (owner): as an internal node, but the last incoming message is followed by the
  compress-once rule: the owner keeps the decoded copy of exactly the bytes it sends, so every
  rank ends with identical values;
* **all-gather**: the owner's bytes are forwarded unchanged; receivers only decompress.

Incoming partial sums are processed in schedule order (step, then sender), which fixes the
floating-point summation order on every executor.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from dynamiq.codecs import HopContext, PartialSumCodec
from dynamiq.collectives.topology import Schedule, Transfer
from dynamiq.pipeline import Pipeline

__all__ = ["Plan", "RankState", "chunk_bounds"]


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
    """

    pipeline: Pipeline
    world_size: int
    length: int
    call: int = 0
    schedule: Schedule = field(init=False)
    bounds: list[tuple[int, int]] = field(init=False)
    #: global statistics from the metadata phase (set by the executor when the pipeline
    #: declares any), passed to every hop through its context
    stats: dict[str, torch.Tensor] | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.schedule = self.pipeline.topology.schedule(self.world_size)
        self.bounds = chunk_bounds(self.schedule.chunk_weights, self.length,
                                   self.pipeline.block_size)
        levels = self.schedule.levels or (None,) * len(self.schedule.transfers)
        self._level = dict(zip(self.schedule.transfers, levels))
        self._send: dict[tuple[int, int], Transfer] = {
            (t.chunk, t.src): t for t in self.schedule.transfers if t.phase == "reduce"
        }

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
        """Bytes carried by transfer ``t``."""
        return self.codec(t).wire_bytes(self.size(t.chunk))

    def active(self, t: Transfer) -> bool:
        """Whether ``t`` carries anything (its chunk is not empty)."""
        return self.size(t.chunk) > 0

    def context(self, rank: int, chunk: int) -> HopContext:
        """Random-number context of ``rank`` compressing ``chunk`` in this call."""
        return HopContext(stream=(self.call, chunk), rank=rank, world_size=self.world_size,
                          index_offset=self.bounds[chunk][0], stats=self.stats)

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
        self._remaining = [len(sched.children(c, rank)) for c in range(sched.num_chunks)]
        self._outbox: dict[int, torch.Tensor] = {}
        self.final: dict[int, torch.Tensor] = {}
        self.bytes_sent = 0
        self._buffers = {} if buffers is None else buffers

    def _buffer(self, chunk: int, codec: PartialSumCodec) -> torch.Tensor:
        size = codec.wire_bytes(self.plan.size(chunk))
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

    def receive(self, t: Transfer, data: torch.Tensor) -> None:
        """Take in the bytes of transfer ``t`` (``t.dst == rank``)."""
        c = t.chunk
        plan = self.plan
        incoming = plan.codec(t)
        view = self._view(c)
        if t.phase == "gather":
            self.final[c] = data
            incoming.decompress(data, view)
            return
        self._remaining[c] -= 1
        if self._remaining[c] > 0:
            incoming.decompress_accumulate(data, view)
            return
        owner = plan.schedule.owners[c] == self.rank
        out_codec = plan.outgoing_codec(self.rank, c)
        ctx = plan.context(self.rank, c)
        writeback = "decoded" if owner else "none"
        buf = self._buffer(c, out_codec)
        if incoming == out_codec:
            out = out_codec.decompress_accumulate_recompress(data, view, ctx, out=buf,
                                                             writeback=writeback)
        else:
            incoming.decompress_accumulate(data, view)
            out = out_codec.compress(view, ctx, out=buf)
            if owner:
                out_codec.decompress(out, view)
        if owner:
            self.final[c] = out
        else:
            self._outbox[c] = out
