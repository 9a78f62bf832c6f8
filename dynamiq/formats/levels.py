"""Level-table formats: any table of magnitudes in ``[0, 1]`` and DynamiQ's ε-spaced levels."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import numpy as np

from dynamiq.formats.base import NumberFormat, _check_int

__all__ = ["EpsilonFormat", "LevelFormat"]


@dataclass(frozen=True)
class LevelFormat(NumberFormat):
    """Any ascending table of magnitudes in ``[0, 1]``, plus a sign bit.

    Args:
        levels: Strictly increasing magnitudes in ``[0, 1]`` (rounded to float32 on entry).
            Codes ``len(levels) … 2**magnitude_bits - 1`` are unused and decode to NaN.
        signed: Whether a sign bit precedes the magnitude code.
    """

    levels: tuple[float, ...]
    signed: bool = True
    bits: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        lv = tuple(float(np.float32(v)) for v in self.levels)
        if len(lv) < 2:
            raise ValueError("a level table needs at least 2 levels")
        if any(not (0.0 <= v <= 1.0) for v in lv) or any(b <= a for a, b in itertools.pairwise(lv)):
            raise ValueError("levels must be strictly increasing values in [0, 1]")
        object.__setattr__(self, "levels", lv)
        object.__setattr__(self, "bits", math.ceil(math.log2(len(lv))) + int(self.signed))
        if self.bits > 16:
            raise ValueError("level tables are limited to 16-bit codes")
        _ = self._tables

    def _magnitude_values(self) -> np.ndarray:
        return np.asarray(self.levels, dtype=np.float64)

    def __str__(self) -> str:
        return f"LevelFormat({len(self.levels)} levels)"


@dataclass(frozen=True)
class EpsilonFormat(NumberFormat):
    """DynamiQ's multiplicative-error levels at width ``bits`` (sign + ``2**(bits-1)`` levels).

    Level ``r`` is ``f(r) / f(L-1)`` with ``f(t) = (1+2ε²)**t - 1`` for ``r = 0 … L-1``,
    ``L = 2**(bits-1)``; ``eps = 0`` gives uniform levels ``r / (L-1)``. With two levels
    (``bits = 2``) the table is ``{0, 1}`` whatever ``eps`` is (``{1/3, 1}`` mid-rise).

    With ``midrise`` the levels sit half a step further out, ``f(r + 1/2) / f(L - 1/2)``
    (uniform: ``(2r + 1) / (2L - 1)``), so the signed grid has no zero and its ``2L`` codes
    are ``2L`` distinct values (:attr:`~dynamiq.formats.NumberFormat.midrise`): the step of
    uniform levels shrinks from ``2/(2L - 2)`` to ``2/(2L - 1)`` of the range.

    Args:
        bits: Code width including the sign bit, 2–16.
        eps: The ε parameter, ``>= 0``.
        midrise: Levels without zero (see above).
    """

    bits: int
    eps: float = 0.0
    midrise: bool = False  # type: ignore[assignment]
    signed: bool = field(default=True, init=False)

    def __post_init__(self) -> None:
        _check_int("bits", self.bits, 2, 16)
        if not (isinstance(self.eps, (int, float)) and math.isfinite(self.eps) and self.eps >= 0):
            raise ValueError(f"eps must be a finite number >= 0, got {self.eps!r}")
        object.__setattr__(self, "eps", float(self.eps))
        if not isinstance(self.midrise, bool):
            raise TypeError(f"midrise must be a bool, got {self.midrise!r}")
        _ = self._tables

    def _magnitude_values(self) -> np.ndarray:
        n = 2 ** (self.bits - 1)
        half = 0.5 if self.midrise else 0.0
        r = np.arange(n, dtype=np.float64) + half
        top = n - 1 + half
        q = 1.0 + 2.0 * self.eps**2
        if self.eps == 0 or q == 1.0 or n == 2:
            v = r / top
        else:
            v = np.expm1(r * math.log(q)) / math.expm1(top * math.log(q))
        v = v.astype(np.float32).astype(np.float64)
        v[-1] = 1.0
        if not self.midrise:
            v[0] = 0.0
        # float32 rounding may merge neighbouring levels for tiny eps at 16 bits
        if (np.diff(v) <= 0).any():
            raise ValueError(f"eps={self.eps} gives levels that collide in float32")
        return v

    def __str__(self) -> str:
        mid = ",midrise=True" if self.midrise else ""
        return f"EpsilonFormat(bits={self.bits},eps={self.eps:g}{mid})"
