"""The uncompressed codec: FP32 or BF16 partial sums (the BF16 baseline)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dynamiq.codecs.base import (
    _WRITEBACK,
    CODECS,
    HopContext,
    PartialSumCodec,
    _check_chunk,
    _triton_launchers,
    hop_backend,
)
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

    @property
    def _dtype(self) -> torch.dtype:
        return torch.float32 if self.wire == "fp32" else torch.bfloat16

    def wire_bytes(self, n: int, ctx: HopContext | None = None) -> int:
        return n * (4 if self.wire == "fp32" else 2)

    def _as_bytes(self, x: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
        if out is None:
            out = torch.empty(self.wire_bytes(x.numel()), dtype=torch.uint8)
        out.view(self._dtype).copy_(x)
        return out

    def compress(self, x, ctx, out=None):
        _check_chunk(x)
        if hop_backend(ctx, x) == "triton":
            return _triton_launchers().wire_encode(x, self.wire, out)
        return self._as_bytes(x, out)

    def decompress(self, data, out, ctx=None):
        if hop_backend(ctx, out) == "triton":
            return _triton_launchers().wire_decode(data, self.wire, out)
        out.copy_(data.view(self._dtype))
        return out

    def decompress_accumulate(self, data, acc, ctx=None):
        if hop_backend(ctx, acc) == "triton":
            _triton_launchers().wire_decode(data, self.wire, acc, accumulate=True)
            return
        acc.add_(data.view(self._dtype).float() if self.wire == "bf16" else data.view(self._dtype))

    def decompress_accumulate_recompress(self, data, acc, ctx, out=None, writeback="none"):
        if writeback not in _WRITEBACK:
            raise ValueError(f"writeback must be one of {_WRITEBACK}")
        if hop_backend(ctx, acc) == "triton":
            return _triton_launchers().wire_recompress(data, acc, self.wire, out, writeback)
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
