"""Argument checks of :class:`~dynamiq.quantizers.BlockQuantizer` (one message per mistake)."""

from __future__ import annotations

from typing import Any

from dynamiq.kernels import ROUNDING, SCALE_ROUNDING

__all__ = ["ROUNDINGS", "SCALE_ROUNDINGS", "check_quantizer_config", "is_pow2"]

#: Element rounding names.
ROUNDINGS = tuple(ROUNDING)
#: Scale rounding names.
SCALE_ROUNDINGS = tuple(SCALE_ROUNDING)


def is_pow2(v: object) -> bool:
    """Whether ``v`` is a positive power-of-two ``int`` (not a bool)."""
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1 and (v & (v - 1)) == 0


def check_quantizer_config(q: Any) -> None:
    """Raise ``ValueError`` / ``TypeError`` naming the first invalid field of the quantizer
    ``q`` (its formats already resolved)."""
    el, sc = q.element, q.scale
    if el.kind != "table" or not el.signed or (el.min_value != 0.0) != el.midrise:
        raise ValueError(
            f"element format {el} must be a signed table format that represents zero, or a "
            "mid-rise one (midrise=True, no zero level)"
        )
    if not is_pow2(q.group_size):
        raise ValueError(f"group_size must be a power of two, got {q.group_size!r}")
    if (q.group_size * el.bits) % 8:
        raise ValueError(
            f"group_size * element bits must be a multiple of 8 (byte-aligned groups); "
            f"got {q.group_size} * {el.bits}"
        )
    if q.rounding not in ROUNDINGS:
        raise ValueError(f"rounding must be one of {ROUNDINGS}, got {q.rounding!r}")
    if not isinstance(q.dither, bool):
        raise TypeError(f"dither must be a bool, got {q.dither!r}")
    if q.dither and q.rounding == "nearest":
        raise ValueError("dither needs stochastic or correlated rounding (it subtracts the "
                         "rounding's uniform), not 'nearest'")
    if q.scale_rounding not in SCALE_ROUNDINGS:
        raise ValueError(
            f"scale_rounding must be one of {SCALE_ROUNDINGS}, got {q.scale_rounding!r}"
        )
    for name, f in (("scale", sc), ("super_scale", q.super_scale)):
        if f is not None and f.kind == "table" and f.bits % 8:
            raise ValueError(f"{name} format must be 8, 16 or 32 bits wide, got {f.bits}")
    if q.scale_rounding == "stochastic" and sc.kind == "fp32":
        raise ValueError("stochastic scale rounding needs a table scale format, not fp32")
    hier = q.super_group_size is not None
    if hier != (q.super_scale is not None):
        raise ValueError("super_group_size and super_scale must be given together")
    top = q.super_scale if hier else sc
    if top.kind == "table" and top.nan_code is None:
        raise ValueError(
            f"the top-level scale format {top} has no NaN code, so a block holding NaN/Inf "
            "could not be flagged; use e8m0, e4m3, bf16 or fp32 (or hierarchical scales)"
        )
    if hier:
        sg = q.super_group_size
        if not is_pow2(sg) or sg < q.group_size:
            raise ValueError(
                f"super_group_size must be a power of two >= group_size, got {sg!r}"
            )
        if sc.kind != "table" or sc.max_value > 1.0:
            raise ValueError(
                f"hierarchical group scales are relative to the super-group scale: their "
                f"format must have magnitudes in [0, 1] (e.g. u8rel), got {sc}"
            )
    if q.scale_rounding == "ocp" and sc.kind == "fp32":
        raise ValueError("'ocp' scale rounding expects a power-of-two scale format (e8m0)")
