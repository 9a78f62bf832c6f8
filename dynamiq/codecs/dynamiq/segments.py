"""The hop operations on one segment of a DynamiQ message: the coordinates of one option.

A segment's coordinates stay where they are in the chunk: the block kernels read and write
them through a row index (on backends without one, the quantizer copies them in and out).
A quantized segment is its option's block quantizer; the BF16 segment (width 16) is the
``passthrough(wire=bf16)`` codec's wire format, so both codecs send the same bytes for the same
values on every backend.
"""

from __future__ import annotations

from functools import cache
from typing import Protocol

import torch

from dynamiq.codecs.base import HopContext
from dynamiq.codecs.dynamiq.options import CodingOption
from dynamiq.codecs.passthrough import Passthrough
from dynamiq.kernels import get_backend
from dynamiq.metadata import SUPER_GROUP
from dynamiq.quantizers import BlockQuantizer, Payload

__all__ = ["Bf16Segment", "QuantSegment", "Segment", "segment_of"]

_BF16 = Passthrough(wire="bf16")


class Segment(Protocol):
    """How one option's coordinates are coded, read from and written to their places in the
    chunk: ``rows`` (int64) are the blocks of :attr:`block` coordinates of the chunk that the
    segment's ``n`` coordinates occupy, in message order (the last may be the chunk's partial
    last block); ``rand``: the random-number keys."""

    unbiased: bool
    #: Coordinates per row of ``rows``.
    block: int

    def nbytes(self, n: int) -> int:
        """Wire bytes of ``n`` coordinates."""

    def encode(self, x: torch.Tensor, rows: torch.Tensor, n: int, out: torch.Tensor,
               backend: str, **rand: object) -> None:
        """Code the segment's coordinates of the chunk ``x`` (float32) into ``out`` (uint8
        ``[nbytes(n)]``)."""

    def decode(self, data: torch.Tensor, out: torch.Tensor, rows: torch.Tensor, n: int,
               accumulate: bool, backend: str, **rand: object) -> None:
        """Decode ``data`` into the segment's places of the chunk ``out`` (float32; added to
        it when ``accumulate``); ``rand``: the encoder's keys."""

    def recompress(self, data: torch.Tensor, acc: torch.Tensor, rows: torch.Tensor, n: int,
                   out: torch.Tensor, writeback: str, backend: str, **rand: object) -> None:
        """``encode(acc + decode(data))`` over the segment's places of the chunk ``acc`` into
        ``out``; those places afterwards as ``writeback`` says (``"none"``: unspecified)."""


class QuantSegment:
    """Widths 2–8: the option's block quantizer, reading and writing the chunk in place."""

    def __init__(self, q: BlockQuantizer) -> None:
        self.q = q
        self.unbiased = q.unbiased
        self.block = q.block_size

    def nbytes(self, n: int) -> int:
        return self.q.nbytes(n)

    def encode(self, x, rows, n, out, backend, **rand):
        self.q.encode(x, out=out, backend=backend, rows=rows, **rand)

    def decode(self, data, out, rows, n, accumulate, backend, **rand):
        self.q.decode(Payload(self.q, n, data), out=out, accumulate=accumulate, rows=rows,
                      backend=backend, **rand)

    def recompress(self, data, acc, rows, n, out, writeback, backend, **rand):
        self.q.recompress(Payload(self.q, n, data), acc, writeback=writeback, out=out,
                          rows=rows, backend=backend, **rand)


@cache
def _on(backend: str) -> HopContext:
    """A context that only names the (already resolved) backend: all BF16 coding reads."""
    return HopContext(backend=backend)


class Bf16Segment:
    """Width 16: BF16 values, round to nearest even, no scales and no random numbers; its
    coordinates are copied out of (and back into) the chunk around the passthrough coding."""

    unbiased = _BF16.unbiased
    block = SUPER_GROUP

    def nbytes(self, n: int) -> int:
        return _BF16.wire_bytes(n)

    def encode(self, x, rows, n, out, backend, **_):
        _BF16.compress(get_backend(backend).gather_rows(x, rows, self.block)[:n], _on(backend),
                       out)

    def decode(self, data, out, rows, n, accumulate, backend, **_):
        be = get_backend(backend)
        dec = torch.empty(rows.numel() * self.block, dtype=torch.float32, device=out.device)
        _BF16.decompress(data, dec[:n], _on(backend))
        be.scatter_rows(dec, rows, out, accumulate, self.block)

    def recompress(self, data, acc, rows, n, out, writeback, backend, **_):
        be = get_backend(backend)
        dense = be.gather_rows(acc, rows, self.block)
        _BF16.decompress_accumulate_recompress(data, dense[:n], _on(backend), out, writeback)
        if writeback != "none":
            be.scatter_rows(dense, rows, acc, False, self.block)


def segment_of(option: CodingOption) -> Segment:
    """The segment coder of ``option``."""
    return Bf16Segment() if option.quantizer is None else QuantSegment(option.quantizer)
