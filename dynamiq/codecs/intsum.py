"""The THC baseline as a partial-sum codec: integer codes summed exactly (docs/method.rst).

THC (NSDI'24) quantizes every rank's (randomly rotated, see the ``rht`` transform) vector onto
one uniform grid shared by all ranks, so that *integer indices* can be summed exactly along the
path ("homomorphic" compression); only the leaves round, nothing is ever re-quantized.

**Grid.** ``L = levels`` (odd) levels ``w * step`` for ``w = -A … A``, ``A = (L - 1) / 2``,
with ``step ≥ M / A`` and ``M`` the global maximum ``|x|`` over all ranks and coordinates (the
``absmax`` statistic: per-rank maxima per block of 256, rounded up to BF16, max-reduced; ``M``
is the largest of them). The grid therefore covers every rank's values: nothing clips, and
stochastic rounding onto it is unbiased.

**Messages** carry the partial sums ``W = Σ w_r`` of the ranks below the sender as
``headroom``-bit offset-binary integers (``W + 2**(headroom-1)``; code 0 is NaN). A sum of
``k`` ranks satisfies ``|W| ≤ A k``, so ``headroom = ceil(log2(2 A n + 1))`` bits always
suffice: with ``L = 15`` that is ``ceil(log2(14 n + 1))``, THC's ``ceil(log2(15 n + 1))`` bits
or fewer (8 bits up to 18 ranks). The sink's final sum decodes to ``step * W`` — equivalently
``step * (Σ_r c_r - n (L - 1) / 2)`` with ``c_r = w_r + A ∈ [0, L - 1]`` each rank's level index.

**Exact integer sums in float32 hops.** The hop operations keep the engine's contract
(``decompress_accumulate`` is ``acc += decompress(data)`` in float32), so exactness comes from
the grid: ``step`` is rounded *up* to ``25 - headroom`` significant bits (a relative change below
``2**(headroom - 24)``), which makes every ``W * step`` with ``|W| < 2**(headroom-1)`` and every
sum of such values exact in float32. Decoded messages, their sums along any tree (a ring's
chain, a butterfly node's several messages) and the re-encoding of such a sum (``floor`` of an
integer plus a uniform below 1 is that integer) are all exact. A rank's own raw value is
rounded once, where it is first encoded: at a leaf, ``compress(x)``; at an internal node, in
``decompress_accumulate_recompress``, where it enters as part of the float32 ``x + Σ D`` (so its
last bits are rounded to float32 next to the partial sum — a perturbation below
``2**(headroom-24)`` steps, far inside the quantization noise, and unbiased rounding is then
applied to the whole value, whose integer part is exact).

Why the level count is odd: a grid with a level at 0 is closed under addition, so a partial sum
decodes without knowing how many ranks it holds. With an even count (e.g. 16), the levels sit at
half-integer multiples of the step and the decode would need each message's rank count.

Outside a collective (a :class:`HopContext` without ``prepared`` values, or none) the step is 1
and the width ``headroom_bits`` (16 by default): the codec then rounds stochastically to
integers, saturating at ``±(2**(bits-1) - 1)``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from dynamiq.codecs.base import (
    CODECS,
    DecodeHops,
    HopContext,
    PartialSumCodec,
    _check_chunk,
    check_message,
    check_writeback,
    hop_kernels,
    message_buffer,
)
from dynamiq.kernels import Purpose
from dynamiq.rng import make_key
from dynamiq.spec import format_call

__all__ = ["IntSum", "IntSumPlan"]

#: Stream purpose of the leaves' rounding random numbers.
#: Widths the default headroom may reach before asking for an explicit ``headroom_bits``.
DEFAULT_MAX_BITS = 16
#: Widest headroom: products ``W * step`` stay exact with at least one significant step bit.
MAX_BITS = 24
#: Smallest step, float32's smallest normal value: every multiple of it is a normal float32
#: (exact sums without subnormals, which some GPUs flush), and gradients down to about 1e-37
#: still get a step of their own size.
MIN_STEP = 2.0**-126


@dataclass(frozen=True)
class IntSumPlan:
    """The per-call decision of an :class:`IntSum` codec (identical on every rank).

    Attributes:
        step: Grid step (a float32 value with at most ``25 - bits`` significant bits).
        bits: Headroom width: bits per coordinate of every message.
        scale: The global maximum ``M`` the step was derived from (NaN outside a collective).
    """

    step: float
    bits: int
    scale: float


def grid_step(scale: float, half_levels: int, bits: int) -> float:
    """``scale / half_levels`` rounded up to ``25 - bits`` significant bits (at least 2**-126)."""
    if not (math.isfinite(scale) and scale > 0):
        return MIN_STEP
    s = scale / half_levels
    if s <= MIN_STEP:
        return MIN_STEP
    p = 25 - bits
    unit = math.ldexp(1.0, math.frexp(s)[1] - p)  # s in [2**(e-1), 2**e): p bits above unit
    return max(MIN_STEP, math.ceil(s / unit) * unit)


@CODECS.register("intsum")
@dataclass(frozen=True)
class IntSum(DecodeHops, PartialSumCodec):
    """THC's homomorphic integer sums: leaves round stochastically, hops add integers exactly.

    Use after an ``rht`` transform (pipeline ``thc``). Equivalent to every rank sending
    ``w_r = SR(x_r / step)`` on a shared grid and the sink forming ``step * Σ_r w_r`` exactly
    (see the module doc for the grid, the wire format and the float32 argument).

    Args:
        levels: Odd number of levels ``L`` per rank (15: 4-bit leaf codes).
        headroom_bits: Bits per coordinate of every message; ``None`` derives
            ``ceil(log2((L - 1) n + 1))`` from the world size ``n`` at each call (at most 16;
            pass a value up to 24 for larger worlds).
        seed: Seed of the rounding random numbers (shared by all ranks).

    Raises:
        ValueError: an even or out-of-range level count, a headroom that cannot hold one
            rank's code, or a negative seed.
    """

    levels: int = 15
    headroom_bits: int | None = None
    seed: int = 0

    #: codes of 8 coordinates fill whole bytes at any width, so tiles concatenate exactly
    block_size = 8
    unbiased = True
    statistics = ("absmax",)

    def __post_init__(self) -> None:
        hb = self.headroom_bits
        if isinstance(hb, str):  # from a spec string: the field's type hint is not plain int
            if not re.fullmatch(r"[+-]?\d+", hb):
                raise ValueError(f"intsum headroom_bits must be an integer, got {hb!r}")
            hb = int(hb)
            object.__setattr__(self, "headroom_bits", hb)
        lv = self.levels
        if isinstance(lv, bool) or not isinstance(lv, int) or lv < 3 or lv % 2 == 0 or lv >= 2**16:
            raise ValueError(
                f"intsum levels must be an odd integer in [3, 65535], got {lv!r} (an odd count "
                "puts a level at 0, so partial sums decode without knowing how many ranks they "
                "hold; 15 levels fit 4-bit codes)"
            )
        if hb is not None:
            if isinstance(hb, bool) or not isinstance(hb, int) or not 2 <= hb <= MAX_BITS:
                raise ValueError(f"intsum headroom_bits must be None or an integer in "
                                 f"[2, {MAX_BITS}], got {hb!r}")
            if (1 << (hb - 1)) - 1 < self.half_levels:
                raise ValueError(f"intsum headroom_bits={hb} cannot hold one rank's code of "
                                 f"{lv} levels (needs {self.bits_for(1)})")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"intsum seed must be a non-negative int, got {self.seed!r}")

    # ---- configuration ----------------------------------------------------------------------
    @property
    def half_levels(self) -> int:
        """``A = (levels - 1) / 2``: codes of one rank lie in ``[-A, A]``."""
        return (self.levels - 1) // 2

    def bits_for(self, world_size: int) -> int:
        """``ceil(log2((levels - 1) n + 1))``: the narrowest exact headroom for ``n`` ranks."""
        return max(2, (2 * self.half_levels * world_size).bit_length())

    @property
    def variable_size(self) -> bool:  # type: ignore[override]
        return self.headroom_bits is None

    @property
    def _max_bits(self) -> int:
        return DEFAULT_MAX_BITS if self.headroom_bits is None else self.headroom_bits

    # ---- the metadata phase -------------------------------------------------------------------
    def prepare(self, stats: Mapping[str, torch.Tensor], length: int, world_size: int,
                state: dict) -> IntSumPlan:
        """Headroom for ``world_size`` ranks and the grid step from the global maximum.

        Args:
            stats: Global statistics; reads float64 ``stats["absmax"]`` (blocks of 256).
            length: Vector length (unused: the scale is global).
            world_size: Number of ranks ``n``.
            state: Unused (THC keeps no state between calls).

        Raises:
            ValueError: the headroom cannot hold the sum of ``n`` ranks' codes.
        """
        need = self.bits_for(world_size)
        if self.headroom_bits is None:
            if need > DEFAULT_MAX_BITS:
                raise ValueError(
                    f"intsum needs {need} headroom bits for {world_size} ranks, more than the "
                    f"default maximum {DEFAULT_MAX_BITS}; pass headroom_bits (up to {MAX_BITS})"
                )
            bits = need
        else:
            bits = self.headroom_bits
            if (1 << (bits - 1)) - 1 < self.half_levels * world_size:
                raise ValueError(f"intsum headroom_bits={bits} cannot hold the sum of "
                                 f"{world_size} ranks' codes (needs {need})")
        amax = stats["absmax"].double()
        finite = amax[torch.isfinite(amax)]
        scale = float(finite.max()) if finite.numel() else 0.0
        return IntSumPlan(grid_step(scale, self.half_levels, bits), bits, scale)

    def _plan(self, ctx: HopContext | None) -> IntSumPlan:
        plan = self.plan_in(ctx)
        return IntSumPlan(1.0, self._max_bits, float("nan")) if plan is None else plan

    # ---- sizes --------------------------------------------------------------------------------
    def wire_bytes(self, n: int, ctx: HopContext | None = None) -> int:
        """``ceil(n * bits / 8)`` with this call's headroom ``bits``."""
        return -(-n * self._plan(ctx).bits // 8)

    def max_wire_bytes(self, n: int) -> int:
        """At ``headroom_bits``, or the default maximum of 16 bits per coordinate."""
        return -(-n * self._max_bits // 8)

    # ---- hop operations -----------------------------------------------------------------------
    def _key(self, ctx: HopContext) -> tuple[int, int]:
        return make_key(self.seed, *ctx.stream, ctx.rank, Purpose.INTSUM)

    def compress(self, x, ctx, out=None):
        """Packed ``bits``-bit codes of ``SR(x / step)`` for the float32 chunk ``x`` ``[n]``."""
        _check_chunk(x)
        plan = self._plan(ctx)
        n = x.numel()
        out = message_buffer(-(-n * plan.bits // 8), out, x.device)
        hop_kernels(ctx, x).intsum_encode(x, plan.step, plan.bits, self._key(ctx),
                                          ctx.index_offset, out)
        return out

    def _decode(self, data: torch.Tensor, out: torch.Tensor, ctx: HopContext | None,
                accumulate: bool) -> None:
        _check_chunk(out, "output")
        plan = self._plan(ctx)
        data = check_message(data, -(-out.numel() * plan.bits // 8))
        hop_kernels(ctx, out).intsum_decode(data, plan.step, plan.bits, out, accumulate)

    def decompress_accumulate_recompress(self, data, acc, ctx, out=None, writeback="none"):
        """``compress(acc + decompress(data))`` in one pass."""
        wb = check_writeback(writeback)
        _check_chunk(acc, "accumulator")
        plan = self._plan(ctx)
        nbytes = -(-acc.numel() * plan.bits // 8)
        out = message_buffer(nbytes, out, acc.device)
        data = check_message(data, nbytes)
        hop_kernels(ctx, acc).intsum_recompress(data, acc, plan.step, plan.bits, self._key(ctx),
                                                ctx.index_offset, wb, out)
        return out

    def spec(self) -> str:
        return format_call("intsum", self)
