"""Host-side launchers of the Triton block kernels: argument checks, allocation, grid.

Each function is equivalent, bit for bit, to the Numba kernel of the same operation (see
:mod:`dynamiq.kernels.triton.jit.elements` for the arithmetic contract). Payload buffers here are
in the kernels' layout of ``K = code.nbytes(n)`` bytes (a partial last block padded to whole);
``BlockQuantizer`` cuts them to the wire layout.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from dynamiq.kernels.abi import TILE, TILE_INTERPRETED, BlockCode, KernelSpec, Writeback
from dynamiq.kernels.triton.common import (
    cdiv,
    check_device,
    check_tensor,
    device_tables,
    interpreted,
    launch,
)
from dynamiq.kernels.triton.jit import blocks

__all__ = ["decode", "encode", "kernel_geometry", "recompress"]


def kernel_geometry(spec: KernelSpec, blocks_per_program: int | None = None,
                    nblocks: int | None = None) -> dict[str, int]:
    """Compile-time tile parameters of a quantizer's kernels.

    Args:
        spec: The quantizer's :class:`~dynamiq.kernels.abi.KernelSpec`.
        blocks_per_program: Blocks per program (a power of two); default ``TILE // block``
            (under the interpreter ``TILE_INTERPRETED // block``, capped by ``nblocks``).
        nblocks: Blocks in the data (only used to cap the interpreter's tile).

    Returns:
        ``GPB`` (groups per block), ``NB`` (blocks per program), and the code packing chunk:
        ``E`` codes of ``bits`` bits fill exactly ``L`` bytes (``E = 8 / gcd(bits, 8)``).
    """
    if blocks_per_program is not None:
        nb = blocks_per_program
    elif interpreted():
        nb = max(1, TILE_INTERPRETED // spec.block)
        if nblocks:
            nb = min(nb, 1 << (nblocks - 1).bit_length())
    else:
        nb = max(1, TILE // spec.block)
    if nb < 1 or nb & (nb - 1):
        raise ValueError(f"blocks_per_program must be a power of two, got {nb}")
    g = math.gcd(spec.bits, 8)
    return {"GPB": spec.block // spec.group, "NB": nb, "E": 8 // g, "L": spec.bits // g}


def _device_args(code: BlockCode, device: torch.device) -> tuple[torch.Tensor, ...]:
    """The code's tables and constants as tensors on ``device`` (cached per code and device):
    ``etab, lut, edec, stab, sdec, utab, udec, iconst, fconst``."""
    e, s, u = code.elem, code.scale, code.sup
    tables = device_tables(
        code, (e.search, e.lut, e.dec, s.search, s.dec, u.search, u.dec),
        (s.nfin, s.logp, s.nan, u.nfin, u.logp, u.nan, e.nfin, e.lshift, e.lkey0, len(e.lut)),
        device)
    fkey = (code, "fconst")
    fconst = device_tables(fkey, (np.asarray([code.divisor, code.kappa], np.float32),), (),
                           device)[0]
    return (*tables, fconst)


def _rand_tensor(rand: Sequence[int], device: torch.device) -> torch.Tensor:
    if len(rand) != 9:
        raise ValueError("rand must be (k0, k1, p0, p1, q0, q1, rank, world, offset)")
    return torch.tensor([int(v) for v in rand], dtype=torch.int64).to(device)


def _spec_kwargs(code: BlockCode, blocks_per_program: int | None,
                 n: int) -> tuple[dict[str, int], int, int]:
    spec = code.spec
    geo = kernel_geometry(spec, blocks_per_program, -(-n // spec.block))
    kw = {
        "BITS": spec.bits, "MBITS": spec.mbits, "GROUP": spec.group, "GPB": geo["GPB"],
        "HIER": bool(spec.hier), "SKIND": spec.skind, "SBYTES": spec.sbytes,
        "UKIND": spec.ukind, "UBYTES": spec.ubytes, "NB": geo["NB"], "E": geo["E"],
        "L": geo["L"], "DITHER": bool(spec.dither), "EMODE": spec.emode,
        "MIDRISE": bool(spec.midrise),
    }
    return kw, spec.block, geo["NB"]


def _sections(code: BlockCode, data: torch.Tensor, n: int) -> tuple[torch.Tensor, ...]:
    a, b, c = code.layout(n)
    supers = data[a + b : a + b + c] if c else data  # never read or written when flat
    return data[:a], data[a : a + b], supers


def encode(code: BlockCode, x: torch.Tensor, rand: Sequence[int],
           out: torch.Tensor | None = None, *,
           blocks_per_program: int | None = None) -> torch.Tensor:
    """Encode ``x`` with the quantizer ``code`` describes; equivalent to the Numba kernel.

    Args:
        code: The quantizer's kernel view (``BlockQuantizer._code``).
        x: float32 ``[n]``, contiguous, on a CUDA device (or the CPU under the interpreter).
        rand: The :class:`~dynamiq.kernels.abi.RandKeys` of the call.
        out: Optional uint8 ``[K]`` on ``x``'s device to write into.
        blocks_per_program: Override of the tile size (a power of two), for tests and tuning.

    Returns:
        The uint8 payload buffer ``[K]`` (``out`` when given), byte-identical to the
        Numba encode of the same arguments.
    """
    check_tensor(x, "x", torch.float32, None)
    n = x.numel()
    if n == 0:
        raise ValueError("cannot quantize an empty tensor")
    check_device(x.device)
    size = code.nbytes(n)
    if out is None:
        out = torch.empty(size, dtype=torch.uint8, device=x.device)
    check_tensor(out, "out", torch.uint8, size, x.device)
    kw, block, nb = _spec_kwargs(code, blocks_per_program, n)
    spec = code.spec
    nblocks = -(-n // block)
    codes, scales, supers = _sections(code, out, n)
    launch(blocks.encode_kernel, (cdiv(nblocks, nb),), x.device, x, n, nblocks, codes,
            scales, supers, *_device_args(code, x.device), _rand_tensor(rand, x.device),
            SMODE=spec.smode, **kw)
    return out


def decode(code: BlockCode, data: torch.Tensor, n: int, rand: Sequence[int],
           out: torch.Tensor | None = None, *, accumulate: bool = False,
           blocks_per_program: int | None = None) -> torch.Tensor:
    """Decode a payload buffer; equivalent to the numba ``BlockQuantizer.decode``.

    Args:
        code: The kernel view of the quantizer that wrote ``data``.
        data: uint8 ``[K]`` payload buffer (CUDA, or CPU under the interpreter).
        n: Number of coordinates.
        out: Optional float32 ``[n]`` on ``data``'s device to write (or add) into.
        rand: The encoder's :class:`~dynamiq.kernels.abi.RandKeys` (dithered codes only).
        accumulate: Add the decoded values to ``out`` (``out + value`` in float32).
        blocks_per_program: Override of the tile size (a power of two).

    Returns:
        float32 ``[n]`` (``out`` when given), bit-identical to the Numba decode.
    """
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    check_tensor(data, "payload data", torch.uint8, code.nbytes(n))
    check_device(data.device)
    if out is None:
        if accumulate:
            raise ValueError("accumulate=True needs an out tensor")
        out = torch.empty(n, dtype=torch.float32, device=data.device)
    check_tensor(out, "out", torch.float32, n, data.device)
    kw, block, nb = _spec_kwargs(code, blocks_per_program, n)
    nblocks = -(-n // block)
    tables = _device_args(code, data.device)
    edec, sdec, udec, fconst = tables[2], tables[4], tables[6], tables[8]
    launch(blocks.decode_kernel, (cdiv(nblocks, nb),), data.device, out, n, nblocks,
            *_sections(code, data, n), edec, sdec, udec, fconst, _rand_tensor(rand, data.device),
            ACCUMULATE=bool(accumulate), **kw)
    return out


def recompress(code: BlockCode, data: torch.Tensor, acc: torch.Tensor, rand: Sequence[int],
               writeback: str = "none", out: torch.Tensor | None = None, *,
               irand: Sequence[int] | None = None,
               blocks_per_program: int | None = None) -> torch.Tensor:
    """Fused ``encode(acc + decode(data))``; equivalent to numba ``BlockQuantizer.recompress``.

    Args:
        code: The kernel view of the incoming payload's quantizer (and the outgoing one's).
        data: Incoming uint8 payload buffer ``[K]``.
        acc: float32 ``[n]`` local contribution, on ``data``'s device; updated according to
            ``writeback``.
        rand: The :class:`~dynamiq.kernels.abi.RandKeys` of the call.
        writeback: ``"none"``, ``"sum"`` or ``"decoded"`` (see ``BlockQuantizer.recompress``).
        out: Optional uint8 ``[K]`` for the outgoing payload (must not be ``data``).
        irand: The incoming payload's encoder's ``rand`` (dithered quantizers; default
            ``rand``).
        blocks_per_program: Override of the tile size (a power of two).

    Returns:
        The outgoing uint8 payload buffer, byte-identical to the Numba recompress.
    """
    wb = Writeback.parse(writeback)
    check_tensor(acc, "acc", torch.float32, None)
    n = acc.numel()
    if n == 0:
        raise ValueError("acc must not be empty")
    check_device(acc.device)
    size = code.nbytes(n)
    check_tensor(data, "payload data", torch.uint8, size, acc.device)
    if out is None:
        out = torch.empty(size, dtype=torch.uint8, device=acc.device)
    check_tensor(out, "out", torch.uint8, size, acc.device)
    if out.data_ptr() == data.data_ptr():
        raise ValueError("out must not be the incoming payload buffer")
    kw, block, nb = _spec_kwargs(code, blocks_per_program, n)
    spec = code.spec
    nblocks = -(-n // block)
    launch(blocks.recompress_kernel, (cdiv(nblocks, nb),), acc.device, acc, n, nblocks,
            *_sections(code, data, n), *_sections(code, out, n), *_device_args(code, acc.device),
            _rand_tensor(rand, acc.device), _rand_tensor(rand if irand is None else irand,
                                                         acc.device),
            SMODE=spec.smode, WRITEBACK=int(wb), **kw)
    return out
