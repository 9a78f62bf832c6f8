"""The per-call decision of the DynamiQ codec and the per-chunk message layout it implies.

A :class:`WidthPlan` gives every super-group of the vector an option. A chunk's message is one
segment per option present in the chunk: the chunk's super-groups are reordered (stably) by
option, so that equal options are contiguous, and each run is coded as one segment, read from
and decoded into the chunk's own places (:meth:`ChunkLayout.rows`), without a reordered copy.
:class:`ChunkLayout` records where each segment's coordinates and bytes lie.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from dynamiq.codecs.dynamiq.options import CodingOption
from dynamiq.metadata import SUPER_GROUP

__all__ = ["ChunkLayout", "WidthPlan", "chunk_layout"]


def _stable_order(choice: np.ndarray) -> np.ndarray:
    """``np.argsort(choice, kind="stable")`` of option indices: as bytes when they fit, which
    NumPy sorts by radix in linear time."""
    if choice.size and 0 <= int(choice.min()) and int(choice.max()) < 256:
        return np.argsort(choice.astype(np.uint8), kind="stable")
    return np.argsort(choice, kind="stable")


@dataclass
class WidthPlan:
    """The per-call width decision of a :class:`~dynamiq.codecs.dynamiq.DynamiQ` codec
    (identical on every rank).

    Attributes:
        choice: int64 ``[super-groups]``, index into the codec's options
            (:attr:`DynamiQ.option_keys`) per super-group.
        widths: The width of every option, in option order (by wire cost; a width repeats
            when it is offered with several group sizes).
        budget_bits: Bits the allocation was given (budget minus metadata).
        used_bits: Bits the chosen widths cost on the wire, for the whole vector (with
            :attr:`hops`, averaged over the transfers as the budget is).
        hops: With a per-hop allocation, the plan of the messages coded from partial sums of
            ``s`` contributions, by ``s`` (:attr:`HopContext.summands
            <dynamiq.codecs.HopContext.summands>`); ``choice`` is then the owner's (the whole
            sum's). ``None``: one plan for every hop.
        dither_from: The narrowest width dithered in this call (the codec's
            ``dither_min_width`` unless the schedule's chains are long enough to raise it, see
            :func:`~dynamiq.codecs.dynamiq.options.dither_floor`); 0: as the options are
            built.
        midrise_from: The narrowest width an undithered segment codes on mid-rise levels;
            narrower undithered ones use the levels with a zero (see
            :func:`~dynamiq.codecs.dynamiq.options.midrise_floor`); 0: every width keeps its
            levels.
    """

    choice: np.ndarray
    widths: tuple[int, ...]
    budget_bits: float
    used_bits: float
    hops: dict[int, WidthPlan] | None = None
    dither_from: int = 0
    midrise_from: int = 0
    _layouts: dict = field(default_factory=dict, repr=False)
    position: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        # each super-group's place in the whole vector's stable order by option: the random
        # numbers of a coordinate are keyed by it, so any cut into chunks or tiles draws the same
        order = _stable_order(self.choice)
        self.position = np.empty_like(order)
        self.position[order] = np.arange(order.size)

    def with_dither_from(self, width: int, midrise_from: int = 0) -> WidthPlan:
        """This plan (and its hop plans) coding widths below ``width`` without dithering, and
        undithered widths below ``midrise_from`` on levels with a zero."""
        for p in (self, *(self.hops or {}).values()):
            p.dither_from = width
            p.midrise_from = midrise_from
        return self

    def for_summands(self, summands: int) -> WidthPlan:
        """The plan of a message coded from a partial sum of ``summands`` contributions (this
        plan itself without :attr:`hops`, or for a count it has no plan of)."""
        if self.hops is None:
            return self
        return self.hops.get(summands, self)

    def histogram(self) -> dict[int, float]:
        """Fraction of super-groups at each width (summed over its group sizes)."""
        m = max(1, self.choice.size)
        out: dict[int, float] = {}
        for i, w in enumerate(self.widths):
            out[w] = out.get(w, 0.0) + float((self.choice == i).sum()) / m
        return out


@dataclass(frozen=True)
class ChunkLayout:
    """Where a chunk's segments lie, in its reordered coordinates and in its message.

    Attributes:
        order: int64 ``[sgs]``, the chunk's super-group indices sorted (stably) by option.
        segments: ``(option, first reordered super-group, coordinates, first byte, end byte,
            random-number index of the first coordinate)`` per segment, in message order: the
            BF16 segment first, the others by option.
        nbytes: Bytes of the whole message.
        sgs: Super-groups in the chunk (the last may be partial).
    """

    order: torch.Tensor
    segments: tuple[tuple[int, int, int, int, int, int], ...]
    nbytes: int
    sgs: int

    def rows(self, k: int, block: int, device: torch.device) -> torch.Tensor:
        """int64 indices of the blocks of ``block`` coordinates (a divisor of the super-group)
        that segment ``k``'s coordinates occupy in the chunk, in message order; the last is
        the chunk's partial last block when the segment ends there. Cached per layout."""
        cache = self.__dict__.setdefault("_rows", {})  # a frozen dataclass's own dict
        key = (k, block, str(device))
        rows = cache.get(key)
        if rows is None:
            _, sg0, coords, *_ = self.segments[k]
            sgs = self.order[sg0: sg0 + -(-coords // SUPER_GROUP)]
            per = SUPER_GROUP // block
            if per > 1:
                sgs = (sgs[:, None] * per + torch.arange(per)).reshape(-1)[: -(-coords // block)]
            rows = cache[key] = sgs.contiguous().to(device)
        return rows


def chunk_layout(choice: np.ndarray, position: np.ndarray, n: int,
                 options: Sequence[CodingOption]) -> ChunkLayout:
    """The layout of a chunk of ``n`` coordinates.

    Args:
        choice: int64 ``[sgs]``, the option of each of the chunk's super-groups.
        position: int64 ``[sgs]``, each super-group's place in the whole vector's stable order
            by option (:attr:`WidthPlan.position`).
        n: Coordinates in the chunk (``sgs = ceil(n / SUPER_GROUP)``).
        options: The codec's options (their wire sizes).

    Returns:
        The :class:`ChunkLayout`; its ``nbytes`` is the sum of the segments' wire sizes, a
        partial last super-group paying only for what it touches.
    """
    sgs = -(-n // SUPER_GROUP)
    order = _stable_order(choice)
    counts = np.bincount(choice, minlength=len(options))
    pad = sgs * SUPER_GROUP - n
    tail_option = int(choice[-1]) if sgs else -1
    parts, sg0 = [], 0
    for i, k in enumerate(counts):
        if not k:
            continue
        coords = int(k) * SUPER_GROUP
        if i == tail_option:
            # the partial last super-group is the last of its option (stable order)
            coords -= pad
        parts.append((i, sg0, coords, int(position[order[sg0]]) * SUPER_GROUP))
        sg0 += int(k)
    # BF16 values go first in the message, so they sit on an even byte offset whatever the
    # (possibly odd) sizes of the quantized segments
    parts.sort(key=lambda t: options[t[0]].quantizer is not None)
    segs, b0 = [], 0
    for i, sg, coords, first in parts:
        nb = options[i].nbytes(coords)
        segs.append((i, sg, coords, b0, b0 + nb, first))
        b0 += nb
    return ChunkLayout(torch.from_numpy(order), tuple(segs), b0, sgs)
