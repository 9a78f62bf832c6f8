"""Block statistics shared by every backend: zero-padded block views and the bound on how far
two backends' float64 block reductions may differ.
"""

from __future__ import annotations

import torch

from dynamiq.kernels.abi import STAT_OPS

__all__ = ["padded_blocks", "stats_tolerance"]


def padded_blocks(y: torch.Tensor, block: int) -> torch.Tensor:
    """``y`` (1-D) as ``[ceil(n / block), block]`` rows, zero-padded at the end; a view of
    ``y`` itself when ``block`` divides its length (no copy)."""
    n = y.numel()
    nb = -(-n // block)
    if nb * block == n:
        return y.view(nb, block)
    g = torch.zeros(nb * block, dtype=y.dtype, device=y.device)
    g[:n] = y
    return g.view(nb, block)


def stats_tolerance(op: str, block: int, y: torch.Tensor) -> torch.Tensor:
    """Bound on how far two backends' unrounded block statistics ``op`` may lie apart.

    Maxima are exact. Every float32 value and every square of one is exact in float64, so a
    sum of a block of ``m`` coordinates rounds only in its ``m - 1`` additions: in any order it
    lies within ``(m - 1) * 2**-53 * sum(|terms|)`` (first order) of the exact sum, and two
    orders within twice that. ``csumsq`` adds the rounding of each deviation ``x - mean`` and
    of its square (``3 * 2**-53`` relative per term) and the error ``δ <= 2**-53 * sum(|x|)``
    of the computed mean, which raises the sum by ``m * δ**2``.

    Args:
        op: One of :data:`~dynamiq.kernels.abi.STAT_OPS`.
        block: Coordinates per block.
        y: The float32 vector ``[n]`` the statistics were taken of.

    Returns:
        float64 ``[ceil(n / block)]`` on the CPU: 0 for maxima, ``2 * (m - 1) * 2**-53 *
        sum(|x|)`` for ``sum`` (``x**2`` for ``sumsq``), ``2 * ((m + 2) * 2**-53 *
        sum((x - mean)**2) + m * δ**2)`` for ``csumsq``, each enlarged by ``1e-6`` relative
        for second-order terms.
    """
    if op not in STAT_OPS:
        raise ValueError(f"block statistics are {STAT_OPS}, not {op!r}")
    g = padded_blocks(y.detach().to("cpu", torch.float64), block)
    u = 2.0**-53
    if op == "absmax":
        return torch.zeros(g.shape[0], dtype=torch.float64)
    if op == "csumsq":
        dev = ((g - g.mean(1, keepdim=True)) ** 2).sum(1)
        delta = u * g.abs().sum(1)
        return 2.0 * ((block + 2) * u * dev + block * delta * delta) * (1.0 + 1e-6)
    mag = g.abs().sum(1) if op == "sum" else (g * g).sum(1)
    return mag * (2.0 * (block - 1) * u * (1.0 + 1e-6))
