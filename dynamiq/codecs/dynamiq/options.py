"""The coding options of the DynamiQ codec: (width, group size) pairs, their quantizers, costs.

An option codes a super-group's coordinates either with one block quantizer (widths 2–8: ε- or
uniform levels in groups of ``group_size`` under hierarchical or flat scales) or as BF16 values
(width 16, no scales). Options are ordered by their wire cost per super-group, which is pure
arithmetic on the configuration: building them never runs a kernel.

The configuration's tuple fields are normalised here (:func:`as_tuple`): spec strings hand them
over as tuples already, direct construction may also pass one value, a list or the legacy
``'/'``-separated text.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dynamiq.formats import TUNED_EPSILON, EpsilonFormat
from dynamiq.metadata import SUPER_GROUP
from dynamiq.quantizers import BlockQuantizer

if TYPE_CHECKING:
    from dynamiq.codecs.dynamiq.codec import DynamiQ

__all__ = [
    "ALLOWED_WIDTHS",
    "BF16_WIDTH",
    "CHOICES",
    "CodingOption",
    "as_tuple",
    "build_options",
    "check_settings",
    "dither_floor",
    "dither_growth",
    "midrise_floor",
    "midrise_growth",
    "normalise_group_sizes",
    "normalise_widths",
    "spec_number",
]

#: Widths the codec offers; 16 is BF16. Width 1 (a sign bit only) is not offered: an unbiased
#: 1-bit code needs signed rounding outside the sign-magnitude element model.
ALLOWED_WIDTHS = (2, 3, 4, 5, 6, 7, 8, 16)
#: The width that travels as BF16 values (round to nearest even, no scales).
BF16_WIDTH = 16

#: The accepted values of the codec's text settings.
CHOICES = {
    "levels": ("eps", "uniform"),
    "scales": ("hier", "flat"),
    "rounding": ("correlated", "path", "stochastic"),
    "allocator": ("measured", "paper"),
    "scale_rounding": ("stochastic", "up"),
    "metadata": ("fp8", "bf16"),
    "super_scale": ("bf16", "e8m0"),
}


def as_tuple(name: str, raw: object, kind: type) -> tuple:
    """``raw`` as a tuple of ``kind`` values (``int`` or ``float``), in the given order.

    Args:
        name: The field's name (for error messages).
        raw: A tuple or list, one value, or text: ``"(2,4,8)"``, ``"2,4,8"``, the legacy
            ``"2/4/8"``, or ``""`` for the empty tuple.
        kind: ``int`` or ``float``.

    Returns:
        A tuple of ``kind``; ``as_tuple("w", "8/2", int) == (8, 2)``.

    Raises:
        ValueError: an item cannot be read as ``kind`` (booleans are refused, and a float
            given for an ``int`` field must be integral).
    """
    if isinstance(raw, str):
        text = "".join(raw.split())
        if text.startswith("(") and text.endswith(")"):
            text = text[1:-1]
        parts: list[object] = [p for p in re.split(r"[/,]", text) if p]
    elif isinstance(raw, (tuple, list)):
        parts = list(raw)
    else:
        parts = [raw]
    try:
        return tuple(_item(p, kind) for p in parts)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: cannot read {raw!r} as {kind.__name__} values") from None


def _item(v: object, kind: type) -> int | float:
    if isinstance(v, bool):
        raise TypeError("a boolean is not a number here")
    if kind is int and isinstance(v, float):
        if not v.is_integer():
            raise ValueError("not an integer")
        return int(v)
    return kind(v)


def normalise_widths(widths: object, eps: object) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """The canonical ``(widths, eps)``: widths increasing, ε reordered with them.

    Raises:
        ValueError: no width, a width outside :data:`ALLOWED_WIDTHS`, a repeated width, an ε
            count other than the widths', or an ε that is negative or not finite.
    """
    ws = as_tuple("widths", widths, int)
    if not ws:
        raise ValueError("widths must name at least one width")
    bad = [w for w in ws if w not in ALLOWED_WIDTHS]
    if bad:
        raise ValueError(f"widths must be among {ALLOWED_WIDTHS}, got {bad}")
    if len(set(ws)) != len(ws):
        raise ValueError(f"widths repeat: {ws}")
    es = as_tuple("eps", eps, float)
    if es and len(es) != len(ws):
        raise ValueError(f"eps needs one value per width ({len(ws)}), got {len(es)}")
    if any(not (math.isfinite(e) and e >= 0) for e in es):
        raise ValueError(f"eps values must be finite and >= 0, got {es}")
    order = sorted(range(len(ws)), key=lambda i: ws[i])
    return tuple(ws[i] for i in order), tuple(es[i] for i in order) if es else ()


def normalise_group_sizes(group_size: object) -> tuple[int, ...]:
    """The canonical group sizes: increasing powers of two in ``[4, SUPER_GROUP]``.

    Raises:
        ValueError: no size, a size that is not such a power of two, or a repeated size.
    """
    gs = as_tuple("group_size", group_size, int)
    if not gs:
        raise ValueError("group_size must name at least one size")
    for g in gs:
        if g < 4 or g > SUPER_GROUP or g & (g - 1):
            raise ValueError(f"group_size must be powers of two in [4, {SUPER_GROUP}], got "
                             f"{group_size!r}")
    if len(set(gs)) != len(gs):
        raise ValueError(f"group sizes repeat: {group_size!r}")
    return tuple(sorted(gs))


def _element_rounding(codec: DynamiQ) -> str:
    """The quantizers' rounding: path-correlated rounding is correlated rounding whose streams
    the codec keys without the tree height."""
    return "correlated" if codec.rounding == "path" else codec.rounding


def spec_number(name: str, value: object) -> object:
    """``value`` as a float when it is text (a spec string's), else unchanged.

    Raises:
        ValueError: text that is not a number.
    """
    if not isinstance(value, str):
        return value
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"{name} must be a number, got {value!r}") from None


def check_settings(codec: DynamiQ) -> None:
    """Check ``codec``'s text settings against :data:`CHOICES`, its ``seed`` and dithering.

    Raises:
        ValueError: a value out of range.
        TypeError: ``dither`` or ``midrise`` is not a bool.
    """
    for name, allowed in CHOICES.items():
        if getattr(codec, name) not in allowed:
            raise ValueError(f"{name} must be one of {allowed}, got {getattr(codec, name)!r}")
    if not isinstance(codec.seed, int) or codec.seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {codec.seed!r}")
    if not isinstance(codec.dither, bool):
        raise TypeError(f"dither must be a bool, got {codec.dither!r}")
    if not isinstance(codec.midrise, bool):
        raise TypeError(f"midrise must be a bool, got {codec.midrise!r}")
    m = codec.dither_min_width
    if isinstance(m, bool) or not isinstance(m, int) or not 2 <= m <= 16:
        raise ValueError(f"dither_min_width must be an int in [2, 16], got {m!r}")
    g = spec_number("dither_max_growth", codec.dither_max_growth)
    if isinstance(g, bool) or not isinstance(g, (int, float)) or not g >= 1.0:
        raise ValueError(f"dither_max_growth must be a number >= 1, got {g!r}")
    object.__setattr__(codec, "dither_max_growth", float(g))


@dataclass(frozen=True)
class CodingOption:
    """One way to code a super-group.

    Attributes:
        width: Bits per coded value (16: BF16).
        group_size: Coordinates per group scale (0 for BF16, which has no scales).
        quantizer: The block quantizer (``None`` for BF16).
    """

    width: int
    group_size: int
    quantizer: BlockQuantizer | None

    @property
    def key(self) -> tuple[int, int]:
        """``(width, group size)``."""
        return (self.width, self.group_size)

    def nbytes(self, n: int) -> int:
        """Wire bytes of ``n`` coordinates (a partial super-group pays for the groups it
        touches only)."""
        return 2 * n if self.quantizer is None else self.quantizer.nbytes(n)

    def bits(self, n: int = SUPER_GROUP) -> float:
        """Wire bits of ``n`` coordinates: the allocator's cost ``c(w)`` for a whole super-group.
        """
        return 8.0 * self.nbytes(n)


def _quantizer(codec: DynamiQ, width: int, eps: float, group_size: int) -> BlockQuantizer:
    fmt = EpsilonFormat(width, eps, midrise=codec.midrise)
    dither = codec.dither and width >= codec.dither_min_width
    rounding = _element_rounding(codec)
    if codec.scales == "hier":
        return BlockQuantizer(fmt, group_size=group_size, scale="u8rel", rounding=rounding,
                              scale_rounding=codec.scale_rounding, super_group_size=SUPER_GROUP,
                              super_scale=codec.super_scale, dither=dither)
    return BlockQuantizer(fmt, group_size=group_size, scale="bf16", rounding=rounding,
                          scale_rounding="up", dither=dither)


def build_options(codec: DynamiQ) -> tuple[CodingOption, ...]:
    """Every option of ``codec``: every width with every group size (BF16 once), ordered by
    increasing wire cost per super-group, then width, then decreasing group size.

    The ε of a width is ``codec.eps`` (same order as ``codec.widths``), else
    :data:`~dynamiq.formats.TUNED_EPSILON`; 0 for ``levels="uniform"``.
    """
    out = []
    for i, w in enumerate(codec.widths):
        if w == BF16_WIDTH:
            out.append(CodingOption(BF16_WIDTH, 0, None))
            continue
        if codec.levels == "uniform":
            eps = 0.0
        else:
            eps = codec.eps[i] if codec.eps else TUNED_EPSILON[w]
        out.extend(CodingOption(w, g, _quantizer(codec, w, eps, g)) for g in codec.group_size)
    return tuple(sorted(out, key=lambda o: (o.nbytes(SUPER_GROUP), o.width, -o.group_size)))


def dither_growth(q: BlockQuantizer) -> float:
    """The modelled growth per hop of a dithered quantizer's noise along a chain,
    ``1 + c κ²/12`` with ``c = 6`` (docs/method.rst): 1.0091 at width 4, 1.0020 at 5, 1.0005
    at 6 for the default ε-levels; 1 for an undithered one."""
    top = float(q.element.magnitudes()[-1])
    k = q.dither_amplitude / top if top > 0 else 0.0
    return 1.0 + k * k / 2.0


def midrise_growth(q: BlockQuantizer) -> float:
    """The modelled growth per hop of an undithered mid-rise quantizer's noise along a chain.

    A mid-rise grid has no zero: an element near zero rounds to ``±m₀`` whatever its value, a
    noise of variance up to ``m₀²`` in units of the group's maximum, which feeds back through
    the next hop's maximum like a dither of that variance: ``1 + c m₀²`` with ``c = 6`` (as
    :func:`dither_growth`). 1 for levels with a zero, whose rounding error shrinks with the
    element.
    """
    if not q.element.midrise:
        return 1.0
    mags = q.element.magnitudes()
    m0 = float(mags[0] / mags[-1])
    return 1.0 + 6.0 * m0 * m0


def _floor(codec: DynamiQ, depth: int, start: int, growth) -> int:
    floor = start
    for o in codec.options:
        g = growth(o.quantizer) if o.quantizer is not None else 1.0
        # in logarithms: the power overflows a float on long chains
        if max(0, depth) * math.log(g) > math.log(codec.dither_max_growth):
            floor = max(floor, o.width + 1)
    return floor


def midrise_floor(codec: DynamiQ, depth: int) -> int:
    """The narrowest width whose undithered mid-rise levels keep their noise's growth over
    ``depth`` hops, ``midrise_growth ** depth``, within ``codec.dither_max_growth``; narrower
    undithered widths code on the levels with a zero (0: every width keeps its levels)."""
    return _floor(codec, depth, 0, midrise_growth)


def dither_floor(codec: DynamiQ, depth: int) -> int:
    """The narrowest width ``codec`` dithers on a schedule whose chains are at most ``depth``
    hops long: ``dither_min_width``, raised until every dithered width's noise growth over
    ``depth`` hops, ``dither_growth ** depth``, stays within ``codec.dither_max_growth``
    (above every width of the codec: none is)."""
    return _floor(codec, depth, codec.dither_min_width,
                  lambda q: dither_growth(q) if q.dither else 1.0)
