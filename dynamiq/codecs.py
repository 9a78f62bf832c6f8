"""Partial-sum codecs: what the wire carries for a partial sum, and how a hop combines it.

A multi-hop all-reduce moves *partial sums*. A codec defines the four hop operations every
executor uses, on a flat float32 chunk ``x`` of ``n`` coordinates and its wire bytes:

* ``compress(x)`` — a leaf's message;
* ``decompress(data)`` — a receiver's view of a message;
* ``decompress_accumulate(data, acc)`` — ``acc += decompress(data)`` (every incoming message of
  an internal node but the last);
* ``decompress_accumulate_recompress(data, acc)`` — ``compress(acc + decompress(data))`` fused
  in one pass (an internal node's last incoming message; the sink's final compression, which
  with ``writeback="decoded"`` also leaves in ``acc`` exactly what every receiver will decode).

Codecs are frozen dataclasses registered by name in :data:`CODECS`; their canonical spec string
(``passthrough``, ``passthrough(wire=bf16)``, ``requant(quantizer=dq4_hier)``; parameters at
their defaults are left out) is what pipelines print and parse.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from dynamiq.quantizers import QUANTIZERS, BlockQuantizer, Payload, get_quantizer
from dynamiq.registry import Registry
from dynamiq.spec import build, format_call

__all__ = [
    "CODECS",
    "HopContext",
    "PartialSumCodec",
    "Passthrough",
    "Requant",
    "get_codec",
]

CODECS: Registry[type] = Registry("partial-sum codec")


@dataclass(frozen=True)
class HopContext:
    """Where a compression happens: it keys the random numbers so that every hop is distinct.

    Attributes:
        seed: Seed shared by all ranks (from the codec).
        stream: Stream ids, e.g. ``(call, chunk)``.
        rank, world_size: The compressing rank and the number of ranks.
        index_offset: Global index of the chunk's first coordinate in the flat vector.
        stats: The metadata phase's global per-super-group statistics (name → float64 tensor
            over the whole vector), for components that declare ``statistics``.
    """

    seed: int = 0
    stream: tuple[int, ...] = ()
    rank: int = 0
    world_size: int = 1
    index_offset: int = 0
    stats: Mapping[str, torch.Tensor] | None = field(default=None, compare=False, hash=False)


_WRITEBACK = ("none", "sum", "decoded")


class PartialSumCodec:
    """Base class of partial-sum codecs (subclasses are frozen dataclasses).

    Attributes:
        block_size: Chunk boundaries must fall on multiples of it (blocks are coded
            independently, so a chunk can be coded alone with the same result).
        lossless: Whether ``decompress(compress(x)) == x`` exactly.
        statistics: Names (in :data:`dynamiq.collectives.metadata.STATISTICS`) of the
            per-super-group statistics the codec needs from the metadata phase.
    """

    block_size: int = 1
    lossless: bool = False
    statistics: tuple[str, ...] = ()

    def wire_bytes(self, n: int) -> int:  # pragma: no cover - abstract
        """Bytes on the wire for a chunk of ``n`` coordinates."""
        raise NotImplementedError

    def compress(self, x: torch.Tensor, ctx: HopContext, out: torch.Tensor | None = None
                 ) -> torch.Tensor:  # pragma: no cover - abstract
        """``uint8[wire_bytes(n)]`` message for the float32 chunk ``x``."""
        raise NotImplementedError

    def decompress(self, data: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """Decode ``data`` into the float32 tensor ``out`` (its length is the chunk size)."""
        raise NotImplementedError  # pragma: no cover - abstract

    def decompress_accumulate(self, data: torch.Tensor, acc: torch.Tensor) -> None:
        """``acc += decompress(data)`` in float32."""
        raise NotImplementedError  # pragma: no cover - abstract

    def decompress_accumulate_recompress(
        self,
        data: torch.Tensor,
        acc: torch.Tensor,
        ctx: HopContext,
        out: torch.Tensor | None = None,
        writeback: str = "none",
    ) -> torch.Tensor:  # pragma: no cover - abstract
        """``compress(acc + decompress(data))``; ``writeback`` as in
        :meth:`dynamiq.quantizers.BlockQuantizer.recompress`."""
        raise NotImplementedError

    def spec(self) -> str:  # pragma: no cover - abstract
        """Canonical spec string."""
        raise NotImplementedError

    def __str__(self) -> str:
        return self.spec()


def _check_chunk(x: torch.Tensor, what: str = "chunk") -> None:
    if not isinstance(x, torch.Tensor) or x.dtype != torch.float32 or x.dim() != 1:
        raise TypeError(f"{what} must be a 1-D float32 tensor")
    if not x.is_contiguous():
        raise ValueError(f"{what} must be contiguous")


@CODECS.register("passthrough")
@dataclass(frozen=True)
class Passthrough(PartialSumCodec):
    """Uncompressed partial sums: FP32 or BF16 on the wire, accumulated in FP32.

    Args:
        wire: ``"fp32"`` (lossless) or ``"bf16"`` (round-to-nearest-even at every send).
    """

    wire: str = "fp32"

    def __post_init__(self) -> None:
        if self.wire not in ("fp32", "bf16"):
            raise ValueError(f"passthrough wire must be 'fp32' or 'bf16', got {self.wire!r}")

    @property
    def lossless(self) -> bool:  # type: ignore[override]
        return self.wire == "fp32"

    @property
    def _dtype(self) -> torch.dtype:
        return torch.float32 if self.wire == "fp32" else torch.bfloat16

    def wire_bytes(self, n: int) -> int:
        return n * (4 if self.wire == "fp32" else 2)

    def _as_bytes(self, x: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
        if out is None:
            out = torch.empty(self.wire_bytes(x.numel()), dtype=torch.uint8)
        out.view(self._dtype).copy_(x)
        return out

    def compress(self, x, ctx, out=None):
        _check_chunk(x)
        return self._as_bytes(x, out)

    def decompress(self, data, out):
        out.copy_(data.view(self._dtype))
        return out

    def decompress_accumulate(self, data, acc):
        acc.add_(data.view(self._dtype).float() if self.wire == "bf16" else data.view(self._dtype))

    def decompress_accumulate_recompress(self, data, acc, ctx, out=None, writeback="none"):
        if writeback not in _WRITEBACK:
            raise ValueError(f"writeback must be one of {_WRITEBACK}")
        if out is None:
            out = torch.empty(self.wire_bytes(acc.numel()), dtype=torch.uint8)
        incoming = data.view(self._dtype)
        if self.wire == "fp32":
            # one pass: the sum is written straight into the outgoing bytes
            torch.add(acc, incoming, out=out.view(torch.float32))
            if writeback != "none":
                acc.copy_(out.view(torch.float32))
            return out
        t = acc + incoming.float()
        out.view(torch.bfloat16).copy_(t)
        if writeback == "sum":
            acc.copy_(t)
        elif writeback == "decoded":
            acc.copy_(out.view(torch.bfloat16))
        return out

    def spec(self) -> str:
        return format_call("passthrough", self)


@CODECS.register("requant")
@dataclass(frozen=True)
class Requant(PartialSumCodec):
    """Re-quantize the partial sum at every hop with fresh scales (DynamiQ's hop rule).

    Every internal node decodes, accumulates and re-encodes with the same quantizer (same
    widths), computing new group and super-group scales from the partial sum.

    Args:
        quantizer: A :class:`~dynamiq.quantizers.BlockQuantizer` or registered name.
        seed: Seed of the rounding random numbers (shared by all ranks).
    """

    quantizer: BlockQuantizer | str
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "quantizer", get_quantizer(self.quantizer))
        if not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed must be a non-negative int, got {self.seed!r}")

    @property
    def block_size(self) -> int:  # type: ignore[override]
        return self.quantizer.block_size

    def wire_bytes(self, n: int) -> int:
        return self.quantizer.nbytes(n)

    def _kw(self, ctx: HopContext) -> dict:
        return {"seed": self.seed, "rank": ctx.rank, "world_size": ctx.world_size,
                "stream": ctx.stream, "index_offset": ctx.index_offset}

    def compress(self, x, ctx, out=None):
        _check_chunk(x)
        return self.quantizer.encode(x, out=out, **self._kw(ctx)).data

    def decompress(self, data, out):
        return self.quantizer.decode(Payload(self.quantizer, out.numel(), data), out=out)

    def decompress_accumulate(self, data, acc):
        self.quantizer.decode(Payload(self.quantizer, acc.numel(), data), out=acc,
                              accumulate=True)

    def decompress_accumulate_recompress(self, data, acc, ctx, out=None, writeback="none"):
        p = Payload(self.quantizer, acc.numel(), data)
        return self.quantizer.recompress(p, acc, writeback=writeback, out=out,
                                         **self._kw(ctx)).data

    def spec(self) -> str:
        q = self.quantizer
        name = QUANTIZERS.name_of(q)
        if name is None:
            raise ValueError(
                f"requant's quantizer {q.describe()} is not registered, so the codec has no "
                "spec string; register it with dynamiq.QUANTIZERS.register(name, q)"
            )
        return f"requant(quantizer={name}" + (f",seed={self.seed})" if self.seed else ")")


def get_codec(spec: str | PartialSumCodec) -> PartialSumCodec:
    """Return ``spec`` itself, or build the codec from a spec like ``requant(quantizer=mxfp8)``."""
    if isinstance(spec, PartialSumCodec):
        return spec
    return build(CODECS, spec, "codec")  # type: ignore[return-value]
