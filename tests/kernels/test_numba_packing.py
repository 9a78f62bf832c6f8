"""Bit packing of the Numba kernels: the BMI2 extract and deposit, and the wire bytes of every
code width whose units pack through them.

The block kernels pack units of 3-, 5-, 6- and 7-bit codes by one bit extraction where the host
has BMI2 (:data:`~dynamiq.kernels.numba.packing.HAS_BMI2`). Widths 5 and 6 are checked byte
for byte against the reference backend's bit stream, on lengths with a partial last block: units
of 8 codes in 5 bytes and of 4 codes in 3 bytes (3 and 7 bits take the first kind, with the
same formula for their masks; each width compiles a kernel, about 15 s of a cold run).
"""

from __future__ import annotations

import numba as nb
import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from dynamiq import BlockQuantizer
from dynamiq.formats import IntFormat
from dynamiq.kernels.numba.packing import HAS_BMI2, pdep64, pext64

pytestmark = pytest.mark.usefixtures("one_numba_thread")

WORD = st.integers(0, (1 << 64) - 1)


# not cache=True: Numba's cache of a test file would not see a change to the kernel modules
# it calls (dynamiq.kernels.numba.stamps covers the package's own files only)
@nb.njit
def _both(a, mask):
    return pext64(a, mask), pdep64(a, mask)


def _moved(a: int, mask: int, extract: bool) -> int:
    """Bit by bit: the masked bits of ``a`` packed at the bottom (``extract``), or the low bits
    of ``a`` placed at the mask's ones."""
    out, k = 0, 0
    for i in range(64):
        if mask >> i & 1:
            src, dst = (i, k) if extract else (k, i)
            out |= (a >> src & 1) << dst
            k += 1
    return out


@pytest.mark.skipif(not HAS_BMI2, reason="the host has no BMI2")
@given(WORD, WORD)
def test_extract_and_deposit_move_the_masked_bits_in_order(a, mask):
    got = _both(np.uint64(a), np.uint64(mask))
    assert (int(got[0]), int(got[1])) == (_moved(a, mask, True), _moved(a, mask, False))


@pytest.mark.parametrize("bits", [5, 6])
def test_odd_widths_pack_the_reference_bit_stream(bits):
    # integer levels rounded to nearest: no random numbers, only the codes and their packing
    q = BlockQuantizer(IntFormat(bits=bits), group_size=8, scale="e8m0", scale_rounding="up")
    x = torch.randn(8 * 40 + 3, generator=torch.Generator().manual_seed(bits)) * 3
    want = q.encode(x, backend="reference")
    got = q.encode(x, backend="numba")
    assert torch.equal(got.data, want.data), f"{bits}-bit codes packed differently"
    assert torch.equal(q.decode(got, backend="numba"), q.decode(want, backend="reference"))
