"""The metadata phase: per-block statistics that components need before the main sum.

A component (codec or transform) lists the statistics it needs in its ``statistics``
attribute, e.g. ``("sum", "sumsq")`` for mean-centering and variance-driven bit allocation. The
executor computes them on every rank's (transformed) vector, per block of the statistic's
``block`` coordinates (a super-group of :data:`SUPER_GROUP` for the built-in ones), and combines
them across ranks in one small exchange before the main all-reduce (a sum for additive
statistics, a max for ``absmax``), so every rank sees the same global values; they reach the
codecs through :class:`~dynamiq.codecs.HopContext`.

**What travels.** Every rank's values are rounded to their statistic's wire format before the
exchange, additive ones to nearest, maxima upwards so that they stay bounds:

* ``"bf16"`` (two BF16 values per super-group in the paper's setting), 16 bits per value;
  additive statistics (sums, energies) travel under a per-vector power-of-two shift
  (:func:`round_bf16_shifted`, one more byte per vector), so that squares of tiny or huge
  gradients stay inside BF16's range; maxima travel as plain BF16, rounded up, with a NaN
  sent as ``+inf`` (every reduction order then agrees); finite values never become infinite
  (they saturate at the largest BF16 value);
* ``"fp8"`` (:func:`round_fp8`): 3 mantissa bits and 4 exponent bits plus a sign (5 exponent
  bits for a non-negative statistic) under a power-of-two shift that each rank picks per vector
  from its own largest value (so 16, resp. 32, binades below it are covered, and smaller values
  round to multiples of the lowest step), 8 bits per value plus one shift byte per vector.
  The statistics DynamiQ's allocation and centering need are well served by 8 bits (a
  relative error of at most 1/16), at half the cost.

Each rank takes its values with :func:`dynamiq.collectives.statistics.local_statistics` (on the
kernel backend of the vector's device). Every value of either format is a BF16 value under a
per-vector power-of-two shift (:func:`wire_shift`), so below 8 ranks the exchange is an
all-gather of 16 bits per value (:func:`pack_bf16`, cheaper there than an all-reduce) and every
rank sums the ranks' values itself in float64; from 8 ranks on it is a float64 all-reduce. Either
way a sum of ``n`` such values is exact in float64 unless their exponents span more than 45
binades, so every executor (and every order of summation) obtains the same global values. The
wire cost is accounted per format (:func:`metadata_bits`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import torch

from dynamiq.registry import Registry

__all__ = [
    "STATISTICS",
    "SUPER_GROUP",
    "Statistic",
    "combine",
    "metadata_bits",
    "pack_bf16",
    "round_bf16",
    "round_bf16_shifted",
    "round_fp8",
    "unpack_bf16",
    "wire_shift",
]

#: Coordinates per super-group over which the built-in statistics are taken.
SUPER_GROUP = 256

_REDUCES = ("sum", "max")
_WIRES = {"bf16": 16, "fp8": 8}
#: fp8 statistics: mantissa bits and exponent values (4 exponent bits) under the shift
_FP8_MANT = 3
#: The largest finite BF16 value, where finite statistics saturate.
BF16_MAX = float(torch.finfo(torch.bfloat16).max)
#: exponent of BF16's smallest subnormal, 2**-133
_BF16_MIN_EXP = -133
#: exponent of float64's smallest subnormal, 2**-1074
_F64_MIN_EXP = -1074


@dataclass(frozen=True)
class Statistic:
    """A per-block statistic and how ranks' values combine.

    Attributes:
        reduce: ``"sum"`` or ``"max"`` across ranks.
        local: float64 ``[blocks, block]`` (zero-padded) → float64 ``[blocks]`` on one rank.
        block: Coordinates per block (a power of two).
        wire: How each value travels: ``"bf16"`` or ``"fp8"`` (see the module doc).
        op: The backends' block reduction equal to :attr:`local` (one of
            :data:`dynamiq.kernels.STAT_OPS`), so that the statistic is taken where the vector
            lives (e.g. on the GPU); ``None``: :attr:`local` runs on the CPU in float64.
        signed: Whether values may be negative (an ``"fp8"`` statistic that cannot spends its
            sign bit on exponent range).
    """

    reduce: str
    local: Callable[[torch.Tensor], torch.Tensor]
    block: int = SUPER_GROUP
    wire: str = "bf16"
    op: str | None = None
    signed: bool = True

    def __post_init__(self) -> None:
        if self.reduce not in _REDUCES:
            raise ValueError(f"reduce must be one of {_REDUCES}, got {self.reduce!r}")
        if self.block < 1 or self.block & (self.block - 1):
            raise ValueError(f"block must be a power of two, got {self.block!r}")
        if self.wire not in _WIRES:
            raise ValueError(f"wire must be one of {tuple(_WIRES)}, got {self.wire!r}")
        if self.wire == "fp8" and self.reduce == "max":
            raise ValueError("fp8 statistics are additive ones (maxima travel as bf16)")

    def round(self, t: torch.Tensor) -> torch.Tensor:
        """One rank's float64 values as they travel (rounded to :attr:`wire`).

        A maximum of a block holding a NaN travels as ``+inf``: reductions disagree on NaN
        (``torch.amax`` propagates it, a backend's elementwise ``max`` may drop it depending on
        the order), while ``+inf`` is the maximum in every order, so every executor sees the
        same global value.
        """
        if self.wire == "fp8":
            # a non-negative statistic (an energy) keeps non-zero values non-zero, so that
            # a super-group with energy is never taken for an empty one
            return round_fp8(t, exponents=16 if self.signed else 32, keep_nonzero=not self.signed)
        if self.reduce == "sum":
            return round_bf16_shifted(t, keep_nonzero=not self.signed)
        r = round_bf16(t, up=True)
        return torch.where(torch.isnan(r), torch.full_like(r, math.inf), r)

    def bits(self, length: int) -> int:
        """Wire bits of this statistic for a vector of ``length`` (one rank)."""
        per = _WIRES[self.wire] * self.blocks(length)
        # additive statistics travel under a per-vector shift byte
        return per + 8 if self.reduce == "sum" else per

    def blocks(self, length: int) -> int:
        """Number of values for a vector of ``length`` coordinates."""
        return -(-length // self.block)


STATISTICS: Registry[Statistic] = Registry("statistic")
STATISTICS.register("sum", Statistic("sum", lambda g: g.sum(1), op="sum"))
STATISTICS.register("sumsq", Statistic("sum", lambda g: (g * g).sum(1), signed=False, op="sumsq"))
STATISTICS.register("absmax", Statistic("max", lambda g: g.abs().amax(1), op="absmax"))
# sum of squares about the rank's own block mean: no cancellation when the mean dominates
STATISTICS.register(
    "csumsq", Statistic("sum", lambda g: ((g - g.mean(1, keepdim=True)) ** 2).sum(1),
                        signed=False, op="csumsq")
)
STATISTICS.register("sum8", Statistic("sum", lambda g: g.sum(1), wire="fp8", op="sum"))
STATISTICS.register(
    "csumsq8", Statistic("sum", lambda g: ((g - g.mean(1, keepdim=True)) ** 2).sum(1), wire="fp8",
                         signed=False, op="csumsq")
)
STATISTICS.register("absmax32", Statistic("max", lambda g: g.abs().amax(1), block=32,
                                          op="absmax"))
STATISTICS.register("absmax16", Statistic("max", lambda g: g.abs().amax(1), block=16,
                                          op="absmax"))


def round_bf16(t: torch.Tensor, up: bool = False) -> torch.Tensor:
    """float64 → the nearest BF16 value (ties to even), or the next one up in magnitude.

    Finite values stay finite: magnitudes beyond the largest BF16 value (``BF16_MAX``, about
    ``3.39e38``) saturate to it, so that a non-finite statistic always means a non-finite
    input (a sum of squares of large gradients must not look like an Inf).

    Args:
        t: float64 tensor.
        up: Round magnitudes upwards instead (keeps a maximum a bound, up to ``BF16_MAX``).

    Returns:
        float64 tensor of BF16-representable values (non-finite values pass through).
    """
    b = t.to(torch.bfloat16)
    if up:
        low = b.double().abs() < t.abs()
        if bool(low.any()):
            bits = b.view(torch.int16)
            b = torch.where(low, (bits + 1).view(torch.bfloat16), b)
    out = b.double()
    over = torch.isinf(out) & torch.isfinite(t)
    if bool(over.any()):
        out = torch.where(over, torch.copysign(torch.full_like(out, BF16_MAX), t), out)
    return out


def _magnitudes(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int | None]:
    """``(finite mask, |t| with non-finite values as 0, floor(log2) of the largest finite
    magnitude)`` of one rank's values; the exponent is ``None`` when all are 0 or non-finite.
    The per-vector shift of the statistics' wire formats is taken from it."""
    finite = torch.isfinite(t)
    a = torch.where(finite, t.abs(), torch.zeros_like(t))
    if a.numel() == 0 or float(a.max()) == 0.0:
        return finite, a, None
    return finite, a, int(torch.frexp(a.max()).exponent) - 1


def round_bf16_shifted(t: torch.Tensor, keep_nonzero: bool = False) -> torch.Tensor:
    """float64 → BF16 values under a per-vector power-of-two shift (the ``"bf16"`` wire of an
    additive statistic).

    The shift ``s`` is a multiple of 4 at most the exponent of the largest finite magnitude
    (so one byte spans the exponents of sums and squares of float32 values); every value is
    rounded as ``round_bf16(t / 2**s) * 2**s``. The statistic is thereby independent of the
    vector's scale: a sum of squares of tiny (or huge) gradients neither underflows nor
    overflows BF16's range, it only has to fit float64's.

    Args:
        t: float64 tensor (one rank's values).
        keep_nonzero: Round non-zero values that would become 0 to the smallest BF16 step
            under the shift instead (an energy must not read as an empty block).

    Returns:
        float64 tensor, same shape, 8 significant bits per value (non-finite values pass
        through).
    """
    finite, _, top = _magnitudes(t)
    if top is None:
        return t.clone()
    shift = top - top % 4
    r = torch.ldexp(round_bf16(torch.ldexp(t, torch.tensor(-shift))), torch.tensor(shift))
    if keep_nonzero:
        tiny = torch.ldexp(torch.ones_like(t), torch.tensor(shift + _BF16_MIN_EXP))
        r = torch.where((r == 0) & (t != 0), torch.copysign(tiny, t), r)
    return torch.where(finite, r, t)


def round_fp8(t: torch.Tensor, exponents: int = 16, keep_nonzero: bool = False) -> torch.Tensor:
    """float64 → the ``"fp8"`` wire values: 3 mantissa bits, ``exponents`` binades under a shift.

    The shift is the exponent of the largest finite magnitude in ``t`` (one rank's vector):
    values keep 4 significant bits (ties to even) down to ``exponents - 1`` binades below it;
    smaller ones round to multiples of the lowest binade's step (so they may become 0). Every
    result is a float64 with at most 4 significant bits, hence sums of them are exact.

    Args:
        t: float64 tensor.
        exponents: Binades covered: 16 (sign + 4 exponent bits) or 32 (5 exponent bits, for
            non-negative values).
        keep_nonzero: Round non-zero values that would become 0 to the lowest step instead.

    Returns:
        float64 tensor, same shape (non-finite values pass through).
    """
    finite, a, top = _magnitudes(t)
    if top is None:
        return t.clone()
    lowest = top + 2 - exponents  # the top binade may be reached by rounding up
    e = torch.frexp(torch.where(a > 0, a, torch.ones_like(a))).exponent - 1
    # the step never goes below float64's smallest subnormal, where it would flush to zero (and
    # t / step become inf): near the bottom of float64 every value is a multiple of it anyway
    floor = _F64_MIN_EXP + _FP8_MANT
    step = torch.ldexp(torch.ones_like(t), e.clamp_min(max(lowest, floor)) - _FP8_MANT)
    r = torch.round(t / step) * step
    if keep_nonzero:
        r = torch.where((r == 0) & (t != 0), torch.sign(t) * step, r)
    return torch.where(finite, r, t)


def wire_shift(name: str, t: torch.Tensor) -> int:
    """The power of two under which one rank's values of statistic ``name`` (as
    :meth:`Statistic.round` left them) are BF16 values exactly: ``t / 2**shift`` loses nothing
    in BF16, so a rank can send them in 16 bits and every receiver gets them back bit for bit.

    fp8 values have 4 significant bits within 32 binades below their largest magnitude (the
    shift is its exponent); shifted BF16 sums are BF16 under their own shift; maxima are plain
    BF16 (shift 0).
    """
    st = STATISTICS[name]
    _, _, top = _magnitudes(t)
    if top is None or (st.wire == "bf16" and st.reduce == "max"):
        return 0
    return top if st.wire == "fp8" else top - top % 4


def _times_pow2(t: torch.Tensor, e: int) -> torch.Tensor:
    """``t * 2**e`` exactly where the result is representable, for any exponent of float64's
    range (``torch.ldexp`` forms ``2**e`` itself, which overflows past ``2**1023``); the steps
    move monotonically towards the result, so none overflows or rounds early."""
    while e:
        k = max(-1000, min(1000, e))
        t = t * (2.0**k)
        e -= k
    return t


def pack_bf16(values: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """One rank's statistics (names of :data:`STATISTICS`, values as rounded for the wire) in
    16 bits each: int16 ``[len(values) + Σ sizes]``, the shifts (:func:`wire_shift`) first, then
    every statistic's BF16 bits under its shift, in the mapping's order. Inverse:
    :func:`unpack_bf16`."""
    shifts = [wire_shift(n, t) for n, t in values.items()]
    parts = [torch.tensor(shifts, dtype=torch.int16)]
    for t, sh in zip(values.values(), shifts):
        b = _times_pow2(t, -sh).to(torch.bfloat16)
        parts.append(b.view(torch.int16))
    return torch.cat(parts)


def unpack_bf16(payload: torch.Tensor, sizes: Mapping[str, int]) -> dict[str, torch.Tensor]:
    """Inverse of :func:`pack_bf16`: name → float64 values, for names and sizes in the packed
    order."""
    k = len(sizes)
    shifts = payload[:k].tolist()
    out, off = {}, k
    for (n, size), sh in zip(sizes.items(), shifts):
        b = payload[off:off + size].view(torch.bfloat16).double()
        out[n] = _times_pow2(b, int(sh))
        off += size
    return out


def combine(per_rank: list[Mapping[str, torch.Tensor]], reduces: Mapping[str, str] | None = None
            ) -> dict[str, torch.Tensor]:
    """Global values from every rank's metadata (ranks in order): sums or maxima by name.

    Args:
        per_rank: One mapping per rank, name → float64 tensor.
        reduces: ``name → "sum" | "max"`` for names not in :data:`STATISTICS`.
    """
    out = {}
    for name in per_rank[0]:
        kind = (reduces or {}).get(name) or STATISTICS[name].reduce
        rows = [m[name] for m in per_rank]
        if kind == "max":
            out[name] = torch.stack(rows).amax(0)
        else:
            acc = rows[0].clone()
            for r in rows[1:]:
                acc += r
            out[name] = acc
    return out


def metadata_bits(names: Iterable[str], length: int) -> int:
    """Bits per rank that the statistics ``names`` cost for a vector of ``length``
    (:meth:`Statistic.bits`: 16 per BF16 value; 8 per fp8 value plus a shift byte)."""
    return sum(STATISTICS[n].bits(length) for n in names)
