"""Integer formats: symmetric sign-magnitude or unsigned integers, optionally normalised."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dynamiq.formats.base import NumberFormat, _check_int

__all__ = ["IntFormat"]


@dataclass(frozen=True)
class IntFormat(NumberFormat):
    """Symmetric sign-magnitude integers ``-(2**(bits-1)-1) … 2**(bits-1)-1`` (or unsigned).

    Args:
        bits: Code width, 2–16 (1–16 when unsigned).
        signed: Sign-magnitude when ``True`` (the sign is the top bit; ``1000…0`` is ``-0``).
        normalized: Divide every magnitude by the largest one, so magnitudes lie in ``[0, 1]``
            (``IntFormat(8, signed=False, normalized=True)`` is the UINT8 *relative* scale of
            hierarchical quantizers: code ``r`` means ``r / 255`` of the parent scale).
    """

    bits: int
    signed: bool = True
    normalized: bool = False

    def __post_init__(self) -> None:
        _check_int("bits", self.bits, 2 if self.signed else 1, 16)
        _ = self._tables

    def _magnitude_values(self) -> np.ndarray:
        n = 2**self.magnitude_bits
        v = np.arange(n, dtype=np.float64)
        return v / (n - 1) if self.normalized else v

    def __str__(self) -> str:
        s = "int" if self.signed else "uint"
        return f"{s}{self.bits}{'rel' if self.normalized else ''}"
