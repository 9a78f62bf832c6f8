"""The DynamiQ codec's configuration and coding options (``dynamiq.codecs.dynamiq.options``).

What is checked:

* spec strings: round trip of every variant, canonical form (tuples, widths sorted, ε reordered
  with them, defaults left out), legacy ``a/b/c`` values parse to the same codec, and the
  parameter errors;
* the tuple-valued fields accept one value, a list, a tuple or text, and normalise the same;
* the options: every width with every group size (BF16 once), ordered by wire cost; their ε;
* the bits floor: the cheapest option plus its scales and the metadata.
"""

from __future__ import annotations

import math

import pytest

from dynamiq import formats
from dynamiq.codecs import get_codec
from dynamiq.codecs.dynamiq import ALLOWED_WIDTHS, BF16_WIDTH, TUNED_EPSILON, DynamiQ
from dynamiq.codecs.dynamiq.options import (
    as_tuple,
    build_options,
    dither_floor,
    dither_growth,
    midrise_floor,
    midrise_growth,
)
from dynamiq.formats import DEFAULT_EPSILON, FORMATS, EpsilonFormat
from dynamiq.metadata import SUPER_GROUP as SG
from dynamiq.pipeline import Pipeline


# ---- spec strings --------------------------------------------------------------------------
@pytest.mark.parametrize("spec", [
    "dynamiq@ring",
    "center+dynamiq@butterfly",
    "dynamiq(widths=4)@ring",
    "dynamiq(widths=2/4/8/16,bits=6)@ring",
    "dynamiq(widths=2/4/8,eps=0.25/0.19/0.09)@ring",
    "dynamiq(levels=uniform,scales=flat,rounding=stochastic,allocator=paper,bits=9)@ring",
    "dynamiq(bits=4.25,widths=2/3/5,seed=3)@ring",
    "center+dynamiq(bits=5.5)@butterfly",
])
def test_spec_round_trip(spec):
    p = Pipeline.parse(spec)
    assert Pipeline.parse(str(p)) == p
    assert str(Pipeline.parse(str(p))) == str(p)
    assert hash(Pipeline.parse(str(p))) == hash(p)


@pytest.mark.parametrize("codec", [
    DynamiQ(),
    DynamiQ(widths=4, group_size=32),
    DynamiQ(widths=(2, 4, 8, 16), bits=6),
    DynamiQ(widths=(3, 5), eps=(0.31, 0.11)),
    DynamiQ(widths=(2, 8), eps=(0.123456789, 0.1)),
    DynamiQ(widths=7, eps=0.05, group_size=(16, 32, 64), bits=8),
    DynamiQ(widths=16, bits=16),
    DynamiQ(levels="uniform", scales="flat", rounding="stochastic", allocator="paper", bits=9),
    DynamiQ(super_scale="e8m0", scale_rounding="up", metadata="bf16", dither=False,
            dither_min_width=2, seed=7),
])
def test_every_variant_reads_back_from_its_spec(codec):
    assert get_codec(str(codec)) == codec
    assert str(get_codec(str(codec))) == str(codec)
    assert hash(get_codec(str(codec))) == hash(codec)


def test_canonical_form_is_sorted_tuples():
    default = DynamiQ().widths
    shuffled = "/".join(str(w) for w in reversed(default))
    assert str(Pipeline.parse(f"dynamiq(widths={shuffled})@ring")) == "dynamiq@ring"
    assert str(Pipeline.parse("dynamiq(widths=8/2/4)@ring")) == "dynamiq(widths=(2,4,8))@ring"
    assert str(Pipeline.parse("center+dynamiq(widths=16/4/2/8,bits=6)@butterfly")) == (
        "center+dynamiq(bits=6.0,widths=(2,4,8,16))@butterfly")
    p = Pipeline.parse("dynamiq(widths=8/2,eps=0.1/0.25)@ring")
    assert str(p) == "dynamiq(widths=(2,8),eps=(0.25,0.1))@ring"
    assert p == Pipeline.parse("dynamiq(widths=(2,8),eps=(0.25,0.1))@ring")
    assert str(DynamiQ(group_size=32)) == "dynamiq(group_size=32)"
    assert str(DynamiQ(group_size="64/16")) == "dynamiq(group_size=(16,64))"


@pytest.mark.parametrize(("legacy", "typed"), [
    ("dynamiq(widths=2/4/8,eps=0.25/0.19/0.09,group_size=16)",
     "dynamiq(widths=(2,4,8),eps=(0.25,0.19,0.09),group_size=16)"),
    ("dynamiq(group_size=32/64)", "dynamiq"),
    ("dynamiq(widths=4,group_size=32)", "dynamiq(widths=(4,),group_size=(32,))"),
    ("dynamiq(widths=16/2,bits=9)", "dynamiq(widths=(2,16),bits=9.0)"),
    ("dynamiq(widths=2/3/4/5/6/7/8,group_size=64/32)", "dynamiq(eps=())"),
])
def test_legacy_values_read_as_the_typed_ones(legacy, typed):
    assert get_codec(legacy) == get_codec(typed)


def test_tuple_fields_accept_one_value_a_list_or_text():
    assert DynamiQ(widths=(8, 2, 4)) == DynamiQ(widths="2/4/8") == DynamiQ(widths=[4, 8, 2])
    assert DynamiQ(widths="(8,2,4)").widths == (2, 4, 8)
    assert DynamiQ(widths="16/2").width_list == (2, 16)
    assert DynamiQ(widths=4).widths == (4,)
    assert DynamiQ(group_size=32).group_size == (32,)
    assert DynamiQ(group_size="64/32").group_sizes == (32, 64)
    c = DynamiQ(widths="8/2", eps="0.1/0.25")
    assert c.eps == (0.25, 0.1) and all(isinstance(e, float) for e in c.eps)
    assert DynamiQ(eps="").eps == ()
    assert as_tuple("w", 4.0, int) == (4,)
    with pytest.raises(ValueError, match="cannot read"):
        as_tuple("w", 4.5, int)
    with pytest.raises(ValueError, match="cannot read"):
        as_tuple("w", (True,), int)


@pytest.mark.parametrize(("spec", "match"), [
    ("dynamiq(widths=1)@ring", "widths must be among"),
    ("dynamiq(widths=9)@ring", "widths must be among"),
    ("dynamiq(widths=2/4/4)@ring", "widths repeat"),
    ("dynamiq(widths=2/4,eps=0.1)@ring", "one value per width"),
    ("dynamiq(widths=2/4/8,eps=0.1/0.2/-1)@ring", "finite and >= 0"),
    ("dynamiq(bits=2)@ring", "below what the cheapest width costs"),
    ("dynamiq(widths=8,bits=8.2)@ring", "below what the cheapest width costs"),
    ("dynamiq(bits=0)@ring", "positive"),
    ("dynamiq(bits=nan)@ring", "positive"),
    ("dynamiq(levels=log)@ring", "levels must be one of"),
    ("dynamiq(scales=x)@ring", "scales must be one of"),
    ("dynamiq(rounding=nearest)@ring", "rounding must be one of"),
    ("dynamiq(allocator=x)@ring", "allocator must be one of"),
    ("dynamiq(seed=-1)@ring", "seed"),
    ("dynamiq(widths=a/b)@ring", "widths must be a tuple of int"),
    ("dynamiq(group_size=24)@ring", "powers of two"),
    ("dynamiq(group_size=32/32)@ring", "group sizes repeat"),
    ("dynamiq(dither_max_growth=0.5)@ring", "dither_max_growth must be a number >= 1"),
    ("dynamiq(dither_max_growth=x)@ring", "dither_max_growth must be a number"),
])
def test_bad_parameters_raise_value_error(spec, match):
    with pytest.raises(ValueError, match=match):
        Pipeline.parse(spec)


def test_bad_direct_values_raise_value_error():
    with pytest.raises(ValueError, match="cannot read"):
        DynamiQ(widths="a/b")
    with pytest.raises(ValueError, match="at least one width"):
        DynamiQ(widths=())
    with pytest.raises(ValueError, match="at least one size"):
        DynamiQ(group_size="")


# ---- the options -----------------------------------------------------------------------------
def test_options_are_every_width_with_every_group_size_by_cost():
    c = DynamiQ(widths=(2, 4, 16), group_size=(32, 64))
    assert c.option_keys == ((2, 64), (2, 32), (4, 64), (4, 32), (16, 0))
    costs = [o.bits() for o in c.options]
    assert costs == sorted(costs)
    assert [o.quantizer is None for o in c.options] == [False] * 4 + [True]
    assert c.quantizers == tuple(o.quantizer for o in c.options)
    assert build_options(c) == c.options
    assert c.max_wire_bytes(1000) == 2000


def test_eps_of_each_option():
    assert [q.element for q in DynamiQ().quantizers] == [
        EpsilonFormat(w, TUNED_EPSILON[w], midrise=True)
        for w in (2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8)]
    c = DynamiQ(widths=(3, 5), eps=(0.31, 0.11), group_size=32)
    assert [q.element for q in c.quantizers] == [EpsilonFormat(3, 0.31, midrise=True),
                                                 EpsilonFormat(5, 0.11, midrise=True)]
    u = DynamiQ(widths=(3, 5), eps=(0.31, 0.11), levels="uniform", group_size=32,
                midrise=False)
    assert [q.element for q in u.quantizers] == [EpsilonFormat(3, 0.0), EpsilonFormat(5, 0.0)]


def test_one_epsilon_catalog():
    """Both ε tables sit in the formats catalog: the registered ``dq<b>`` formats use the
    paper-range table (which has no width 7, so there is no ``dq7``), the codec the tuned one,
    which covers every width it offers."""
    for b, e in DEFAULT_EPSILON.items():
        assert FORMATS[f"dq{b}"] == EpsilonFormat(b, e)
    assert "dq7" not in FORMATS.names()
    assert set(TUNED_EPSILON) == set(ALLOWED_WIDTHS) - {BF16_WIDTH}
    assert TUNED_EPSILON is formats.TUNED_EPSILON


def test_bits_floor_is_the_cheapest_width_plus_metadata():
    # width 2 with hierarchical scales in groups of 64 (the default offers 32 and 64) under an
    # E8M0 super-group scale: 2 + 8/64 + 8/256 = 2.15625 bits, plus the metadata phase's two
    # 8-bit statistics per super-group (16/256 = 0.0625) and their shift bytes (16 bits per
    # vector, counted over 1024 groups)
    floor = 2.15625 + 0.0625 + 16 / (1024 * SG)
    DynamiQ(bits=floor + 1e-9)
    with pytest.raises(ValueError):
        DynamiQ(bits=floor - 1e-6)
    # groups of 32 only: 2 + 8/32 + 8/256
    DynamiQ(bits=2.28125 + 0.0625 + 16 / (1024 * SG) + 1e-9, group_size=32)
    with pytest.raises(ValueError):
        DynamiQ(bits=2.34375, group_size=32)
    # the paper's BF16 metadata: + 32/256 (and its shift bytes); a BF16 super-group scale:
    # + 8/256
    DynamiQ(bits=2.40625 + 16 / (1024 * SG) + 1e-9, metadata="bf16", group_size=32)
    with pytest.raises(ValueError):
        DynamiQ(bits=2.4062, metadata="bf16", group_size=32)
    DynamiQ(bits=2.4375 + 16 / (1024 * SG) + 1e-9, metadata="bf16", super_scale="bf16",
            group_size=32)
    with pytest.raises(ValueError):
        DynamiQ(bits=2.4374, metadata="bf16", super_scale="bf16", group_size=32)
    DynamiQ(widths=4, bits=4.28125, group_size=32)  # one option: no allocation, no metadata
    with pytest.raises(ValueError):
        DynamiQ(widths=4, bits=4.28, group_size=32)
    DynamiQ(widths=4, bits=4.53125, group_size=16)  # groups of 16: 8/16 for the scales
    with pytest.raises(ValueError):
        DynamiQ(widths=4, bits=4.53, group_size=16)


# ---- dithered widths on long chains --------------------------------------------------------
def test_dither_growth_follows_the_model_and_shrinks_with_width():
    c = DynamiQ()
    growth = {o.width: dither_growth(o.quantizer) for o in c.options if o.quantizer is not None}
    assert growth[2] == 1.0  # not dithered (below dither_min_width)
    assert growth[3] == pytest.approx(1.037, abs=5e-4)  # the codec's docstring
    assert growth[4] == pytest.approx(1.008, abs=5e-4)
    assert growth[3] > growth[4] > growth[5] > growth[6] > growth[7] > growth[8] > 1.0
    # levels with a zero (the paper's): the first dithered width of the earlier default
    old = DynamiQ(midrise=False, dither_min_width=4, super_scale="bf16",
                  scale_rounding="stochastic")
    g_old = {o.width: dither_growth(o.quantizer) for o in old.options if o.quantizer is not None}
    assert g_old[4] == pytest.approx(1.009, abs=5e-4)


def test_dither_floor_rises_where_the_growth_passes_the_bound():
    c = DynamiQ()
    g = {o.width: dither_growth(o.quantizer) for o in c.options if o.quantizer is not None}
    for depth in (1, 7, 63, 134, 135, 511, 613, 614, 1023, 2617, 2618, 4095, 10857, 10858):
        # the narrowest width whose growth, and every wider one's, stays within the bound
        want = min(w for w in range(3, 17)
                   if all(g[v] ** depth <= c.dither_max_growth for v in g if v >= w))
        assert dither_floor(c, depth) == want, depth
    assert dither_floor(c, 63) == 3 and dither_floor(c, 511) == 4
    assert dither_floor(c, 1023) == 5
    assert dither_floor(DynamiQ(dither_max_growth=1e300), 10**4) == 3
    assert dither_floor(c, 10**9) == 9  # above every width: none dithered (and no overflow)
    assert dither_floor(DynamiQ(dither_min_width=6), 7) == 6


def test_prepare_records_the_dither_floor_of_the_schedule():
    import torch

    from dynamiq.codecs.dynamiq.hops import ring_profile

    c = DynamiQ()
    m = 64
    stats = {"csumsq8": torch.rand(m, dtype=torch.float64),
             "sum8": torch.zeros(m, dtype=torch.float64)}
    for n, want, mid in ((8, 3, 0), (512, 4, 5), (1024, 5, 5), (4096, 6, 6)):
        plan = c.prepare(stats, m * SG, n, {}, hop_profile=ring_profile(n))
        assert (plan.dither_from, plan.midrise_from) == (want, mid)
        assert all((h.dither_from, h.midrise_from) == (want, mid)
                   for h in (plan.hops or {}).values())
        q = c.quantizer_for(next(i for i, o in enumerate(c.options) if o.width == 4), plan)
        assert q.dither == (want <= 4)
        # an undithered width keeps its mid-rise levels only from midrise_from on
        assert q.element.midrise == (want <= 4 or mid <= 4)


def test_undithered_midrise_levels_fall_back_to_a_zero_level_on_long_chains():
    """Without dither a mid-rise grid still rounds every element near zero to ``±m₀``: noise
    that scales with the group's maximum and grows along a chain by ``1 + 6 m₀²`` per hop (1.67
    at width 2); the widths whose growth passes the bound code on levels with a zero."""
    c = DynamiQ()
    g = {o.width: midrise_growth(o.quantizer) for o in c.options if o.quantizer is not None}
    m0 = c.options[0].quantizer.element.magnitudes()[0]
    assert g[2] == pytest.approx(1 + 6 * m0**2) and g[2] == pytest.approx(5 / 3, rel=1e-6)
    assert g[2] > g[3] > g[4] > g[5] > g[6] > g[7] > g[8] > 1.0
    assert midrise_growth(DynamiQ(midrise=False).options[0].quantizer) == 1.0
    for depth in (1, 7, 15, 63, 127, 511, 1023, 4095):
        want = min(w for w in range(2, 17) if all(
            depth * math.log(g[v]) <= math.log(c.dither_max_growth) for v in g if v >= w))
        assert midrise_floor(c, depth) == (0 if want == 2 else want), depth
    assert midrise_floor(c, 7) == 0 and midrise_floor(c, 4095) == 6
    assert midrise_floor(DynamiQ(midrise=False), 10**6) == 0
    assert DynamiQ(dither=False, per_hop=False).wants_hop_profile
