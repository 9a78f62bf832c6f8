"""The Numba backend: compiled CPU kernels, the default for CPU tensors.

* :mod:`~dynamiq.kernels.numba.rng` — the counter-based hash and uniforms;
* :mod:`~dynamiq.kernels.numba.elements` — device functions of the block quantization maths;
* :mod:`~dynamiq.kernels.numba.blocks` — generation and launch of the block kernels (template
  :mod:`~dynamiq.kernels.numba._blocks`);
* :mod:`~dynamiq.kernels.numba.packing` — the bit streams of per-coordinate codes;
* :mod:`~dynamiq.kernels.numba.shared_scale`, :mod:`~dynamiq.kernels.numba.intsum` — the
  shared-scale and integer-sum codes;
* :mod:`~dynamiq.kernels.numba.hadamard` — the blocked randomized Hadamard transform;
* :mod:`~dynamiq.kernels.numba.stats` — the metadata phase's block statistics;
* :mod:`~dynamiq.kernels.numba.wire` — BF16 wire values in one pass.

FP32 wire values, selections of blocks and row permutations are torch operations
(:class:`~dynamiq.kernels.backend.Backend`'s own). Submodules (and Numba) are imported on
first use, so discovering the backend costs nothing.
"""

from __future__ import annotations

import importlib
from types import ModuleType

import torch

from dynamiq.kernels.backend import Backend

__all__ = ["BACKEND", "NumbaBackend"]


def _mod(name: str) -> ModuleType:
    return importlib.import_module(f"{__name__}.{name}")


#: Below this world size and up to this many runs of shared keys
#: (:meth:`~dynamiq.kernels.BlockKeys.runs`), ``block_roundtrip`` codes each run with the
#: per-call kernels instead of the keyed ones.
KEYED_MIN_WORLD = 64
KEYED_MIN_RUNS = 32


class NumbaBackend(Backend):
    """Numba kernels on CPU tensors (every tensor argument contiguous and on the CPU)."""

    name = "numba"
    auto_devices = ("cpu",)
    block_rows = True

    def check_device(self, device: torch.device) -> None:
        if device.type != "cpu":
            raise ValueError(
                f"backend='numba' runs on CPU tensors only, got a tensor on {device}; use "
                "backend='triton' (or 'auto') for CUDA tensors, or move the tensor to the CPU"
            )

    def block_encode(self, code, x, rand, out, rows=None, n=None):
        _mod("blocks").block_encode(code, x, rand, out, rows, n)

    def block_decode(self, code, data, out, rand, accumulate, rows=None, n=None):
        _mod("blocks").block_decode(code, data, out, rand, accumulate, rows, n)

    def block_roundtrip(self, code, x, keys, rows):
        # the keyed kernels cost a compilation per format on first use: worth it for a large
        # world (whose simulation calls them thousands of times) or a call of many runs, not
        # for a few runs of a small world, which the per-call kernels code as fast
        runs = len(keys.runs(code.spec.block)) - 1
        if keys.world < KEYED_MIN_WORLD and runs <= KEYED_MIN_RUNS:
            super().block_roundtrip(code, x, keys, rows)
        else:
            _mod("blocks").block_roundtrip(code, x, keys, rows)

    def block_recompress(self, code, data, acc, rand, irand, writeback, out, rows=None,
                         n=None):
        _mod("blocks").block_recompress(code, data, acc, rand, irand, writeback, out, rows, n)

    # BF16 wire values of whole chunks by the one-pass kernels of ``wire``; FP32 (already one
    # torch pass each) and selections of blocks by torch, as every backend
    def wire_encode(self, x, wire, out, select=None):
        if wire != "bf16" or select is not None:
            return super().wire_encode(x, wire, out, select)
        _mod("wire").encode(x, self._view(out, x.numel(), wire, "out"))

    def wire_decode(self, data, wire, out, accumulate, select=None):
        if wire != "bf16" or select is not None:
            return super().wire_decode(data, wire, out, accumulate, select)
        _mod("wire").decode(self._view(data, out.numel(), wire, "message"), out, accumulate)

    def wire_recompress(self, data, acc, wire, writeback, out, select=None):
        if wire != "bf16" or select is not None:
            return super().wire_recompress(data, acc, wire, writeback, out, select)
        n = acc.numel()
        _mod("wire").recompress(self._view(data, n, wire, "message"), acc,
                                self._view(out, n, wire, "out"), writeback)

    def shared_encode(self, code, x, scales, block, out):
        _mod("shared_scale").encode(code, x, scales, block, out)

    def shared_decode(self, code, data, scales, block, out, accumulate):
        _mod("shared_scale").decode(code, data, scales, block, out, accumulate)

    def shared_recompress(self, code, data, acc, scales, block, writeback, out):
        _mod("shared_scale").recompress(code, data, acc, scales, block, writeback, out)

    def intsum_encode(self, x, step, bits, key, offset, out, shift=0.0):
        _mod("intsum").encode(x, step, bits, key, offset, out, shift)

    def intsum_decode(self, data, step, bits, out, accumulate, shift=0.0):
        _mod("intsum").decode(data, step, bits, out, accumulate, shift)

    def intsum_recompress(self, data, acc, step, bits, key, offset, writeback, out,
                          shift_in=0.0, shift_out=0.0):
        _mod("intsum").recompress(data, acc, step, bits, key, offset, writeback, out, shift_in,
                                  shift_out)

    def intsum_round(self, x, step, grid, key, offset, out):
        _mod("intsum").round_levels(x, step, grid, key, offset, out)

    def rht_forward(self, x, out, block, key, norm):
        _mod("hadamard").rht_forward(x.numpy(), out.numpy(), block, key[0], key[1], norm)

    def rht_inverse(self, y, out, block, key, norm):
        _mod("hadamard").rht_inverse(y.numpy(), out.numpy(), block, key[0], key[1], norm)

    def block_statistics(self, y, ops):
        return _mod("stats").block_statistics(y, ops)


#: The backend's instance, found by :func:`dynamiq.kernels.backend.get_backend`.
BACKEND = NumbaBackend()
