"""The reference backend: the kernels' maths as readable NumPy/torch, on CPU tensors.

It is the specification: every other backend is tested against it, bit for bit, for every
registered component. It is slow (whole-array NumPy with temporaries) and never chosen by
``backend="auto"``; ask for it with ``backend="reference"``.

* :mod:`~dynamiq.kernels.reference.blocks` — block quantization (encode, decode, fused hop);
* :mod:`~dynamiq.kernels.reference.shared_scale`, :mod:`~dynamiq.kernels.reference.intsum` —
  the shared-scale and integer-sum codes;
* :mod:`~dynamiq.kernels.reference.hadamard` — the randomized Hadamard transform;
* :mod:`~dynamiq.kernels.reference.packing` — bit streams and little-endian words.

Wire values, row permutations and block statistics are the torch operations of
:class:`~dynamiq.kernels.backend.Backend`.
"""

from __future__ import annotations

import numpy as np
import torch

from dynamiq.kernels.backend import Backend
from dynamiq.kernels.reference import blocks, hadamard, intsum, shared_scale

__all__ = ["BACKEND", "ReferenceBackend"]


def _put(dst: torch.Tensor, values: np.ndarray) -> None:
    dst.copy_(torch.from_numpy(np.ascontiguousarray(values)))


class ReferenceBackend(Backend):
    """NumPy/torch statement of every kernel family, on CPU tensors."""

    name = "reference"
    auto_devices = ()

    def check_device(self, device: torch.device) -> None:
        if device.type != "cpu":
            raise ValueError(f"backend='reference' runs on CPU tensors only, got a tensor on "
                             f"{device}")

    def block_encode(self, code, x, rand, out):
        _put(out, blocks.encode_with_scales(code, x.numpy(), rand)[0])

    def block_decode(self, code, data, out, rand, accumulate):
        v = blocks.decode(code, data.numpy(), out.numel(), rand)
        _put(out, (out.numpy() + v).astype(np.float32) if accumulate else v)

    def block_recompress(self, code, data, acc, rand, irand, writeback, out):
        sent, kept = blocks.recompress(code, data.numpy(), acc.numpy(), rand, irand, writeback)
        _put(out, sent)
        _put(acc, kept)

    def shared_encode(self, code, x, scales, block, out):
        _put(out, shared_scale.encode(code, x.numpy(), scales.numpy(), block))

    def shared_decode(self, code, data, scales, block, out, accumulate):
        _put(out, shared_scale.decode(code, data.numpy(), scales.numpy(), block, out.numpy(),
                                      accumulate))

    def shared_recompress(self, code, data, acc, scales, block, writeback, out):
        sent, kept = shared_scale.recompress(code, data.numpy(), acc.numpy(), scales.numpy(),
                                             block, writeback)
        _put(out, sent)
        _put(acc, kept)

    def intsum_encode(self, x, step, bits, key, offset, out, shift=0.0):
        _put(out, intsum.encode(x.numpy(), step, bits, key, offset, shift))

    def intsum_decode(self, data, step, bits, out, accumulate, shift=0.0):
        _put(out, intsum.decode(data.numpy(), step, bits, out.numpy(), accumulate, shift))

    def intsum_recompress(self, data, acc, step, bits, key, offset, writeback, out,
                          shift_in=0.0, shift_out=0.0):
        sent, kept = intsum.recompress(data.numpy(), acc.numpy(), step, bits, key, offset,
                                       writeback, shift_in, shift_out)
        _put(out, sent)
        _put(acc, kept)

    def intsum_round(self, x, step, grid, key, offset, out):
        _put(out, intsum.round_levels(x.numpy(), step, grid, key, offset))

    def rht_forward(self, x, out, block, key, norm):
        _put(out, hadamard.rht_forward(x.numpy(), block, key, norm))

    def rht_inverse(self, y, out, block, key, norm):
        _put(out, hadamard.rht_inverse(y.numpy(), block, key, norm))


#: The backend's instance, found by :func:`dynamiq.kernels.backend.get_backend`.
BACKEND = ReferenceBackend()
