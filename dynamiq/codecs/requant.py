"""Re-quantization with one fixed quantizer at every hop."""

from __future__ import annotations

from dataclasses import dataclass

from dynamiq.codecs.base import CODECS, HopContext, PartialSumCodec, _check_chunk
from dynamiq.quantizers import QUANTIZERS, BlockQuantizer, Payload, get_quantizer

__all__ = ["Requant"]


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

    @classmethod
    def examples(cls) -> list[Requant]:
        """Every registered quantizer, and one with another seed."""
        return [cls(name) for name in QUANTIZERS.names()] + [cls("dq4_hier", seed=7)]

    def __post_init__(self) -> None:
        object.__setattr__(self, "quantizer", get_quantizer(self.quantizer))
        if not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed must be a non-negative int, got {self.seed!r}")

    @property
    def unbiased(self) -> bool:  # type: ignore[override]
        return self.quantizer.unbiased

    @property
    def block_size(self) -> int:  # type: ignore[override]
        return self.quantizer.block_size

    def wire_bytes(self, n: int, ctx: HopContext | None = None) -> int:
        return self.quantizer.nbytes(n)

    def _kw(self, ctx: HopContext | None) -> dict:
        """The quantizer's random-number keys under ``ctx`` (defaults when ``None``)."""
        if ctx is None:
            return {"seed": self.seed, "backend": "auto"}
        return {"seed": self.seed, "rank": ctx.rank, "world_size": ctx.world_size,
                "stream": ctx.stream, "index_offset": ctx.index_offset, "backend": ctx.backend}

    def _decode_kw(self, ctx: HopContext | None) -> dict:
        """Keys of the message's producer, as a (dithered) decode regenerates them."""
        kw = self._kw(None if ctx is None else ctx.producer)
        if ctx is not None:
            kw["backend"] = ctx.backend
        return kw

    def compress(self, x, ctx, out=None):
        _check_chunk(x)
        return self.quantizer.encode(x, out=out, **self._kw(ctx)).data

    def decompress(self, data, out, ctx=None):
        return self.quantizer.decode(Payload(self.quantizer, out.numel(), data), out=out,
                                     **self._decode_kw(ctx))

    def decompress_accumulate(self, data, acc, ctx=None):
        self.quantizer.decode(Payload(self.quantizer, acc.numel(), data), out=acc,
                              accumulate=True, **self._decode_kw(ctx))

    def decompress_accumulate_recompress(self, data, acc, ctx, out=None, writeback="none"):
        p = Payload(self.quantizer, acc.numel(), data)
        src = ctx.producer
        return self.quantizer.recompress(p, acc, writeback=writeback, out=out,
                                         in_rank=src.rank, in_stream=src.stream,
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
