"""Host-side launchers of the Triton block kernels: argument checks, allocation, grid.

The functions here are what :class:`dynamiq.quantizers.BlockQuantizer` calls when its
``backend`` resolves to ``"triton"``; each is equivalent, bit for bit, to the Numba path of the
same method (see :mod:`dynamiq.kernels.triton.codec` for the arithmetic contract). Tensors may
live on a CUDA device, or on the CPU when Triton's interpreter is on (``TRITON_INTERPRET=1``
before this package is imported; that is how the kernels are tested without a GPU).

Payload buffers here are in the kernels' layout of ``K = q._kernel_nbytes(n)`` bytes (a partial
last block padded to whole); ``BlockQuantizer`` cuts them to the wire layout.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from dynamiq.kernels.triton import blocks

__all__ = ["TILE", "TILE_INTERPRETED", "decode", "encode", "kernel_geometry", "recompress"]

#: Target elements per program: a program codes ``max(1, TILE // block)`` whole blocks.
TILE = 1024
#: The same under the interpreter, where fewer, larger programs run faster (numpy per-op costs).
TILE_INTERPRETED = 4096

_WRITEBACK = {"none": 0, "sum": 1, "decoded": 2}
_device_cache: dict[tuple[Any, str], tuple[tuple, tuple[torch.Tensor, ...]]] = {}


def kernel_geometry(spec: Any, blocks_per_program: int | None = None,
                    nblocks: int | None = None) -> dict[str, int]:
    """Compile-time tile parameters of a quantizer's kernels.

    Args:
        spec: The quantizer's :class:`~dynamiq.kernels.numba.codec.KernelSpec`.
        blocks_per_program: Blocks per program (a power of two); default ``TILE // block``
            (under the interpreter ``TILE_INTERPRETED // block``, capped by ``nblocks``).
        nblocks: Blocks in the data (only used to cap the interpreter's tile).

    Returns:
        ``GPB`` (groups per block), ``NB`` (blocks per program), and the code packing chunk:
        ``E`` codes of ``bits`` bits fill exactly ``L`` bytes (``E = 8 / gcd(bits, 8)``).
    """
    if blocks_per_program is not None:
        nb = blocks_per_program
    elif _interpreted():
        nb = max(1, TILE_INTERPRETED // spec.block)
        if nblocks:
            nb = min(nb, 1 << (nblocks - 1).bit_length())
    else:
        nb = max(1, TILE // spec.block)
    if nb < 1 or nb & (nb - 1):
        raise ValueError(f"blocks_per_program must be a power of two, got {nb}")
    g = math.gcd(spec.bits, 8)
    return {"GPB": spec.block // spec.group, "NB": nb, "E": 8 // g, "L": spec.bits // g}


def _interpreted() -> bool:
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(blocks.encode_kernel, InterpretedFunction)


def _check_device(device: torch.device) -> None:
    if device.type == "cuda":
        return
    if device.type == "cpu":
        if not _interpreted():
            raise RuntimeError(
                "Triton kernels on CPU tensors need Triton's interpreter, but "
                "dynamiq.kernels.triton was imported without TRITON_INTERPRET=1; set it before "
                "the first import (or use CUDA tensors)"
            )
        return
    raise ValueError(f"the Triton kernels need CUDA tensors, got a tensor on {device}")


def _check_tensor(t: object, name: str, dtype: torch.dtype, numel: int | None,
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


def _device_args(q: Any, device: torch.device) -> tuple[torch.Tensor, ...]:
    """The quantizer's tables and constants as tensors on ``device`` (cached per device)."""
    tables, consts = q._kernel_args
    key = (q, str(device))
    hit = _device_cache.get(key)
    if hit is not None and hit[0] is q._kernel_args:
        return hit[1]
    snfin, slogp, snan, sdiv, unfin, ulogp, unan, enfin, lshift, lkey0, llen, kap = consts
    ints = [snfin, slogp, snan, unfin, ulogp, unan, enfin, lshift, lkey0, llen]
    arrays = [torch.from_numpy(np.ascontiguousarray(a)).to(device) for a in tables]
    iconst = torch.tensor([int(v) for v in ints], dtype=torch.int64).to(device)
    fconst = torch.from_numpy(np.asarray([sdiv, kap], dtype=np.float32)).to(device)
    args = (*arrays, iconst, fconst)
    if len(_device_cache) > 256:
        _device_cache.clear()
    _device_cache[key] = (q._kernel_args, args)
    return args


def _rand_tensor(rand: Sequence[int], device: torch.device) -> torch.Tensor:
    if len(rand) != 9:
        raise ValueError("rand must be (k0, k1, p0, p1, q0, q1, rank, world, offset)")
    return torch.tensor([int(v) for v in rand], dtype=torch.int64).to(device)


def _spec_kwargs(q: Any, blocks_per_program: int | None,
                 n: int) -> tuple[dict[str, int], int, int]:
    spec = q._kernel_spec
    geo = kernel_geometry(spec, blocks_per_program, -(-n // spec.block))
    kw = {
        "BITS": spec.bits, "MBITS": spec.mbits, "GROUP": spec.group, "GPB": geo["GPB"],
        "HIER": bool(spec.hier), "SKIND": spec.skind, "SBYTES": spec.sbytes,
        "UKIND": spec.ukind, "UBYTES": spec.ubytes, "NB": geo["NB"], "E": geo["E"],
        "L": geo["L"], "DITHER": bool(spec.dither), "EMODE": spec.emode,
    }
    return kw, spec.block, geo["NB"]


def _sections(q: Any, data: torch.Tensor, n: int) -> tuple[torch.Tensor, ...]:
    a, b, c = q._section_sizes(n)
    supers = data[a + b : a + b + c] if c else data  # never read or written when flat
    return data[:a], data[a : a + b], supers


@contextlib.contextmanager
def _on(device: torch.device):
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


def _launch(kernel: Any, grid: tuple[int], device: torch.device, *args: Any, **kw: Any) -> None:
    with _on(device):
        kernel[grid](*args, **kw, num_warps=4, enable_fp_fusion=False)


def encode(q: Any, x: torch.Tensor, rand: Sequence[int], out: torch.Tensor | None = None, *,
           blocks_per_program: int | None = None) -> torch.Tensor:
    """Encode ``x`` with quantizer ``q``; equivalent to the numba ``BlockQuantizer.encode``.

    Args:
        q: A :class:`~dynamiq.quantizers.BlockQuantizer`.
        x: float32 ``[n]``, contiguous, on a CUDA device (or the CPU under the interpreter).
        rand: ``q._rand(seed, rank, world_size, stream, index_offset)``.
        out: Optional uint8 ``[K]`` on ``x``'s device to write into.
        blocks_per_program: Override of the tile size (a power of two), for tests and tuning.

    Returns:
        The uint8 payload buffer ``[K]`` (``out`` when given), byte-identical to the
        Numba encode of the same arguments.
    """
    _check_tensor(x, "x", torch.float32, None)
    n = x.numel()
    if n == 0:
        raise ValueError("cannot quantize an empty tensor")
    _check_device(x.device)
    size = q._kernel_nbytes(n)
    if out is None:
        out = torch.empty(size, dtype=torch.uint8, device=x.device)
    _check_tensor(out, "out", torch.uint8, size, x.device)
    kw, block, nb = _spec_kwargs(q, blocks_per_program, n)
    spec = q._kernel_spec
    nblocks = -(-n // block)
    codes, scales, supers = _sections(q, out, n)
    _launch(blocks.encode_kernel, (_cdiv(nblocks, nb),), x.device, x, n, nblocks, codes,
            scales, supers, *_device_args(q, x.device), _rand_tensor(rand, x.device),
            SMODE=spec.smode, **kw)
    return out


def decode(q: Any, data: torch.Tensor, n: int, out: torch.Tensor | None = None,
           rand: Sequence[int] | None = None, *, accumulate: bool = False,
           blocks_per_program: int | None = None) -> torch.Tensor:
    """Decode a payload buffer; equivalent to the numba ``BlockQuantizer.decode``.

    Args:
        q: The quantizer that wrote ``data``.
        data: uint8 ``[K]`` payload buffer (CUDA, or CPU under the interpreter).
        n: Number of coordinates.
        out: Optional float32 ``[n]`` on ``data``'s device to write (or add) into.
        rand: The encoder's ``q._rand(...)`` (used by dithered quantizers only; default: the
            keys of ``q._rand(0, 0, 1, (), 0)``).
        accumulate: Add the decoded values to ``out`` (``out + value`` in float32).
        blocks_per_program: Override of the tile size (a power of two).

    Returns:
        float32 ``[n]`` (``out`` when given), bit-identical to the Numba decode.
    """
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    _check_tensor(data, "payload data", torch.uint8, q._kernel_nbytes(n))
    _check_device(data.device)
    if out is None:
        if accumulate:
            raise ValueError("accumulate=True needs an out tensor")
        out = torch.empty(n, dtype=torch.float32, device=data.device)
    _check_tensor(out, "out", torch.float32, n, data.device)
    kw, block, nb = _spec_kwargs(q, blocks_per_program, n)
    nblocks = -(-n // block)
    tables = _device_args(q, data.device)
    edec, sdec, udec, fconst = tables[2], tables[4], tables[6], tables[8]
    if rand is None:
        rand = q._rand(0, 0, 1, (), 0)
    _launch(blocks.decode_kernel, (_cdiv(nblocks, nb),), data.device, out, n, nblocks,
            *_sections(q, data, n), edec, sdec, udec, fconst, _rand_tensor(rand, data.device),
            ACCUMULATE=bool(accumulate), **kw)
    return out


def recompress(q: Any, data: torch.Tensor, acc: torch.Tensor, rand: Sequence[int],
               writeback: str = "none", out: torch.Tensor | None = None, *,
               irand: Sequence[int] | None = None,
               blocks_per_program: int | None = None) -> torch.Tensor:
    """Fused ``encode(acc + decode(data))``; equivalent to numba ``BlockQuantizer.recompress``.

    Args:
        q: The quantizer of the incoming payload (and of the outgoing one).
        data: Incoming uint8 payload buffer ``[K]``.
        acc: float32 ``[n]`` local contribution, on ``data``'s device; updated according to
            ``writeback``.
        rand: ``q._rand(seed, rank, world_size, stream, index_offset)``.
        writeback: ``"none"``, ``"sum"`` or ``"decoded"`` (see ``BlockQuantizer.recompress``).
        out: Optional uint8 ``[K]`` for the outgoing payload (must not be ``data``).
        irand: The incoming payload's encoder's ``rand`` (dithered quantizers; default
            ``rand``).
        blocks_per_program: Override of the tile size (a power of two).

    Returns:
        The outgoing uint8 payload buffer, byte-identical to the Numba recompress.
    """
    if writeback not in _WRITEBACK:
        raise ValueError(f"writeback must be one of {tuple(_WRITEBACK)}, got {writeback!r}")
    _check_tensor(acc, "acc", torch.float32, None)
    n = acc.numel()
    if n == 0:
        raise ValueError("acc must not be empty")
    _check_device(acc.device)
    size = q._kernel_nbytes(n)
    _check_tensor(data, "payload data", torch.uint8, size, acc.device)
    if out is None:
        out = torch.empty(size, dtype=torch.uint8, device=acc.device)
    _check_tensor(out, "out", torch.uint8, size, acc.device)
    if out.data_ptr() == data.data_ptr():
        raise ValueError("out must not be the incoming payload buffer")
    kw, block, nb = _spec_kwargs(q, blocks_per_program, n)
    spec = q._kernel_spec
    nblocks = -(-n // block)
    _launch(blocks.recompress_kernel, (_cdiv(nblocks, nb),), acc.device, acc, n, nblocks,
            *_sections(q, data, n), *_sections(q, out, n), *_device_args(q, acc.device),
            _rand_tensor(rand, acc.device), _rand_tensor(rand if irand is None else irand,
                                                         acc.device),
            SMODE=spec.smode, WRITEBACK=_WRITEBACK[writeback], **kw)
    return out


def _cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for positive ints (the grid size)."""
    return -(-a // b)
