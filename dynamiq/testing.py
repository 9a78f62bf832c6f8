"""Conformance checks that every registered component must pass.

The test suite runs these over every name in the registries at the time it runs, so a format or
quantizer registered by a user (or inside a test) is checked with no extra test code::

    from dynamiq import FORMATS, FloatFormat
    from dynamiq.testing import check_format
    FORMATS.register("e3m4", FloatFormat(3, 4, special="none"))
    check_format("e3m4")        # raises AssertionError with a precise message on failure
"""

from __future__ import annotations

import numpy as np
import torch

from dynamiq.formats import FORMATS, NumberFormat, resolve_format
from dynamiq.kernels.reference import blocks as reference_blocks
from dynamiq.quantizers import QUANTIZERS, BlockQuantizer, get_quantizer

__all__ = [
    "check_format",
    "check_quantizer",
    "element_error_bound",
    "reference_scales",
    "run_conformance",
]


def reference_scales(q: BlockQuantizer, x: np.ndarray, *, seed: int = 0, rank: int = 0,
                     world_size: int = 1, stream: tuple[int, ...] = (),
                     index_offset: int = 0) -> np.ndarray:
    """float32 decoded group scales that ``q`` gives float32 ``x`` (NaN for groups flagged
    non-finite), from the reference backend's statement of the kernels."""
    rand = q._rand(seed, rank, world_size, stream, index_offset)
    return reference_blocks.encode_with_scales(q._code, np.asarray(x, np.float32), rand)[1]


def _usable_as_element(fmt: NumberFormat) -> bool:
    return fmt.kind == "table" and fmt.signed and fmt.min_value == 0.0


def check_format(fmt: str | NumberFormat) -> None:
    """Exhaustively check a format: every code, through the reference cast and the kernels.

    * ``decode`` then ``encode`` gives back every finite code, for nearest/up/down rounding;
    * for element-capable formats, the Numba kernel (scale fixed to exactly 1) writes the same
      bytes as the NumPy reference and decodes every value of the format, and every midpoint
      between neighbouring values (ties to even), to what the reference cast gives.

    Raises:
        AssertionError: naming the format and the first offending code.
    """
    f = resolve_format(fmt)
    if f.kind != "table":
        return
    codes = f.valid_codes()
    vals = f.decode(codes)
    fin = ~np.isnan(vals)
    for mode in ("nearest", "up", "down"):
        back = f.encode(vals[fin], mode)
        bad = np.flatnonzero(back != codes[fin])
        assert len(bad) == 0, f"{f}: encode(decode({codes[fin][bad[0]]})) != code ({mode})"
    if not _usable_as_element(f):
        return
    mags = f.magnitudes()
    mids = ((mags[1:] + mags[:-1]) / 2).astype(np.float32)
    probe = np.concatenate([mags, mids]).astype(np.float32)
    probe = np.concatenate([probe, -probe])
    # one group: the first element pins the scale to exactly 1 (amax / max_value)
    g = 8
    while (g * f.bits) % 8:
        g *= 2
    per = g - 1
    pad = (-len(probe)) % per
    probe = np.concatenate([probe, np.zeros(pad, np.float32)]).reshape(-1, per)
    x = np.concatenate([np.full((len(probe), 1), mags[-1], np.float32), probe], 1).reshape(-1)
    q = BlockQuantizer(f, group_size=g, scale="fp32", rounding="nearest", scale_rounding="nearest")
    p = q.encode(torch.from_numpy(x))
    ref = q.encode(torch.from_numpy(x), backend="reference")
    assert torch.equal(p.data, ref.data), f"{f}: kernel codes differ from reference"
    want = f.decode(f.encode(x)).astype(np.float32)
    got = q.decode(p).numpy()
    bad = np.flatnonzero(got != want)
    assert len(bad) == 0, f"{f}: kernel maps {x[bad[0]]} to {got[bad[0]]}, expected {want[bad[0]]}"


def element_error_bound(q: BlockQuantizer, x: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """Largest error ``|decode(encode(x)) - x|`` each element may have under ``q``.

    Derived from the rounding rule: an element normalised by ``norm`` lands between two
    neighbouring levels at most ``gap`` apart (``gap/2`` when rounding to nearest), times the
    decoded scale ``s``. With stochastic scales the element is normalised by the exact
    ``s* = amax / max_level``, adding ``max_level * |s - s*|``; with deterministic scales values
    above ``max_level * s`` saturate, adding the excess; dithered decoding adds ``κ s / 2``. A
    float32 slack of a few ulps is added.

    Args:
        q: The quantizer.
        x: float32[n] input (finite).
        scales: float32 decoded group scales (:func:`reference_scales`).

    Returns:
        float64[n] per-element bound.
    """
    G = q.group_size
    n = x.size
    mags = q.element.magnitudes()
    gap = float(np.diff(mags).max())
    mx = float(mags[-1])
    xp = np.zeros(q.padded_length(n))
    xp[:n] = np.abs(x)
    s = np.repeat(scales.astype(np.float64), G)
    factor = 0.5 if q.rounding == "nearest" else 1.0
    bound = factor * gap * s
    if q.scale_rounding == "stochastic":
        sstar = np.repeat(xp.reshape(-1, G).max(1) / float(q._scale_divisor), G)
        bound += mx * np.abs(s - sstar)
    else:
        bound += np.maximum(0.0, xp - mx * s)
    if q.dither:  # the subtracted dither moves a decoded magnitude by at most κ/2
        bound += 0.5 * q.dither_amplitude * s
    slack = 2.0**-20 * (xp + mx * s)
    return (bound + slack)[:n]


def check_quantizer(q: str | BlockQuantizer, *, seed: int = 0) -> None:
    """Check a quantizer on adversarial data: layout, bit-exactness, error bound, NaN policy.

    * payload size equals ``nbytes(n)`` and ``bits_per_coord(n) == 8 * nbytes / n``, for lengths
      with and without a partial last block;
    * the Numba kernels write exactly the bytes of the reference backend, and decode to its
      values;
    * every element's error is within :func:`element_error_bound`;
    * zeros stay exact zeros (a dithered quantizer's only on average); a group (or
      super-group) holding NaN/Inf decodes to NaN and every
      other block stays finite.

    Raises:
        AssertionError: with the quantizer and the failed property.
    """
    q = get_quantizer(q)
    rs = np.random.default_rng(seed)
    B = q.block_size
    for n in (1, B - 1 if B > 1 else 1, 3 * B, 5 * B + 3):
        x = (rs.standard_normal(n) * np.exp(2 * rs.standard_normal(n))).astype(np.float32)
        if n > 4:
            x[rs.integers(0, n, size=max(1, n // 7))] = 0.0
        kw = {"seed": seed, "rank": 1, "world_size": 3, "stream": (5,), "index_offset": 7}
        p = q.encode(torch.from_numpy(x), **kw)
        assert p.nbytes == q.nbytes(n), f"{q.describe()}: payload size {p.nbytes} != {q.nbytes(n)}"
        assert p.bits_per_coord == 8 * q.nbytes(n) / n == q.bits_per_coord(n)
        ref = q.encode(torch.from_numpy(x), backend="reference", **kw)
        assert torch.equal(p.data, ref.data), f"{q.describe()}: bytes != reference"
        scales = reference_scales(q, x, **kw)
        y = q.decode(p, **kw).numpy()
        assert np.array_equal(y, q.decode(ref, backend="reference", **kw).numpy()), (
            f"{q.describe()}: decode")
        err = np.abs(y.astype(np.float64) - x)
        bound = element_error_bound(q, x, scales)
        worst = int(np.argmax(err - bound))
        assert err[worst] <= bound[worst], (
            f"{q.describe()}: element {worst} error {err[worst]:.3g} > bound {bound[worst]:.3g}"
        )
        if not q.dither:  # a dithered zero is zero only on average
            assert np.all(y[x == 0] == 0), f"{q.describe()}: zeros not preserved"
    n = 4 * B
    x = rs.standard_normal(n).astype(np.float32)
    x[B + 1] = np.nan
    x[2 * B + 2] = -np.inf
    y = q.decode(q.encode(torch.from_numpy(x))).numpy()
    for i in (B + 1, 2 * B + 2):
        g0 = i // q.group_size * q.group_size
        assert not np.isfinite(y[g0 : g0 + q.group_size]).any(), (
            f"{q.describe()}: group with non-finite input has finite outputs"
        )
    assert np.isfinite(y[:B]).all() and np.isfinite(y[3 * B :]).all(), (
        f"{q.describe()}: non-finite values leaked into clean blocks"
    )


def run_conformance() -> list[str]:
    """Check every registered format and quantizer; returns the names checked."""
    checked = []
    for name in FORMATS.names():
        check_format(name)
        checked.append(f"format:{name}")
    for name in QUANTIZERS.names():
        check_quantizer(name)
        checked.append(f"quantizer:{name}")
    return checked


def representative_codecs(cls: type) -> list:
    """Representative instances of a registered partial-sum codec class, for tests that run
    every codec: ``cls.examples()`` (see :meth:`dynamiq.codecs.PartialSumCodec.examples`)."""
    return list(cls.examples())
