"""The uncompressed codec: FP32 or BF16 partial sums (the BF16 baseline)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dynamiq.codecs.base import (
    CODECS,
    HopContext,
    PartialSumCodec,
    _check_chunk,
    check_writeback,
    hop_kernels,
)
from dynamiq.kernels import backend_for
from dynamiq.spec import format_call

__all__ = ["Passthrough"]


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
    def unbiased(self) -> bool:  # type: ignore[override]
        return self.wire == "fp32"  # BF16 rounds to nearest: biased, if only slightly

    @classmethod
    def examples(cls) -> list[Passthrough]:
        """Both wire formats."""
        return [cls("fp32"), cls("bf16")]

    def wire_bytes(self, n: int, ctx: HopContext | None = None) -> int:
        return n * (4 if self.wire == "fp32" else 2)

    def _out(self, n: int, out: torch.Tensor | None, device: torch.device) -> torch.Tensor:
        if out is None:
            return torch.empty(self.wire_bytes(n), dtype=torch.uint8, device=device)
        return out

    def compress(self, x, ctx, out=None):
        _check_chunk(x)
        out = self._out(x.numel(), out, x.device)
        hop_kernels(ctx, x).wire_encode(x, self.wire, out)
        return out

    def decompress(self, data, out, ctx=None):
        hop_kernels(ctx, out).wire_decode(data, self.wire, out, False)
        return out

    def decompress_accumulate(self, data, acc, ctx=None):
        hop_kernels(ctx, acc).wire_decode(data, self.wire, acc, True)

    def decompress_accumulate_recompress(self, data, acc, ctx, out=None, writeback="none"):
        wb = check_writeback(writeback)
        out = self._out(acc.numel(), out, acc.device)
        hop_kernels(ctx, acc).wire_recompress(data, acc, self.wire, wb, out)
        return out

    def roundtrip_batch(self, values, batch):
        """Every row's round trip in one cast of the whole buffer (values are coded one by
        one)."""
        batch.check(values)
        if self.wire != "fp32" and values.numel():
            be = backend_for(batch.backend, values)
            data = torch.empty(self.wire_bytes(values.numel()), dtype=torch.uint8,
                               device=values.device)
            be.wire_encode(values, self.wire, data)
            be.wire_decode(data, self.wire, values, False)
        return batch.sizes * (4 if self.wire == "fp32" else 2)

    def spec(self) -> str:
        return format_call("passthrough", self)
