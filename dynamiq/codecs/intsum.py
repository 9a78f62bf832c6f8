"""The THC baseline as a partial-sum codec: integer codes summed exactly (docs/method.rst).

THC (NSDI'24) quantizes every rank's (randomly rotated, see the ``rht`` transform) vector onto
one grid shared by all ranks, so that *integer indices* can be summed exactly along the path
("homomorphic" compression); only a rank's own values round, nothing is ever re-quantized.
Two scalings of the grid, chosen by ``clamp``:

* **max-scaled** (``clamp=None``, the ``thc-maxscale`` pipeline): ``L = levels`` (odd) uniform
  levels ``w * step``, ``w = -A … A``, ``A = (L - 1) / 2``, ``step ≥ M / A`` with ``M`` the global
  maximum ``|x|`` over all ranks and coordinates (the ``absmax`` statistic). Nothing clips, and
  stochastic rounding onto the grid is unbiased.
* **clamped** (``clamp=T``, THC as its authors run it, the ``thc`` pipeline): per block of
  ``block`` coordinates (the Hadamard block) with ``σ = ‖x‖ / √B`` (``‖x‖`` the largest norm
  of the block over the ranks, exchanged in the metadata phase), every rank clamps its values to
  ``±T σ`` and rounds them, once and before any hop (:meth:`IntSum.round_own`), stochastically
  to one of ``L`` levels chosen from a fine grid of ``g + 1`` points ``(c - g/2) * step``,
  ``step = 2 T σ / g`` (:mod:`dynamiq.codecs.thc_levels`: the levels optimal for a Gaussian,
  ``T`` from its table with ``clamp="auto"``). The clamp is the only bias. With ``first``, the
  rotated vector's first coordinate of every block skips the grid: its exact sum travels in the
  metadata phase (float32 values summed in float64) and replaces the grid's value in the result.

**Messages** carry the partial sums ``W`` of the ranks below the sender as ``bits``-bit
offset-binary integers (``W + 2**(bits-1)``; code 0 is NaN), in units of ``step``: a partial
sum of ``k`` ranks lies in ``[-k g/2, k g/2]`` (``g = L - 1`` for the max-scaled grid), so
``bits = (ceil(n g / 2)).bit_length() + 1`` bits always hold the sum of all ``n`` ranks: THC's
``ceil(log2(g n + 1))`` except when ``g n + 1`` is a power of two (one more bit then, as
offset binary spends a code on NaN), e.g. ``ceil(log2(15 n + 1))`` for THC's 16 uniform levels
(7 bits up to 8 ranks) and ``ceil(log2(14 n + 1))`` for 15 max-scaled levels. An odd ``k g``
puts the values on odd multiples of ``step / 2``: such a message is coded with a *shift* of
1/2 (``W = v / step + 1/2``), which the decoder knows from the producer's
:attr:`~dynamiq.codecs.HopContext.summands`.

**Exact integer sums in float32 hops.** The hop operations keep the engine's contract
(``decompress_accumulate`` is ``acc += decompress(data)`` in float32), so exactness comes from
the grid: ``step`` is rounded *up* to ``25 - bits`` significant bits (``24 - bits`` for the
clamped grid, whose values may be multiples of ``step / 2``), which makes every grid value of a
partial sum, and every sum of such values, exact in float32; re-encoding a value on the grid
(``floor`` of an integer plus a uniform below 1 is that integer) is exact too. The max-scaled
grid is shift invariant, so there a rank's raw value may also enter at an internal node, in
``decompress_accumulate_recompress``, as part of the float32 ``x + Σ D`` (its last bits rounded
to float32 next to the partial sum — a perturbation below ``2**(bits-24)`` steps, far inside
the quantization noise; unbiased rounding is then applied to the whole value, whose integer
part is exact). THC's non-uniform levels are not: a partial sum cannot be rounded onto them,
which is why their rounding happens in :meth:`~IntSum.round_own`.

Outside a collective (a :class:`HopContext` without ``prepared`` values, or none) the step is 1
and the width ``headroom_bits`` (16 by default): the codec then rounds stochastically to
integers, saturating at ``±(2**(bits-1) - 1)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from dynamiq.codecs.base import (
    CODECS,
    DecodeHops,
    HopContext,
    Metadata,
    PartialSumCodec,
    _check_chunk,
    check_message,
    check_writeback,
    hop_kernels,
    message_buffer,
)
from dynamiq.codecs.intsum_grid import (
    DEFAULT_MAX_BITS,
    MAX_BITS,
    ClampedGrid,
    IntSumPlan,
    check_params,
    grid_step,
)
from dynamiq.kernels import Purpose, Writeback
from dynamiq.rng import make_key
from dynamiq.spec import format_call

__all__ = ["IntSum", "IntSumPlan", "grid_step"]


@CODECS.register("intsum")
@dataclass(frozen=True)
class IntSum(DecodeHops, PartialSumCodec):
    """THC's homomorphic integer sums: ranks round stochastically, hops add integers exactly.

    Use after an ``rht`` transform (pipelines ``thc``, ``thc-maxscale``). Equivalent to every
    rank sending its grid index ``c_r`` (``SR(x_r / step)`` on the max-scaled grid; clamped and
    rounded to THC's levels on the clamped one) and the sink forming ``step * (Σ_r c_r - n g/2)``
    exactly (see the module doc for the grids, the wire format and the float32 argument).

    Args:
        levels: Number of levels ``L`` per rank: odd for the max-scaled grid (15: 4-bit leaf
            codes with a level at 0); any count in ``[2, granularity + 1]`` when clamped (16:
            THC's 4-bit indices).
        headroom_bits: Bits per coordinate of every message; ``None`` derives the narrowest
            exact width from the world size ``n`` at each call (at most 16; pass a value up to
            24 for larger worlds).
        seed: Seed of the rounding random numbers (shared by all ranks).
        clamp: ``None``: the max-scaled grid (today's ``thc-maxscale``). A number ``T``: clamp
            at ``±T σ`` per block (THC). ``"auto"``: ``T`` from THC's table
            (:func:`~dynamiq.codecs.thc_levels.optimal_clamp` of ``levels`` and ``granularity``).
        granularity: ``g``, grid steps across the clamp range, at least ``levels - 1`` (the
            default: uniform levels) and at most 1024; clamped grids only.
        block: Coordinates per block of the clamped grid's ``σ`` and of ``first`` (the Hadamard
            block of the preceding ``rht``): a power of two in ``[256, 2**30]``.
        first: Sum every block's first coordinate exactly instead of on the grid.

    Raises:
        ValueError: a level count, granularity, clamp, block, headroom or seed out of range (the
            message says which and why).
    """

    levels: int = 15
    headroom_bits: int | None = None
    seed: int = 0
    clamp: float | str | None = None
    granularity: int | None = None
    block: int = 1 << 16
    first: bool = False
    _grid: ClampedGrid | None = field(init=False, repr=False, compare=False, hash=False,
                                      default=None)

    #: codes of 8 coordinates fill whole bytes at any width, so tiles concatenate exactly
    block_size = 8

    def __post_init__(self) -> None:
        hb, clamp = check_params(self)
        object.__setattr__(self, "headroom_bits", hb)
        object.__setattr__(self, "clamp", clamp)
        if clamp is not None:
            object.__setattr__(self, "_grid", ClampedGrid.of(self.levels, self.fine, clamp))

    @classmethod
    def examples(cls) -> list[IntSum]:
        """The max-scaled grid and THC's clamped one, uniform (granularity 15, first
        coordinates apart) and non-uniform (granularity 30), on blocks of 256 so that a chunk
        spans several block steps."""
        return [cls(), cls(levels=16, clamp="auto", first=True, block=256),
                cls(levels=16, clamp="auto", granularity=30, block=256)]

    # ---- configuration ----------------------------------------------------------------------
    @property
    def half_levels(self) -> int:
        """``A = (levels - 1) / 2`` of the max-scaled grid: codes of one rank lie in ``[-A, A]``."""
        return (self.levels - 1) // 2

    @property
    def fine(self) -> int:
        """``g``: grid steps between the lowest and the highest level."""
        return self.levels - 1 if self.granularity is None else self.granularity

    @property
    def unbiased(self) -> bool:  # type: ignore[override]
        """Only the max-scaled grid is unbiased (THC's clamp biases large values)."""
        return self.clamp is None

    @property
    def statistics(self) -> tuple[str, ...]:  # type: ignore[override]
        return ("absmax",) if self.clamp is None else ()

    @property
    def rounds_own(self) -> bool:  # type: ignore[override]
        return self.clamp is not None or self.first

    def bits_for(self, world_size: int) -> int:
        """The narrowest exact headroom for ``n`` ranks: ``(ceil(n g / 2)).bit_length() + 1``."""
        return max(2, (-(-world_size * self.fine // 2)).bit_length() + 1)

    @property
    def variable_size(self) -> bool:  # type: ignore[override]
        return self.headroom_bits is None

    @property
    def _max_bits(self) -> int:
        return DEFAULT_MAX_BITS if self.headroom_bits is None else self.headroom_bits

    # ---- the metadata phase -------------------------------------------------------------------
    def metadata_bits(self, length: int) -> int:
        """The clamped grid's block scales (16 bits each) and, with ``first``, the blocks' first
        coordinates (32 bits each)."""
        blocks = -(-length // self.block)
        return (16 * blocks if self.clamp is not None else 0) + (32 * blocks if self.first else 0)

    def local_metadata(self, y: torch.Tensor, state: dict, backend: str = "auto") -> Metadata:
        """This rank's block scales (max-reduced) and first coordinates (summed)."""
        return ClampedGrid.local_metadata(self, y)

    def prepare(self, stats: Mapping[str, torch.Tensor], length: int, world_size: int,
                state: dict) -> IntSumPlan:
        """Headroom for ``world_size`` ranks and the grid steps.

        Args:
            stats: Global metadata; reads float64 ``stats["absmax"]`` (max-scaled grid) or
                ``stats["intsum.sigma"]`` (clamped grid: every block's largest scale
                ``‖x‖ / √B`` over the ranks) and, with ``first``, ``stats["intsum.first"]``.
            length: Vector length.
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
            if (1 << (bits - 1)) - 1 < -(-self.fine * world_size // 2):
                raise ValueError(f"intsum headroom_bits={bits} cannot hold the sum of "
                                 f"{world_size} ranks' codes (needs {need})")
        first = None
        if self.first:
            first = stats["intsum.first"].to(torch.float32)
        if self.clamp is None:
            amax = stats["absmax"].double()
            finite = amax[torch.isfinite(amax)]
            scale = float(finite.max()) if finite.numel() else 0.0
            return IntSumPlan(grid_step(scale, self.half_levels, bits), bits, scale,
                              fine=self.fine, block=self.block, first=first)
        assert self._grid is not None
        steps = self._grid.steps(stats["intsum.sigma"], bits)
        return IntSumPlan(float("nan"), bits, float("nan"), steps=steps, fine=self.fine,
                          block=self.block, first=first)

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
    def _key(self, ctx: HopContext, purpose: Purpose = Purpose.INTSUM) -> tuple[int, int]:
        return make_key(self.seed, *ctx.stream, ctx.rank, purpose)

    def round_own(self, x: torch.Tensor, ctx: HopContext) -> None:
        """THC's rounding of this rank's chunk ``x`` (float32 ``[n]``, in place): clamp to
        ``±T σ`` and round to the levels, block by block; with ``first``, every block's first
        coordinate becomes the grid point nearest 0 (its exact sum replaces it at the end)."""
        _check_chunk(x)
        plan = self.plan_in(ctx)
        if plan is None:
            return
        be = hop_kernels(ctx, x)
        if self._grid is not None:
            key = self._key(ctx, Purpose.LEVELS)
            for lo, hi, step in plan.segments(ctx.index_offset, x.numel()):
                part = x[lo:hi]
                be.intsum_round(part, step, self._grid.levels, key, ctx.index_offset + lo, part)
            for lo, hi in plan.poisoned(ctx.index_offset, x.numel()):
                x[lo:hi] = float("nan")  # a non-finite input poisons its block on every rank
        if self.first:
            pos, blocks = plan.firsts(ctx.index_offset, x.numel())
            if pos.numel():
                near0 = [0.5 * plan.block_step(j) * (self.fine % 2) for j in blocks.tolist()]
                x[pos.to(x.device)] = torch.tensor(near0, dtype=torch.float32, device=x.device)

    def compress(self, x, ctx, out=None):
        """Packed ``bits``-bit codes of ``SR(x / step + shift)`` for the float32 chunk ``x``."""
        _check_chunk(x)
        plan = self._plan(ctx)
        n = x.numel()
        out = message_buffer(-(-n * plan.bits // 8), out, x.device)
        be = hop_kernels(ctx, x)
        shift = plan.shift(ctx)
        key = self._key(ctx)
        for lo, hi, step in plan.segments(ctx.index_offset, n):
            be.intsum_encode(x[lo:hi], step, plan.bits, key, ctx.index_offset + lo,
                             plan.byte_slice(out, lo, hi), shift)
        return out

    def _decode(self, data: torch.Tensor, out: torch.Tensor, ctx: HopContext | None,
                accumulate: bool) -> None:
        _check_chunk(out, "output")
        plan = self._plan(ctx)
        n = out.numel()
        data = check_message(data, -(-n * plan.bits // 8))
        be = hop_kernels(ctx, out)
        shift = plan.shift(ctx.producer if ctx else None)
        offset = ctx.index_offset if ctx else 0
        final = plan.final_firsts(ctx, ctx.producer if ctx else None, n, out.device)
        kept = out[final[0]].clone() if final is not None and accumulate else None
        for lo, hi, step in plan.segments(offset, n):
            be.intsum_decode(plan.byte_slice(data, lo, hi), step, plan.bits, out[lo:hi],
                             accumulate, shift)
        if final is not None:
            pos, vals = final
            out[pos] = vals if kept is None else kept + vals

    def decompress_accumulate_recompress(self, data, acc, ctx, out=None, writeback="none"):
        """``compress(acc + decompress(data))`` in one pass."""
        wb = check_writeback(writeback)
        _check_chunk(acc, "accumulator")
        plan = self._plan(ctx)
        n = acc.numel()
        nbytes = -(-n * plan.bits // 8)
        out = message_buffer(nbytes, out, acc.device)
        data = check_message(data, nbytes)
        be = hop_kernels(ctx, acc)
        shift_in, shift_out = plan.shift(ctx.producer if ctx else None), plan.shift(ctx)
        key = self._key(ctx)
        for lo, hi, step in plan.segments(ctx.index_offset, n):
            be.intsum_recompress(plan.byte_slice(data, lo, hi), acc[lo:hi], step, plan.bits, key,
                                 ctx.index_offset + lo, wb, plan.byte_slice(out, lo, hi),
                                 shift_in, shift_out)
        final = plan.final_firsts(ctx, ctx, n, acc.device)
        if final is not None and wb == Writeback.DECODED:
            acc[final[0]] = final[1]
        return out

    def spec(self) -> str:
        return format_call("intsum", self)
