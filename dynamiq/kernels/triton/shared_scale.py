"""Launchers of the Triton shared-scale kernels (:mod:`dynamiq.kernels.triton.jit.shared_scale`);
each is equivalent, bit for bit, to :mod:`dynamiq.kernels.numba.shared_scale`."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dynamiq.kernels.abi import SharedScaleCode, Writeback
from dynamiq.kernels.triton.common import (
    check_device,
    check_tensor,
    code_chunk,
    device_tables,
    distinct,
    grid_for,
    launch,
    stream_in,
    stream_out,
    tile_for,
)
from dynamiq.kernels.triton.jit import shared_scale as kern

__all__ = ["shared_decode", "shared_encode", "shared_recompress", "tables_of"]


def tables_of(code: SharedScaleCode, device: torch.device) -> tuple[torch.Tensor, ...]:
    """``(tab, lut, dec, iconst)`` of ``code`` on ``device`` (cached), ``iconst`` holding
    ``[nfin, lshift, lkey0, len(lut), nan_code]``."""
    t = code.tables
    return device_tables(code, (t.search, t.lut, code.dec),
                         (t.nfin, t.lshift, t.lkey0, t.lut.size, code.nan_code), device)


# ---- shared scale -------------------------------------------------------------------------------
def _shared_args(x_or_acc: torch.Tensor, scales: torch.Tensor, block: int,
                 tables: Sequence[torch.Tensor]) -> int:
    n = x_or_acc.numel()
    check_tensor(scales, "scales", torch.float32, -(-n // block), x_or_acc.device)
    if len(tables) != 4:
        raise ValueError("tables must be (tab, lut, dec, iconst) from device_tables")
    return n


def shared_encode(x: torch.Tensor, scales: torch.Tensor, block: int, mbits: int,
                  tables: Sequence[torch.Tensor], out: torch.Tensor | None = None
                  ) -> torch.Tensor:
    """Packed shared-scale codes of ``x``; equivalent to numba ``shared_encode``.

    Args:
        x: float32 ``[n]`` (CUDA, or CPU under the interpreter).
        scales: float32 ``[ceil(n / block)]`` block scales on ``x``'s device.
        block: Coordinates per scale.
        mbits: Magnitude bits of the element format (codes are ``mbits + 1`` bits).
        tables: ``(tab, lut, dec, iconst)`` from :func:`device_tables`, ``iconst`` holding
            ``[nfin, lshift, lkey0, len(lut), nan_code]``.
        out: Optional uint8 ``[ceil(n * (mbits + 1) / 8)]``.

    Returns:
        The packed codes (``out`` when given), byte-identical to the Numba kernel.
    """
    check_tensor(x, "x", torch.float32, None)
    check_device(x.device)
    n = _shared_args(x, scales, block, tables)
    bits = mbits + 1
    out = stream_out(out, n, bits, x.device)
    tab, lut, _, iconst = tables
    tile = tile_for(n)
    launch(kern.shared_encode_kernel, grid_for(n, tile), x.device, x, n, out.numel(), scales, out,
            tab, lut, iconst, BLOCK=block, MBITS=mbits, TILE=tile, **code_chunk(bits))
    return out


def shared_decode(data: torch.Tensor, scales: torch.Tensor, block: int, mbits: int,
                  tables: Sequence[torch.Tensor], out: torch.Tensor,
                  accumulate: bool = False) -> torch.Tensor:
    """``out (=|+=) dec[code] * scale``; equivalent to numba ``shared_decode``.

    Args:
        data: uint8 packed codes of ``out.numel()`` coordinates.
        scales, block, mbits, tables: as in :func:`shared_encode`.
        out: float32 ``[n]`` to write (or add) into.
        accumulate: Add (``out + value`` in float32) instead of overwriting.
    """
    check_tensor(out, "out", torch.float32, None)
    check_device(out.device)
    n = _shared_args(out, scales, block, tables)
    stream_in(data, n, mbits + 1, out.device, "message")
    tile = tile_for(n)
    launch(kern.shared_decode_kernel, grid_for(n, tile), out.device, data, n, data.numel(),
            scales, out, tables[2], BLOCK=block, MBITS=mbits, ACCUMULATE=bool(accumulate),
            TILE=tile, **code_chunk(mbits + 1))
    return out


def shared_recompress(data: torch.Tensor, acc: torch.Tensor, scales: torch.Tensor, block: int,
                      mbits: int, tables: Sequence[torch.Tensor],
                      out: torch.Tensor | None = None, writeback: str = "none") -> torch.Tensor:
    """Codes of ``acc + decode(data)``; equivalent to numba ``shared_recompress``.

    Args:
        data: Incoming packed codes. acc: float32 ``[n]``, updated per ``writeback``.
        scales, block, mbits, tables: as in :func:`shared_encode`.
        out: Optional output buffer (not ``data``).
        writeback: ``"none"``, ``"sum"`` or ``"decoded"``.

    Returns:
        The outgoing packed codes.
    """
    wb = int(Writeback.parse(writeback))
    check_tensor(acc, "acc", torch.float32, None)
    check_device(acc.device)
    n = _shared_args(acc, scales, block, tables)
    bits = mbits + 1
    stream_in(data, n, bits, acc.device, "message")
    out = stream_out(out, n, bits, acc.device)
    distinct(out, data)
    tab, lut, dec, iconst = tables
    tile = tile_for(n)
    launch(kern.shared_recompress_kernel, grid_for(n, tile), acc.device, data, acc, n, out.numel(),
            scales, out, tab, lut, dec, iconst, BLOCK=block, MBITS=mbits, WRITEBACK=wb,
            TILE=tile, **code_chunk(bits))
    return out


