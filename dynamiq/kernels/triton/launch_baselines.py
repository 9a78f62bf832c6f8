"""Host-side launchers of :mod:`dynamiq.kernels.triton.baselines`: checks, tables, grid.

What the codecs call when their backend resolves to ``"triton"``; each function is equivalent,
bit for bit, to the CPU path of the same hop (the Numba kernels of
:mod:`dynamiq.kernels.numba.baselines`, or the torch operations of the passthrough / sparse
codecs and of DynamiQ's width reordering). Tensors live on a CUDA device, or on the CPU under
Triton's interpreter (``TRITON_INTERPRET=1`` before :mod:`dynamiq.kernels.triton` is imported).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

import numpy as np
import torch

from dynamiq.kernels.triton import baselines as kern
from dynamiq.kernels.triton.launch import _check_device, _check_tensor, _interpreted, _launch

__all__ = [
    "WRITEBACK",
    "bf16_nan_pattern",
    "block_positions",
    "device_tables",
    "gather_rows",
    "intsum_decode",
    "intsum_encode",
    "intsum_recompress",
    "scatter_rows",
    "shared_decode",
    "shared_encode",
    "shared_recompress",
    "wire_decode",
    "wire_encode",
    "wire_recompress",
]

#: ``writeback`` names → the kernels' ``WRITEBACK`` values.
WRITEBACK = {"none": 0, "sum": 1, "decoded": 2}
#: Coordinates per program (a power of two, multiple of 8); larger under the interpreter, where
#: fewer, larger programs run faster.
TILE = 1024
TILE_INTERPRETED = 4096
#: Rows per program of the row permutation (rows of 256 coordinates).
ROWS = 4
ROWS_INTERPRETED = 64

_tables: dict[tuple, tuple[torch.Tensor, ...]] = {}
_nan16: dict[str, int] = {}


def _tile(n: int) -> int:
    if _interpreted():
        return max(8, min(TILE_INTERPRETED, 1 << max(0, n - 1).bit_length()))
    return TILE


def _grid(n: int, tile: int) -> tuple[int]:
    return (max(1, -(-n // tile)),)


def _chunk(bits: int) -> dict[str, int]:
    g = math.gcd(bits, 8)
    return {"E": 8 // g, "L": bits // g}


def _writeback(writeback: str) -> int:
    if writeback not in WRITEBACK:
        raise ValueError(f"writeback must be one of {tuple(WRITEBACK)}, got {writeback!r}")
    return WRITEBACK[writeback]


def _stream(data: torch.Tensor, n: int, bits: int, device: torch.device, name: str
            ) -> torch.Tensor:
    return _check_tensor(data, name, torch.uint8, -(-n * bits // 8), device)


def _out_stream(out: torch.Tensor | None, n: int, bits: int, device: torch.device
                ) -> torch.Tensor:
    nbytes = -(-n * bits // 8)
    if out is None:
        return torch.empty(nbytes, dtype=torch.uint8, device=device)
    return _check_tensor(out, "out", torch.uint8, nbytes, device)


def device_tables(key: Hashable, arrays: Sequence[np.ndarray], ints: Sequence[int],
                  device: torch.device) -> tuple[torch.Tensor, ...]:
    """``arrays`` and an int64 tensor of ``ints`` on ``device``, cached per ``(key, device)``.

    Args:
        key: A hashable owner of the tables (e.g. the codec), constant for their lifetime.
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


# ---- shared scale -------------------------------------------------------------------------------
def _shared_args(x_or_acc: torch.Tensor, scales: torch.Tensor, block: int,
                 tables: Sequence[torch.Tensor]) -> int:
    n = x_or_acc.numel()
    _check_tensor(scales, "scales", torch.float32, -(-n // block), x_or_acc.device)
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
    _check_tensor(x, "x", torch.float32, None)
    _check_device(x.device)
    n = _shared_args(x, scales, block, tables)
    bits = mbits + 1
    out = _out_stream(out, n, bits, x.device)
    tab, lut, _, iconst = tables
    tile = _tile(n)
    _launch(kern.shared_encode_kernel, _grid(n, tile), x.device, x, n, out.numel(), scales, out,
            tab, lut, iconst, BLOCK=block, MBITS=mbits, TILE=tile, **_chunk(bits))
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
    _check_tensor(out, "out", torch.float32, None)
    _check_device(out.device)
    n = _shared_args(out, scales, block, tables)
    _stream(data, n, mbits + 1, out.device, "message")
    tile = _tile(n)
    _launch(kern.shared_decode_kernel, _grid(n, tile), out.device, data, n, data.numel(),
            scales, out, tables[2], BLOCK=block, MBITS=mbits, ACCUMULATE=bool(accumulate),
            TILE=tile, **_chunk(mbits + 1))
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
    wb = _writeback(writeback)
    _check_tensor(acc, "acc", torch.float32, None)
    _check_device(acc.device)
    n = _shared_args(acc, scales, block, tables)
    bits = mbits + 1
    _stream(data, n, bits, acc.device, "message")
    out = _out_stream(out, n, bits, acc.device)
    _distinct(out, data)
    tab, lut, dec, iconst = tables
    tile = _tile(n)
    _launch(kern.shared_recompress_kernel, _grid(n, tile), acc.device, data, acc, n, out.numel(),
            scales, out, tab, lut, dec, iconst, BLOCK=block, MBITS=mbits, WRITEBACK=wb,
            TILE=tile, **_chunk(bits))
    return out


def _distinct(out: torch.Tensor, data: torch.Tensor) -> None:
    if out.numel() and out.data_ptr() == data.data_ptr():
        raise ValueError("out must not be the incoming message buffer")


# ---- integer sums -------------------------------------------------------------------------------
def _int_args(step: float, bits: int, key: Sequence[int], offset: int, device: torch.device
              ) -> tuple[torch.Tensor, torch.Tensor]:
    if not 2 <= bits <= 24:
        raise ValueError(f"bits must be in [2, 24], got {bits}")
    fconst = torch.from_numpy(np.asarray([step], dtype=np.float32)).to(device)
    rand = torch.tensor([int(key[0]), int(key[1]), int(offset)], dtype=torch.int64).to(device)
    return fconst, rand


def intsum_encode(x: torch.Tensor, step: float, bits: int, key: Sequence[int], offset: int,
                  out: torch.Tensor | None = None) -> torch.Tensor:
    """Packed ``bits``-bit offset-binary codes of ``SR(x / step)``; numba ``intsum_encode``.

    Args:
        x: float32 ``[n]``. step: Grid step (a float32 value). bits: Code width (2–24).
        key: ``(k0, k1)`` of the rounding uniforms. offset: Global index of ``x[0]``.
        out: Optional uint8 ``[ceil(n * bits / 8)]``.
    """
    _check_tensor(x, "x", torch.float32, None)
    _check_device(x.device)
    n = x.numel()
    fconst, rand = _int_args(step, bits, key, offset, x.device)
    out = _out_stream(out, n, bits, x.device)
    tile = _tile(n)
    _launch(kern.intsum_encode_kernel, _grid(n, tile), x.device, x, n, out.numel(), out, fconst,
            rand, BITS=bits, TILE=tile, **_chunk(bits))
    return out


def intsum_decode(data: torch.Tensor, step: float, bits: int, out: torch.Tensor,
                  accumulate: bool = False) -> torch.Tensor:
    """``out (=|+=) float32(w) * step``; numba ``intsum_decode``."""
    _check_tensor(out, "out", torch.float32, None)
    _check_device(out.device)
    n = out.numel()
    fconst, _ = _int_args(step, bits, (0, 0), 0, out.device)
    _stream(data, n, bits, out.device, "message")
    tile = _tile(n)
    _launch(kern.intsum_decode_kernel, _grid(n, tile), out.device, data, n, data.numel(), out,
            fconst, BITS=bits, ACCUMULATE=bool(accumulate), TILE=tile, **_chunk(bits))
    return out


def intsum_recompress(data: torch.Tensor, acc: torch.Tensor, step: float, bits: int,
                      key: Sequence[int], offset: int, out: torch.Tensor | None = None,
                      writeback: str = "none") -> torch.Tensor:
    """Codes of ``acc + decode(data)``; numba ``intsum_recompress``."""
    wb = _writeback(writeback)
    _check_tensor(acc, "acc", torch.float32, None)
    _check_device(acc.device)
    n = acc.numel()
    fconst, rand = _int_args(step, bits, key, offset, acc.device)
    _stream(data, n, bits, acc.device, "message")
    out = _out_stream(out, n, bits, acc.device)
    _distinct(out, data)
    tile = _tile(n)
    _launch(kern.intsum_recompress_kernel, _grid(n, tile), acc.device, data, acc, n,
            out.numel(), out, fconst, rand, BITS=bits, WRITEBACK=wb, TILE=tile, **_chunk(bits))
    return out


# ---- wire values --------------------------------------------------------------------------------
_WIRES = {"fp32": (torch.float32, 4), "bf16": (torch.int16, 2)}


def bf16_nan_pattern(device: torch.device) -> int:
    """The BF16 bits torch writes for a float32 NaN on ``device``: a constant, or ``-1`` when it
    keeps the NaN's top half (quietened). Probed once per device type."""
    key = str(torch.device(device).type)
    hit = _nan16.get(key)
    if hit is None:
        bits = np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0xFFBFFFFF, 0x7FFFFFFF,
                         0x7FA50000, 0xFFD40000, 0x7F81FFFF] * 4, dtype=np.uint32)
        x = torch.from_numpy(bits.view(np.float32)).to(device)
        got = (x.to(torch.bfloat16).view(torch.int16).cpu().numpy().astype(np.int64) & 0xFFFF)
        keep = ((bits >> 16) | 0x40).astype(np.int64)
        if (got == got[0]).all():
            hit = int(got[0])
        elif (got == keep).all():
            hit = -1
        else:
            raise RuntimeError(f"torch's float32 -> bfloat16 NaN conversion on {device} follows "
                               f"no known rule: {[hex(v) for v in got]}")
        _nan16[key] = hit
    return hit


def _wire_view(buf: torch.Tensor, count: int, wire: str, device: torch.device, name: str
               ) -> torch.Tensor:
    dtype, size = _WIRES[wire]
    _check_tensor(buf, name, torch.uint8, size * count, device)
    return buf.view(dtype)


def _select_args(n: int, select: tuple[torch.Tensor, int] | None, block: int,
                 device: torch.device) -> tuple[torch.Tensor, int]:
    """The block-position table (a dummy when all travel) and the travelling count."""
    if select is None:
        return torch.empty(1, dtype=torch.int64, device=device), n
    table, count = select
    _check_tensor(table, "select table", torch.int64, -(-n // block), device)
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
    """``wire``-format (``"fp32"`` / ``"bf16"``) bytes of the travelling coordinates of ``x``.

    Equivalent to ``out.view(dtype).copy_(x[idx])`` (torch's conversion, round to nearest even;
    NaN as torch writes it on ``x``'s device).

    Args:
        x: float32 ``[n]``.
        wire: ``"fp32"`` or ``"bf16"``.
        out: Optional uint8 buffer of the travelling count times 4 (fp32) or 2 (bf16) bytes.
        select: ``None`` (every coordinate travels) or what :func:`block_positions` returns.
        block: Coordinates per selection block.
    """
    _check_tensor(x, "x", torch.float32, None)
    _check_device(x.device)
    n = x.numel()
    bpos, count = _select_args(n, select, block, x.device)
    if out is None:
        out = torch.empty(count * _WIRES[wire][1], dtype=torch.uint8, device=x.device)
    w = _wire_view(out, count, wire, x.device, "out")
    if n:
        tile = _tile(n)
        _launch(kern.wire_encode_kernel, _grid(n, tile), x.device, x, n, w, bpos,
                bf16_nan_pattern(x.device), BF16=wire == "bf16", SELECT=select is not None,
                SB=block, TILE=tile)
    return out


def wire_decode(data: torch.Tensor, wire: str, out: torch.Tensor, accumulate: bool = False,
                select: tuple[torch.Tensor, int] | None = None, block: int = 256) -> torch.Tensor:
    """``out (=|+=)`` the values of ``data`` at the travelling coordinates (0 elsewhere)."""
    _check_tensor(out, "out", torch.float32, None)
    _check_device(out.device)
    n = out.numel()
    bpos, count = _select_args(n, select, block, out.device)
    w = _wire_view(data, count, wire, out.device, "message")
    if n:
        tile = _tile(n)
        _launch(kern.wire_decode_kernel, _grid(n, tile), out.device, w, n, out, bpos,
                BF16=wire == "bf16", SELECT=select is not None, SB=block,
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
    wb = _writeback(writeback)
    _check_tensor(acc, "acc", torch.float32, None)
    _check_device(acc.device)
    n = acc.numel()
    bpos, count = _select_args(n, select, block, acc.device)
    w_in = _wire_view(data, count, wire, acc.device, "message")
    if out is None:
        out = torch.empty(count * _WIRES[wire][1], dtype=torch.uint8, device=acc.device)
    w_out = _wire_view(out, count, wire, acc.device, "out")
    _distinct(out, data)
    if n:
        tile = _tile(n)
        _launch(kern.wire_recompress_kernel, _grid(n, tile), acc.device, w_in, acc, n, w_out,
                bpos, bf16_nan_pattern(acc.device), BF16=wire == "bf16",
                SELECT=select is not None, SB=block, WRITEBACK=wb, TILE=tile)
    return out


# ---- row permutation ----------------------------------------------------------------------------
def _rows(order: torch.Tensor, row: int, device: torch.device) -> tuple[int, int]:
    _check_tensor(order, "order", torch.int64, None, device)
    rows = order.numel()
    rpp = ROWS_INTERPRETED if _interpreted() else ROWS
    rpp = max(1, min(rpp, 1 << max(0, rows - 1).bit_length()))
    if row < 1 or row & (row - 1):
        raise ValueError(f"row must be a power of two, got {row}")
    return rows, rpp


def gather_rows(x: torch.Tensor, order: torch.Tensor, row: int = 256,
                out: torch.Tensor | None = None) -> torch.Tensor:
    """Rows of ``row`` coordinates of ``x`` in the order ``order`` (zero-padded past ``n``).

    Equivalent to ``pad(x).view(-1, row).index_select(0, order).view(-1)``.

    Args:
        x: float32 ``[n]``, ``n <= order.numel() * row``.
        order: int64 permutation of the rows, on ``x``'s device.
        row: Coordinates per row (a power of two).
        out: Optional float32 ``[order.numel() * row]``.
    """
    _check_tensor(x, "x", torch.float32, None)
    _check_device(x.device)
    rows, rpp = _rows(order, row, x.device)
    if x.numel() > rows * row:
        raise ValueError(f"x has {x.numel()} coordinates, more than {rows} rows of {row}")
    if out is None:
        out = torch.empty(rows * row, dtype=torch.float32, device=x.device)
    _check_tensor(out, "out", torch.float32, rows * row, x.device)
    if rows:
        _launch(kern.gather_rows_kernel, (-(-rows // rpp),), x.device, x, x.numel(), order, rows,
                out, ROW=row, RPP=rpp)
    return out


def scatter_rows(g: torch.Tensor, order: torch.Tensor, out: torch.Tensor, add: bool = False,
                 row: int = 256) -> torch.Tensor:
    """Undo :func:`gather_rows` into ``out`` (``out + value`` in float32 when ``add``).

    Equivalent to ``out.view(-1, row).index_copy_(0, order, g.view(-1, row))`` (or
    ``index_add_``), keeping the first ``out.numel()`` coordinates.
    """
    _check_tensor(out, "out", torch.float32, None)
    _check_device(out.device)
    rows, rpp = _rows(order, row, out.device)
    _check_tensor(g, "g", torch.float32, rows * row, out.device)
    if out.numel() > rows * row:
        raise ValueError(f"out has {out.numel()} coordinates, more than {rows} rows of {row}")
    if rows:
        _launch(kern.scatter_rows_kernel, (-(-rows // rpp),), out.device, g, out.numel(), order,
                rows, out, ROW=row, RPP=rpp, ADD=bool(add))
    return out
