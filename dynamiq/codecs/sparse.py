"""The OmniReduce baseline as a partial-sum codec: block sparsification (docs/method.rst).

The vector is cut into blocks of 256 coordinates. Only a call-wide set of *selected* blocks
travels, summed in BF16 (or FP16, ``wire="fp16"``, as OmniReduce's paper runs it); every other
block is dropped (its result is 0), which biases the sum towards zero (``unbiased = False``).

Two ways to choose the blocks:

* **a fixed keep fraction** (``keep``, the ``omnireduce-paper`` pipeline): OmniReduce sends the
  blocks that are non-zero; on dense gradients it is run with a block top-k, every worker
  keeping its ``ceil(keep * B)`` blocks of largest norm among the ``B`` blocks. The union of
  the ranks' choices travels (each rank flags its blocks in a 1-bit-per-block bitmap,
  max-reduced), so the density lies between ``keep`` (identical choices) and ``n * keep``.
* **a budget** (``keep=None``, the ``omnireduce`` pipeline), steps 1–3 below.

FP16 has a fixed range (65504 down to 6e-8), which is why FP16 training scales its loss: every
call scales the travelling FP16 values by the power of two ``2**e`` putting ``n M`` just below
65504 (``M`` the largest finite ``|x|`` over the ranks: one BF16 maximum per vector in the
metadata phase), so no partial sum overflows and small gradients keep their bits.

1. **Metadata.** Every rank flags its own top-``k`` blocks by norm
   (:meth:`Sparse.local_metadata`: a 0/1 indicator per block, max-reduced into the *union*
   ``U``; accounted at 1 bit per block, :meth:`Sparse.metadata_bits`), and the declared
   ``sumsq`` statistic gives every block's global energy (16 bits per block, accounted by the
   metadata module). Blocks holding NaN or ±Inf count as infinitely large locally, and every
   block whose global energy is not finite (which only a non-finite input gives) is selected
   whatever the budget, so that the non-finite values stay visible, at their coordinates.
2. **Selection** (:meth:`Sparse.prepare`): the budget ``b̄`` (bits per coordinate, metadata
   included, as :attr:`dynamiq.SimulationResult.bits` counts it) leaves
   ``target = floor((b̄ d - metadata bits) / (16 * 256))`` blocks of BF16 values. If
   ``|U| > target``, the ``target`` blocks of ``U`` with the largest global energy are kept, so
   the budget always holds for finite inputs (every block, the vector's partial last one
   included, is counted as 256 coordinates).
3. **Adapting k.** The ``k`` of the next call moves with momentum 0.8 towards the ``k*`` that
   would have produced ``|U| = target``, estimated from this call's ``(k, |U|)`` with the model
   ``|U(k)| = B (1 - (1 - k/B)**m)`` of ``m`` independent selections among ``B`` blocks (``m``
   fitted to the observation: 1 when all ranks chose alike, ``n`` when they chose
   independently). ``state["k"]`` holds the (real) value; a call uses ``round(k)`` clipped to
   ``[1, B]``. The first call, whose local selection happens before the world size is known
   (``local_metadata`` does not receive it), uses ``k = target``; the trim of step 2 keeps it
   within budget.
4. **Hops.** Selected coordinates travel as BF16 (FP16); every hop adds in float32 and re-casts
   (round to nearest even).

Wire: the chunk's selected coordinates as BF16 (FP16), in order; the size depends on the call
(``variable_size``). Outside a collective (a :class:`HopContext` without ``prepared`` values,
or none) every block counts as selected: the codec is then a BF16 (FP16) passthrough.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from dynamiq.codecs.base import (
    CODECS,
    HopContext,
    Metadata,
    PartialSumCodec,
    _check_chunk,
    check_writeback,
    hop_kernels,
    message_buffer,
)
from dynamiq.kernels import Selection, Writeback
from dynamiq.metadata import metadata_bits, round_bf16
from dynamiq.spec import format_call

__all__ = ["Sparse", "SparsePlan"]

BLOCK = 256
#: Name of the codec's own metadata (the union of the ranks' top-k blocks).
MASK_NAME = "sparse.mask"
#: Name of the FP16 wire's metadata (every rank's largest finite magnitude, max-reduced).
ABSMAX_NAME = "sparse.absmax"
#: FP16's largest finite value.
FP16_MAX = 65504.0
#: Bits per selected coordinate on the wire (BF16 or FP16).
VALUE_BITS = 16
#: Wire formats of the selected values.
WIRES = ("bf16", "fp16")


@dataclass
class SparsePlan:
    """The per-call selection of a :class:`Sparse` codec (identical on every rank).

    Attributes:
        selected: bool ``[blocks]``, the blocks that travel.
        union: Number of blocks in the union of the ranks' top-k selections.
        k: The per-rank ``k`` this call's selections used.
        target: Blocks the budget allows.
        length: Vector length.
        scale: The power of two the travelling values are multiplied by (FP16: see the module
            doc; 1 for BF16).
    """

    selected: torch.Tensor
    union: int
    k: int
    target: int
    length: int
    scale: float = 1.0
    _chunks: dict = field(default_factory=dict, repr=False)

    def selection(self, offset: int, n: int) -> Selection | None:
        """The travelling blocks of the chunk ``[offset, offset + n)`` (cached per chunk), or
        ``None`` when every coordinate of it travels."""
        key = (offset, n)
        if key not in self._chunks:
            j0 = offset // BLOCK
            nb = -(-n // BLOCK)
            sel = self.selected[j0:j0 + nb]
            if sel.numel() != nb:
                raise ValueError(f"chunk [{offset}, {offset + n}) lies outside the prepared "
                                 "vector")
            self._chunks[key] = None if bool(sel.all()) else Selection(sel.clone(), n, BLOCK)
        return self._chunks[key]


@CODECS.register("sparse")
@dataclass(frozen=True)
class Sparse(PartialSumCodec):
    """OmniReduce-style block sparsification: a shared set of blocks, summed in BF16 or FP16.

    Equivalent to ``cast_sum(x masked to the selected blocks)`` at every hop, with the selection
    fixed for the call (see the module doc).

    Args:
        bits: Budget ``b̄`` in bits per coordinate, metadata included (without ``keep``).
        momentum: Weight of the previous ``k`` in its update, in ``[0, 1)`` (without ``keep``).
        wire: How selected values travel: ``"bf16"`` or ``"fp16"`` (round to nearest even;
            FP16 saturates to infinity beyond 65504 and loses precision below 6.1e-5).
        keep: Fraction of its blocks every rank keeps (OmniReduce's block top-k), in
            ``(0, 1]``; ``None``: the budget ``bits`` decides.

    Raises:
        ValueError: a non-positive or non-finite budget, a momentum outside ``[0, 1)``, an
            unknown wire, a keep fraction outside ``(0, 1]``, or a budget given with ``keep``.
    """

    bits: float = 8.0
    momentum: float = 0.8
    wire: str = "bf16"
    keep: float | None = None

    block_size = BLOCK
    variable_size = True

    def __post_init__(self) -> None:
        for name, value in (("bits", self.bits), ("momentum", self.momentum)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value):
                raise ValueError(f"sparse {name} must be a finite number, got {value!r}")
            object.__setattr__(self, name, float(value))
        if not 0 < self.bits <= 64:
            raise ValueError(f"sparse bits must be in (0, 64] bits per coordinate, got "
                             f"{self.bits!r}")
        if not 0 <= self.momentum < 1:
            raise ValueError(f"sparse momentum must be in [0, 1), got {self.momentum!r}")
        if self.wire not in WIRES:
            raise ValueError(f"sparse wire must be one of {WIRES}, got {self.wire!r}")
        if self.keep is not None:
            k = self.keep
            if isinstance(k, bool) or not isinstance(k, (int, float)) or not 0 < k <= 1:
                raise ValueError(f"sparse keep must be a fraction in (0, 1] or None, got {k!r}")
            object.__setattr__(self, "keep", float(k))
            if self.bits != 8.0 or self.momentum != 0.8:
                raise ValueError("sparse takes a budget (bits, momentum) or a keep fraction, "
                                 "not both")

    @property
    def statistics(self) -> tuple[str, ...]:  # type: ignore[override]
        """The budget trims the union by global energy (``sumsq``); a keep fraction needs
        none."""
        return () if self.keep is not None else ("sumsq",)

    @classmethod
    def examples(cls) -> list[Sparse]:
        """The budgeted BF16 codec and OmniReduce's paper configuration (FP16, keep)."""
        return [cls(), cls(wire="fp16", keep=0.3)]

    # ---- budget -------------------------------------------------------------------------------
    def metadata_bits(self, length: int) -> int:
        """The bitmap: 1 bit per block (a budget's energies are the declared ``sumsq``
        statistic), and FP16's scale: one BF16 maximum per vector."""
        return -(-length // BLOCK) + (16 if self.wire == "fp16" else 0)

    def target_blocks(self, length: int) -> int:
        """Blocks of BF16 values the budget allows for a vector of ``length``.

        A vector too short for its metadata to fit the budget (the per-vector shift byte, a
        partial last block counted whole) gets 0: only blocks holding non-finite values travel,
        and the result reports the bits spent.

        Raises:
            ValueError: the metadata of a whole block (17 bits) exceeds the budget of one
                (the budget cannot hold at any length).
        """
        blocks = -(-length // BLOCK)
        # what one more block adds to the metadata (the per-vector shift byte excluded)
        per_block = (metadata_bits(self.statistics, 2 * BLOCK)
                     - metadata_bits(self.statistics, BLOCK) + self.metadata_bits(BLOCK))
        if self.bits * BLOCK < per_block:
            raise ValueError(
                f"sparse(bits={self.bits:g}): the metadata alone costs "
                f"{per_block / BLOCK:.4g} bits per coordinate"
            )
        meta = metadata_bits(self.statistics, length) + self.metadata_bits(length)
        spare = self.bits * length - meta
        return min(blocks, max(0, int(spare // (VALUE_BITS * BLOCK))))

    def _k(self, length: int, state: dict) -> int:
        blocks = -(-length // BLOCK)
        if self.keep is not None:
            return max(1, min(blocks, math.ceil(self.keep * blocks)))
        k = state.get("k")
        if k is None:
            k = self.target_blocks(length)
        return int(min(blocks, max(1, round(k))))

    # ---- the metadata phase -------------------------------------------------------------------
    @staticmethod
    def _energies(y: torch.Tensor) -> torch.Tensor:
        """float64 ``[blocks]`` block energies of a float32 vector, non-finite ones as +inf."""
        y64 = y.detach().to(device="cpu", dtype=torch.float64).reshape(-1)
        blocks = -(-y64.numel() // BLOCK)
        pad = torch.zeros(blocks * BLOCK, dtype=torch.float64)
        pad[: y64.numel()] = y64
        e = (pad.view(blocks, BLOCK) ** 2).sum(1)
        return torch.where(torch.isnan(e), torch.full_like(e, math.inf), e)

    @staticmethod
    def _top(energy: torch.Tensor, k: int) -> torch.Tensor:
        """Indices of the ``k`` largest entries (ties: lower index first)."""
        return torch.sort(-energy, stable=True).indices[:k]

    def local_metadata(self, y: torch.Tensor, state: dict, backend: str = "auto") -> Metadata:
        """This rank's top-``k`` blocks by norm as a float64 0/1 indicator (max-reduced)."""
        e = self._energies(y)
        k = self._k(y.numel(), state)
        state["k_used"] = k  # prepare reads it; every rank (and virtual rank) writes the same
        ind = torch.zeros(e.numel(), dtype=torch.float64)
        ind[self._top(e, k)] = 1.0
        out = {MASK_NAME: (ind, "max")}
        if self.wire == "fp16":
            a = y.detach().abs()
            top = torch.where(torch.isfinite(a), a, torch.zeros_like(a)).max()
            out[ABSMAX_NAME] = (round_bf16(top.double().cpu().reshape(1), up=True), "max")
        return out

    def _scale(self, stats: Mapping[str, torch.Tensor], world_size: int) -> float:
        """``2**e`` with ``e`` the largest integer such that ``n M 2**e <= 65504``; 1 for BF16
        or when ``M`` is 0."""
        top = stats.get(ABSMAX_NAME)
        if self.wire != "fp16" or top is None:
            return 1.0
        m = float(top.max())
        if not (math.isfinite(m) and m > 0):
            return 1.0
        e = math.floor(math.log2(FP16_MAX / (world_size * m)))
        while world_size * m * 2.0**e > FP16_MAX:  # log2's rounding
            e -= 1
        return 2.0 ** max(-126, min(126, e))

    @staticmethod
    def _k_star(k: int, union: int, target: int, blocks: int) -> float:
        """``k`` that would have given ``|U| = target`` under the overlap model (module doc)."""
        if target >= blocks:
            return float(blocks)
        if target <= 0:
            return 1.0
        if union >= blocks:  # saturated: the model says nothing, shrink proportionally
            return k * target / union
        if union <= k or k >= blocks:  # identical selections: |U| = k
            return float(target)
        m = math.log1p(-union / blocks) / math.log1p(-k / blocks)
        return blocks * -math.expm1(math.log1p(-target / blocks) / m)

    def prepare(self, stats: Mapping[str, torch.Tensor], length: int, world_size: int,
                state: dict) -> SparsePlan:
        """The selected blocks (union, trimmed to the budget by energy); updates ``state["k"]``.

        Args:
            stats: Global statistics: float64 ``stats["sumsq"]`` and the union indicator
                ``stats["sparse.mask"]`` (every block is a candidate when it is absent).
            length: Vector length.
            world_size: Number of ranks.
            state: Per-tensor state: reads ``k_used``, writes ``k``.
        """
        blocks = -(-length // BLOCK)
        mask = stats.get(MASK_NAME)
        union = torch.ones(blocks, dtype=torch.bool) if mask is None else mask.cpu() > 0
        count = int(union.sum())
        if self.keep is not None:
            # OmniReduce's fixed top-k: the union travels whole (a rank's non-finite blocks
            # count as infinitely large, so they are among its choices and stay visible)
            k = self._k(length, state)
            return SparsePlan(union, count, k, count, length, self._scale(stats, world_size))
        target = self.target_blocks(length)
        energy = stats["sumsq"].double().cpu()
        if energy.numel() != blocks:
            raise ValueError(f"sumsq has {energy.numel()} blocks, the vector needs {blocks}")
        # a finite input gives a finite energy (the metadata saturates), so these blocks hold
        # a NaN or an Inf on some rank: they always travel, or the value would read as 0
        nonfinite = ~torch.isfinite(energy)
        selected = union | nonfinite
        if int(selected.sum()) > target:
            cand = torch.nonzero(union & ~nonfinite).flatten()
            room = max(0, target - int(nonfinite.sum()))
            keep = cand[self._top(energy[cand], room)]
            selected = nonfinite.clone()
            selected[keep] = True
        k = int(state.get("k_used", self._k(length, state)))
        k_star = min(float(blocks), max(1.0, self._k_star(k, count, target, blocks)))
        prev = float(state.get("k", k))
        state["k"] = self.momentum * prev + (1.0 - self.momentum) * k_star
        return SparsePlan(selected, count, k, target, length, self._scale(stats, world_size))

    # ---- sizes --------------------------------------------------------------------------------
    def _selection(self, n: int, ctx: HopContext | None) -> Selection | None:
        """The chunk's travelling blocks, or ``None`` for all (also outside a collective)."""
        plan = self.plan_in(ctx)
        if plan is None:
            return None
        if ctx.index_offset % BLOCK:  # type: ignore[union-attr]
            raise ValueError(f"chunk offset {ctx.index_offset} is not a multiple of {BLOCK}")
        return plan.selection(ctx.index_offset, n)  # type: ignore[union-attr]

    def _count(self, n: int, ctx: HopContext | None) -> int:
        sel = self._selection(n, ctx)
        return n if sel is None else sel.count

    def wire_bytes(self, n: int, ctx: HopContext | None = None) -> int:
        """2 bytes per selected coordinate of the chunk."""
        return 2 * self._count(n, ctx)

    def max_wire_bytes(self, n: int) -> int:
        """Every coordinate selected: ``2 n``."""
        return 2 * n

    # ---- hop operations -----------------------------------------------------------------------
    def compress(self, x, ctx, out=None):
        """BF16 (FP16, scaled) bytes (nearest even) of the chunk's selected coordinates."""
        _check_chunk(x)
        sel = self._selection(x.numel(), ctx)
        out = message_buffer(2 * (x.numel() if sel is None else sel.count), out, x.device)
        s = getattr(self.plan_in(ctx), "scale", 1.0)
        hop_kernels(ctx, x).wire_encode(x if s == 1.0 else x * s, self.wire, out, sel)
        return out

    def _decode(self, data, out, ctx, accumulate: bool) -> None:
        _check_chunk(out, "output")
        be = hop_kernels(ctx, out)
        sel = self._selection(out.numel(), ctx)
        s = getattr(self.plan_in(ctx), "scale", 1.0)
        if s == 1.0:
            be.wire_decode(data, self.wire, out, accumulate, sel)
            return
        vals = torch.empty_like(out)
        be.wire_decode(data, self.wire, vals, False, sel)
        vals.mul_(1.0 / s)  # a power of two: exact
        if accumulate:
            out.add_(vals)
        else:
            out.copy_(vals)

    def decompress(self, data, out, ctx=None):
        """Decode into the float32 ``out`` ``[n]``: the BF16 (FP16) values, 0 elsewhere."""
        self._decode(data, out, ctx, False)
        return out

    def decompress_accumulate(self, data, acc, ctx=None):
        """``acc += decompress(data)`` (one float32 add per coordinate)."""
        self._decode(data, acc, ctx, True)

    def decompress_accumulate_recompress(self, data, acc, ctx, out=None, writeback="none"):
        """``compress(acc + decompress(data))``; only the selected coordinates are added unless
        ``writeback="sum"`` asks for the whole float32 sum."""
        wb = check_writeback(writeback)
        _check_chunk(acc, "accumulator")
        sel = self._selection(acc.numel(), ctx)
        out = message_buffer(2 * (acc.numel() if sel is None else sel.count), out, acc.device)
        be = hop_kernels(ctx, acc)
        s = getattr(self.plan_in(ctx), "scale", 1.0)
        if s == 1.0:
            be.wire_recompress(data, acc, self.wire, wb, out, sel)
            return out
        # (acc + v / s) * s = acc * s + v exactly: the sum is formed on the scaled values
        scaled = acc * s
        be.wire_recompress(data, scaled, self.wire, wb, out, sel)
        if wb != Writeback.NONE:
            acc.copy_(scaled.mul_(1.0 / s))
        return out

    def spec(self) -> str:
        return format_call("sparse", self)
