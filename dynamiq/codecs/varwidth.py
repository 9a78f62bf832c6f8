"""The DynamiQ codec: per-super-group bit widths under a budget, coded in one message.

See docs/method.rst. From the metadata phase (global per-super-group sums and sums of
squares; 8 bits each on the wire by default, BF16 in the paper) every rank derives the same
coding option, a width and a group size, for every super-group of 256 coordinates
(:mod:`dynamiq.codecs.allocation`); no width map travels. A chunk's message is the
concatenation of one segment per option, in increasing cost order (BF16 first): the chunk's
super-groups are reordered (stably) so that equal options are contiguous, each segment is coded
by the quantizer of its option (ε-levels, groups of 32 or 64 with UINT8 scales relative to a
BF16 super-group scale, stochastic scale rounding, correlated element rounding decoded with
subtractive dithering), and the reorder is undone on decoding. Options never change along the
path; every hop recomputes the scales from its partial sum.

Width 16 means "BF16, uncompressed" (round to nearest). Width 1 (a sign bit only) is not
offered: an unbiased 1-bit code needs signed rounding outside the sign-magnitude element model.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property, lru_cache

import numpy as np
import torch

from dynamiq.codecs.allocation import WidthOption, allocate
from dynamiq.codecs.base import (
    _WRITEBACK,
    CODECS,
    HopContext,
    PartialSumCodec,
    _check_chunk,
    _triton_launchers,
    hop_backend,
)
from dynamiq.collectives.metadata import STATISTICS, SUPER_GROUP, metadata_bits
from dynamiq.formats import EpsilonFormat
from dynamiq.quantizers import BlockQuantizer, Payload
from dynamiq.spec import format_call

__all__ = ["TUNED_EPSILON", "DynamiQ", "WidthPlan"]

#: ε per width minimising the measured error of one quantization of Gaussian groups of 16 under
#: hierarchical scales (the codec's default; the paper's values are in
#: :data:`dynamiq.formats.DEFAULT_EPSILON`). Width 2 has the levels {0, 1} whatever ε is.
TUNED_EPSILON = {2: 0.25, 3: 0.35, 4: 0.22, 5: 0.15, 6: 0.12, 7: 0.08, 8: 0.06}

_LEVELS = ("eps", "uniform")
_SCALES = ("hier", "flat")
_ROUNDINGS = ("correlated", "stochastic")
_ALLOCATORS = ("measured", "paper")
_ALLOWED = (2, 3, 4, 5, 6, 7, 8, 16)
#: Vectors shorter than this many coordinates are coded at widths of at least
#: :data:`SHORT_MIN_WIDTH` (where the codec offers one), even when that overruns the budget.
SHORT_LENGTH = 4 * SUPER_GROUP
SHORT_MIN_WIDTH = 4


def _parse_list(name: str, raw: object, kind: type) -> tuple:
    if isinstance(raw, str):
        parts = [p for p in raw.split("/") if p]
    elif isinstance(raw, (tuple, list)):
        parts = list(raw)
    else:
        raise TypeError(f"{name} must be a '/'-separated string or a sequence, got {raw!r}")
    try:
        return tuple(kind(p) for p in parts)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: cannot read {raw!r} as {kind.__name__} values") from None


def _fmt_list(values: tuple) -> str:
    return "/".join(f"{v:g}" if isinstance(v, float) else str(v) for v in values)


class _Bf16Segment:
    """Width 16: BF16 values, no scales (round to nearest even)."""

    unbiased = False

    @staticmethod
    def nbytes(n: int) -> int:
        return 2 * n

    def encode(self, x: torch.Tensor, out: torch.Tensor, backend: str = "numba",
               **_: object) -> None:
        if backend == "triton":
            _triton_launchers().wire_encode(x, "bf16", out)
            return
        out.view(torch.bfloat16).copy_(x)

    def decode(self, data: torch.Tensor, out: torch.Tensor, backend: str = "numba",
               **_: object) -> None:
        if backend == "triton":
            _triton_launchers().wire_decode(data, "bf16", out)
            return
        out.copy_(data.view(torch.bfloat16))

    def recompress(self, data: torch.Tensor, acc: torch.Tensor, out: torch.Tensor,
                   writeback: str, backend: str = "numba", **_: object) -> None:
        if backend == "triton":  # acc ends as the sum unless the decoded value is asked for
            _triton_launchers().wire_recompress(data, acc, "bf16", out,
                                                "decoded" if writeback == "decoded" else "sum")
            return
        acc.add_(data.view(torch.bfloat16).float())
        out.view(torch.bfloat16).copy_(acc)
        if writeback == "decoded":
            acc.copy_(out.view(torch.bfloat16))


class _QuantSegment:
    """Widths 2–8: one block quantizer."""

    def __init__(self, q: BlockQuantizer) -> None:
        self.q = q
        self.unbiased = q.unbiased

    def nbytes(self, n: int) -> int:
        return self.q.nbytes(n)

    def encode(self, x: torch.Tensor, out: torch.Tensor, **rand: object) -> None:
        self.q.encode(x, out=out, **rand)

    def decode(self, data: torch.Tensor, out: torch.Tensor, **rand: object) -> None:
        self.q.decode(Payload(self.q, out.numel(), data), out=out, **rand)

    def recompress(self, data: torch.Tensor, acc: torch.Tensor, out: torch.Tensor,
                   writeback: str, **rand: object) -> None:
        self.q.recompress(Payload(self.q, acc.numel(), data), acc, writeback=writeback,
                          out=out, **rand)


@lru_cache(maxsize=64)
def _measured_error(q: BlockQuantizer | None) -> float:
    """Relative squared error of one quantizer on Gaussian data (fixed seed, 2^16 values)."""
    g = torch.Generator().manual_seed(0x5EED)
    x = torch.randn(1 << 16, generator=g)
    if q is None:  # BF16: relative error of round-to-nearest
        y = x.to(torch.bfloat16).float()
    else:
        y = q.decode(q.encode(x, seed=1), seed=1)
    return float(((y.double() - x.double()) ** 2).sum() / (x.double() ** 2).sum())


@dataclass
class WidthPlan:
    """The per-call width decision of a :class:`DynamiQ` codec (identical on every rank).

    Attributes:
        choice: int64 ``[super-groups]``, index into the codec's options
            (:attr:`DynamiQ.option_keys`) per super-group.
        widths: The width of every option, in option order (by wire cost; a width repeats
            when it is offered with several group sizes).
        budget_bits: Bits the allocation was given (budget minus metadata).
        used_bits: Bits the chosen widths cost on the wire, for the whole vector.
    """

    choice: np.ndarray
    widths: tuple[int, ...]
    budget_bits: float
    used_bits: float
    _layouts: dict = field(default_factory=dict, repr=False)
    position: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        # each super-group's place in the whole vector's stable order by width: the random
        # numbers of a coordinate are keyed by it, so any cut into chunks or tiles draws the same
        order = np.argsort(self.choice, kind="stable")
        self.position = np.empty_like(order)
        self.position[order] = np.arange(order.size)

    def histogram(self) -> dict[int, float]:
        """Fraction of super-groups at each width."""
        m = max(1, self.choice.size)
        out: dict[int, float] = {}
        for i, w in enumerate(self.widths):
            out[w] = out.get(w, 0.0) + float((self.choice == i).sum()) / m
        return out


@dataclass(frozen=True)
class _ChunkLayout:
    order: torch.Tensor  # int64 [sgs], chunk-local super-group indices sorted by width
    # (option, sg0, coord count, b0, b1, random-number index of the segment's first coordinate);
    # BF16 segment first in the bytes, the others in width order
    segments: tuple[tuple[int, int, int, int, int, int], ...]
    nbytes: int
    sgs: int


@CODECS.register("dynamiq")
@dataclass(frozen=True)
class DynamiQ(PartialSumCodec):
    """DynamiQ partial-sum codec: variable widths per super-group, fresh scales per hop.

    Args:
        bits: Budget ``b̄`` in bits per coordinate, metadata included (the metadata phase's
            two statistics per super-group count 0.0625 with ``metadata="fp8"``, 0.125 with
            BF16).
        widths: Candidate widths, ``'/'``-separated (e.g. ``"2/4/8"``, the paper's set) or a
            sequence; values in 2–8 and 16 (BF16). The default ``2/3/4/5/6/7/8`` measured about
            2× lower error than ``2/4/8`` at equal bits. A single width in a single group size
            (one option) disables the allocation (and its metadata).
        eps: ε per width (same order as ``widths``), ``'/'``-separated; empty for
            :data:`TUNED_EPSILON`. Ignored for ``levels="uniform"`` and width 16.
        levels: ``"eps"`` (ε-levels) or ``"uniform"``.
        scales: ``"hier"`` (UINT8 group scales under a super-group scale, stochastic scale
            rounding) or ``"flat"`` (a BF16 scale per group, rounded up).
        rounding: ``"correlated"`` (stratified across ranks and hops) or ``"stochastic"``.
        allocator: ``"measured"`` (error model from the codec's own measured error per width)
            or ``"paper"`` (``4^−w``, the paper's thresholds).
        seed: Seed of the rounding random numbers (shared by all ranks).
        group_size: Coordinates per group scale (a power of two from 4 to 256), or several
            ``'/'``-separated: every width is then offered with each, and the allocation picks
            one (width, group size) option per super-group, which refines its steps from 256
            to 32 bits per super-group. The paper uses 16; 32 halves the scales' cost and
            measured 10–15 % lower error at equal bits on both real-gradient workloads; the
            default ``32/64`` a further 4 % (gpt-stdlib).
        scale_rounding: How hierarchical group scales are rounded to UINT8: ``"stochastic"``
            (the paper: unbiased scale, elements normalised by the exact group max) or
            ``"up"`` (never below the group max, elements normalised by the rounded scale:
            also unbiased, without the scale's multiplicative noise).
        dither: Subtractive dithering (``BlockQuantizer.dither``): every receiver regenerates
            the uniforms the sender rounded with and removes most of the rounding noise,
            still unbiased, at no cost on the wire. Measured about 1.6× lower vNMSE on the
            real-gradient workloads; ``False`` is plain stochastic (or correlated) rounding,
            the paper's.
        dither_min_width: Narrowest dithered width; narrower ones round stochastically. The
            dither's noise is the same for every element of a group, proportional to the
            group's maximum, so along a chain of hops it feeds back through the next hop's
            maximum and grows by about ``1 + 6κ²/12`` per hop (1.5 at width 2, 1.05 at 3, 1.009
            at 4): dithering widths 2 and 3 diverged on 64-rank rings, from 4 on it stays
            stable (measured up to 128 ranks, 1.8× lower vNMSE than no dithering there).
        metadata: Precision of the two statistics of the metadata phase: ``"fp8"`` (8 bits
            each, ``csumsq8``/``sum8``: 0.0625 bits/coordinate with a sum-of-squares for the
            allocation and a sum for centering, whose 1/16 relative precision costs nothing
            measurable) or ``"bf16"`` (16 bits each, the paper's 0.125). Pair it with
            ``center(statistic=sum8)`` resp. ``center``, so centering reuses the same sum.
        super_scale: Format of the hierarchical super-group scale, rounded up: ``"bf16"``
            (16 bits, the paper's) or ``"e8m0"`` (a power of two, 8 bits: it saves 1/32
            bit/coordinate but halves the relative resolution of the UINT8 group scales below
            it; at 5 bits/coordinate it measured 2.6 % lower vNMSE on gpt-stdlib and 22 %
            higher on minilm-mlm, so it is not the default).
    """

    bits: float = 5.0
    widths: str = "2/3/4/5/6/7/8"
    eps: str = ""
    levels: str = "eps"
    scales: str = "hier"
    rounding: str = "correlated"
    allocator: str = "measured"
    seed: int = 0
    group_size: int | str = "32/64"
    scale_rounding: str = "stochastic"
    dither: bool = True
    dither_min_width: int = 4
    metadata: str = "fp8"
    super_scale: str = "bf16"

    block_size = SUPER_GROUP

    def __post_init__(self) -> None:
        ws = _parse_list("widths", self.widths, int)
        if not ws:
            raise ValueError("widths must name at least one width")
        bad = [w for w in ws if w not in _ALLOWED]
        if bad:
            raise ValueError(f"widths must be among {_ALLOWED}, got {bad}")
        if len(set(ws)) != len(ws):
            raise ValueError(f"widths repeat: {ws}")
        order = sorted(range(len(ws)), key=lambda i: ws[i])
        eps = _parse_list("eps", self.eps, float)
        if eps and len(eps) != len(ws):
            raise ValueError(f"eps needs one value per width ({len(ws)}), got {len(eps)}")
        if any(not (math.isfinite(e) and e >= 0) for e in eps):
            raise ValueError(f"eps values must be finite and >= 0, got {eps}")
        object.__setattr__(self, "widths", _fmt_list(tuple(ws[i] for i in order)))
        object.__setattr__(self, "eps", _fmt_list(tuple(float(eps[i]) for i in order))
                           if eps else "")
        if not (isinstance(self.bits, (int, float)) and math.isfinite(self.bits)
                and self.bits > 0):
            raise ValueError(f"bits must be a positive number, got {self.bits!r}")
        object.__setattr__(self, "bits", float(self.bits))
        for name, value, allowed in (("scale_rounding", self.scale_rounding, ("stochastic", "up")),
                                     ("metadata", self.metadata, ("fp8", "bf16")),
                                     ("super_scale", self.super_scale, ("bf16", "e8m0")),
                                     ("levels", self.levels, _LEVELS),
                                     ("scales", self.scales, _SCALES),
                                     ("rounding", self.rounding, _ROUNDINGS),
                                     ("allocator", self.allocator, _ALLOCATORS)):
            if value not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed must be a non-negative int, got {self.seed!r}")
        if not isinstance(self.dither, bool):
            raise TypeError(f"dither must be a bool, got {self.dither!r}")
        if (isinstance(self.dither_min_width, bool) or not isinstance(self.dither_min_width, int)
                or not 2 <= self.dither_min_width <= 16):
            raise ValueError(f"dither_min_width must be an int in [2, 16], got "
                             f"{self.dither_min_width!r}")
        gs = _parse_list("group_size", self.group_size, int) if isinstance(
            self.group_size, (str, tuple, list)) else (self.group_size,)
        if not gs:
            raise ValueError("group_size must name at least one size")
        for g in gs:
            if isinstance(g, bool) or not isinstance(g, int) or g < 4 or g > SUPER_GROUP or (
                    g & (g - 1)):
                raise ValueError(f"group_size must be powers of two in [4, {SUPER_GROUP}], got "
                                 f"{self.group_size!r}")
        if len(set(gs)) != len(gs):
            raise ValueError(f"group sizes repeat: {self.group_size!r}")
        gs = tuple(sorted(gs))
        object.__setattr__(self, "group_size", gs[0] if len(gs) == 1 else _fmt_list(gs))
        cheapest = min(self._options_full, key=lambda o: o.cost)
        floor = (cheapest.cost * 1024 + self._meta_bits(1024 * SUPER_GROUP)) / (
            1024 * SUPER_GROUP)
        if self.bits < floor - 1e-9:
            raise ValueError(
                f"bits={self.bits:g} is below what the cheapest width costs with its scales "
                f"and metadata ({floor:.4g} bits/coordinate)"
            )

    # ---- configuration ----------------------------------------------------------------------
    @cached_property
    def width_list(self) -> tuple[int, ...]:
        """The widths, increasing."""
        return _parse_list("widths", self.widths, int)

    @cached_property
    def group_sizes(self) -> tuple[int, ...]:
        """The group sizes, increasing."""
        g = self.group_size
        return (g,) if isinstance(g, int) else _parse_list("group_size", g, int)

    @cached_property
    def option_keys(self) -> tuple[tuple[int, int], ...]:
        """The coding options ``(width, group size)`` in the order of their indices, which is
        by increasing wire cost (the allocator's order): every width with every group size
        (width 16, unscaled BF16, once with group size 0)."""
        return tuple(k for k, _ in self._options)

    @property
    def variable(self) -> bool:
        """Whether options are allocated per super-group (more than one width or group size)."""
        return len(self.option_keys) > 1

    @property
    def statistics(self) -> tuple[str, ...]:  # type: ignore[override]
        if not self.variable:
            return ()
        return ("csumsq8", "sum8") if self.metadata == "fp8" else ("csumsq", "sum")

    @property
    def variable_size(self) -> bool:  # type: ignore[override]
        return self.variable

    def _eps_for(self, i: int, w: int) -> float:
        if self.levels == "uniform":
            return 0.0
        if self.eps:
            return _parse_list("eps", self.eps, float)[i]
        return TUNED_EPSILON[w]

    @cached_property
    def _options(self) -> tuple[tuple[tuple[int, int], BlockQuantizer | None], ...]:
        """``((width, group size), quantizer)`` of every option, by increasing wire cost."""
        out = []
        for i, w in enumerate(self.width_list):
            if w == 16:
                out.append(((16, 0), None))
                continue
            fmt = EpsilonFormat(w, self._eps_for(i, w))
            dither = self.dither and w >= self.dither_min_width
            for g in self.group_sizes:
                if self.scales == "hier":
                    q = BlockQuantizer(fmt, group_size=g, scale="u8rel", rounding=self.rounding,
                                       scale_rounding=self.scale_rounding,
                                       super_group_size=SUPER_GROUP,
                                       super_scale=self.super_scale, dither=dither)
                else:
                    q = BlockQuantizer(fmt, group_size=g, scale="bf16", rounding=self.rounding,
                                       scale_rounding="up", dither=dither)
                out.append(((w, g), q))

        def cost(item: tuple[tuple[int, int], BlockQuantizer | None]) -> tuple[int, int, int]:
            (w, g), q = item
            return (2 * SUPER_GROUP if q is None else q.nbytes(SUPER_GROUP), w, -g)

        return tuple(sorted(out, key=cost))

    @cached_property
    def quantizers(self) -> tuple[BlockQuantizer | None, ...]:
        """The quantizer of each option of :attr:`option_keys` (``None`` for BF16)."""
        return tuple(q for _, q in self._options)

    @cached_property
    def _segments(self) -> tuple:
        return tuple(_Bf16Segment() if q is None else _QuantSegment(q) for q in self.quantizers)

    @cached_property
    def _options_full(self) -> list[WidthOption]:
        opts = []
        for (w, _), q, seg in zip(self.option_keys, self.quantizers, self._segments):
            cost = 8.0 * seg.nbytes(SUPER_GROUP)
            err = 4.0 ** (-w) if self.allocator == "paper" else _measured_error(q)
            opts.append(WidthOption(w, err, cost))
        return opts

    @cached_property
    def _option_widths(self) -> tuple[int, ...]:
        return tuple(w for w, _ in self.option_keys)

    @property
    def unbiased(self) -> bool:  # type: ignore[override]
        return all(s.unbiased for s in self._segments)

    def _meta_bits(self, length: int) -> int:
        return metadata_bits(self.statistics, length)

    # ---- the per-call decision ------------------------------------------------------------
    def prepare(self, stats: Mapping[str, torch.Tensor], length: int, world_size: int,
                state: dict) -> WidthPlan:
        """Widths for every super-group of the ``length``-long vector (see the module doc)."""
        m = -(-length // SUPER_GROUP)
        opts = self._options_full
        if not self.variable:
            choice = np.zeros(m, dtype=np.int64)
            return WidthPlan(choice, self._option_widths, self.bits * length,
                             float(opts[0].cost * m))
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
        budget = self.bits * length - metadata_bits(sorted(declared), length)
        costs = self._costs(m, length)
        if m == 1 and float(costs.min()) > budget:
            # a vector shorter than one super-group whose budget cannot pay even the cheapest
            # option (the metadata and a group's scales dominate a few coordinates): the
            # budget is overrun whatever is sent, so send the most accurate option; the
            # overrun is bounded by one super-group and the result reports the bits spent
            choice = np.array([int(np.argmin([o.error for o in opts]))], dtype=np.int64)
        else:
            alloc_costs = costs
            if length < SHORT_LENGTH and any(w >= SHORT_MIN_WIDTH for w in self._option_widths):
                # short vectors: fixed costs (metadata, scales, groups cut short) leave the
                # narrowest widths, whose error is of the order of the signal; keep them out
                # (the budget may then be overrun by a bounded amount, reported as spent)
                narrow = np.array([w < SHORT_MIN_WIDTH for w in self._option_widths])
                alloc_costs = np.where(narrow[None, :], np.inf, costs)
            choice = allocate(energy, opts, budget, state, alloc_costs)
        used = float(np.take_along_axis(costs, choice[:, None], 1).sum())
        return WidthPlan(choice, self._option_widths, budget, used)

    def _costs(self, m: int, length: int) -> np.ndarray:
        """float64 ``[m, options]``: wire bits of every option for every super-group (a partial
        last one is cut to the groups it touches, so it costs less)."""
        costs = np.tile(np.array([o.cost for o in self._options_full]), (m, 1))
        tail = length - (m - 1) * SUPER_GROUP
        if tail < SUPER_GROUP:
            costs[-1] = [8.0 * seg.nbytes(tail) for seg in self._segments]
        return costs

    def _plan(self, ctx: HopContext | None) -> WidthPlan:
        plan = self.plan_in(ctx)
        if plan is None:
            raise ValueError(
                "the dynamiq codec needs the call's width plan: run it inside a pipeline "
                "(simulate / all_reduce), or pass a HopContext with prepared={codec: plan}"
            )
        return plan

    def _layout(self, n: int, ctx: HopContext | None) -> _ChunkLayout:
        sgs = -(-n // SUPER_GROUP)
        off = 0 if ctx is None else ctx.index_offset
        if not self.variable and (ctx is None or ctx.prepared is None
                                  or self not in ctx.prepared):
            key = (off, n)
            choice = np.zeros(sgs, dtype=np.int64)
            position = np.arange(sgs, dtype=np.int64) + off // SUPER_GROUP
            cache: dict = {}
        else:
            wp = self._plan(ctx)
            if off % SUPER_GROUP:
                raise ValueError(f"chunk offset {off} is not a multiple of {SUPER_GROUP}")
            key = (off, n)
            cache = wp._layouts
            if key in cache:
                return cache[key]
            j0 = off // SUPER_GROUP
            choice = wp.choice[j0: j0 + sgs]
            position = wp.position[j0: j0 + sgs]
        order = np.argsort(choice, kind="stable")
        counts = np.bincount(choice, minlength=len(self.option_keys))
        pad = sgs * SUPER_GROUP - n
        tail_option = int(choice[-1]) if sgs else -1
        parts, sg0 = [], 0
        for i, k in enumerate(counts):
            if not k:
                continue
            coords = int(k) * SUPER_GROUP
            if i == tail_option:
                # the partial last super-group is the last of its width (stable order)
                coords -= pad
            parts.append((i, sg0, coords, int(position[order[sg0]]) * SUPER_GROUP))
            sg0 += int(k)
        # BF16 values go first in the message, so they sit on an even byte offset whatever
        # the (possibly odd) sizes of the quantized segments
        parts.sort(key=lambda t: self.quantizers[t[0]] is not None)
        segs, b0 = [], 0
        for i, sg, coords, first in parts:
            nb = self._segments[i].nbytes(coords)
            segs.append((i, sg, coords, b0, b0 + nb, first))
            b0 += nb
        lay = _ChunkLayout(torch.from_numpy(order), tuple(segs), b0, sgs)
        cache[key] = lay
        return lay

    # ---- sizes ---------------------------------------------------------------------------
    def wire_bytes(self, n: int, ctx: HopContext | None = None) -> int:
        return self._layout(n, ctx).nbytes

    def max_wire_bytes(self, n: int) -> int:
        return max(seg.nbytes(n) for seg in self._segments)

    # ---- hop operations ------------------------------------------------------------------
    def _rand(self, ctx: HopContext | None, first: int) -> dict:
        """Random-number keys of the segment starting at ``first`` under ``ctx``."""
        if ctx is None:
            return {"seed": self.seed, "index_offset": first}
        return {"seed": self.seed, "rank": ctx.rank, "world_size": ctx.world_size,
                "stream": ctx.stream, "index_offset": first}

    @staticmethod
    def _device_order(lay: _ChunkLayout, device: torch.device) -> torch.Tensor:
        """The layout's super-group order on ``device`` (copied once per layout and device)."""
        cache = lay.__dict__.setdefault("_device_order", {})  # a frozen dataclass's own dict
        order = cache.get(str(device))
        if order is None:
            order = cache[str(device)] = lay.order.to(device)
        return order

    @staticmethod
    def _gather(x: torch.Tensor, lay: _ChunkLayout, backend: str = "numba") -> torch.Tensor:
        """Chunk values reordered by width: float32 ``[sgs * 256]`` (zero padded)."""
        if backend == "triton":
            return _triton_launchers().gather_rows(x, DynamiQ._device_order(lay, x.device),
                                                   SUPER_GROUP)
        full = lay.sgs * SUPER_GROUP
        if x.numel() == full:
            return x.view(lay.sgs, SUPER_GROUP).index_select(0, lay.order).view(-1)
        pad = torch.zeros(full, dtype=torch.float32)
        pad[: x.numel()] = x
        return pad.view(lay.sgs, SUPER_GROUP).index_select(0, lay.order).view(-1)

    @staticmethod
    def _scatter(src: torch.Tensor, out: torch.Tensor, lay: _ChunkLayout, add: bool,
                 backend: str = "numba") -> None:
        """``out (+)= src`` with the reorder undone (``src`` as :meth:`_gather` returns)."""
        if backend == "triton":
            _triton_launchers().scatter_rows(src, DynamiQ._device_order(lay, out.device), out,
                                             add, SUPER_GROUP)
            return
        rows = src.view(lay.sgs, SUPER_GROUP)
        n = out.numel()
        if n == lay.sgs * SUPER_GROUP:
            dst = out.view(lay.sgs, SUPER_GROUP)
            if add:
                dst.index_add_(0, lay.order, rows)
            else:
                dst.index_copy_(0, lay.order, rows)
            return
        full = torch.zeros(lay.sgs * SUPER_GROUP, dtype=torch.float32)
        full.view(lay.sgs, SUPER_GROUP).index_copy_(0, lay.order, rows)
        if add:
            out.add_(full[:n])
        else:
            out.copy_(full[:n])

    def _out(self, lay: _ChunkLayout, out: torch.Tensor | None,
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
        be = hop_backend(ctx, x)
        out = self._out(lay, out, x.device)
        g = self._gather(x, lay, be)
        for i, sg0, coords, b0, b1, first in lay.segments:
            s = sg0 * SUPER_GROUP
            self._segments[i].encode(g[s:s + coords], out[b0:b1], backend=be,
                                     **self._rand(ctx, first))
        return out

    def _decode_gathered(self, data: torch.Tensor, lay: _ChunkLayout, ctx: HopContext | None,
                         backend: str = "numba") -> torch.Tensor:
        if data.numel() != lay.nbytes:
            raise ValueError(f"message has {data.numel()} bytes, this chunk's layout {lay.nbytes}")
        g = torch.zeros(lay.sgs * SUPER_GROUP, dtype=torch.float32, device=data.device)
        src = None if ctx is None else ctx.producer
        for i, sg0, coords, b0, b1, first in lay.segments:
            s = sg0 * SUPER_GROUP
            self._segments[i].decode(data[b0:b1], g[s:s + coords], backend=backend,
                                     **self._rand(src, first))
        return g

    def decompress(self, data, out, ctx=None):
        """Decode into ``out`` (float32 ``[n]``); dithered widths use ``ctx.producer``'s keys."""
        lay = self._layout(out.numel(), ctx)
        be = hop_backend(ctx, out)
        self._scatter(self._decode_gathered(data, lay, ctx, be), out, lay, add=False, backend=be)
        return out

    def decompress_accumulate(self, data, acc, ctx=None):
        """``acc += decompress(data)`` (one float32 addition per coordinate)."""
        lay = self._layout(acc.numel(), ctx)
        be = hop_backend(ctx, acc)
        self._scatter(self._decode_gathered(data, lay, ctx, be), acc, lay, add=True, backend=be)

    def decompress_accumulate_recompress(self, data, acc, ctx, out=None, writeback="none"):
        """``compress(acc + decompress(data))`` with fresh scales, widths unchanged."""
        if writeback not in _WRITEBACK:
            raise ValueError(f"writeback must be one of {_WRITEBACK}")
        _check_chunk(acc, "accumulator")
        lay = self._layout(acc.numel(), ctx)
        if data.numel() != lay.nbytes:
            raise ValueError(f"message has {data.numel()} bytes, this chunk's layout {lay.nbytes}")
        be = hop_backend(ctx, acc)
        out = self._out(lay, out, acc.device)
        g = self._gather(acc, lay, be)
        src = ctx.producer
        for i, sg0, coords, b0, b1, first in lay.segments:
            s = sg0 * SUPER_GROUP
            self._segments[i].recompress(data[b0:b1], g[s:s + coords], out[b0:b1], writeback,
                                         backend=be, in_rank=src.rank, in_stream=src.stream,
                                         **self._rand(ctx, first))
        if writeback != "none":
            self._scatter(g, acc, lay, add=False, backend=be)
        return out

    def spec(self) -> str:
        return format_call("dynamiq", self)
