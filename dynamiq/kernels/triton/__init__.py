"""The Triton backend: GPU kernels, bit-exact twins of the Numba and reference backends.

Device code (``@triton.jit``) lives in :mod:`~dynamiq.kernels.triton.jit`, one module per family
(``rng``, ``elements``, ``blocks``, ``shared_scale``, ``intsum``, ``wire``, ``hadamard``,
``stats``, and ``streams`` for the tiles of per-coordinate kernels); the host-side launchers
(argument checks, allocation, grid) are the modules of the same names here, with
:mod:`~dynamiq.kernels.triton.common` for what they share.

Importing this package does not import :mod:`triton`: the launchers (and with them the kernels)
are imported on first use. Kernels are decorated when their module is imported, and that is when
Triton decides between compiling them and interpreting them: to run them on CPU tensors (tests),
set ``TRITON_INTERPRET=1`` before the first use.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from types import ModuleType

import torch

from dynamiq.kernels.backend import Backend

__all__ = ["BACKEND", "TRITON_MISSING", "TritonBackend", "interpreting", "triton_available"]

#: The message raised (as :class:`ImportError`) when the Triton backend is wanted but missing.
TRITON_MISSING = "backend='triton' needs the triton package: pip install 'dynamiq[triton]'"


def triton_available() -> bool:
    """Whether the :mod:`triton` package can be imported (checked without importing it)."""
    try:
        return importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):  # a broken or stubbed-out module entry
        return False


def interpreting() -> bool:
    """Whether Triton's interpreter is requested (``TRITON_INTERPRET`` set to a true value)."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on", "yes")


def _mod(name: str) -> ModuleType:
    return importlib.import_module(f"{__name__}.{name}")


class TritonBackend(Backend):
    """Triton kernels on CUDA tensors (or CPU tensors under the interpreter)."""

    name = "triton"
    auto_devices = ("cuda",)
    stable = False  # the answer on CPU tensors depends on TRITON_INTERPRET

    def check_device(self, device: torch.device) -> None:
        if not triton_available():
            raise ImportError(TRITON_MISSING)
        if device.type == "cuda":
            return
        if device.type == "cpu":
            if interpreting():
                return
            raise ValueError(
                "backend='triton' on a CPU tensor needs Triton's interpreter: set "
                "TRITON_INTERPRET=1 before dynamiq.kernels.triton is imported (slow; meant for "
                "tests), or use a CUDA tensor, or backend='numba'"
            )
        raise ValueError(f"backend='triton' needs CUDA tensors, got a tensor on {device}")

    def block_encode(self, code, x, rand, out):
        _mod("blocks").encode(code, x, rand, out)

    def block_decode(self, code, data, out, rand, accumulate):
        _mod("blocks").decode(code, data, out.numel(), rand, out, accumulate=accumulate)

    def block_recompress(self, code, data, acc, rand, irand, writeback, out):
        _mod("blocks").recompress(code, data, acc, rand, writeback, out, irand=irand)

    def shared_encode(self, code, x, scales, block, out):
        m = _mod("shared_scale")
        m.shared_encode(x, scales, block, code.mbits, m.tables_of(code, x.device), out)

    def shared_decode(self, code, data, scales, block, out, accumulate):
        m = _mod("shared_scale")
        m.shared_decode(data, scales, block, code.mbits, m.tables_of(code, out.device), out,
                        accumulate)

    def shared_recompress(self, code, data, acc, scales, block, writeback, out):
        m = _mod("shared_scale")
        m.shared_recompress(data, acc, scales, block, code.mbits, m.tables_of(code, acc.device),
                            out, writeback)

    def intsum_encode(self, x, step, bits, key, offset, out, shift=0.0):
        _mod("intsum").intsum_encode(x, step, bits, key, offset, out, shift)

    def intsum_decode(self, data, step, bits, out, accumulate, shift=0.0):
        _mod("intsum").intsum_decode(data, step, bits, out, accumulate, shift)

    def intsum_recompress(self, data, acc, step, bits, key, offset, writeback, out,
                          shift_in=0.0, shift_out=0.0):
        _mod("intsum").intsum_recompress(data, acc, step, bits, key, offset, out, writeback,
                                         shift_in, shift_out)

    def intsum_round(self, x, step, grid, key, offset, out):
        _mod("intsum").intsum_round(x, step, grid, key, offset, out)

    @staticmethod
    def _positions(select, device: torch.device):
        """The wire kernels' form of a :class:`~dynamiq.kernels.abi.Selection` (cached)."""
        if select is None:
            return None, 256
        key = ("triton", str(device))
        pos = select.derived.get(key)
        if pos is None:
            pos = select.derived[key] = _mod("wire").block_positions(
                select.mask, select.n, select.block, device)
        return pos, select.block

    def wire_encode(self, x, wire, out, select=None):
        pos, block = self._positions(select, x.device)
        _mod("wire").wire_encode(x, wire, out, pos, block)

    def wire_decode(self, data, wire, out, accumulate, select=None):
        pos, block = self._positions(select, out.device)
        _mod("wire").wire_decode(data, wire, out, accumulate, pos, block)

    def wire_recompress(self, data, acc, wire, writeback, out, select=None):
        pos, block = self._positions(select, acc.device)
        _mod("wire").wire_recompress(data, acc, wire, out, writeback, pos, block)

    def gather_rows(self, x, order, row):
        return _mod("wire").gather_rows(x, order, row)

    def scatter_rows(self, g, order, out, add, row):
        _mod("wire").scatter_rows(g, order, out, add, row)

    def rht_forward(self, x, out, block, key, norm):
        _mod("hadamard").rht_forward(x, out, block, key[0], key[1], norm)

    def rht_inverse(self, y, out, block, key, norm):
        _mod("hadamard").rht_inverse(y, out, block, key[0], key[1], norm)

    def block_statistics(self, y, ops):
        return _mod("stats").block_statistics(y.detach().contiguous(), ops)


#: The backend's instance, found by :func:`dynamiq.kernels.backend.get_backend`.
BACKEND = TritonBackend()
