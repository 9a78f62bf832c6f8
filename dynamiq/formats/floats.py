"""Floating-point formats: OCP/IEEE minifloats (:class:`FloatFormat`) and raw binary32."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from dynamiq.formats.base import NumberFormat, _check_int

__all__ = ["Float32Format", "FloatFormat"]


@dataclass(frozen=True)
class FloatFormat(NumberFormat):
    """A minifloat with ``ebits`` exponent and ``mbits`` mantissa bits (OCP/IEEE conventions).

    Args:
        ebits: Exponent bits (1–8).
        mbits: Mantissa bits (0–10).
        special: Which codes are not finite numbers:
            ``"ieee"`` all-ones exponent is ±Inf (mantissa 0) or NaN (E5M2, FP16, BF16);
            ``"fn"`` only the all-ones magnitude code is NaN (OCP E4M3, E8M0);
            ``"none"`` every code is finite (OCP FP6/FP4: E3M2, E2M3, E2M1).
        signed: Whether a sign bit precedes the magnitude (E8M0 is unsigned).
        bias: Exponent bias; default ``2**(ebits-1) - 1``.
        subnormals: Whether exponent field 0 codes subnormals (``0.m × 2**(1-bias)``); when
            ``False`` it is an ordinary exponent (E8M0: code 0 is ``2**-127``).
    """

    ebits: int
    mbits: int
    special: str = "ieee"
    signed: bool = True
    bias: int | None = None
    subnormals: bool = True
    bits: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _check_int("ebits", self.ebits, 1, 8)
        _check_int("mbits", self.mbits, 0, 10)
        if self.special not in ("ieee", "fn", "none"):
            raise ValueError(f"special must be 'ieee', 'fn' or 'none', got {self.special!r}")
        if self.special == "ieee" and self.ebits < 2:
            raise ValueError("'ieee' specials need at least 2 exponent bits")
        bits = self.ebits + self.mbits + int(self.signed)
        if bits > 16:
            raise ValueError(f"FloatFormat is limited to 16 bits (got {bits}); use Float32Format")
        object.__setattr__(self, "bits", bits)
        if self.bias is None:
            object.__setattr__(self, "bias", 2 ** (self.ebits - 1) - 1)
        _ = self._tables  # validate now

    def _magnitude_values(self) -> np.ndarray:
        m = self.mbits
        codes = np.arange(2 ** (self.ebits + m), dtype=np.int64)
        e = codes >> m
        f = (codes & (2**m - 1)).astype(np.float64)
        bias = int(self.bias)  # type: ignore[arg-type]
        normal = np.ldexp(1.0 + f / 2**m, (e - bias).astype(np.int64))
        if self.subnormals:
            sub = np.ldexp(f / 2**m, 1 - bias)
            vals = np.where(e == 0, sub, normal)
        else:
            vals = normal
        top = 2**self.ebits - 1
        if self.special == "ieee":
            vals = np.where(e == top, np.where(f == 0, np.inf, np.nan), vals)
            # keep only Inf and one NaN code at the top: the rest are NaN too
        elif self.special == "fn":
            vals = vals.copy()
            vals[-1] = np.nan
        return vals

    @property
    def emax(self) -> int:
        """Exponent of the largest power of two not above ``max_value``."""
        return math.floor(math.log2(self.max_value))

    def __str__(self) -> str:
        return f"FloatFormat(e{self.ebits}m{self.mbits},{self.special})"


@dataclass(frozen=True)
class Float32Format(NumberFormat):
    """IEEE binary32, stored as its raw 32 bits (used for scales; kernels pass values through)."""

    bits: int = field(default=32, init=False)
    signed: bool = field(default=False, init=False)

    @property
    def kind(self) -> str:
        return "fp32"

    def _magnitude_values(self) -> np.ndarray:
        # The table of a 31-bit magnitude code is not materialised; kernels use the raw bits.
        raise NotImplementedError("Float32Format has no magnitude table")

    @property
    def max_value(self) -> float:
        return float(np.finfo(np.float32).max)

    @property
    def min_value(self) -> float:
        return 0.0

    @property
    def n_finite(self) -> int:
        return 0x7F800000

    @property
    def nan_code(self) -> int:
        return 0x7FC00000

    @property
    def inf_code(self) -> int:
        return 0x7F800000

    def decode(self, codes: np.ndarray) -> np.ndarray:
        return np.asarray(codes, dtype=np.uint32).view(np.float32).astype(np.float64)

    def encode(self, values: np.ndarray, rounding: str = "nearest") -> np.ndarray:
        return np.asarray(values, dtype=np.float32).view(np.uint32).astype(np.int64)

    def valid_codes(self) -> np.ndarray:
        raise NotImplementedError("Float32Format has 2**32 codes; it is not enumerated")

    def describe(self) -> str:
        return "32-bit IEEE float (raw bits)"
