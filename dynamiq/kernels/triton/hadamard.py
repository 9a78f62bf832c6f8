"""Triton kernels of the blocked randomized Hadamard transform (RHT), bit-exact with Numba.

Same contract as :mod:`dynamiq.kernels.numba.hadamard` (read its docstring): per block of
``block`` elements, forward ``y = norm * FWHT(d * x)`` and inverse ``x = d * (norm * FWHT(y))``,
with ``d_i = -1`` when ``hash_u32(k0, k1, i) & 1`` for the global index ``i``.

1. The sign is an exact sign-bit flip (xor), never a multiply.
2. FWHT stage ``s`` (``h = 2**s``) pairs ``a = v[p]`` with ``b = v[p + h]`` (``p & h == 0``) and
   writes ``(a + b, a - b)``: the same pairs and float32 operations as Numba, stages in the same
   order (the order of pairs *within* a stage does not matter).
3. One float32 multiply by ``norm`` per element after the last stage.

Stages run in *passes* of up to ``log2(max_tile)`` consecutive stages, one pass per launch, each
program holding a ``[2**NS, CI]`` tile in registers: element
``p = (o * 2**NS + m) * 2**S0 + i`` sits at row ``m``, and stages ``S0 ... S0 + NS - 1`` act
along the rows only. The first pass (``S0 = 0``) covers whole sub-blocks of ``max_tile``
contiguous elements, so a block of up to ``max_tile`` elements is one launch; larger blocks (up to
``2**16``) take further passes over strided tiles instead of one huge register tile. A pass only
regroups independent pairs, so every element sees the same operations in the same order whatever
the pass split.

No multiply feeds an add, so FMA contraction cannot occur; launches pass ``enable_fp_fusion=False``
anyway. Additions, subtractions and the multiply are IEEE round-to-nearest on NVIDIA GPUs (no
flush to zero), so results are identical bits, NaN payloads aside (a NaN created on a GPU by
``inf - inf`` is ``0x7FFFFFFF``, on x86 ``0xFFC00000``).
"""

from __future__ import annotations

import numpy as np
import torch

from dynamiq.kernels.abi import MAX_HADAMARD_BLOCK, MIN_HADAMARD_BLOCK
from dynamiq.kernels.triton.common import check_device, on_device
from dynamiq.kernels.triton.jit.hadamard import rht_pass_kernel

__all__ = ["MAX_TILE", "rht_forward", "rht_inverse"]

#: Default largest tile (elements) a program holds; also the largest one-pass block.
MAX_TILE = 4096


def _passes(log: int, log_tile: int) -> list[tuple[int, int, int]]:
    """``(S0, NS, CI)`` of every pass for blocks of ``2**log`` and tiles of ``2**log_tile``."""
    out = []
    s0 = 0
    while s0 < log:
        ns = min(log - s0, log_tile) if s0 == 0 else min(log - s0, max(1, log_tile // 2))
        ci = min(1 << s0, 1 << max(0, log_tile - ns))
        out.append((s0, ns, ci))
        s0 += ns
    return out


def _launch(x: torch.Tensor, out: torch.Tensor, block: int, k0: int, k1: int, norm: float,
            inverse: bool, max_tile: int) -> None:
    if (not isinstance(block, int) or not MIN_HADAMARD_BLOCK <= block <= MAX_HADAMARD_BLOCK
            or block & (block - 1)):
        raise ValueError(f"block must be a power of two in [2, 65536], got {block!r}")
    if not isinstance(max_tile, int) or max_tile < 2 or max_tile & (max_tile - 1):
        raise ValueError(f"max_tile must be a power of two >= 2, got {max_tile!r}")
    for name, t in (("x", x), ("out", out)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype != torch.float32 or t.dim() != 1 or not t.is_contiguous():
            raise ValueError(f"{name} must be a contiguous 1-D float32 tensor")
    if x.numel() % block:
        raise ValueError("input length must be a multiple of block")
    if out.numel() != x.numel() or out.device != x.device:
        raise ValueError("out must have the input's length and device")
    check_device(x.device)
    n = x.numel()
    if n == 0:
        return
    key = torch.tensor([int(k0), int(k1)], dtype=torch.int64).to(x.device)
    passes = _passes(block.bit_length() - 1, max_tile.bit_length() - 1)
    norm32 = float(np.float32(norm))
    with on_device(x.device):
        for k, (s0, ns, ci) in enumerate(passes):
            tile = ci << ns
            grid = (n // tile,)
            rht_pass_kernel[grid](
                x if k == 0 else out, out, key, norm32, S0=s0, NS=ns, CI=ci, FIRST=k == 0,
                LAST=k == len(passes) - 1, INVERSE=inverse,
                num_warps=max(1, min(8, tile // 512)), enable_fp_fusion=False,
            )


def rht_forward(x: torch.Tensor, out: torch.Tensor, block: int, k0: int, k1: int,
                norm: float, *, max_tile: int = MAX_TILE) -> None:
    """Forward blocked RHT: ``out_blk = norm * (H @ (d_blk * x_blk))`` for every block.

    Equivalent (bit for bit) to numba ``rht_forward``.

    Args:
        x: float32 ``[m]``, contiguous, ``m`` a multiple of ``block``; CUDA (or CPU under the
            interpreter).
        out: float32 ``[m]`` on ``x``'s device; may be ``x`` itself, must not otherwise overlap.
        block: Block size, a power of two in ``[2, 2**16]``.
        k0, k1: RNG key of the sign diagonal (:meth:`RandomizedHadamard.key`).
        norm: ``rht_norm(block)`` (a float32 value).
        max_tile: Largest tile per program (a power of two); blocks above it take several
            passes. Does not change the result.
    """
    _launch(x, out, block, k0, k1, norm, False, max_tile)


def rht_inverse(y: torch.Tensor, out: torch.Tensor, block: int, k0: int, k1: int,
                norm: float, *, max_tile: int = MAX_TILE) -> None:
    """Inverse blocked RHT: ``out_blk = d_blk * (norm * (H @ y_blk))``; numba ``rht_inverse``.

    Args:
        y: float32 ``[m]``, contiguous, ``m`` a multiple of ``block``.
        out: float32 ``[m]`` on ``y``'s device; may be ``y`` itself.
        block, k0, k1, norm, max_tile: As for :func:`rht_forward`.
    """
    _launch(y, out, block, k0, k1, norm, True, max_tile)
