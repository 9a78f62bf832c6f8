"""Number format types: a format is its parameters.

Every format codes one value in ``bits`` bits as *sign-magnitude*: when ``signed`` the top bit is
the sign, and the remaining bits are a *magnitude code* indexing an ascending table of
non-negative magnitudes (:meth:`NumberFormat.decode_table`). Minifloat magnitude codes are exactly
the OCP/IEEE bit patterns (their magnitudes grow with the pattern); symmetric integers and level
tables use the same sign-magnitude layout. Special codes (NaN, Inf) sit at the top of the magnitude
code range, so the finite magnitudes are a prefix of the table.

Because kernels only ever consume the tables (plus ``bits`` and ``signed``), a format registered
by a user needs no kernel code of its own.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

__all__ = [
    "EpsilonFormat",
    "Float32Format",
    "FloatFormat",
    "IntFormat",
    "LevelFormat",
    "NumberFormat",
]

_ROUNDINGS = ("nearest", "up", "down")


class NumberFormat:
    """Base class of every number format (subclasses are frozen dataclasses).

    Subclasses implement :meth:`_magnitude_values` (the value of every magnitude code, NaN and
    ±Inf included) and declare ``bits`` and ``signed``.
    """

    bits: int
    signed: bool

    # ---- what subclasses provide -------------------------------------------------------------
    def _magnitude_values(self) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    @property
    def kind(self) -> str:
        """How kernels treat the format: ``"table"`` (all formats but FP32) or ``"fp32"``."""
        return "table"

    # ---- derived tables ----------------------------------------------------------------------
    @property
    def magnitude_bits(self) -> int:
        """Bits of the magnitude code (``bits`` minus the sign bit)."""
        return self.bits - int(self.signed)

    @cached_property
    def _tables(self) -> tuple[np.ndarray, int]:
        # Kernels compute in float32, so a format *is* its float32-rounded table.
        vals = np.asarray(self._magnitude_values(), dtype=np.float64)
        vals = vals.astype(np.float32).astype(np.float64)
        if vals.ndim != 1 or len(vals) > 2**self.magnitude_bits or len(vals) == 0:
            raise ValueError(f"{self}: magnitude table has the wrong size")
        finite = np.isfinite(vals)
        n_finite = int(np.argmin(finite)) if not finite.all() else len(vals)
        if not finite[:n_finite].all() or finite[n_finite:].any():
            raise ValueError(f"{self}: special (non-finite) codes must follow all finite ones")
        f = vals[:n_finite]
        if n_finite == 0 or (f < 0).any() or (np.diff(f) <= 0).any():
            raise ValueError(
                f"{self}: finite magnitudes must be non-negative and strictly increasing "
                "(after rounding to float32)"
            )
        full = np.full(2**self.magnitude_bits, np.nan)
        full[: len(vals)] = vals
        return full, n_finite

    def decode_table(self) -> np.ndarray:
        """Value (float64) of every magnitude code ``0 … 2**magnitude_bits - 1``.

        Codes the format does not use decode to NaN.
        """
        return self._tables[0].copy()

    @property
    def n_finite(self) -> int:
        """Number of finite magnitude codes; they are codes ``0 … n_finite - 1``."""
        return self._tables[1]

    def magnitudes(self) -> np.ndarray:
        """The finite magnitudes, ascending (float64 holding float32-rounded values)."""
        return self._tables[0][: self.n_finite].copy()

    @property
    def max_value(self) -> float:
        """Largest finite magnitude."""
        return float(self._tables[0][self.n_finite - 1])

    @property
    def min_value(self) -> float:
        """Smallest finite magnitude (0 for formats that represent zero)."""
        return float(self._tables[0][0])

    @property
    def nan_code(self) -> int | None:
        """Magnitude code of NaN, or ``None`` when the format has no NaN."""
        t = self._tables[0]
        idx = np.flatnonzero(np.isnan(t[: self._n_defined]))
        return int(idx[0]) if len(idx) else None

    @property
    def inf_code(self) -> int | None:
        """Magnitude code of +Inf, or ``None`` when the format has no infinity."""
        t = self._tables[0]
        idx = np.flatnonzero(np.isinf(t))
        return int(idx[0]) if len(idx) else None

    @property
    def _n_defined(self) -> int:
        return len(np.asarray(self._magnitude_values()))

    def valid_codes(self) -> np.ndarray:
        """Every code (sign included) that the format defines, as int64, ascending."""
        mags = np.arange(self._n_defined, dtype=np.int64)
        if not self.signed:
            return mags
        return np.concatenate([mags, mags | (1 << self.magnitude_bits)])

    # ---- reference cast (NumPy, float64) -----------------------------------------------------
    def decode(self, codes: np.ndarray) -> np.ndarray:
        """Values of ``codes`` (any int array) as float64; the sign bit gives ``-0.0`` too."""
        c = np.asarray(codes, dtype=np.int64)
        if (c < 0).any() or (c >= 2**self.bits).any():
            raise ValueError(f"{self}: codes must lie in [0, 2**{self.bits})")
        mag = c & (2**self.magnitude_bits - 1)
        v = self._tables[0][mag]
        if self.signed:
            v = np.where((c >> self.magnitude_bits) & 1 == 1, -v, v)
        return v

    def encode(self, values: np.ndarray, rounding: str = "nearest") -> np.ndarray:
        """Reference cast of float values to codes (int64), saturating at ``±max_value``.

        Args:
            values: Any float array.
            rounding: ``"nearest"`` (ties to the even magnitude code, i.e. IEEE round-half-even
                for minifloats), ``"up"`` / ``"down"`` (towards larger / smaller magnitude).

        NaN maps to the NaN code and ±Inf to the Inf code (or NaN code) when the format has one;
        otherwise a non-finite value raises ``ValueError``: it is never made finite silently.
        Negative values raise for unsigned formats.
        """
        if rounding not in _ROUNDINGS:
            raise ValueError(f"rounding must be one of {_ROUNDINGS}, got {rounding!r}")
        x = np.asarray(values, dtype=np.float64)
        neg = np.signbit(x)
        if not self.signed and (neg & (x != 0) & ~np.isnan(x)).any():
            raise ValueError(f"{self} is unsigned; got negative values")
        a = np.abs(x)
        mags = self.magnitudes()
        finite = np.isfinite(a)
        af = np.where(finite, a, 0.0)
        lo = np.clip(np.searchsorted(mags, af, side="right") - 1, 0, len(mags) - 1)
        hi = np.minimum(lo + 1, len(mags) - 1)
        below = af < mags[lo]  # only possible when the table does not start at zero
        exact = mags[lo] == af
        if rounding == "down":
            idx = lo
        elif rounding == "up":
            idx = np.where(exact | below, lo, hi)
        else:
            dlo = af - mags[lo]
            dhi = mags[hi] - af
            idx = np.where(dlo < dhi, lo, np.where(dlo > dhi, hi, np.where(lo % 2 == 0, lo, hi)))
            idx = np.where(below, lo, idx)
        idx = idx.astype(np.int64)
        if not finite.all():
            nanc, infc = self.nan_code, self.inf_code
            is_nan = np.isnan(a)
            is_inf = np.isinf(a)
            if (is_nan.any() and nanc is None) or (is_inf.any() and infc is None and nanc is None):
                raise ValueError(f"{self} cannot represent NaN/Inf; refusing to make them finite")
            if is_nan.any():
                idx = np.where(is_nan, nanc, idx)
            if is_inf.any():
                idx = np.where(is_inf, infc if infc is not None else nanc, idx)
        if self.signed:
            idx = idx | (neg.astype(np.int64) << self.magnitude_bits)
        return idx

    def describe(self) -> str:
        """One-line human description (range, special values)."""
        specials = []
        if self.inf_code is not None:
            specials.append("inf")
        if self.nan_code is not None:
            specials.append("nan")
        sp = ",".join(specials) if specials else "no inf/nan"
        return (
            f"{self.bits}-bit {'signed' if self.signed else 'unsigned'}, "
            f"max {self.max_value:.6g}, {self.n_finite} magnitudes, {sp}"
        )


def _check_int(name: str, v: object, lo: int, hi: int) -> None:
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise ValueError(f"{name} must be an integer in [{lo}, {hi}], got {v!r}")


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

    Level ``r`` is ``((1+2ε²)**r - 1) / ((1+2ε²)**(L-1) - 1)`` for ``r = 0 … L-1``,
    ``L = 2**(bits-1)``; ``eps = 0`` gives uniform levels ``r / (L-1)``. With two levels
    (``bits = 2``) the table is ``{0, 1}`` whatever ``eps`` is.

    Args:
        bits: Code width including the sign bit, 2–16.
        eps: The ε parameter, ``>= 0``.
    """

    bits: int
    eps: float = 0.0
    signed: bool = field(default=True, init=False)

    def __post_init__(self) -> None:
        _check_int("bits", self.bits, 2, 16)
        if not (isinstance(self.eps, (int, float)) and math.isfinite(self.eps) and self.eps >= 0):
            raise ValueError(f"eps must be a finite number >= 0, got {self.eps!r}")
        object.__setattr__(self, "eps", float(self.eps))
        _ = self._tables

    def _magnitude_values(self) -> np.ndarray:
        n = 2 ** (self.bits - 1)
        r = np.arange(n, dtype=np.float64)
        q = 1.0 + 2.0 * self.eps**2
        if self.eps == 0 or q == 1.0:
            v = r / (n - 1)
        else:
            v = np.expm1(r * math.log(q)) / math.expm1((n - 1) * math.log(q))
        v = v.astype(np.float32).astype(np.float64)
        v[0], v[-1] = 0.0, 1.0
        # float32 rounding may merge neighbouring levels for tiny eps at 16 bits
        if (np.diff(v) <= 0).any():
            raise ValueError(f"eps={self.eps} gives levels that collide in float32")
        return v

    def __str__(self) -> str:
        return f"EpsilonFormat(bits={self.bits},eps={self.eps:g})"
