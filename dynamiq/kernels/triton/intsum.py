"""Launchers of the Triton integer-sum kernels (:mod:`dynamiq.kernels.triton.jit.intsum`);
each is equivalent, bit for bit, to :mod:`dynamiq.kernels.numba.intsum`."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from dynamiq.kernels.abi import LevelGrid, Writeback
from dynamiq.kernels.triton.common import (
    check_device,
    check_tensor,
    code_chunk,
    distinct,
    grid_for,
    launch,
    stream_in,
    stream_out,
    tile_for,
)
from dynamiq.kernels.triton.jit import intsum as kern

__all__ = ["intsum_decode", "intsum_encode", "intsum_recompress", "intsum_round"]


# ---- integer sums -------------------------------------------------------------------------------
def _int_args(step: float, bits: int, key: Sequence[int], offset: int, device: torch.device,
              shift_in: float = 0.0, shift_out: float = 0.0
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """``fconst = [step, shift_in, shift_out]`` (float32) and ``rand = [k0, k1, offset]``."""
    if not 2 <= bits <= 24:
        raise ValueError(f"bits must be in [2, 24], got {bits}")
    fconst = torch.from_numpy(np.asarray([step, shift_in, shift_out], dtype=np.float32)).to(device)
    rand = torch.tensor([int(key[0]), int(key[1]), int(offset)], dtype=torch.int64).to(device)
    return fconst, rand


def intsum_encode(x: torch.Tensor, step: float, bits: int, key: Sequence[int], offset: int,
                  out: torch.Tensor | None = None, shift: float = 0.0) -> torch.Tensor:
    """Packed ``bits``-bit offset-binary codes of ``SR(x / step + shift)``; numba
    ``intsum_encode``.

    Args:
        x: float32 ``[n]``. step: Grid step (a float32 value). bits: Code width (2–24).
        key: ``(k0, k1)`` of the rounding uniforms. offset: Global index of ``x[0]``.
        out: Optional uint8 ``[ceil(n * bits / 8)]``. shift: Grid shift (0 or 1/2).
    """
    check_tensor(x, "x", torch.float32, None)
    check_device(x.device)
    n = x.numel()
    fconst, rand = _int_args(step, bits, key, offset, x.device, shift_out=shift)
    out = stream_out(out, n, bits, x.device)
    tile = tile_for(n)
    launch(kern.intsum_encode_kernel, grid_for(n, tile), x.device, x, n, out.numel(), out, fconst,
            rand, BITS=bits, TILE=tile, **code_chunk(bits))
    return out


def intsum_decode(data: torch.Tensor, step: float, bits: int, out: torch.Tensor,
                  accumulate: bool = False, shift: float = 0.0) -> torch.Tensor:
    """``out (=|+=) (float32(w) - shift) * step``; numba ``intsum_decode``."""
    check_tensor(out, "out", torch.float32, None)
    check_device(out.device)
    n = out.numel()
    fconst, _ = _int_args(step, bits, (0, 0), 0, out.device, shift_in=shift)
    stream_in(data, n, bits, out.device, "message")
    tile = tile_for(n)
    launch(kern.intsum_decode_kernel, grid_for(n, tile), out.device, data, n, data.numel(), out,
            fconst, BITS=bits, ACCUMULATE=bool(accumulate), TILE=tile, **code_chunk(bits))
    return out


def intsum_recompress(data: torch.Tensor, acc: torch.Tensor, step: float, bits: int,
                      key: Sequence[int], offset: int, out: torch.Tensor | None = None,
                      writeback: str = "none", shift_in: float = 0.0, shift_out: float = 0.0
                      ) -> torch.Tensor:
    """Codes of ``acc + decode(data)``; numba ``intsum_recompress``."""
    wb = int(Writeback.parse(writeback))
    check_tensor(acc, "acc", torch.float32, None)
    check_device(acc.device)
    n = acc.numel()
    fconst, rand = _int_args(step, bits, key, offset, acc.device, shift_in, shift_out)
    stream_in(data, n, bits, acc.device, "message")
    out = stream_out(out, n, bits, acc.device)
    distinct(out, data)
    tile = tile_for(n)
    launch(kern.intsum_recompress_kernel, grid_for(n, tile), acc.device, data, acc, n,
            out.numel(), out, fconst, rand, BITS=bits, WRITEBACK=wb, TILE=tile, **code_chunk(bits))
    return out


def _grid_tables(grid: LevelGrid, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The level grid's cell tables on ``device`` (cached on the grid)."""
    key = ("triton", str(device))
    hit = grid.derived.get(key)
    if hit is None:
        hit = grid.derived[key] = (torch.from_numpy(grid.lower).to(device),
                                   torch.from_numpy(grid.upper).to(device))
    return hit


def intsum_round(x: torch.Tensor, step: float, grid: LevelGrid, key: Sequence[int], offset: int,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """THC's rounding of ``x`` onto ``grid``'s levels; numba ``round_levels``.

    Args:
        x: float32 ``[n]``. step: Grid step (a float32 value). grid: The level table.
        key: ``(k0, k1)`` of the rounding uniforms. offset: Global index of ``x[0]``.
        out: Optional float32 ``[n]`` (may be ``x``).
    """
    check_tensor(x, "x", torch.float32, None)
    check_device(x.device)
    n = x.numel()
    if out is None:
        out = torch.empty_like(x)
    check_tensor(out, "out", torch.float32, n, x.device)
    fconst, rand = _int_args(step, 2, key, offset, x.device)
    lower, upper = _grid_tables(grid, x.device)
    if n:
        tile = tile_for(n)
        launch(kern.intsum_round_kernel, grid_for(n, tile), x.device, x, n, out, lower, upper,
               grid.granularity, fconst, rand, TILE=tile)
    return out

