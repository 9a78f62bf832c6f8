"""The MX baselines (MXFP8 / MXFP6 / MXFP4, NVFP4) as a partial-sum codec (docs/method.rst).

Every block of ``block`` consecutive coordinates shares one scale that all ranks derive from the
metadata phase, so no scale travels with the data and every hop re-casts onto the *same* grid:

1. **Metadata.** The per-block maximum ``max_i max_blk |x_i|`` (statistic ``absmax32`` or
   ``absmax16``, each rank's value rounded up to BF16, max-reduced). The metadata module
   accounts it at 16 bits per block: 0.5 bits/coordinate for blocks of 32 (MXFP8 costs 8.5
   bits/coordinate, as the paper counts it), 1 bit/coordinate for blocks of 16.
2. **Scale** (:meth:`SharedScale.prepare`): ``raw = gmax * μ / elem_max`` rounded *up* to the
   scale format. E8M0 scales are powers of two (``2**ceil(log2 raw)``, clamped to E8M0's
   ``2**-127 … 2**127``). Any other scale format (E4M3 for NVFP4) cannot span a gradient's
   range on its own, so, as NVFP4 does, it is relative to one FP32 per-tensor scale
   ``T = max(raw) / fmt_max`` that every rank computes from the same metadata: the block scale
   is ``T * up(raw / T)``. ``μ`` is the FP8-LM-style auto-scale factor (a power of two, kept in
   the per-tensor ``state``): partial sums of ``k`` ranks exceed one rank's maximum, by about
   ``sqrt(k)`` for random signs, so it starts at ``2**round(log2 sqrt(n))``.
3. **Hops.** Every hop adds in float32 and re-casts with round-to-nearest-even onto
   ``element`` × the block's scale, saturating at ``±elem_max * scale``. No per-hop rescaling,
   no stochastic rounding (biased: ``unbiased = False``).
4. **Auto-scale** (:meth:`SharedScale.observe`, on the final result, identical on every rank):
   the coordinates whose magnitude equals their block's saturation value ``elem_max * scale``
   are counted; if more than ``1e-4`` of the coordinates saturated, ``μ`` doubles for the next
   call; if none did, ``μ`` halves, but never below 1.

NaN and ±Inf (inputs, or any partial sum) are coded as NaN, so they stay visible; E4M3 has a
NaN code, and formats without one (E3M2, E2M1) use the negative-zero pattern, which a
round-to-nearest cast never produces otherwise (zero is always coded ``+0``).

Wire: only the element codes, ``bits`` per coordinate, packed (6- and 4-bit codes share
bytes); see :mod:`dynamiq.kernels.numba.baselines` for the layout.

Outside a collective (a :class:`HopContext` without ``prepared`` values, or none) every block's
scale is 1: the codec is then a plain saturating cast to ``element``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

import numpy as np
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
from dynamiq.codecs.batch import ragged_arange, split_unaligned
from dynamiq.formats import FORMATS, FloatFormat, NumberFormat
from dynamiq.kernels import FormatTables, SharedScaleCode, backend_for
from dynamiq.spec import format_call

__all__ = ["MX_ELEMENTS", "SharedScale", "SharedScalePlan", "mx_codec"]

#: Overflow rate above which the auto-scale factor doubles.
OVERFLOW_RATE = 1e-4
#: Upper bound of the auto-scale factor (a runaway guard; 2**24 ranks' worth of head-room).
MAX_MU = 2.0**24

_STATISTIC = {32: "absmax32", 16: "absmax16"}
_E8M0_MIN_EXP = -127
_E8M0_MAX_EXP = 127

#: The OCP MX formats as this codec runs them (blocks of 32 under E8M0 scales): method name →
#: element format. The ``mxfp*`` baselines and DynamiQ's named accuracy targets both read it.
MX_ELEMENTS = {"mxfp8": "e4m3", "mxfp6": "e3m2", "mxfp4": "e2m1"}


def initial_mu(world_size: int) -> float:
    """``2**round(log2(sqrt(n)))`` (halves round up): the auto-scale factor of a first call."""
    return 2.0 ** math.floor(0.5 * math.log2(max(1, world_size)) + 0.5)


@dataclass(frozen=True)
class SharedScalePlan:
    """The per-call decision of a :class:`SharedScale` codec (identical on every rank).

    Attributes:
        scales: float32 ``[blocks]``, the shared scale of every block of the vector (NaN for a
            block whose global maximum is not finite).
        saturation: float32 ``[blocks]``, ``elem_max * scale`` as decoded (the value an
            overflowing coordinate takes).
        mu: The auto-scale factor the scales were computed with.
        tensor_scale: The FP32 per-tensor scale ``T`` (1 for power-of-two scales).
    """

    scales: torch.Tensor
    saturation: torch.Tensor
    mu: float
    tensor_scale: float = 1.0


@CODECS.register("shared_scale")
@dataclass(frozen=True)
class SharedScale(DecodeHops, PartialSumCodec):
    """MX-style partial sums: minifloat elements under a shared per-block scale from the metadata.

    Equivalent, at every hop, to ``cast_rne_saturate((acc + decode(msg)) / scale) * scale``
    with one fixed scale per block for the whole call (see the module doc).

    Args:
        element: Element format name (``"e4m3"`` MXFP8, ``"e3m2"`` MXFP6, ``"e2m1"`` MXFP4 and
            NVFP4, or any signed table format of :data:`~dynamiq.formats.FORMATS` with a zero).
        block: Coordinates per shared scale: 32 (MX) or 16 (NVFP4) — the block sizes of the
            ``absmax32`` / ``absmax16`` metadata statistics.
        scale: Scale format name: ``"e8m0"`` (power-of-two, MX) or another float format such
            as ``"e4m3"`` (NVFP4-style, under an FP32 per-tensor scale).

    Raises:
        ValueError: unknown format, element format unusable (unsigned, no zero, FP32), scale
            format not a float format, or a block size without a matching statistic.
    """

    element: str = "e4m3"
    block: int = 32
    scale: str = "e8m0"

    @classmethod
    def examples(cls) -> list[SharedScale]:
        """The default (MXFP8-like) and an NVFP4-like configuration."""
        return [cls(), cls("e2m1", 16, "e4m3")]

    def __post_init__(self) -> None:
        for name in ("element", "scale"):
            value = getattr(self, name)
            if not isinstance(value, str):
                raise ValueError(f"shared_scale {name} must be a format name, got {value!r}")
            # canonical names, so that aliases give equal codecs and one spec string
            object.__setattr__(self, name, FORMATS.canonical(value))
        fmt = FORMATS[self.element]
        if fmt.kind != "table" or not fmt.signed or fmt.min_value != 0.0 or fmt.bits > 16:
            raise ValueError(
                f"shared_scale element {self.element!r} must be a signed format of at most 16 "
                f"bits with a zero (got {fmt.describe()})"
            )
        if not isinstance(FORMATS[self.scale], FloatFormat):
            raise ValueError(
                f"shared_scale scale {self.scale!r} must be a float format such as 'e8m0' or "
                "'e4m3'"
            )
        if isinstance(self.block, bool) or self.block not in _STATISTIC:
            raise ValueError(
                f"shared_scale block must be one of {sorted(_STATISTIC)} (the block sizes of the "
                f"per-block maximum statistics {sorted(_STATISTIC.values())}), got {self.block!r}"
            )

    # ---- configuration ----------------------------------------------------------------------
    @property
    def block_size(self) -> int:  # type: ignore[override]
        return self.block

    @property
    def statistics(self) -> tuple[str, ...]:  # type: ignore[override]
        return (_STATISTIC[self.block],)

    @property
    def element_format(self) -> NumberFormat:
        """The element format object."""
        return FORMATS[self.element]

    @property
    def bits(self) -> int:
        """Bits per coordinate on the wire."""
        return self.element_format.bits

    @cached_property
    def _code(self) -> SharedScaleCode:
        """The element format as the kernels see it (its NaN code, or negative zero as NaN)."""
        fmt = self.element_format
        mb = fmt.magnitude_bits
        dec = fmt.decode(np.arange(2**fmt.bits)).astype(np.float32)
        if fmt.nan_code is not None:
            nan_code = fmt.nan_code
        else:
            nan_code = 1 << mb  # negative zero: never produced by the cast itself
            dec[nan_code] = np.nan
        return SharedScaleCode(FormatTables.of(fmt), mb, nan_code, dec)

    # ---- sizes --------------------------------------------------------------------------------
    def wire_bytes(self, n: int, ctx: HopContext | None = None) -> int:
        """``ceil(n * bits / 8)``: the packed element codes, nothing else."""
        return -(-n * self.bits // 8)

    # ---- the metadata phase -------------------------------------------------------------------
    def _scales(self, gmax: np.ndarray, mu: float) -> tuple[np.ndarray, float]:
        """float32 block scales for float64 global block maxima, and the per-tensor scale."""
        raw = gmax * mu / self.element_format.max_value
        finite = np.isfinite(raw)
        out = np.full(raw.shape, np.nan)
        sfmt = FORMATS[self.scale]
        tensor = 1.0
        if self.scale == "e8m0":
            with np.errstate(divide="ignore"):
                e = np.ceil(np.log2(np.where(finite & (raw > 0), raw, 1.0)))
            e = np.where(finite & (raw > 0), e, _E8M0_MIN_EXP)
            out[finite] = np.ldexp(1.0, np.clip(e, _E8M0_MIN_EXP, _E8M0_MAX_EXP)
                                   .astype(np.int64))[finite]
        else:
            top = float(raw[finite].max()) if finite.any() else 0.0
            tensor = top / sfmt.max_value if top > 0 else 1.0
            if top / tensor > sfmt.max_value:  # keep the largest block inside the format
                tensor = float(np.nextafter(tensor, np.inf))
            ratio = np.where(finite, raw / tensor, 0.0)
            q = sfmt.decode(sfmt.encode(ratio, rounding="up"))
            q = np.where(q > 0, q, sfmt.magnitudes()[sfmt.magnitudes() > 0][0])
            out[finite] = (q * tensor)[finite]
        s = out.astype(np.float32)
        # the float32 scale must not fall below the float64 one (the maximum must not saturate)
        low = np.isfinite(s) & (s.astype(np.float64) < out)
        s[low] = np.nextafter(s[low], np.float32(np.inf))
        return s, tensor

    def prepare(self, stats: Mapping[str, torch.Tensor], length: int, world_size: int,
                state: dict) -> SharedScalePlan:
        """Block scales from the global block maxima and the auto-scale factor in ``state``.

        Args:
            stats: Global statistics; reads float64 ``[ceil(length / block)]``
                ``stats["absmax32"]`` (or ``"absmax16"``).
            length: Vector length.
            world_size: Number of ranks (sets the first call's ``μ``).
            state: Per-tensor state; ``state["mu"]`` is read (created on the first call).
        """
        gmax = stats[_STATISTIC[self.block]].double().cpu().numpy()
        blocks = -(-length // self.block)
        if gmax.size != blocks:
            raise ValueError(f"{_STATISTIC[self.block]} has {gmax.size} blocks, the vector "
                             f"needs {blocks}")
        mu = float(state.setdefault("mu", initial_mu(world_size)))
        s, tensor = self._scales(gmax, mu)
        top = np.float32(self.element_format.max_value)
        sat = (top * s).astype(np.float32)  # float32 multiply, as the decoder computes it
        return SharedScalePlan(torch.from_numpy(s), torch.from_numpy(sat), mu, tensor)

    def observe(self, result: torch.Tensor, prepared: SharedScalePlan | None, world_size: int,
                state: dict) -> None:
        """Count saturated coordinates of the result and adapt ``μ`` (see the module doc).

        Sets ``state["mu"]`` for the next call and ``state["overflow_rate"]`` (the fraction of
        coordinates at their block's saturation value in this call).
        """
        if prepared is None:
            return
        r = result.detach().float().reshape(-1).cpu()
        n = r.numel()
        sat = prepared.saturation
        whole = min(n // self.block, sat.numel())
        hits = 0
        if whole:
            v = r[: whole * self.block].view(whole, self.block)
            # the block maxima find the blocks that reach their saturation value (or hold a
            # NaN, which hides the maximum): only those are compared element by element, so
            # the count costs one read of the result (the backend's statistics kernel)
            # instead of a copy, a padding and a compare
            top = backend_for("auto", v).block_statistics(
                v.reshape(-1), [("absmax", self.block)])[("absmax", self.block)]
            cand = torch.nonzero((top >= sat[:whole]) | torch.isnan(top)).flatten()
            if cand.numel():
                hits += int((v[cand].abs() == sat[cand, None]).sum())
        if whole * self.block < n and whole < sat.numel():
            hits += int((r[whole * self.block:].abs() == sat[whole]).sum())
        rate = hits / max(1, n)
        mu = prepared.mu
        if rate > OVERFLOW_RATE:
            mu = min(MAX_MU, mu * 2.0)
        elif hits == 0:
            mu = max(1.0, mu / 2.0)
        state["mu"] = mu
        state["overflow_rate"] = rate

    # ---- hop operations -----------------------------------------------------------------------
    def _block_scales(self, n: int, ctx: HopContext | None, device: torch.device
                      ) -> torch.Tensor:
        """float32 scales of the chunk's blocks on ``device`` (ones outside a collective; the
        plan's scales are copied to a device once per call, not once per hop)."""
        nb = -(-n // self.block)
        plan = self.plan_in(ctx)
        if plan is None:
            return torch.ones(nb, dtype=torch.float32, device=device)
        off = ctx.index_offset  # type: ignore[union-attr]
        if off % self.block:
            raise ValueError(f"chunk offset {off} is not a multiple of the block {self.block}")
        j = off // self.block
        if plan.scales[j: j + nb].numel() != nb:
            raise ValueError(f"chunk [{off}, {off + n}) lies outside the prepared vector")
        full = plan.scales
        if full.device != device or full.dtype != torch.float32:
            cache = plan.__dict__.setdefault("_device_scales", {})  # a frozen dataclass's dict
            full = cache.get(str(device))
            if full is None:
                full = cache[str(device)] = plan.scales.to(device=device, dtype=torch.float32)
        return full[j: j + nb]

    def compress(self, x, ctx, out=None):
        """Packed codes (uint8 ``[ceil(n*bits/8)]``) of the float32 chunk ``x`` ``[n]``."""
        _check_chunk(x)
        n = x.numel()
        out = message_buffer(self.wire_bytes(n), out, x.device)
        hop_kernels(ctx, x).shared_encode(self._code, x, self._block_scales(n, ctx, x.device),
                                          self.block, out)
        return out

    def _decode(self, data: torch.Tensor, out: torch.Tensor, ctx: HopContext | None,
                accumulate: bool) -> None:
        _check_chunk(out, "output")
        n = out.numel()
        hop_kernels(ctx, out).shared_decode(self._code, check_message(data, self.wire_bytes(n)),
                                            self._block_scales(n, ctx, out.device), self.block,
                                            out, accumulate)

    def decompress_accumulate_recompress(self, data, acc, ctx, out=None, writeback="none"):
        """``compress(acc + decompress(data))`` in one pass, with the same block scales."""
        wb = check_writeback(writeback)
        _check_chunk(acc, "accumulator")
        n = acc.numel()
        out = message_buffer(self.wire_bytes(n), out, acc.device)
        data = check_message(data, self.wire_bytes(n))
        hop_kernels(ctx, acc).shared_recompress(self._code, data, acc,
                                                self._block_scales(n, ctx, acc.device),
                                                self.block, wb, out)
        return out

    def roundtrip_batch(self, values, batch):
        """Every row's round trip in one encode and one decode over the whole buffer: blocks
        are coded independently, on scales of the call's plan (by global block), without
        random numbers."""
        batch.check(values)
        b = self.block
        split = split_unaligned(values, batch, b, self.roundtrip_batch,
                                lambda v, sub: PartialSumCodec.roundtrip_batch(self, v, sub))
        if split is not None:
            return split
        blocks = ragged_arange(batch.offsets // b, batch.sizes // b)
        plan = self.plan_in(batch.context(0)) if len(batch) else None
        if plan is None:
            scales = torch.ones(blocks.size, dtype=torch.float32, device=values.device)
        else:
            scales = plan.scales.to(device=values.device, dtype=torch.float32)[
                torch.from_numpy(blocks).to(values.device)]
        be = backend_for(batch.backend, values)
        data = torch.empty(self.wire_bytes(values.numel()), dtype=torch.uint8,
                           device=values.device)
        be.shared_encode(self._code, values, scales, b, data)
        be.shared_decode(self._code, data, scales, b, values, False)
        return -(-batch.sizes * self.bits // 8)

    def spec(self) -> str:
        return format_call("shared_scale", self)


def mx_codec(name: str) -> SharedScale:
    """The codec of the MX method ``name`` (a key of :data:`MX_ELEMENTS`), e.g.
    ``mx_codec("mxfp8") == SharedScale("e4m3", 32, "e8m0")``.

    Raises:
        KeyError: ``name`` is not an MX method.
    """
    return SharedScale(MX_ELEMENTS[name], 32, "e8m0")
