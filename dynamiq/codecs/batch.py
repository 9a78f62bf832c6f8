"""Many chunks of one all-reduce step coded at once: the batched form of a compression.

An executor that simulates many ranks (:mod:`dynamiq.collectives.batched`) processes all the
compressions of one schedule step together. Each is described by a row of a :class:`HopBatch`
(the compressing rank, the chunk, its place in the vector and in the chunk's tree) and its
values lie side by side in one flat float32 buffer. What the batch needs of a codec is the
*round trip* :meth:`~dynamiq.codecs.PartialSumCodec.roundtrip_batch`: every chunk's values
replaced by what a receiver decodes of the message compressed from them, and the message's
size. A hop that adds a message to an accumulator is then ``acc + roundtrip(values)`` in
float32, the same addition as ``decompress_accumulate`` makes, so a batched run gives the
bits of the per-message one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import torch

from dynamiq.codecs.base import HopContext

__all__ = ["HopBatch", "ragged_arange", "split_unaligned"]


def ragged_arange(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """int64 ``[sum(counts)]``: ``starts[i], starts[i] + 1, … starts[i] + counts[i] − 1`` for
    every ``i`` in turn (the indices of ragged runs laid end to end)."""
    counts = np.asarray(counts, dtype=np.int64)
    before = np.zeros_like(counts)
    np.cumsum(counts[:-1], out=before[1:])
    return (np.repeat(np.asarray(starts, dtype=np.int64) - before, counts)
            + np.arange(int(counts.sum()), dtype=np.int64))


@dataclass(frozen=True)
class HopBatch:
    """The compressions of one batch: row ``i`` is ``ranks[i]`` compressing chunk ``i`` of the
    batch, whose ``sizes[i]`` coordinates start at global index ``offsets[i]`` of the vector
    and at :attr:`starts` ``[i]`` of the batch's flat buffer.

    Attributes:
        streams: The random streams of the rows as columns (ints or int64 ``[k]`` arrays,
            broadcast), e.g. ``(call, chunk, height)``: row ``i``'s
            :attr:`HopContext.stream <dynamiq.codecs.HopContext.stream>` is
            ``tuple(c[i] for c in streams)``.
        ranks: int64 ``[k]``, the compressing ranks.
        offsets: int64 ``[k]``, global index of each chunk's first coordinate.
        sizes: int64 ``[k]``, coordinates per chunk.
        summands: int64 ``[k]``, contributions in each compressed partial sum.
        world_size: Number of ranks.
        stats, prepared, backend: As in :class:`~dynamiq.codecs.HopContext`, shared by every
            row.
    """

    streams: tuple[Any, ...]
    ranks: np.ndarray
    offsets: np.ndarray
    sizes: np.ndarray
    summands: np.ndarray
    world_size: int
    stats: Mapping[str, torch.Tensor] | None = field(default=None, compare=False)
    prepared: Mapping[Any, Any] | None = field(default=None, compare=False)
    backend: str = field(default="auto", compare=False)

    def __post_init__(self) -> None:
        k = len(self.ranks)
        for name in ("offsets", "sizes", "summands"):
            if len(getattr(self, name)) != k:
                raise ValueError(f"{name} has {len(getattr(self, name))} rows, ranks {k}")
        for c in self.streams:
            if np.ndim(c) and len(c) != k:
                raise ValueError(f"a stream column has {len(c)} rows, ranks {k}")

    def __len__(self) -> int:
        return len(self.ranks)

    @cached_property
    def starts(self) -> np.ndarray:
        """int64 ``[k]``: where each row's values start in the flat buffer."""
        out = np.zeros(len(self), dtype=np.int64)
        np.cumsum(self.sizes[:-1], out=out[1:])
        return out

    @property
    def total(self) -> int:
        """Coordinates in the flat buffer (all rows)."""
        return int(self.sizes.sum())

    def stream_columns(self) -> list[np.ndarray | int]:
        """The stream columns, arrays as int64 and scalars as ints."""
        return [np.asarray(c, dtype=np.int64) if np.ndim(c) else int(c) for c in self.streams]

    def subset(self, mask: np.ndarray) -> tuple[HopBatch, torch.Tensor]:
        """The rows where ``mask`` holds, as a batch of their own, and int64 indices of their
        values in this batch's flat buffer (on the CPU)."""
        sel = np.flatnonzero(mask)
        cols = tuple(np.asarray(c)[sel] if np.ndim(c) else c for c in self.streams)
        sub = HopBatch(cols, self.ranks[sel], self.offsets[sel], self.sizes[sel],
                       self.summands[sel], self.world_size, self.stats, self.prepared,
                       self.backend)
        return sub, torch.from_numpy(ragged_arange(self.starts[sel], self.sizes[sel]))

    def context(self, i: int) -> HopContext:
        """Row ``i`` as the :class:`~dynamiq.codecs.HopContext` a per-message executor gives
        that compression."""
        return HopContext(stream=tuple(int(c[i]) if np.ndim(c) else int(c)
                                       for c in self.streams),
                          rank=int(self.ranks[i]), world_size=self.world_size,
                          index_offset=int(self.offsets[i]), stats=self.stats,
                          prepared=self.prepared, backend=self.backend,
                          summands=int(self.summands[i]))

    def check(self, values: torch.Tensor) -> None:
        """Raise unless ``values`` is the batch's flat float32 buffer."""
        if (not isinstance(values, torch.Tensor) or values.dtype != torch.float32
                or values.dim() != 1 or not values.is_contiguous()):
            raise TypeError("batch values must be a contiguous 1-D float32 tensor")
        if values.numel() != self.total:
            raise ValueError(f"batch values have {values.numel()} coordinates, its rows "
                             f"{self.total}")


def split_unaligned(values: torch.Tensor, batch: HopBatch, unit: int,
                    whole: Callable[[torch.Tensor, HopBatch], np.ndarray],
                    each: Callable[[torch.Tensor, HopBatch], np.ndarray]) -> np.ndarray | None:
    """Run a batch whose rows are not all whole ``unit`` s (the vector's last chunk may end
    in part of one): the other rows through ``whole`` on a buffer of their own, where every
    row starts on a unit, the cut ones through ``each`` (the per-message round trip).

    Returns:
        int64 ``[k]`` message bytes, or ``None`` when every row is whole (nothing ran: the
        caller codes the batch itself).
    """
    ok = batch.sizes % unit == 0
    if ok.all():
        return None
    nbytes = np.zeros(len(batch), dtype=np.int64)
    for mask, run in ((~ok, each), (ok, whole)):
        if mask.any():
            sub, idx = batch.subset(mask)
            idx = idx.to(values.device)
            part = values[idx]
            nbytes[mask] = run(part, sub)
            values[idx] = part
    return nbytes
