"""The Numba backend's one-pass BF16 wire kernels give the bytes of the torch operations they
replace (:class:`dynamiq.kernels.backend.Backend`'s), NaN, infinities, ties and subnormals
included, across task boundaries."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dynamiq.kernels.abi import Writeback
from dynamiq.kernels.backend import Backend, get_backend
from dynamiq.kernels.nan16 import _keep_rule, nan_pattern
from dynamiq.kernels.numba import wire

BE = get_backend("numba")
SIZES = (1, 7, 1000, wire.TASK + 5)

_SPECIAL = np.array([
    0x7FC00000, 0xFFC00000, 0x7F800001, 0xFFBFFFFF, 0x7FFFFFFF,  # NaNs, payloads
    0x7F800000, 0xFF800000, 0x00000000, 0x80000000,  # infinities, zeros
    0x00000001, 0x807FFFFF, 0x00008000, 0x00018000,  # subnormals, ties below
    0x3F808000, 0x3F818000, 0x3F808001, 0x3F807FFF,  # ties to even, just off them
    0x7F7FFFFF, 0xFF7F8000, 0x7F7F7FFF,  # the largest values: round to inf or not
], dtype=np.uint32)


def _floats(n: int, seed: int) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    normal = (rng.standard_normal(n) * 10.0 ** rng.integers(-8, 8, n)).astype(np.float32)
    bits = np.where(rng.random(n) < 0.5, bits, normal.view(np.uint32))
    bits[rng.integers(0, n, min(n, 64))] = rng.choice(_SPECIAL, min(n, 64))
    bits[: min(n, _SPECIAL.size)] = _SPECIAL[: min(n, _SPECIAL.size)]
    return torch.from_numpy(bits.view(np.float32).copy())


def _bf16_bytes(n: int, seed: int) -> torch.Tensor:
    out = torch.empty(2 * n, dtype=torch.uint8)
    Backend.wire_encode(BE, _floats(n, seed), "bf16", out)
    return out


def _same(a: torch.Tensor, b: torch.Tensor) -> None:
    assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@pytest.mark.parametrize("n", SIZES)
def test_encode_is_torchs_cast(n):
    x = _floats(n, n)
    ours, ref = torch.empty(2 * n, dtype=torch.uint8), torch.empty(2 * n, dtype=torch.uint8)
    BE.wire_encode(x, "bf16", ours)
    Backend.wire_encode(BE, x, "bf16", ref)
    _same(ours, ref)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("accumulate", [False, True])
def test_decode_is_torchs(n, accumulate):
    data = _bf16_bytes(n, n + 1)
    acc = torch.randn(n)
    ours, ref = acc.clone(), acc.clone()
    BE.wire_decode(data, "bf16", ours, accumulate)
    Backend.wire_decode(BE, data, "bf16", ref, accumulate)
    _same(ours, ref)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("writeback", list(Writeback))
def test_recompress_is_torchs(n, writeback):
    data = _bf16_bytes(n, n + 2)
    acc = _floats(n, n + 3)
    acc[torch.isnan(acc)] = 1.0  # a NaN meeting a NaN may keep either payload: not compared
    ours_acc, ref_acc = acc.clone(), acc.clone()
    ours, ref = torch.empty(2 * n, dtype=torch.uint8), torch.empty(2 * n, dtype=torch.uint8)
    BE.wire_recompress(data, ours_acc, "bf16", writeback, ours)
    Backend.wire_recompress(BE, data, ref_acc, "bf16", writeback, ref)
    _same(ours, ref)
    _same(ours_acc, ref_acc)


def test_the_cpu_nan_rule_is_probed_and_the_other_rule_is_kept_too():
    assert nan_pattern(torch.device("cpu"), "bf16") == 0xFFFF  # torch 2.x on x86 and ARM
    nans = _SPECIAL[:5]
    x = nans.view(np.float32)
    out = np.empty(x.size, np.uint16)
    wire._encode(0, 1, x, out, True, np.uint32(0))
    assert (out.astype(np.int64) == _keep_rule(nans, "bf16")).all()
    wire._encode(0, 1, x, out, False, np.uint32(0x7FC0))
    assert (out == 0x7FC0).all()


def test_other_wires_and_selections_stay_on_torch(monkeypatch):
    def boom(*args):
        raise AssertionError("the BF16 kernel ran")

    for name in ("encode", "decode", "recompress"):
        monkeypatch.setattr(wire, name, boom)
    x = torch.randn(8)
    out = torch.empty(32, dtype=torch.uint8)
    BE.wire_encode(x, "fp32", out)
    BE.wire_decode(out, "fp32", x, True)
    BE.wire_recompress(out, x, "fp32", Writeback.SUM, torch.empty(32, dtype=torch.uint8))
    with pytest.raises(AssertionError, match="the BF16 kernel ran"):
        BE.wire_encode(x, "bf16", torch.empty(16, dtype=torch.uint8))


def test_wrong_sizes_are_refused():
    with pytest.raises(ValueError, match="must be 16 uint8 bytes"):
        BE.wire_encode(torch.randn(8), "bf16", torch.empty(15, dtype=torch.uint8))
    with pytest.raises(ValueError, match="must be 16 uint8 bytes"):
        BE.wire_recompress(torch.empty(14, dtype=torch.uint8), torch.randn(8), "bf16",
                           Writeback.NONE, torch.empty(16, dtype=torch.uint8))
