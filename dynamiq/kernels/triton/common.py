"""Host-side helpers shared by the Triton launchers: device and tensor checks, launches, tiles,
device copies of tables.

Tensors live on a CUDA device, or on the CPU when Triton's interpreter is on
(``TRITON_INTERPRET=1`` before :mod:`dynamiq.kernels.triton`'s kernels are first imported; that
is how the kernels are tested without a GPU).
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np
import torch

from dynamiq.kernels.abi import TILE, TILE_INTERPRETED

__all__ = ["cdiv", "check_device", "check_tensor", "code_chunk", "device_tables", "distinct",
           "grid_for", "interpreted", "launch", "on_device", "stream_in", "stream_out",
           "tile_for"]

_tables: dict[tuple, tuple[torch.Tensor, ...]] = {}


def interpreted() -> bool:
    """Whether the kernels were decorated under Triton's interpreter."""
    from triton.runtime.interpreter import InterpretedFunction

    from dynamiq.kernels.triton.jit import blocks

    return isinstance(blocks.encode_kernel, InterpretedFunction)


def check_device(device: torch.device) -> None:
    """Raise unless the kernels can run on tensors of ``device``."""
    if device.type == "cuda":
        return
    if device.type == "cpu":
        if not interpreted():
            raise RuntimeError(
                "Triton kernels on CPU tensors need Triton's interpreter, but "
                "dynamiq.kernels.triton was imported without TRITON_INTERPRET=1; set it before "
                "the first import (or use CUDA tensors)"
            )
        return
    raise ValueError(f"the Triton kernels need CUDA tensors, got a tensor on {device}")


def check_tensor(t: object, name: str, dtype: torch.dtype, numel: int | None,
                 device: torch.device | None = None) -> torch.Tensor:
    """``t`` itself if it is a contiguous 1-D ``dtype`` tensor (of ``numel`` elements, on
    ``device``, when given); else a clear ``TypeError`` / ``ValueError``."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    size = t.numel() if numel is None else numel
    if t.dtype != dtype or t.dim() != 1 or t.numel() != size or not t.is_contiguous():
        raise ValueError(
            f"{name} must be a contiguous 1-D {dtype} tensor of {size} elements, got "
            f"{t.dtype} of shape {tuple(t.shape)}{'' if t.is_contiguous() else ' (strided)'}"
        )
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device}, expected {device} (the input's device)")
    return t


def distinct(out: torch.Tensor, data: torch.Tensor) -> None:
    """Raise when the outgoing buffer is the incoming one (a fused hop reads while it writes)."""
    if out.numel() and out.data_ptr() == data.data_ptr():
        raise ValueError("out must not be the incoming message buffer")


@contextlib.contextmanager
def on_device(device: torch.device):
    """Context of a launch on ``device``: that CUDA device made current (Triton launches on
    the current one), or, under the interpreter, numpy's warnings silenced: it would warn about
    the inf/NaN arithmetic of groups flagged non-finite, whose results are discarded."""
    if device.type == "cpu":
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            yield
    else:
        with torch.cuda.device(device):
            yield


def launch(kernel: Any, grid: tuple[int, ...], device: torch.device, *args: Any,
           **kw: Any) -> None:
    """Launch ``kernel`` on ``grid`` with FMA contraction off (the bit-exactness contract)."""
    with on_device(device):
        kernel[grid](*args, **kw, num_warps=4, enable_fp_fusion=False)


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for positive ints (grid sizes)."""
    return -(-a // b)


def grid_for(n: int, tile: int) -> tuple[int]:
    """One program per ``tile`` coordinates (at least one)."""
    return (max(1, cdiv(n, tile)),)


def stream_in(data: torch.Tensor, n: int, bits: int, device: torch.device, name: str
              ) -> torch.Tensor:
    """``data`` checked as the ``ceil(n * bits / 8)``-byte stream of ``n`` ``bits``-bit codes."""
    return check_tensor(data, name, torch.uint8, -(-n * bits // 8), device)


def stream_out(out: torch.Tensor | None, n: int, bits: int, device: torch.device
               ) -> torch.Tensor:
    """``out`` checked (or allocated) as the stream of ``n`` ``bits``-bit codes."""
    nbytes = -(-n * bits // 8)
    if out is None:
        return torch.empty(nbytes, dtype=torch.uint8, device=device)
    return check_tensor(out, "out", torch.uint8, nbytes, device)


def tile_for(n: int) -> int:
    """Coordinates per program of the per-coordinate kernels (a power of two, multiple of 8):
    :data:`~dynamiq.kernels.abi.TILE`, or under the interpreter the smallest power of two
    covering ``n`` up to :data:`~dynamiq.kernels.abi.TILE_INTERPRETED`."""
    if interpreted():
        return max(8, min(TILE_INTERPRETED, 1 << max(0, n - 1).bit_length()))
    return TILE


def code_chunk(bits: int) -> dict[str, int]:
    """The packing chunk of ``bits``-bit codes: ``E`` codes fill exactly ``L`` bytes."""
    g = math.gcd(bits, 8)
    return {"E": 8 // g, "L": bits // g}


def device_tables(key: Hashable, arrays: Sequence[np.ndarray], ints: Sequence[int],
                  device: torch.device) -> tuple[torch.Tensor, ...]:
    """``arrays`` and an int64 tensor of ``ints`` on ``device``, cached per ``(key, device)``.

    Args:
        key: A hashable owner of the tables (e.g. a code record), constant for their lifetime.
        arrays: numpy arrays (tables) to copy.
        ints: Integer constants, packed into one int64 tensor (last element of the result).
        device: Target device.
    """
    k = (key, str(device))
    hit = _tables.get(k)
    if hit is None:
        hit = (*(torch.from_numpy(np.ascontiguousarray(a)).to(device) for a in arrays),
               torch.tensor([int(v) for v in ints], dtype=torch.int64).to(device))
        if len(_tables) > 256:
            _tables.clear()
        _tables[k] = hit
    return hit
