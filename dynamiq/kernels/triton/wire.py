"""Launchers of the Triton wire-value and row-permutation kernels
(:mod:`dynamiq.kernels.triton.jit.wire`); each is equivalent, bit for bit, to the torch
operations of :class:`dynamiq.kernels.backend.Backend`."""

from __future__ import annotations

import torch

from dynamiq.kernels.abi import Writeback
from dynamiq.kernels.nan16 import nan_pattern
from dynamiq.kernels.triton.common import (
    check_device,
    check_tensor,
    distinct,
    grid_for,
    interpreted,
    launch,
    tile_for,
)
from dynamiq.kernels.triton.jit import wire as kern

__all__ = ["bf16_nan_pattern", "block_positions", "gather_rows", "nan_pattern", "scatter_rows",
           "wire_decode", "wire_encode", "wire_recompress"]

#: Rows per program of the row permutation (rows of 256 coordinates).
ROWS = 4
ROWS_INTERPRETED = 64

# ---- wire values --------------------------------------------------------------------------------
_WIRES = {"fp32": (torch.float32, 4), "bf16": (torch.int16, 2), "fp16": (torch.int16, 2)}
#: The kernels' ``FMT`` of every wire format.
_FMT = {"fp32": 0, "bf16": 1, "fp16": 2}


def bf16_nan_pattern(device: torch.device) -> int:
    """:func:`nan_pattern` of BF16."""
    return nan_pattern(device, "bf16")


def _nan_arg(device: torch.device, wire: str) -> int:
    return 0 if wire == "fp32" else nan_pattern(device, wire)


def _wire_view(buf: torch.Tensor, count: int, wire: str, device: torch.device, name: str
               ) -> torch.Tensor:
    dtype, size = _WIRES[wire]
    check_tensor(buf, name, torch.uint8, size * count, device)
    return buf.view(dtype)


def _select_args(n: int, select: tuple[torch.Tensor, int] | None, block: int,
                 device: torch.device) -> tuple[torch.Tensor, int]:
    """The block-position table (a dummy when all travel) and the travelling count."""
    if select is None:
        return torch.empty(1, dtype=torch.int64, device=device), n
    table, count = select
    check_tensor(table, "select table", torch.int64, -(-n // block), device)
    return table, int(count)


def block_positions(selected: torch.Tensor, n: int, block: int, device: torch.device
                    ) -> tuple[torch.Tensor, int]:
    """The selection of the wire kernels for a chunk of ``n`` coordinates.

    Args:
        selected: bool ``[ceil(n / block)]``, the chunk's travelling blocks.
        n: Coordinates in the chunk.
        block: Coordinates per block.
        device: Where the kernels run.

    Returns:
        ``(table, count)``: int64 ``[blocks]`` on ``device``, the wire index of each selected
        block's first coordinate (``-1`` for blocks that do not travel), and the number of
        travelling coordinates.
    """
    sel = selected.to(torch.bool).cpu()
    nb = -(-n // block)
    if sel.numel() != nb:
        raise ValueError(f"selected has {sel.numel()} blocks, a chunk of {n} needs {nb}")
    ones = sel.to(torch.int64)
    start = (torch.cumsum(ones, 0) - ones) * block
    table = torch.where(sel, start, torch.full_like(start, -1))
    sizes = torch.full((nb,), block, dtype=torch.int64)
    if nb:
        sizes[-1] = n - (nb - 1) * block
    return table.to(device), int((sizes * ones).sum())


def wire_encode(x: torch.Tensor, wire: str, out: torch.Tensor | None = None,
                select: tuple[torch.Tensor, int] | None = None, block: int = 256) -> torch.Tensor:
    """``wire``-format (``"fp32"`` / ``"bf16"`` / ``"fp16"``) bytes of the travelling
    coordinates of ``x``.

    Equivalent to ``out.view(dtype).copy_(x[idx])`` (torch's conversion, round to nearest even;
    NaN as torch writes it on ``x``'s device).

    Args:
        x: float32 ``[n]``.
        wire: ``"fp32"``, ``"bf16"`` or ``"fp16"``.
        out: Optional uint8 buffer of the travelling count times 4 (fp32) or 2 (bf16, fp16)
            bytes.
        select: ``None`` (every coordinate travels) or what :func:`block_positions` returns.
        block: Coordinates per selection block.
    """
    check_tensor(x, "x", torch.float32, None)
    check_device(x.device)
    n = x.numel()
    bpos, count = _select_args(n, select, block, x.device)
    if out is None:
        out = torch.empty(count * _WIRES[wire][1], dtype=torch.uint8, device=x.device)
    w = _wire_view(out, count, wire, x.device, "out")
    if n:
        tile = tile_for(n)
        launch(kern.wire_encode_kernel, grid_for(n, tile), x.device, x, n, w, bpos,
                _nan_arg(x.device, wire), FMT=_FMT[wire], SELECT=select is not None,
                SB=block, TILE=tile)
    return out


def wire_decode(data: torch.Tensor, wire: str, out: torch.Tensor, accumulate: bool = False,
                select: tuple[torch.Tensor, int] | None = None, block: int = 256) -> torch.Tensor:
    """``out (=|+=)`` the values of ``data`` at the travelling coordinates (0 elsewhere)."""
    check_tensor(out, "out", torch.float32, None)
    check_device(out.device)
    n = out.numel()
    bpos, count = _select_args(n, select, block, out.device)
    w = _wire_view(data, count, wire, out.device, "message")
    if n:
        tile = tile_for(n)
        launch(kern.wire_decode_kernel, grid_for(n, tile), out.device, w, n, out, bpos,
                FMT=_FMT[wire], SELECT=select is not None, SB=block,
                ACCUMULATE=bool(accumulate), TILE=tile)
    return out


def wire_recompress(data: torch.Tensor, acc: torch.Tensor, wire: str,
                    out: torch.Tensor | None = None, writeback: str = "none",
                    select: tuple[torch.Tensor, int] | None = None, block: int = 256
                    ) -> torch.Tensor:
    """``cast(acc + value(data))`` at the travelling coordinates, in one pass.

    ``writeback``: ``"none"`` leaves ``acc``; ``"sum"`` stores ``acc + value`` (``acc + 0``
    where nothing travels); ``"decoded"`` the decoded outgoing values (0 where nothing travels).
    """
    wb = int(Writeback.parse(writeback))
    check_tensor(acc, "acc", torch.float32, None)
    check_device(acc.device)
    n = acc.numel()
    bpos, count = _select_args(n, select, block, acc.device)
    w_in = _wire_view(data, count, wire, acc.device, "message")
    if out is None:
        out = torch.empty(count * _WIRES[wire][1], dtype=torch.uint8, device=acc.device)
    w_out = _wire_view(out, count, wire, acc.device, "out")
    distinct(out, data)
    if n:
        tile = tile_for(n)
        launch(kern.wire_recompress_kernel, grid_for(n, tile), acc.device, w_in, acc, n, w_out,
                bpos, _nan_arg(acc.device, wire), FMT=_FMT[wire],
                SELECT=select is not None, SB=block, WRITEBACK=wb, TILE=tile)
    return out


# ---- row permutation ----------------------------------------------------------------------------
def _rows(order: torch.Tensor, row: int, device: torch.device) -> tuple[int, int]:
    check_tensor(order, "order", torch.int64, None, device)
    rows = order.numel()
    rpp = ROWS_INTERPRETED if interpreted() else ROWS
    rpp = max(1, min(rpp, 1 << max(0, rows - 1).bit_length()))
    if row < 1 or row & (row - 1):
        raise ValueError(f"row must be a power of two, got {row}")
    return rows, rpp


def gather_rows(x: torch.Tensor, order: torch.Tensor, row: int = 256,
                out: torch.Tensor | None = None) -> torch.Tensor:
    """Rows of ``row`` coordinates of ``x`` in the order ``order`` (zero-padded past ``n``).

    Equivalent to ``pad(x).view(-1, row).index_select(0, order).view(-1)``.

    Args:
        x: float32 ``[n]``.
        order: int64 distinct row indices (a permutation of the rows or a subset), on ``x``'s
            device.
        row: Coordinates per row (a power of two).
        out: Optional float32 ``[order.numel() * row]``.
    """
    check_tensor(x, "x", torch.float32, None)
    check_device(x.device)
    rows, rpp = _rows(order, row, x.device)
    if out is None:
        out = torch.empty(rows * row, dtype=torch.float32, device=x.device)
    check_tensor(out, "out", torch.float32, rows * row, x.device)
    if rows:
        launch(kern.gather_rows_kernel, (-(-rows // rpp),), x.device, x, x.numel(), order, rows,
                out, ROW=row, RPP=rpp)
    return out


def scatter_rows(g: torch.Tensor, order: torch.Tensor, out: torch.Tensor, add: bool = False,
                 row: int = 256) -> torch.Tensor:
    """Undo :func:`gather_rows` into ``out`` (``out + value`` in float32 when ``add``).

    Equivalent to ``out.view(-1, row).index_copy_(0, order, g.view(-1, row))`` (or
    ``index_add_``), keeping the first ``out.numel()`` coordinates.
    """
    check_tensor(out, "out", torch.float32, None)
    check_device(out.device)
    rows, rpp = _rows(order, row, out.device)
    check_tensor(g, "g", torch.float32, rows * row, out.device)
    if rows:
        launch(kern.scatter_rows_kernel, (-(-rows // rpp),), out.device, g, out.numel(), order,
                rows, out, ROW=row, RPP=rpp, ADD=bool(add))
    return out
