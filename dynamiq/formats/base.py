"""The number format base class: a format is its parameters, and its tables follow from them.

Every format codes one value in ``bits`` bits as *sign-magnitude*: when ``signed`` the top bit is
the sign, and the remaining bits are a *magnitude code* indexing an ascending table of
non-negative magnitudes (:meth:`NumberFormat.decode_table`). Minifloat magnitude codes are exactly
the OCP/IEEE bit patterns (their magnitudes grow with the pattern); symmetric integers and level
tables use the same sign-magnitude layout. Special codes (NaN, Inf) sit at the top of the magnitude
code range, so the finite magnitudes are a prefix of the table.

Because kernels only ever consume the tables (plus ``bits`` and ``signed``), a format registered
by a user needs no kernel code of its own: a subclass only lists its magnitudes.
"""

from __future__ import annotations

from functools import cached_property

import numpy as np

__all__ = ["NumberFormat"]

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
    def midrise(self) -> bool:
        """Whether the signed grid has no zero level (a *mid-rise* grid).

        The magnitudes then all exceed zero, so the ``2**bits`` codes are ``2**bits`` distinct
        values, and a value between ``-min_value`` and ``min_value`` rounds to one of the two
        (stochastic rounding crosses zero; the block kernels implement it). Formats with a
        zero level spend two codes on ``±0``. False unless a subclass says otherwise.
        """
        return False

    def level_gaps(self) -> np.ndarray:
        """Gaps between neighbouring values of the grid's non-negative half, from zero up.

        The magnitudes' differences; a mid-rise grid's first gap is the one across zero, twice
        its first level (a value below that level rounds between ``±min_value``). Gap ``i``
        covers the magnitudes from ``np.union1d([0], magnitudes())[i]`` to the next.
        """
        m = self.magnitudes()
        gaps = np.diff(m)
        return np.concatenate([[2.0 * m[0]], gaps]) if self.midrise else gaps

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
    # bool is an int subclass, but ``bits=True`` is a mistake, not 1
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise ValueError(f"{name} must be an integer in [{lo}, {hi}], got {v!r}")
