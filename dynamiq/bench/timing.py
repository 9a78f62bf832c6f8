"""Timing helpers shared by the benchmarks."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

__all__ = ["best_time", "copy_bandwidth"]


def best_time(fn: Callable[[], object], repeat: int = 5, warmup: int = 1) -> float:
    """Best wall time of ``fn()`` in seconds over ``repeat`` runs, after ``warmup`` runs."""
    for _ in range(warmup):
        fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def copy_bandwidth(nbytes: int, repeat: int = 5) -> float:
    """Memory-copy bandwidth (bytes read + written per second) of a ``nbytes`` buffer copy.

    Uses ``torch.Tensor.copy_``, which is multi-threaded like the kernels it is compared with.
    """
    src = torch.empty(nbytes // 4, dtype=torch.float32).fill_(1.0)
    dst = torch.empty_like(src)
    t = best_time(lambda: dst.copy_(src), repeat)
    return 2 * src.numel() * 4 / t
