"""The grids of the integer-sum codec (:mod:`dynamiq.codecs.intsum`): parameters, steps and the
per-call plan.

* :func:`check_params` validates an :class:`~dynamiq.codecs.IntSum`'s parameters;
* :func:`grid_step` is the max-scaled grid's step, :class:`ClampedGrid` the clamped one's level
  table, clamp, metadata and per-block steps;
* :class:`IntSumPlan` is the per-call decision every rank derives alike, with the chunk-level
  views the hop operations need: the chunk's blocks (one kernel call per block step), the grid
  shift of a message, and the first coordinates of the blocks.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, field
from typing import Any

import torch

from dynamiq.codecs.base import HopContext
from dynamiq.codecs.thc_levels import MAX_GRANULARITY, level_table, optimal_clamp
from dynamiq.kernels import LevelGrid, backend_for
from dynamiq.metadata import round_bf16

__all__ = ["DEFAULT_MAX_BITS", "MAX_BITS", "MIN_STEP", "ClampedGrid", "IntSumPlan",
           "check_params", "grid_step"]

#: Widths the default headroom may reach before asking for an explicit ``headroom_bits``.
DEFAULT_MAX_BITS = 16
#: Widest headroom: products ``W * step`` stay exact with at least one significant step bit.
MAX_BITS = 24
#: Smallest step, float32's smallest normal value: every multiple of it is a normal float32
#: (exact sums without subnormals, which some GPUs flush), and gradients down to about 1e-37
#: still get a step of their own size. The clamped grid's values may be multiples of half a
#: step, so its smallest step is twice this.
MIN_STEP = 2.0**-126
#: Names of the clamped grid's metadata: block scales (max-reduced), first coordinates (summed).
SIGMA, FIRST = "intsum.sigma", "intsum.first"


def _round_up(s: float, sig: int, smallest: float) -> float:
    """``s`` rounded up to ``sig`` significant bits, at least ``smallest``."""
    if not (math.isfinite(s) and s > smallest):
        return smallest
    unit = math.ldexp(1.0, math.frexp(s)[1] - sig)  # s in [2**(e-1), 2**e): sig bits above unit
    return max(smallest, math.ceil(s / unit) * unit)


def grid_step(scale: float, half_levels: int, bits: int) -> float:
    """``scale / half_levels`` rounded up to ``25 - bits`` significant bits (at least 2**-126)."""
    if not (math.isfinite(scale) and scale > 0):
        return MIN_STEP
    return _round_up(scale / half_levels, 25 - bits, MIN_STEP)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_params(c: Any) -> tuple[int | None, float | str | None]:
    """Validate an ``IntSum``'s parameters; returns its ``(headroom_bits, clamp)`` normalised.

    Raises:
        ValueError: the first parameter out of range, naming it and the allowed values.
    """
    hb = c.headroom_bits
    if isinstance(hb, str):  # from a spec string: the field's type hint is not plain int
        if not re.fullmatch(r"[+-]?\d+", hb):
            raise ValueError(f"intsum headroom_bits must be an integer, got {hb!r}")
        hb = int(hb)
    clamp = c.clamp
    if isinstance(clamp, str) and clamp != "auto":
        try:
            clamp = float(clamp)
        except ValueError:
            raise ValueError(f"intsum clamp must be None, 'auto' or a positive number of "
                             f"standard deviations, got {clamp!r}") from None
    if clamp is not None and clamp != "auto":
        if isinstance(clamp, bool) or not isinstance(clamp, (int, float)) \
                or not math.isfinite(clamp) or clamp <= 0:
            raise ValueError(f"intsum clamp must be None, 'auto' or a positive number of "
                             f"standard deviations, got {clamp!r}")
        clamp = float(clamp)
    lv, g = c.levels, c.granularity
    if clamp is None:
        if not _is_int(lv) or lv < 3 or lv % 2 == 0 or lv >= 2**16:
            raise ValueError(
                f"intsum levels must be an odd integer in [3, 65535], got {lv!r} (an odd count "
                "puts a level at 0 on the max-scaled grid; 15 levels fit 4-bit codes; THC's 16 "
                "levels need clamp=...)"
            )
        if g is not None:
            raise ValueError(f"intsum granularity={g!r} needs a clamp (the max-scaled grid's "
                             "levels are its every step)")
    else:
        if not _is_int(lv) or not 2 <= lv <= MAX_GRANULARITY + 1:
            raise ValueError(f"intsum levels must be an integer in [2, {MAX_GRANULARITY + 1}], "
                             f"got {lv!r}")
        fine = lv - 1 if g is None else g
        if not _is_int(fine) or not lv - 1 <= fine <= MAX_GRANULARITY:
            raise ValueError(f"intsum granularity must be an integer in [levels - 1 = {lv - 1}, "
                             f"{MAX_GRANULARITY}] (the levels are points of its grid), got {g!r}")
    b = c.block
    if not _is_int(b) or b < 256 or b > 2**30 or b & (b - 1):
        raise ValueError(f"intsum block must be a power of two in [256, 2**30], got {b!r}")
    if not isinstance(c.first, bool):
        raise ValueError(f"intsum first must be True or False, got {c.first!r}")
    if hb is not None:
        if not _is_int(hb) or not 2 <= hb <= MAX_BITS:
            raise ValueError(f"intsum headroom_bits must be None or an integer in "
                             f"[2, {MAX_BITS}], got {hb!r}")
        fine = lv - 1 if g is None else g
        if (1 << (hb - 1)) - 1 < -(-fine // 2):
            raise ValueError(f"intsum headroom_bits={hb} cannot hold one rank's code of "
                             f"{lv} levels (needs {max(2, (-(-fine // 2)).bit_length() + 1)})")
    if not _is_int(c.seed) or c.seed < 0:
        raise ValueError(f"intsum seed must be a non-negative int, got {c.seed!r}")
    return hb, clamp


@dataclass(frozen=True)
class ClampedGrid:
    """THC's clamped grid: the level table and the clamp ``T`` (in standard deviations).

    Attributes:
        levels: The levels on the fine grid (the kernels' :class:`~dynamiq.kernels.LevelGrid`).
        clamp: ``T``.
    """

    levels: LevelGrid
    clamp: float

    @staticmethod
    @functools.cache
    def of(levels: int, granularity: int, clamp: float | str) -> ClampedGrid:
        """The grid of ``levels`` levels on ``granularity`` steps (cached: its device tables
        are built once); ``clamp="auto"`` takes ``T`` from THC's table."""
        t = optimal_clamp(levels, granularity) if clamp == "auto" else float(clamp)
        return ClampedGrid(LevelGrid(level_table(levels, granularity, t)), t)

    @staticmethod
    def local_metadata(c: Any, y: torch.Tensor) -> dict[str, tuple[torch.Tensor, str]]:
        """One rank's metadata for codec ``c`` (an ``IntSum``) and its float32 vector ``y``:
        every block's scale ``σ = ‖x‖ / √count`` (``count`` the block's coordinates; its first
        one excluded with ``first``), rounded up to BF16 (a NaN as ``+inf``, so that every order
        of the max agrees; a scale, unlike a norm, never exceeds the largest value and so
        stays inside BF16's range), and the blocks' first coordinates."""
        out: dict[str, tuple[torch.Tensor, str]] = {}
        b = c.block
        first = y.detach()[::b].to(device="cpu", dtype=torch.float64) if c.first else None
        if c.clamp is not None:
            ss = backend_for("auto", y).block_statistics(y.detach(), [("sumsq", b)])[("sumsq", b)]
            count = torch.full_like(ss, float(b))
            count[-1] = y.numel() - (ss.numel() - 1) * b
            if first is not None:
                ss = (ss - first * first).clamp_min(0.0)
                count = (count - 1).clamp_min(1.0)
            sigma = round_bf16((ss / count).sqrt(), up=True)
            out[SIGMA] = (torch.where(torch.isnan(sigma), torch.full_like(sigma, math.inf),
                                      sigma), "max")
        if first is not None:
            out[FIRST] = (first, "sum")
        return out

    def steps(self, sigma: torch.Tensor, bits: int) -> tuple[float, ...]:
        """Every block's step ``2 T σ / g``, rounded up to ``24 - bits`` significant bits (at
        least twice float32's smallest normal value); NaN for a block whose ``σ`` is not
        finite (a non-finite input)."""
        g = self.levels.granularity
        return tuple(_round_up(2.0 * self.clamp * v / g, 24 - bits, 2.0 * MIN_STEP)
                     if math.isfinite(v) else math.nan for v in sigma.double().cpu().tolist())


@dataclass(eq=False)
class IntSumPlan:
    """The per-call decision of an :class:`~dynamiq.codecs.IntSum` codec (identical on every
    rank).

    Attributes:
        step: Grid step of the max-scaled grid (a float32 value with at most ``25 - bits``
            significant bits); NaN for the clamped grid, whose steps are per block.
        bits: Headroom width: bits per coordinate of every message.
        scale: The global maximum ``M`` the max-scaled step was derived from (NaN otherwise).
        steps: The clamped grid's step of every block (NaN: a block poisoned by a non-finite
            input), or ``None``.
        fine: ``g``, grid steps across one rank's range (the shift of a sum of ``k`` ranks is
            1/2 when ``k g`` is odd); 0 outside a collective.
        block: Coordinates per block of ``steps`` and ``first``.
        first: float32 ``[blocks]``, the exact sums of the blocks' first coordinates, or
            ``None``.
    """

    step: float
    bits: int
    scale: float
    steps: tuple[float, ...] | None = None
    fine: int = 0
    block: int = 1 << 16
    first: torch.Tensor | None = None
    _cache: dict = field(default_factory=dict, repr=False)

    def shift(self, ctx: HopContext | None) -> float:
        """The grid shift of a message compressed under ``ctx``: 1/2 when its ``summands``
        times ``g`` is odd."""
        if ctx is None or self.fine % 2 == 0:
            return 0.0
        return 0.5 * ((ctx.summands * self.fine) % 2)

    def block_step(self, j: int) -> float:
        """Step of block ``j`` (the one step of the max-scaled grid)."""
        return self.step if self.steps is None else self.steps[j]

    def segments(self, offset: int, n: int) -> list[tuple[int, int, float]]:
        """``(lo, hi, step)`` runs of the chunk ``[offset, offset + n)`` with one step each
        (chunk-local, boundaries on block boundaries, hence on whole bytes of the codes); a
        poisoned block's step reads 1 (its values are NaN anyway)."""
        key = ("seg", offset, n)
        hit = self._cache.get(key)
        if hit is None:
            if self.steps is None or n == 0:
                hit = [(0, n, self.step)]
            else:
                hit = []
                b = self.block
                for j in range(offset // b, (offset + n - 1) // b + 1):
                    lo, hi = max(j * b, offset) - offset, min((j + 1) * b, offset + n) - offset
                    step = self.steps[j] if math.isfinite(self.steps[j]) else 1.0
                    if hit and hit[-1][2] == step:
                        hit[-1] = (hit[-1][0], hi, step)
                    else:
                        hit.append((lo, hi, step))
            self._cache[key] = hit
        return hit

    def poisoned(self, offset: int, n: int) -> list[tuple[int, int]]:
        """Chunk-local ``(lo, hi)`` of the blocks whose step is NaN."""
        if self.steps is None:
            return []
        b = self.block
        return [(max(j * b, offset) - offset, min((j + 1) * b, offset + n) - offset)
                for j in range(offset // b, (offset + n - 1) // b + 1)
                if not math.isfinite(self.steps[j])]

    def byte_slice(self, buf: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
        """The codes of coordinates ``[lo, hi)`` in the packed message ``buf``."""
        return buf[lo * self.bits // 8: -(-hi * self.bits // 8)]

    def firsts(self, offset: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """int64 chunk-local positions of the blocks' first coordinates in ``[offset, offset +
        n)`` and their blocks."""
        b = self.block
        blocks = torch.arange(-(-offset // b), -(-(offset + n) // b), dtype=torch.int64)
        return blocks * b - offset, blocks

    def final_firsts(self, ctx: HopContext | None, producer: HopContext | None, n: int,
                     device: torch.device) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Where a message of every rank (``producer.summands`` = world size) decodes to the
        exact first-coordinate sums: ``(positions, float32 values)``; ``None`` for a partial
        sum or without ``first``."""
        if self.first is None or ctx is None or producer is None \
                or producer.summands < ctx.world_size:
            return None
        pos, blocks = self.firsts(ctx.index_offset, n)
        return pos.to(device), self.first[blocks].to(device)

