"""Numba's shared-scale kernels (the MX and NVFP baselines' hops) against the reference backend.

The kernels code a vector in passes of ``TASK`` coordinates, each pass packing its codes on
its own where the width allows it (8- and 4-bit codes) and through the bit stream otherwise,
so the lengths here span several passes and end in a partial one, with odd counts for the
4-bit codes. Scales that are not powers of two (NVFP4's relative E4M3 scales) exercise the
bracket's settling on the decoded levels; power-of-two scales at the far ends of their range
exercise the switch between the arithmetic search and the table's; zeros, signed zeros,
saturating values and non-finite values and scales exercise the rest of the coding.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dynamiq.codecs.shared_scale import SharedScale
from dynamiq.kernels import Writeback, get_backend
from dynamiq.kernels.numba.shared_scale import TASK

pytestmark = pytest.mark.usefixtures("one_numba_thread")

ELEMENTS = ["e4m3", "e3m2", "e2m1", "e5m2"]
LENGTHS = [2 * TASK + 77, TASK + 1, 33]


def _case(code, n: int, block: int, pow2: bool, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * torch.exp(2 * torch.randn(n, generator=g))
    nblocks = -(-n // block)
    raw = torch.exp(torch.randn(nblocks, generator=g))
    s = torch.exp2(torch.ceil(torch.log2(raw))) if pow2 else raw
    # every third value a decoded level itself (level * scale in float32): with a scale that
    # is not a power of two, |v| / s can round below the level, and the bracket must be settled
    # on the decoded levels
    levels = torch.from_numpy(code.tables.search[:code.tables.nfin].copy())
    idx = torch.arange(0, n, 3)
    pick = levels[torch.randint(len(levels), (len(idx),), generator=g)]
    x[idx] = pick * s[idx // block] * torch.where(idx % 2 == 0, 1.0, -1.0)
    x[::97] = 0.0
    x[1::97] = -0.0
    x[2::389] = float("nan")
    x[4::613] = float("-inf")
    s[5 % nblocks] = float("nan")
    s[7 % nblocks] = 1e-30  # everything saturates or rounds to zero at the far ends
    if pow2:
        # both sides of the range of exact power-of-two scales (levels * scale normal and
        # finite), where the kernels switch between the arithmetic and the table search
        for j, e in ((9, -127), (11, -117), (13, -116), (15, 117), (17, 118), (19, 127)):
            s[j % nblocks] = 2.0**e
            x[(j % nblocks) * block:((j % nblocks) + 1) * block] *= 2.0**e
    return x, s.float()


@pytest.mark.parametrize("element", ELEMENTS)
@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("pow2", [True, False], ids=["pow2", "any-scale"])
def test_shared_scale_kernels_match_the_reference(element, n, pow2):
    code = SharedScale(element, 16, "e8m0")._code
    block = 16
    x, s = _case(code, n, block, pow2, seed=n + len(element))
    nb, ref = get_backend("numba"), get_backend("reference")
    nbytes = -(-n * code.bits // 8)

    def encode(backend):
        out = torch.full((nbytes,), 0xAA, dtype=torch.uint8)
        backend.shared_encode(code, x, s, block, out)
        return out

    want = encode(ref)
    got = encode(nb)
    assert torch.equal(got, want), "encode"

    for accumulate in (False, True):
        outs = []
        for backend in (nb, ref):
            out = torch.linspace(-1, 1, n)
            backend.shared_decode(code, want, s, block, out, accumulate)
            outs.append(out.numpy().view(np.uint32))
        np.testing.assert_array_equal(outs[0], outs[1], f"decode accumulate={accumulate}")

    acc0 = torch.randn(n, generator=torch.Generator().manual_seed(3)) * 4
    for wb in Writeback:
        res = []
        for backend in (nb, ref):
            acc = acc0.clone()
            out = torch.full((nbytes,), 0x55, dtype=torch.uint8)
            backend.shared_recompress(code, want, acc, s, block, wb, out)
            res.append((out, acc.numpy().view(np.uint32)))
        assert torch.equal(res[0][0], res[1][0]), f"recompress codes, writeback {wb.name}"
        np.testing.assert_array_equal(res[0][1], res[1][1], f"recompress acc, {wb.name}")
