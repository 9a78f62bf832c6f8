"""Exhaustive tests of number formats: every code, its documented value, and round trips."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dynamiq.formats import (
    FORMATS,
    EpsilonFormat,
    FloatFormat,
    IntFormat,
    LevelFormat,
)

TORCH_TWINS = {
    "e4m3": torch.float8_e4m3fn,
    "e5m2": torch.float8_e5m2,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "e8m0": torch.float8_e8m0fnu,
}


def _scalar_minifloat(fmt: FloatFormat, code: int) -> float:
    """Independent scalar decoding of one minifloat code from its bit fields."""
    m = fmt.mbits
    sign = -1.0 if fmt.signed and (code >> (fmt.bits - 1)) & 1 else 1.0
    mag = code & ((1 << (fmt.ebits + m)) - 1)
    e, f = mag >> m, mag & ((1 << m) - 1)
    top = (1 << fmt.ebits) - 1
    if fmt.special == "ieee" and e == top:
        return sign * math.inf if f == 0 else math.nan
    if fmt.special == "fn" and mag == (1 << (fmt.ebits + m)) - 1:
        return math.nan
    if e == 0 and fmt.subnormals:
        return sign * (f / 2**m) * 2.0 ** (1 - fmt.bias)
    return sign * (1 + f / 2**m) * 2.0 ** (e - fmt.bias)


def _documented(name: str, codes: np.ndarray) -> np.ndarray:
    fmt = FORMATS[name]
    if name in TORCH_TWINS:
        dt = TORCH_TWINS[name]
        width = 2 if fmt.bits == 16 else 1
        raw = torch.tensor(codes.astype(np.int64), dtype=torch.int32 if width == 2 else torch.int16)
        raw = raw.to(torch.int16 if width == 2 else torch.uint8)
        return raw.view(dt).double().numpy()
    if isinstance(fmt, FloatFormat):
        return np.array([_scalar_minifloat(fmt, int(c)) for c in codes])
    if isinstance(fmt, IntFormat):
        mb = fmt.bits - int(fmt.signed)
        mag = (codes & ((1 << mb) - 1)).astype(np.float64)
        if fmt.normalized:
            mag = mag / (2**mb - 1)
        sgn = np.where(fmt.signed & ((codes >> mb) & 1 == 1), -1.0, 1.0)
        return (sgn * mag).astype(np.float32).astype(np.float64)
    if isinstance(fmt, EpsilonFormat):
        L = 2 ** (fmt.bits - 1)
        r = codes & (L - 1)
        q = 1 + 2 * fmt.eps**2
        lv = [(q**k - 1) / (q ** (L - 1) - 1) if fmt.eps else k / (L - 1) for k in r]
        sgn = np.where((codes >> (fmt.bits - 1)) & 1 == 1, -1.0, 1.0)
        return (sgn * np.array(lv)).astype(np.float32).astype(np.float64)
    if name == "e4m3rel":  # E4M3's magnitude of the same code over 448, as float32
        e4m3 = FORMATS["e4m3"]
        mag = np.array([_scalar_minifloat(e4m3, int(c) & 127) / 448.0 for c in codes])
        sgn = np.where((codes >> 7) & 1 == 1, -1.0, 1.0)
        return (sgn * mag).astype(np.float32).astype(np.float64)
    raise AssertionError(f"no documented value for {name}")


ENUMERABLE = [n for n in FORMATS.names() if FORMATS[n].kind == "table"]


@pytest.mark.parametrize("name", ENUMERABLE)
def test_every_code_decodes_to_documented_value(name):
    fmt = FORMATS[name]
    codes = fmt.valid_codes()
    got = fmt.decode(codes)
    want = _documented(name, codes)
    assert np.array_equal(got, want, equal_nan=True), name
    # signed zero keeps its sign
    if fmt.signed:
        neg0 = fmt.decode(np.array([1 << fmt.magnitude_bits]))[0]
        assert neg0 == 0 and math.copysign(1, neg0) == -1


@pytest.mark.parametrize("name", ENUMERABLE)
def test_encode_decode_roundtrip_every_code(name):
    fmt = FORMATS[name]
    codes = fmt.valid_codes()
    vals = fmt.decode(codes)
    finite = ~np.isnan(vals)
    for mode in ("nearest", "up", "down"):
        assert np.array_equal(fmt.encode(vals[finite], mode), codes[finite]), (name, mode)
    if fmt.nan_code is not None:
        c = fmt.encode(np.array([np.nan]))[0]
        assert np.isnan(fmt.decode(np.array([c]))[0])


def test_ocp_tables():
    assert list(FORMATS["e2m1"].magnitudes()) == [0, 0.5, 1, 1.5, 2, 3, 4, 6]
    e3m2, e2m3 = FORMATS["e3m2"], FORMATS["e2m3"]
    assert e3m2.max_value == 28 and e3m2.magnitudes()[1] == 0.0625
    assert e2m3.max_value == 7.5 and e2m3.magnitudes()[1] == 0.125
    assert FORMATS["e4m3"].max_value == 448 and FORMATS["e5m2"].max_value == 57344
    assert FORMATS["e4m3"].inf_code is None and FORMATS["e5m2"].inf_code == 124
    assert FORMATS["e2m1"].nan_code is None and FORMATS["e2m1"].inf_code is None
    assert FORMATS["e8m0"].min_value == 2.0**-127 and FORMATS["e8m0"].nan_code == 255
    assert FORMATS["u8rel"].magnitudes()[255] == 1.0


# (format, value, expected value after round-to-nearest-even); each is a tie unless noted
TIES = [
    ("e2m1", 0.25, 0.0),  # between 0 (code 0) and 0.5 (code 1): even code wins
    ("e2m1", 0.75, 1.0),  # between 0.5 (1) and 1.0 (2)
    ("e2m1", 2.5, 2.0),  # between 2 (4) and 3 (5)
    ("e2m1", 3.5, 4.0),  # between 3 (5) and 4 (6)
    ("e2m1", 5.0, 4.0),  # between 4 (6) and 6 (7)
    ("e2m1", -5.0, -4.0),
    ("e2m1", 100.0, 6.0),  # not a tie: saturates
    ("e4m3", 17.0, 16.0),  # between 16 (0x58) and 18 (0x59)
    ("e4m3", 19.0, 20.0),
    ("e4m3", 464.0, 448.0),  # saturates (no inf in E4M3)
    ("e4m3", 2.0**-10, 0.0),  # half the smallest subnormal 2**-9
    ("e5m2", 1.125, 1.0),  # between 1.0 and 1.25
    ("e5m2", 1.375, 1.5),
    ("e3m2", 0.03125, 0.0),  # half the smallest subnormal
    ("int4", 2.5, 2.0),
    ("int4", 3.5, 4.0),
    ("int4", -2.5, -2.0),
    ("int4", 7.5, 7.0),  # saturates
    ("bf16", 1 + 2.0**-8, 1.0),
    ("bf16", 1 + 3 * 2.0**-8, 1 + 2.0**-6),
    ("fp16", 1 + 2.0**-11, 1.0),
    ("dq2", 0.5, 0.0),  # levels {0, 1}
]


@pytest.mark.parametrize(("name", "value", "expected"), TIES)
def test_tie_rounding_cases(name, value, expected):
    fmt = FORMATS[name]
    got = fmt.decode(fmt.encode(np.array([value])))[0]
    assert got == expected


def test_nonfinite_never_made_finite():
    e4m3, e5m2, e2m1 = FORMATS["e4m3"], FORMATS["e5m2"], FORMATS["e2m1"]
    assert np.isnan(e4m3.decode(e4m3.encode(np.array([np.inf])))).all()
    assert np.isinf(e5m2.decode(e5m2.encode(np.array([-np.inf])))).all()
    with pytest.raises(ValueError, match="NaN/Inf"):
        e2m1.encode(np.array([np.nan]))


@pytest.mark.parametrize(
    ("factory", "match"),
    [
        (lambda: FloatFormat(0, 3), "ebits"),
        (lambda: FloatFormat(4, 11), "mbits"),
        (lambda: FloatFormat(4, 3, special="x"), "special"),
        (lambda: FloatFormat(8, 8), "16 bits"),
        (lambda: IntFormat(1), "bits"),
        (lambda: IntFormat(17), "bits"),
        (lambda: LevelFormat((0.5,)), "at least 2"),
        (lambda: LevelFormat((0.0, 0.5, 0.5)), "strictly increasing"),
        (lambda: LevelFormat((0.0, 1.5)), "strictly increasing"),
        (lambda: EpsilonFormat(1, 0.2), "bits"),
        (lambda: EpsilonFormat(4, -0.1), "eps"),
        (lambda: EpsilonFormat(4, float("nan")), "eps"),
    ],
)
def test_invalid_parameters(factory, match):
    with pytest.raises(ValueError, match=match):
        factory()


def test_level_format_unused_codes_are_nan():
    f = LevelFormat((0.0, 0.25, 1.0))
    assert f.bits == 3
    assert np.isnan(f.decode_table()[3])
    assert list(f.valid_codes()) == [0, 1, 2, 4, 5, 6]


def test_epsilon_levels_shape():
    f = EpsilonFormat(4, 0.2)
    m = f.magnitudes()
    assert m[0] == 0 and m[-1] == 1 and len(m) == 8
    # multiplicative spacing: gaps grow geometrically with ratio 1 + 2 eps^2
    gaps = np.diff(m)
    assert np.allclose(gaps[1:] / gaps[:-1], 1 + 2 * 0.2**2, rtol=1e-5)
    assert np.allclose(EpsilonFormat(4, 0.0).magnitudes(), np.arange(8) / 7, rtol=1e-7)


def test_formats_are_hashable_values():
    assert FloatFormat(4, 3, "fn") == FORMATS["e4m3"]
    assert hash(FloatFormat(4, 3, "fn")) == hash(FORMATS["e4m3"])
    assert EpsilonFormat(4, 0.19) == FORMATS["dq4"]


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 8])
@pytest.mark.parametrize("eps", [0.0, 0.15, 0.35])
def test_midrise_levels_are_half_a_step_out_and_every_code_is_a_value(bits, eps):
    f = EpsilonFormat(bits, eps, midrise=True)
    assert f.midrise and not EpsilonFormat(bits, eps).midrise
    L = 2 ** (bits - 1)
    q = 1 + 2 * eps**2
    t = np.arange(L) + 0.5
    if eps == 0 or bits == 2:
        want = t / (L - 0.5)
    else:
        want = (q**t - 1) / (q ** (L - 0.5) - 1)
    m = f.magnitudes()
    assert np.allclose(m, want, rtol=1e-6) and m[-1] == 1.0 and m[0] > 0
    assert f.min_value == m[0]
    # all 2**bits codes decode to 2**bits distinct values, symmetric about zero
    vals = f.decode(f.valid_codes())
    assert len(vals) == 2**bits and len(np.unique(vals)) == 2**bits
    assert np.array_equal(np.sort(vals), -np.sort(vals)[::-1])
    # the reference cast still inverts the table
    assert np.array_equal(f.encode(vals), f.valid_codes())


def test_midrise_must_be_a_bool_and_other_formats_have_a_zero():
    with pytest.raises(TypeError, match="midrise"):
        EpsilonFormat(4, 0.2, midrise=1)
    assert str(EpsilonFormat(4, 0.2, midrise=True)) == "EpsilonFormat(bits=4,eps=0.2,midrise=True)"
    assert EpsilonFormat(4, 0.2, midrise=True) != EpsilonFormat(4, 0.2)
    assert not any(FORMATS[n].midrise for n in FORMATS.names())
