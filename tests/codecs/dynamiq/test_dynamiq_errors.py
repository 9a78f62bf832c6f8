"""The error model of the ``measured`` allocator (``dynamiq.codecs.dynamiq.errors``).

What is checked:

* building a codec measures nothing and compiles no kernel (``import dynamiq`` builds the
  registered pipelines' codecs); the errors are measured on first use, once per quantizer;
* measuring compiles no kernel either (it runs on the reference backend) and gives the bits
  of a measurement on the compiled kernels;
* the ``paper`` model is ``4^−w``; the measured one falls with the width;
* the allocator's options carry each option's wire cost per super-group.
"""

from __future__ import annotations

import json

import pytest
from _dynamiq_data import run_with_fresh_kernel_cache

from dynamiq.codecs.dynamiq import DynamiQ, measured_error, width_options
from dynamiq.metadata import SUPER_GROUP as SG


def test_construction_measures_nothing_until_first_use():
    # ε no other test uses, so these quantizers are not measured yet (same kernels as the
    # default codec's, though)
    codec = DynamiQ(widths=(3, 6), eps=(0.3, 0.1), group_size=32, bits=7.0)
    before = measured_error.cache_info()
    assert codec.option_keys == ((3, 32), (6, 32))
    assert measured_error.cache_info() == before
    opts = codec.width_options
    after = measured_error.cache_info()
    assert after.misses == before.misses + 2
    assert [o.error for o in opts] == [measured_error(q) for q in codec.quantizers]
    assert measured_error.cache_info().misses == after.misses  # cached per quantizer
    assert codec.width_options is opts


def test_import_compiles_no_kernel(tmp_path):
    """``import dynamiq`` (which builds every registered pipeline's codec) and building a DynamiQ
    codec write nothing into a fresh kernel cache."""
    _, made = run_with_fresh_kernel_cache(
        tmp_path, "import dynamiq\n"
        "c = dynamiq.DynamiQ(widths=(2, 5, 16), group_size=(16, 32))\n"
        "assert c.option_keys and c.max_wire_bytes(300) == 600\n")
    assert made == []


def test_measuring_compiles_no_kernel(tmp_path):
    """The first ``width_options`` of a codec (what the first ``prepare`` of a pipeline asks
    for) writes nothing into a fresh kernel cache: a pipeline whose hops run on another
    backend compiles no CPU kernel for its options. The errors equal those measured through
    the Numba kernels, bit for bit."""
    out, made = run_with_fresh_kernel_cache(
        tmp_path, "import json, dynamiq\n"
        "c = dynamiq.DynamiQ(widths=(2, 5, 8, 16), group_size=(32, 64))\n"
        "print(json.dumps([o.error for o in c.width_options]))\n")
    assert made == []
    from dynamiq.codecs.dynamiq.errors import _relative, _sample

    x = _sample()
    codec = DynamiQ(widths=(2, 5, 8, 16), group_size=(32, 64))
    numba = [measured_error(None) if q is None else
             _relative(x, q.decode(q.encode(x, seed=1, backend="numba"), seed=1,
                                   backend="numba"))
             for q in (o.quantizer for o in codec.options)]
    assert json.loads(out) == numba  # floats round-trip through JSON exactly


def test_paper_model_is_four_to_the_minus_width():
    codec = DynamiQ(widths=(2, 4, 8), allocator="paper", group_size=16)
    assert [(o.width, o.error) for o in codec.width_options] == [
        (2, 4.0**-2), (4, 4.0**-4), (8, 4.0**-8)]


def test_measured_error_falls_with_the_width():
    codec = DynamiQ(widths=(2, 4, 8, 16), group_size=32)
    errs = [o.error for o in codec.width_options]
    assert errs == sorted(errs, reverse=True)
    assert errs[-1] == pytest.approx(measured_error(None))
    assert 0 < errs[-1] < 2.0**-16  # BF16: round to nearest, 8 significant bits


def test_costs_are_the_options_wire_bits_per_super_group():
    codec = DynamiQ(widths=(2, 8, 16), group_size=(32, 64))
    opts = width_options(codec.options, "paper")
    assert [o.cost for o in opts] == [8.0 * o.nbytes(SG) for o in codec.options]
    # width 2 in groups of 64: 64 code bytes, 4 UINT8 scales, an E8M0 super-group scale
    assert opts[0].cost == 8.0 * (64 + 4 + 1)
    assert opts[-1].cost == 16.0 * SG
    with pytest.raises(ValueError, match="allocator"):
        width_options(codec.options, "exact")
