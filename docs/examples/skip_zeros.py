"""Skip zero blocks: FP32 (or BF16) partial sums that leave out the blocks zero on every rank.

Importing this module registers the codec as ``skip_zeros``, so that spec strings such as
``skip_zeros@ring`` or ``skip_zeros(wire=bf16)@butterfly`` can name it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from dynamiq.codecs.base import CODECS, PartialSumCodec, check_writeback, hop_kernels
from dynamiq.kernels import Selection
from dynamiq.spec import format_call

BLOCK = 256  # coordinates per value of the metadata phase's "absmax" statistic


@dataclass
class Travelling:
    """One call's decision: ``mask[j]`` says whether block ``j`` of the vector travels."""

    mask: torch.Tensor  # bool [blocks], on the CPU
    chunks: dict = field(default_factory=dict, repr=False)

    def selection(self, offset: int, n: int) -> Selection | None:
        """The travelling blocks of the chunk ``[offset, offset + n)``; ``None``: all of them.
        One :class:`Selection` per chunk and call, so that backends cache their form of it."""
        if (offset, n) not in self.chunks:
            part = self.mask[offset // BLOCK: offset // BLOCK + -(-n // BLOCK)]
            self.chunks[offset, n] = None if bool(part.all()) else Selection(part, n, BLOCK)
        return self.chunks[offset, n]


@CODECS.register("skip_zeros")
@dataclass(frozen=True)
class SkipZeros(PartialSumCodec):
    """Partial sums as ``wire`` values, without the blocks of 256 that are zero on every rank.

    Args:
        wire: ``"fp32"`` (lossless) or ``"bf16"`` (round to nearest even at every send).
    """

    wire: str = "fp32"

    block_size = BLOCK
    statistics = ("absmax",)
    variable_size = True  # the bytes of a chunk depend on the call's data

    def __post_init__(self) -> None:
        if self.wire not in ("fp32", "bf16"):
            raise ValueError(f"skip_zeros wire must be 'fp32' or 'bf16', got {self.wire!r}")

    @property
    def lossless(self) -> bool:  # type: ignore[override]
        return self.wire == "fp32"

    @property
    def unbiased(self) -> bool:  # type: ignore[override]
        return self.wire == "fp32"

    @classmethod
    def examples(cls) -> list[SkipZeros]:
        return [cls("fp32"), cls("bf16")]

    def prepare(self, stats, length, world_size, state) -> Travelling:
        # global block maxima of |x| (a NaN counts as +inf): 0 only where every rank holds 0
        return Travelling(stats["absmax"].cpu() != 0)

    def _select(self, n: int, ctx) -> Selection | None:
        plan = self.plan_in(ctx)  # None outside a collective: every block travels
        return None if plan is None else plan.selection(ctx.index_offset, n)

    def wire_bytes(self, n, ctx=None) -> int:
        sel = self._select(n, ctx)
        return (4 if self.wire == "fp32" else 2) * (n if sel is None else sel.count)

    def max_wire_bytes(self, n) -> int:
        return self.wire_bytes(n)  # every block travelling

    def _out(self, n, ctx, out, like) -> torch.Tensor:
        size = self.wire_bytes(n, ctx)
        return torch.empty(size, dtype=torch.uint8, device=like.device) if out is None else out

    def compress(self, x, ctx, out=None):
        if x.dtype != torch.float32 or x.dim() != 1:
            raise TypeError("a chunk must be a 1-D float32 tensor")
        out = self._out(x.numel(), ctx, out, x)
        hop_kernels(ctx, x).wire_encode(x, self.wire, out, self._select(x.numel(), ctx))
        return out

    def decompress(self, data, out, ctx=None):
        sel = self._select(out.numel(), ctx)
        hop_kernels(ctx, out).wire_decode(data, self.wire, out, False, sel)
        return out

    def decompress_accumulate(self, data, acc, ctx=None):
        sel = self._select(acc.numel(), ctx)
        hop_kernels(ctx, acc).wire_decode(data, self.wire, acc, True, sel)

    def decompress_accumulate_recompress(self, data, acc, ctx, out=None, writeback="none"):
        wb = check_writeback(writeback)
        out = self._out(acc.numel(), ctx, out, acc)
        sel = self._select(acc.numel(), ctx)
        hop_kernels(ctx, acc).wire_recompress(data, acc, self.wire, wb, out, sel)
        return out

    def spec(self) -> str:
        return format_call("skip_zeros", self)
