"""Every registered format and quantizer passes the conformance checks of dynamiq.testing.

Parametrised over the registries at collection time; the last test shows that a component
registered at run time is enrolled too.
"""

from __future__ import annotations

import pytest

from dynamiq import FORMATS, QUANTIZERS, BlockQuantizer, FloatFormat, LevelFormat
from dynamiq.testing import check_format, check_quantizer, run_conformance


@pytest.mark.parametrize("name", FORMATS.names())
def test_format_conformance(name):
    check_format(name)


@pytest.mark.parametrize("name", QUANTIZERS.names())
def test_quantizer_conformance(name):
    check_quantizer(name)


def test_format_registered_in_a_test_is_enrolled():
    FORMATS.register("test_e3m4", FloatFormat(3, 4, special="none"))
    FORMATS.register("test_log3", LevelFormat((0.0, 0.25, 0.5, 1.0)))
    QUANTIZERS.register(
        "test_e3m4_sr", BlockQuantizer("test_e3m4", group_size=16, rounding="stochastic")
    )
    try:
        checked = run_conformance()
    finally:
        QUANTIZERS.unregister("test_e3m4_sr")
        FORMATS.unregister("test_log3")
        FORMATS.unregister("test_e3m4")
    assert "format:test_e3m4" in checked and "format:test_log3" in checked
    assert "quantizer:test_e3m4_sr" in checked


def test_conformance_catches_a_broken_kernel_table():
    # sabotage the decode table the kernels see (not the reference's): the check must notice
    # (an ε-level grid: minifloat and integer grids decode by arithmetic, without the table)
    q = BlockQuantizer("dq4", group_size=8, scale="e8m0", scale_rounding="up")
    from dynamiq.kernels.numba import blocks as numba_blocks

    tables, consts = numba_blocks.kernel_args(q._code)
    tables = list(tables)
    tables[2] = tables[2] * 1.01
    numba_blocks._args[q._code] = (tuple(tables), consts)
    with pytest.raises(AssertionError, match="decode"):
        check_quantizer(q)
