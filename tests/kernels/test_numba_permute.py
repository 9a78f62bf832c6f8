"""The vector-permute level lookup of the Numba decodes of small tables.

Where the host has AVX2 (:data:`~dynamiq.kernels.numba.permute.HAS_AVX2`), the block kernels
look up the levels of tables of at most 16 entries eight codes at a time with ``vpermps``
(:func:`~dynamiq.kernels.numba.permute.permute_levels`). It must give the select tree's level,
bit for bit, for every code byte (the sign and any bits above the mask ignored), every mask
width and every count, a tail of fewer than eight codes included. The decodes that use it are
compared with the reference backend by the parity tests.
"""

from __future__ import annotations

import numba as nb
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dynamiq.kernels.numba.levels import select_tree
from dynamiq.kernels.numba.permute import HAS_AVX2, permute_levels

pytestmark = pytest.mark.skipif(not HAS_AVX2, reason="the host has no AVX2")

LEVELS = st.lists(st.floats(width=32, allow_nan=False), min_size=16, max_size=16)


# not cache=True: Numba's cache of a test file would not see a change to the kernel modules
# it calls (dynamiq.kernels.numba.stamps covers the package's own files only)
@nb.njit
def _permuted(cb, n, mask, lv):
    lb = np.full(cb.size + 8, np.float32(-7.0))
    permute_levels(cb, lb, n, mask, lv)
    return lb


@nb.njit
def _tree(cb, n, mask, lv):
    lb = np.full(cb.size + 8, np.float32(-7.0))
    for j in range(n):
        lb[j] = select_tree(np.uint32(np.uint32(cb[j]) & np.uint32(mask)), lv)
    return lb


@given(st.binary(min_size=0, max_size=70), st.integers(0, 4), LEVELS)
def test_permute_equals_the_select_tree(codes, mbits, levels):
    cb = np.frombuffer(codes, np.uint8).copy()
    lv = tuple(np.float32(v) for v in levels)
    mask = np.uint32((1 << mbits) - 1)
    got = _permuted(cb, cb.size, mask, lv)
    want = _tree(cb, cb.size, mask, lv)
    # written where asked only (the -7 sentinel past n), the same bits everywhere
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_every_code_byte_reads_its_masked_entry():
    cb = np.arange(256, dtype=np.uint8)
    lv = tuple(np.float32(k + 0.25) for k in range(16))
    for mbits in range(5):
        mask = (1 << mbits) - 1
        got = _permuted(cb, 256, np.uint32(mask), lv)[:256]
        assert np.array_equal(got, np.float32(np.arange(256) & mask) + np.float32(0.25))
