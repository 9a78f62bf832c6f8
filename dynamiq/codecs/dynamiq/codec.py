"""The ``dynamiq`` codec: its configuration, the per-call width decision and the hop operations.

See :mod:`dynamiq.codecs.dynamiq` for the method in brief and docs/method.rst for the details.
The module is long because the class docstring documents each of the sixteen fields users set in
spec strings; the mechanics live in the sibling modules (options, plan, segments, target).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch

from dynamiq.codecs.allocation import WidthOption, allocate
from dynamiq.codecs.base import (
    CODECS,
    HopContext,
    Metadata,
    PartialSumCodec,
    _check_chunk,
    check_writeback,
    hop_backend,
)
from dynamiq.codecs.dynamiq.batch import roundtrip_batch
from dynamiq.codecs.dynamiq.calibration import calibration_sums
from dynamiq.codecs.dynamiq.errors import width_options
from dynamiq.codecs.dynamiq.hops import hop_plans, ring_profile
from dynamiq.codecs.dynamiq.options import (
    CodingOption,
    build_options,
    check_settings,
    dither_floor,
    midrise_floor,
    normalise_group_sizes,
    normalise_widths,
    spec_number,
)
from dynamiq.codecs.dynamiq.plan import ChunkLayout, WidthPlan, chunk_layout
from dynamiq.codecs.dynamiq.segments import Segment, segment_of
from dynamiq.codecs.dynamiq.target import check_target, targeted_choice
from dynamiq.formats import EpsilonFormat
from dynamiq.metadata import STATISTICS, SUPER_GROUP, metadata_bits
from dynamiq.quantizers import BlockQuantizer
from dynamiq.spec import format_call

__all__ = ["SHORT_LENGTH", "SHORT_MIN_WIDTH", "DynamiQ"]

#: Vectors shorter than this many coordinates are coded at widths of at least
#: :data:`SHORT_MIN_WIDTH` (where the codec offers one), even when that overruns the budget.
SHORT_LENGTH = 4 * SUPER_GROUP
SHORT_MIN_WIDTH = 4

@CODECS.register("dynamiq")
@dataclass(frozen=True)
class DynamiQ(PartialSumCodec):
    """DynamiQ partial-sum codec: variable widths per super-group, fresh scales per hop.

    Building one computes only the options' wire costs (the bits floor check); the measured
    errors of the ``measured`` allocator are taken on the first :meth:`prepare` that needs them.

    Args:
        bits: Budget ``b̄`` in bits per coordinate, metadata included (the metadata phase's
            two statistics per super-group count 0.0625 with ``metadata="fp8"``, 0.125 with
            BF16).
        widths: Candidate widths, e.g. ``(2, 4, 8)`` (the paper's set); values in 2–8 and 16
            (BF16), kept increasing. Also accepted: one width, a list, or the text ``"2/4/8"``.
            The default ``(2, 3, 4, 5, 6, 7, 8)`` gives the allocation finer steps than the
            paper's set (measured in docs/method.rst). A single width in a single group size
            (one option) disables the allocation (and its metadata).
        eps: ε per width (same order as ``widths``, reordered with them); empty for
            :data:`~dynamiq.formats.TUNED_EPSILON`. Ignored for ``levels="uniform"`` and width
            16.
        levels: ``"eps"`` (ε-levels) or ``"uniform"``.
        scales: ``"hier"`` (UINT8 group scales under a super-group scale, rounded as
            ``scale_rounding`` says) or ``"flat"`` (a BF16 scale per group, rounded up).
        rounding: ``"correlated"`` (stratified across the ranks of one tree height, unbiased
            conditionally on the path), ``"path"`` (the paper's: stratified across every rank
            of a chunk's tree, so successive roundings of one coordinate are correlated too;
            lower error on a ring at a small bias, measured with ``bench nmse --bias``) or
            ``"stochastic"``.
        allocator: ``"measured"`` (error model from the codec's own measured error per option)
            or ``"paper"`` (``4^−w``, the paper's thresholds).
        seed: Seed of the rounding random numbers (shared by all ranks).
        group_size: Coordinates per group scale (powers of two from 4 to 256), e.g. ``32`` or
            ``(32, 64)``, kept increasing: every width is then offered with each, and the
            allocation picks one (width, group size) option per super-group, which refines its
            steps from 256 to 32 bits per super-group. The paper uses 16; 32 halves the scales'
            cost, and the default ``(32, 64)`` lets the allocation trade scales for width
            (measured in docs/method.rst).
        scale_rounding: How hierarchical group scales are rounded to UINT8: ``"up"`` (never
            below the group max, elements normalised by the rounded scale: unbiased, without
            multiplicative noise on the elements) or ``"stochastic"`` (the paper: an unbiased
            scale, elements normalised by the exact group max, whose noise dominates the error
            of wide widths in groups far below their super-group's maximum; see
            docs/method.rst).
        dither: Subtractive dithering (``BlockQuantizer.dither``): every receiver regenerates
            the uniforms the sender rounded with and removes most of the rounding noise,
            still unbiased, at no cost on the wire (measured in docs/method.rst); ``False`` is
            plain stochastic (or correlated) rounding, the paper's.
        midrise: Levels without a zero (a mid-rise grid,
            :attr:`EpsilonFormat.midrise <dynamiq.formats.EpsilonFormat>`): the ``2^w``
            codes of width ``w`` are ``2^w`` distinct values instead of ``2^w - 1`` (a grid
            with a zero level spends two codes on ``±0``), so the levels' steps shrink by
            ``(2^w - 2) / (2^w - 1)``; values near zero round across it, still unbiased and
            dithered as any other. Undithered, the rounding near zero adds noise that grows
            along a chain, so on long chains narrow undithered widths fall back to levels
            with a zero (:func:`~dynamiq.codecs.dynamiq.options.midrise_floor`, under
            ``dither_max_growth``). ``False``: the paper's levels, with a zero.
        dither_min_width: Narrowest dithered width; narrower ones round stochastically. The
            dither's noise is the same for every element of a group, proportional to the
            group's maximum, so along a chain of hops it feeds back through the next hop's
            maximum and grows by about ``1 + 6κ²/12`` per hop (1.5 at width 2, 1.05 at 3, 1.009
            at 4): width 2 is too coarse to dither along any chain; how long a chain each
            wider width may run dithered is :attr:`dither_max_growth`'s rule (measurements in
            docs/method.rst).
        dither_max_growth: Along a chain of ``D`` hops the dither's noise of a width grows by
            about ``dither_growth ** D`` (:func:`~dynamiq.codecs.dynamiq.options.dither_growth`:
            1.037 per hop at width 3, 1.008 at 4, 1.002 at 5); per call, a width whose
            growth over the schedule's longest chain exceeds this is rounded stochastically
            instead (:func:`~dynamiq.codecs.dynamiq.options.dither_floor`). The default keeps
            width 3 dithered on rings of up to 135 ranks, width 4 up to 614, width 5 up to
            2618, width 6 up to 10,858 (butterflies keep width 3): on a ring of 1024 a dithered
            width 4 diverges (docs/method.rst).
        metadata: Precision of the two statistics of the metadata phase: ``"fp8"`` (8 bits
            each, ``csumsq8``/``sum8``: 0.0625 bits/coordinate with a sum-of-squares for the
            allocation and a sum for centering, whose 1/16 relative precision costs nothing
            measurable) or ``"bf16"`` (16 bits each, the paper's 0.125). Pair it with
            ``center(statistic=sum8)`` resp. ``center``, so centering reuses the same sum.
        super_scale: Format of the hierarchical super-group scale, rounded up: ``"e8m0"`` (a
            power of two, 8 bits) or ``"bf16"`` (16 bits, the paper's). A power of two saves
            1/32 bit/coordinate but halves the relative resolution of the UINT8 group scales
            below it, which costs little when those are rounded up (``scale_rounding``) and
            much when they are rounded stochastically (docs/method.rst).
        target: Accuracy-targeted budget: per call, the smallest ``b̄`` (on a 1/64-bit grid)
            whose vNMSE, predicted from the metadata phase by
            :mod:`~dynamiq.codecs.dynamiq.target`'s model, stays below ``target``; a number in
            (0, 1), or ``"mxfp8"`` / ``"mxfp6"`` / ``"mxfp4"`` for that method's predicted
            vNMSE under the same model. ``bits`` is then not used; the chosen budget is in the
            per-tensor state (``state["bits"]``) and in the measured bits. ``None``: the fixed
            budget ``bits``.
        max_bits: With a ``target``, the largest budget a call may choose (bits per
            coordinate, metadata included); ``None``: as many as the most accurate option
            costs.
        per_hop: Allocate the options per hop as well as per super-group
            (:mod:`~dynamiq.codecs.dynamiq.hops`): a partial sum of ``s`` contributions is
            coded under the plan of ``s``, so early hops of a reduce chain are narrower than
            late ones and the owner's message (sent by every all-gather transfer) is narrow,
            at the same budget. A hop whose incoming and outgoing plans differ decodes, adds
            and codes again instead of the fused recompress. ``False``: one plan for every
            hop (options never change along the path, the paper's). Vectors shorter than
            :data:`SHORT_LENGTH` use one plan.

    Raises:
        ValueError: a value out of range, or ``bits`` below what the cheapest option costs
            with its scales and the metadata.
        TypeError: ``dither`` is not a bool.
    """

    bits: float = 5.0
    widths: tuple[int, ...] = (2, 3, 4, 5, 6, 7, 8)
    eps: tuple[float, ...] = ()
    levels: str = "eps"
    scales: str = "hier"
    rounding: str = "correlated"
    allocator: str = "measured"
    seed: int = 0
    group_size: tuple[int, ...] = (32, 64)
    scale_rounding: str = "up"
    dither: bool = True
    midrise: bool = True
    dither_min_width: int = 3
    dither_max_growth: float = 128.0
    metadata: str = "fp8"
    super_scale: str = "e8m0"
    target: float | str | None = None
    max_bits: float | None = None
    per_hop: bool = True

    block_size = SUPER_GROUP

    @classmethod
    def examples(cls) -> list[DynamiQ]:
        """The default, one fixed width (no allocation, no metadata), and BF16 among the widths
        with flat scales and plain stochastic rounding."""
        return [cls(), cls(widths=(4,)),
                cls(bits=7.0, widths=(2, 4, 8, 16), scales="flat", rounding="stochastic")]

    def __post_init__(self) -> None:
        widths, eps = normalise_widths(self.widths, self.eps)
        object.__setattr__(self, "widths", widths)
        object.__setattr__(self, "eps", eps)
        if not (isinstance(self.bits, (int, float)) and math.isfinite(self.bits)
                and self.bits > 0):
            raise ValueError(f"bits must be a positive number, got {self.bits!r}")
        object.__setattr__(self, "bits", float(self.bits))
        check_settings(self)
        object.__setattr__(self, "target", check_target(self.target))
        mb = spec_number("max_bits", self.max_bits)
        if mb is not None:
            if isinstance(mb, bool) or not isinstance(mb, (int, float)) or not (
                    math.isfinite(mb) and mb > 0):
                raise ValueError(f"max_bits must be a positive number or None, got {mb!r}")
            mb = float(mb)
        object.__setattr__(self, "max_bits", mb)
        if not isinstance(self.per_hop, bool):
            raise TypeError(f"per_hop must be a bool, got {self.per_hop!r}")
        object.__setattr__(self, "group_size", normalise_group_sizes(self.group_size))
        # pure arithmetic on the options' sizes: no quantizer runs here
        floor = (min(self._option_bits) * 1024 + self._meta_bits(1024 * SUPER_GROUP)) / (
            1024 * SUPER_GROUP)
        if self.bits < floor - 1e-9:
            raise ValueError(
                f"bits={self.bits:g} is below what the cheapest width costs with its scales "
                f"and metadata ({floor:.4g} bits/coordinate)"
            )

    # ---- configuration ----------------------------------------------------------------------
    @property
    def width_list(self) -> tuple[int, ...]:
        """The widths, increasing (the same as :attr:`widths`)."""
        return self.widths

    @property
    def group_sizes(self) -> tuple[int, ...]:
        """The group sizes, increasing (the same as :attr:`group_size`)."""
        return self.group_size

    @cached_property
    def options(self) -> tuple[CodingOption, ...]:
        """The coding options, by increasing wire cost (the allocator's order)."""
        return build_options(self)

    @cached_property
    def option_keys(self) -> tuple[tuple[int, int], ...]:
        """The coding options ``(width, group size)`` in the order of their indices, which is
        by increasing wire cost (the allocator's order): every width with every group size
        (width 16, unscaled BF16, once with group size 0)."""
        return tuple(o.key for o in self.options)

    @cached_property
    def quantizers(self) -> tuple[BlockQuantizer | None, ...]:
        """The quantizer of each option of :attr:`option_keys` (``None`` for BF16)."""
        return tuple(o.quantizer for o in self.options)

    @cached_property
    def width_options(self) -> list[WidthOption]:
        """The allocator's options: width, model error and cost per whole super-group.

        The ``measured`` allocator's errors are measured here (once per quantizer and
        process, see :func:`~dynamiq.codecs.dynamiq.errors.measured_error`).
        """
        return width_options(self.options, self.allocator)

    @cached_property
    def _option_bits(self) -> tuple[float, ...]:
        return tuple(o.bits() for o in self.options)

    @cached_property
    def _option_widths(self) -> tuple[int, ...]:
        return tuple(o.width for o in self.options)

    @cached_property
    def _segments(self) -> tuple[Segment, ...]:
        return tuple(segment_of(o) for o in self.options)

    def _twins(self, base: tuple[tuple[BlockQuantizer | None, Segment], ...], change
               ) -> tuple[tuple[BlockQuantizer | None, Segment], ...]:
        """``base``'s quantizer and segment of every option, with ``change`` applied to each
        quantizer (a new segment only where it changed anything)."""
        out = []
        for o, (q, seg) in zip(self.options, base):
            t = q if q is None else change(q)
            out.append((q, seg) if t == q else
                       (t, segment_of(dataclasses.replace(o, quantizer=t))))
        return tuple(out)

    @cached_property
    def _plain(self) -> tuple[tuple[BlockQuantizer | None, Segment], ...]:
        """Every option's quantizer and segment without dithering (the same where it has
        none)."""
        own = tuple(zip(self.quantizers, self._segments))
        return self._twins(own, lambda q: dataclasses.replace(q, dither=False))

    @cached_property
    def _tread(self) -> tuple[tuple[BlockQuantizer | None, Segment], ...]:
        """Every option's undithered quantizer and segment on levels with a zero (the same as
        :attr:`_plain` where its levels have one)."""
        def zero_level(q: BlockQuantizer) -> BlockQuantizer:
            e = q.element
            return (dataclasses.replace(q, element=EpsilonFormat(e.bits, e.eps))
                    if e.midrise else q)
        return self._twins(self._plain, zero_level)

    def _variant(self, i: int, wp: WidthPlan | None) -> tuple[BlockQuantizer | None, Segment]:
        """Option ``i``'s quantizer and segment under plan ``wp``: its own where ``wp`` keeps
        it, else undithered, on levels with a zero below ``wp.midrise_from``."""
        w = self.options[i].width
        q = self.options[i].quantizer
        if wp is None or (q is not None and q.dither and w >= wp.dither_from):
            return q, self._segments[i]
        return self._plain[i] if w >= wp.midrise_from else self._tread[i]

    def quantizer_for(self, i: int, wp: WidthPlan | None) -> BlockQuantizer | None:
        """The quantizer option ``i`` codes with under the width plan ``wp`` (``None``:
        BF16): its own, undithered when ``wp`` dithers only wider widths, and on levels with a
        zero when ``wp`` keeps mid-rise levels for wider undithered widths only."""
        return self._variant(i, wp)[0]

    def _segment(self, i: int, wp: WidthPlan | None) -> Segment:
        return self._variant(i, wp)[1]

    @property
    def wants_compression_factors(self) -> bool:  # type: ignore[override]
        # only the targeted mode reads them; a fixed budget skips walking every chunk's tree
        return self.target is not None

    @property
    def wants_hop_profile(self) -> bool:  # type: ignore[override]
        """Whether :meth:`prepare` reads the schedule's hop profile (a per-hop allocation, or
        the chain length that decides which widths are dithered or keep mid-rise levels)."""
        return (self.per_hop and self.variable) or self.dither or self.midrise

    @property
    def variable(self) -> bool:
        """Whether options are allocated per super-group (more than one width or group size)."""
        return len(self.options) > 1

    @property
    def statistics(self) -> tuple[str, ...]:  # type: ignore[override]
        if not self.variable:
            return ()
        return ("csumsq8", "sum8") if self.metadata == "fp8" else ("csumsq", "sum")

    @property
    def variable_size(self) -> bool:  # type: ignore[override]
        return self.variable

    @property
    def unbiased(self) -> bool:  # type: ignore[override]
        # path-correlated rounding shares one permutation with the roundings that shaped a
        # partial sum, so it is not unbiased conditionally on the path (docs/method.rst)
        return self.rounding != "path" and all(s.unbiased for s in self._segments)

    def _meta_bits(self, length: int) -> int:
        return metadata_bits(self.statistics, length)

    # ---- the per-call decision ------------------------------------------------------------
    def prepare(self, stats: Mapping[str, torch.Tensor], length: int, world_size: int,
                state: dict, *, compression_factors: tuple[float, float] | None = None,
                hop_profile: tuple[tuple[int, float, float], ...] | None = None
                ) -> WidthPlan:
        """The option of every super-group of the ``length``-long vector.

        Args:
            stats: The metadata phase's global statistics (float64 ``[super-groups]`` each,
                :attr:`statistics` among them).
            length: Coordinates in the vector.
            world_size: Number of ranks.
            state: Kept between calls: the allocator's last multiplier (``log2_lambda``);
                with a :attr:`target`, also ``state["bits"]`` (the budget chosen by the last
                call) and ``state["predicted_vnmse"]`` (its predicted vNMSE).
            compression_factors: The schedule's
                :meth:`~dynamiq.topologies.Schedule.compression_factors` (the executors pass
                them); ``None``: a ring's of ``world_size`` ranks. Only a :attr:`target`
                reads them.
            hop_profile: The schedule's :meth:`~dynamiq.topologies.Schedule.hop_profile`
                (the executors pass it when :attr:`wants_hop_profile`); ``None``: a ring's
                of ``world_size`` ranks.

        Returns:
            The :class:`WidthPlan`: the allocation of
            :func:`~dynamiq.codecs.allocation.allocate` under ``bits * length`` minus the whole
            metadata phase (with a :attr:`target`, the smallest budget whose predicted vNMSE
            meets it), the same on every rank; with :attr:`per_hop`, one plan per hop
            position (:attr:`WidthPlan.hops`) under that budget per transfer. Its
            :attr:`WidthPlan.dither_from` is the narrowest width dithered on chains as long
            as the profile's (:func:`~dynamiq.codecs.dynamiq.options.dither_floor`).
        """
        profile = hop_profile if hop_profile is not None else ring_profile(world_size)
        plan = self._decide(stats, length, world_size, state, compression_factors, profile)
        if self.dither or self.midrise:
            # sizes strictly grow along a chain, so the profile's positions bound its length
            depth = len(profile) - 1
            plan.with_dither_from(dither_floor(self, depth), midrise_floor(self, depth))
        return plan

    def _decide(self, stats: Mapping[str, torch.Tensor], length: int, world_size: int,
                state: dict, compression_factors: tuple[float, float] | None,
                profile: tuple[tuple[int, float, float], ...]) -> WidthPlan:
        """:meth:`prepare`'s allocation, before the dithered widths are decided."""
        m = -(-length // SUPER_GROUP)
        if not self.variable:
            choice = np.zeros(m, dtype=np.int64)
            return WidthPlan(choice, self._option_widths, self.bits * length,
                             float(self._option_bits[0] * m))
        # energy of the coded values: each rank's spread about its own mean plus, unless a
        # centering transform zeroed the sums, the squared mean the partial sums carry (exact
        # when the ranks' means agree); no difference of large numbers, so no cancellation
        sq_name, sum_name = self.statistics
        s_ = stats[sum_name].numpy()
        if s_.size != m:
            raise ValueError(f"statistics have {s_.size} super-groups, the vector needs {m}")
        counts_ = np.full(m, float(SUPER_GROUP))
        counts_[-1] = length - (m - 1) * SUPER_GROUP
        energy = stats[sq_name].numpy() + s_ * s_ / (world_size * counts_)
        # the budget covers the whole metadata phase: this codec's statistics and any other
        # component's (e.g. a centering transform's own sum), as the executors account them
        declared = set(self.statistics) | {k for k in stats if k in STATISTICS}
        meta = metadata_bits(sorted(declared), length)
        costs = self._costs(m, length)
        if self.target is None:
            return self._allocate(energy, self.bits * length - meta, costs, length, profile,
                                  state)
        return targeted_choice(self, energy, costs, length, meta + self.metadata_bits(length),
                               stats, world_size, state, compression_factors, profile)

    def _allocate(self, energy: np.ndarray, budget: float, costs: np.ndarray, length: int,
                  profile: tuple[tuple[int, float, float], ...], state: dict) -> WidthPlan:
        """The plan(s) of ``budget`` bits per transfer (metadata excluded): per hop position
        with :attr:`per_hop` (on a schedule of more than one position, a vector of at least
        :data:`SHORT_LENGTH` coordinates and a budget above the cheapest option), else one."""
        if (self.per_hop and len(profile) > 1 and length >= SHORT_LENGTH
                and float(costs.min(axis=1).sum()) < budget):
            # the costs are this codec's for this length (_costs): their derived facts are
            # kept under that key
            return hop_plans(energy, self.width_options, budget, costs, profile,
                             self._option_widths, state, cost_key=(self, length))
        choice = self._choose(energy, budget, costs, length, state)
        used = float(np.take_along_axis(costs, choice[:, None], 1).sum())
        return WidthPlan(choice, self._option_widths, budget, used)

    def _choose(self, energy: np.ndarray, budget: float, costs: np.ndarray, length: int,
                state: dict) -> np.ndarray:
        """int64 ``[m]``: the allocation of ``budget`` bits (metadata excluded)."""
        opts = self.width_options
        if costs.shape[0] == 1 and float(costs.min()) > budget:
            # a vector shorter than one super-group whose budget cannot pay even the cheapest
            # option (the metadata and a group's scales dominate a few coordinates): the
            # budget is overrun whatever is sent, so send the most accurate option; the
            # overrun is bounded by one super-group and the result reports the bits spent
            return np.array([int(np.argmin([o.error for o in opts]))], dtype=np.int64)
        alloc_costs = costs
        if length < SHORT_LENGTH and any(w >= SHORT_MIN_WIDTH for w in self._option_widths):
            # short vectors: fixed costs (metadata, scales, groups cut short) leave the
            # narrowest widths, whose error is of the order of the signal; keep them out
            # (the budget may then be overrun by a bounded amount, reported as spent)
            narrow = np.array([w < SHORT_MIN_WIDTH for w in self._option_widths])
            alloc_costs = np.where(narrow[None, :], np.inf, costs)
        return allocate(energy, opts, budget, state, alloc_costs, cost_key=(self, length))

    def metadata_bits(self, length: int) -> int:
        """With a :attr:`target`, the calibration's float32 sums (one per option, plus the
        sampled energy and its share of zeros); nothing otherwise."""
        return 32 * (len(self.options) + 2) if self.target is not None and self.variable else 0

    def local_metadata(self, y: torch.Tensor, state: dict, backend: str = "auto") -> Metadata:
        """With a :attr:`target`: this rank's calibration sums (see
        :func:`~dynamiq.codecs.dynamiq.calibration.calibration_sums`, coded on ``backend``),
        sum-reduced."""
        if self.target is None or not self.variable:
            return {}
        return calibration_sums(y, self.quantizers, self.seed, backend)

    def _costs(self, m: int, length: int) -> np.ndarray:
        """float64 ``[m, options]``: wire bits of every option for every super-group (a partial
        last one is cut to the groups it touches, so it costs less)."""
        costs = np.tile(np.array(self._option_bits), (m, 1))
        tail = length - (m - 1) * SUPER_GROUP
        if tail < SUPER_GROUP:
            costs[-1] = [o.bits(tail) for o in self.options]
        return costs

    def _plan(self, ctx: HopContext | None) -> WidthPlan | None:
        """The width plan ``ctx`` codes under (its hop's, with per-hop plans); ``None`` for a
        one-option codec outside a pipeline, whose super-groups all keep their places."""
        if not self.variable and (ctx is None or ctx.prepared is None
                                  or self not in ctx.prepared):
            return None
        wp = self.plan_in(ctx)
        if wp is None:
            raise ValueError(
                "the dynamiq codec needs the call's width plan: run it inside a pipeline "
                "(simulate / all_reduce), or pass a HopContext with prepared={codec: plan}"
            )
        return wp.for_summands(ctx.summands)

    def _layout(self, n: int, ctx: HopContext | None) -> ChunkLayout:
        sgs = -(-n // SUPER_GROUP)
        off = 0 if ctx is None else ctx.index_offset
        wp = self._plan(ctx)
        if wp is None:
            # one option: every super-group keeps its place, no plan needed (nor cached)
            choice = np.zeros(sgs, dtype=np.int64)
            position = np.arange(sgs, dtype=np.int64) + off // SUPER_GROUP
            return chunk_layout(choice, position, n, self.options)
        if off % SUPER_GROUP:
            raise ValueError(f"chunk offset {off} is not a multiple of {SUPER_GROUP}")
        lay = wp._layouts.get((off, n))
        if lay is None:
            j0 = off // SUPER_GROUP
            lay = wp._layouts[(off, n)] = chunk_layout(
                wp.choice[j0: j0 + sgs], wp.position[j0: j0 + sgs], n, self.options)
        return lay

    # ---- sizes ---------------------------------------------------------------------------
    def wire_bytes(self, n: int, ctx: HopContext | None = None) -> int:
        return self._layout(n, ctx).nbytes

    def max_wire_bytes(self, n: int) -> int:
        return max(o.nbytes(n) for o in self.options)

    # ---- hop operations ------------------------------------------------------------------
    def _rand(self, ctx: HopContext | None, first: int) -> dict:
        """Random-number keys of the segment starting at ``first`` under ``ctx``."""
        if ctx is None:
            return {"seed": self.seed, "index_offset": first}
        return {"seed": self.seed, "rank": ctx.rank, "world_size": ctx.world_size,
                "stream": self._stream(ctx), "index_offset": first}

    def _stream(self, ctx: HopContext) -> tuple[int, ...]:
        """``ctx``'s random stream; under ``rounding="path"`` without the tree height, so that
        every rounding of a coordinate along its chunk's tree (each rank rounds it once) draws
        from one permutation of the ranks: a stratum per rank along the whole path."""
        return (*ctx.stream[:-1], 0) if self.rounding == "path" and ctx.stream else ctx.stream

    def _out(self, lay: ChunkLayout, out: torch.Tensor | None,
             device: torch.device | None = None) -> torch.Tensor:
        if out is None:
            return torch.empty(lay.nbytes, dtype=torch.uint8, device=device)
        if out.dtype != torch.uint8 or out.numel() != lay.nbytes:
            raise ValueError(f"out must be a uint8 tensor of {lay.nbytes} bytes")
        return out

    def compress(self, x, ctx, out=None):
        """The message for chunk ``x`` (float32 ``[n]``) at the position ``ctx`` gives."""
        _check_chunk(x)
        lay = self._layout(x.numel(), ctx)
        wp = self._plan(ctx)
        be = hop_backend(ctx, x)
        out = self._out(lay, out, x.device)
        for k, (i, _, coords, b0, b1, first) in enumerate(lay.segments):
            seg = self._segment(i, wp)
            seg.encode(x, lay.rows(k, seg.block, x.device), coords, out[b0:b1], be,
                       **self._rand(ctx, first))
        return out

    def _decode_into(self, data: torch.Tensor, out: torch.Tensor, ctx: HopContext | None,
                     accumulate: bool) -> None:
        """Every segment of ``data`` decoded into its places of ``out`` (or added to them)."""
        lay = self._layout(out.numel(), None if ctx is None else ctx.producer)
        wp = None if ctx is None else self._plan(ctx.producer)
        if data.numel() != lay.nbytes:
            raise ValueError(f"message has {data.numel()} bytes, this chunk's layout {lay.nbytes}")
        be = hop_backend(ctx, out)
        src = None if ctx is None else ctx.producer
        for k, (i, _, coords, b0, b1, first) in enumerate(lay.segments):
            seg = self._segment(i, wp)
            seg.decode(data[b0:b1], out, lay.rows(k, seg.block, out.device), coords,
                       accumulate, be, **self._rand(src, first))

    def decompress(self, data, out, ctx=None):
        """Decode into ``out`` (float32 ``[n]``); dithered widths use ``ctx.producer``'s keys."""
        self._decode_into(data, out, ctx, False)
        return out

    def decompress_accumulate(self, data, acc, ctx=None):
        """``acc += decompress(data)`` (one float32 addition per coordinate)."""
        self._decode_into(data, acc, ctx, True)

    def decompress_accumulate_recompress(self, data, acc, ctx, out=None, writeback="none"):
        """``compress(acc + decompress(data))`` with fresh scales: the message's options are
        its producer's hop plan, the result's this hop's (the same with one plan per call)."""
        wb = check_writeback(writeback).name.lower()
        _check_chunk(acc, "accumulator")
        if self._plan(ctx) is not self._plan(ctx.producer):
            # the message was coded under another hop's plan (per_hop): decode and add in
            # place (under "none" the accumulator is scratch afterwards), then code under this
            # hop's
            self.decompress_accumulate(data, acc, ctx)
            own = dataclasses.replace(ctx, source=None)
            out = self.compress(acc, own, out)
            if wb == "decoded":
                self.decompress(out, acc, own)
            return out
        lay = self._layout(acc.numel(), ctx)
        wp = self._plan(ctx)
        if data.numel() != lay.nbytes:
            raise ValueError(f"message has {data.numel()} bytes, this chunk's layout {lay.nbytes}")
        be = hop_backend(ctx, acc)
        out = self._out(lay, out, acc.device)
        src = ctx.producer
        for k, (i, _, coords, b0, b1, first) in enumerate(lay.segments):
            seg = self._segment(i, wp)
            seg.recompress(data[b0:b1], acc, lay.rows(k, seg.block, acc.device), coords,
                           out[b0:b1], wb, be, in_rank=src.rank, in_stream=self._stream(src),
                           **self._rand(ctx, first))
        return out

    def roundtrip_batch(self, values, batch):
        """Every row's round trip with one encode and one decode per option present (see
        :mod:`~dynamiq.codecs.dynamiq.batch`); the same bits as the per-message operations."""
        return roundtrip_batch(self, values, batch)

    def spec(self) -> str:
        return format_call("dynamiq", self)
