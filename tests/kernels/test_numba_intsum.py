"""Numba's integer-sum kernels (THC's hops) against the reference backend, bit for bit.

The kernels code in tasks of ``TASK`` coordinates, packing 4- and 8-bit codes as bytes and
nibbles, other widths eight codes to a word with the bit stream for the rest, so the lengths
span several tasks and end in partial ones and in partial words; the values reach both clamps,
non-finite values and the rounding's ties to the uniform.
"""

from __future__ import annotations

import numba
import numpy as np
import pytest
import torch

from dynamiq.kernels import Writeback, get_backend
from dynamiq.kernels.abi import LevelGrid
from dynamiq.kernels.numba.intsum import TASK

pytestmark = pytest.mark.usefixtures("one_numba_thread")

BITS = [3, 4, 5, 7, 8, 12]
LENGTHS = [1, 13, TASK + 5, 2 * TASK + 77]
KEY, STEP = (12345, 678), 0.25
#: Global index of the first coordinate: high words set, and a run that crosses 2**32, where
#: the kernels restart their hash state.
OFFSETS = [1 << 33, (1 << 32) - TASK - 1000]


def _values(n: int, bits: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    top = 2 ** (bits - 1) * STEP
    x = (torch.rand(n, generator=g) * 2.4 - 1.2) * top  # beyond both clamps
    x[::7] = torch.round(x[::7] / STEP) * STEP  # on the grid: no rounding at all
    x[3::11] = float("nan")
    x[5::13] = float("inf")
    x[6::17] = -float("inf")
    x[::19] = -0.0
    return x


def _codes(backend, x: torch.Tensor, bits: int, shift: float, offset: int = OFFSETS[0]
           ) -> torch.Tensor:
    out = torch.full((-(-x.numel() * bits // 8),), 0xA5, dtype=torch.uint8)
    backend.intsum_encode(x, STEP, bits, KEY, offset, out, shift)
    return out


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("shift", [0.0, 0.5])
@pytest.mark.parametrize("offset", OFFSETS, ids=["high", "crossing"])
def test_intsum_kernels_match_the_reference(bits, n, shift, offset):
    nb, ref = get_backend("numba"), get_backend("reference")
    x = _values(n, bits, seed=n * 31 + bits)
    want = _codes(ref, x, bits, shift, offset)
    assert torch.equal(_codes(nb, x, bits, shift, offset), want), "encode"

    for accumulate in (False, True):
        outs = []
        for backend in (nb, ref):
            out = torch.linspace(-1, 1, n)
            backend.intsum_decode(want, STEP, bits, out, accumulate, shift)
            outs.append(out.numpy().view(np.uint32))
        np.testing.assert_array_equal(outs[0], outs[1], f"decode accumulate={accumulate}")

    acc0 = _values(n, bits, seed=n + 7) / 2
    for wb in Writeback:
        res = []
        for backend in (nb, ref):
            acc = acc0.clone()
            out = torch.full_like(want, 0x5A)
            backend.intsum_recompress(want, acc, STEP, bits, KEY, offset + 3, wb, out, shift,
                                      0.5 - shift)
            res.append((out, acc.numpy().view(np.uint32)))
        assert torch.equal(res[0][0], res[1][0]), f"recompress codes, writeback {wb}"
        np.testing.assert_array_equal(res[0][1], res[1][1], f"recompress acc, writeback {wb}")


@pytest.mark.parametrize("bits", [5, 8])
def test_tasks_on_several_threads_write_the_same_bytes(bits):
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("one Numba thread only")
    nb = get_backend("numba")
    n = 5 * TASK + 3
    x = _values(n, bits, seed=bits)
    one = _codes(nb, x, bits, 0.0)
    numba.set_num_threads(2)
    try:
        assert torch.equal(_codes(nb, x, bits, 0.0), one)
    finally:
        numba.set_num_threads(1)


@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("offset", OFFSETS, ids=["high", "crossing"])
def test_leaf_rounding_onto_levels_matches_the_reference(n, offset):
    grid = LevelGrid((0, 3, 4, 9, 16, 17, 30, 32))  # uneven gaps, both ends levels
    x = _values(n, 5, seed=n + 11) * 4  # beyond the clamp, non-finite values too
    outs = []
    for backend in (get_backend("numba"), get_backend("reference")):
        out = torch.full((n,), 7.0)
        backend.intsum_round(x, STEP, grid, KEY, offset, out)
        outs.append(out.numpy().view(np.uint32))
    np.testing.assert_array_equal(outs[0], outs[1])
    assert np.isnan(outs[0].view(np.float32)[~np.isfinite(x.numpy())]).all()
