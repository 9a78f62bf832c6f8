"""The hop operations on one segment of a DynamiQ message: the coordinates of one option.

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
from dynamiq.quantizers import BlockQuantizer, Payload

__all__ = ["Bf16Segment", "QuantSegment", "Segment", "segment_of"]

_BF16 = Passthrough(wire="bf16")


class Segment(Protocol):
    """How one option's coordinates are coded (``rand``: the random-number keys)."""

    unbiased: bool

    def nbytes(self, n: int) -> int:
        """Wire bytes of ``n`` coordinates."""

    def encode(self, x: torch.Tensor, out: torch.Tensor, backend: str, **rand: object) -> None:
        """Code float32 ``x [n]`` into ``out`` (uint8 ``[nbytes(n)]``)."""

    def decode(self, data: torch.Tensor, out: torch.Tensor, backend: str,
               **rand: object) -> None:
        """Decode ``data`` into float32 ``out [n]`` (``rand``: the encoder's keys)."""

    def recompress(self, data: torch.Tensor, acc: torch.Tensor, out: torch.Tensor,
                   writeback: str, backend: str, **rand: object) -> None:
        """``encode(acc + decode(data))`` into ``out``; ``acc`` afterwards as ``writeback``
        says (``"none"``: unspecified)."""


class QuantSegment:
    """Widths 2–8: the option's block quantizer."""

    def __init__(self, q: BlockQuantizer) -> None:
        self.q = q
        self.unbiased = q.unbiased

    def nbytes(self, n: int) -> int:
        return self.q.nbytes(n)

    def encode(self, x: torch.Tensor, out: torch.Tensor, backend: str, **rand: object) -> None:
        self.q.encode(x, out=out, backend=backend, **rand)

    def decode(self, data: torch.Tensor, out: torch.Tensor, backend: str,
               **rand: object) -> None:
        self.q.decode(Payload(self.q, out.numel(), data), out=out, backend=backend, **rand)

    def recompress(self, data: torch.Tensor, acc: torch.Tensor, out: torch.Tensor,
                   writeback: str, backend: str, **rand: object) -> None:
        self.q.recompress(Payload(self.q, acc.numel(), data), acc, writeback=writeback,
                          out=out, backend=backend, **rand)


@cache
def _on(backend: str) -> HopContext:
    """A context that only names the (already resolved) backend: all BF16 coding reads."""
    return HopContext(backend=backend)


class Bf16Segment:
    """Width 16: BF16 values, round to nearest even, no scales and no random numbers."""

    unbiased = _BF16.unbiased

    def nbytes(self, n: int) -> int:
        return _BF16.wire_bytes(n)

    def encode(self, x: torch.Tensor, out: torch.Tensor, backend: str, **_: object) -> None:
        _BF16.compress(x, _on(backend), out)

    def decode(self, data: torch.Tensor, out: torch.Tensor, backend: str, **_: object) -> None:
        _BF16.decompress(data, out, _on(backend))

    def recompress(self, data: torch.Tensor, acc: torch.Tensor, out: torch.Tensor,
                   writeback: str, backend: str, **_: object) -> None:
        # ``acc`` is the codec's private reordered copy, dropped under "none": asking for the
        # sum then leaves it as every backend left it before this segment became a passthrough
        # (an in-place sum), at no cost to the bytes or to the caller's accumulator
        _BF16.decompress_accumulate_recompress(data, acc, _on(backend), out,
                                               "decoded" if writeback == "decoded" else "sum")


def segment_of(option: CodingOption) -> Segment:
    """The segment coder of ``option``."""
    return Bf16Segment() if option.quantizer is None else QuantSegment(option.quantizer)
