"""Timing for the benchmarks, through :class:`torch.utils.benchmark.Timer`.

The timer runs the statement under a fixed thread count and synchronises CUDA around each block
when a GPU is in use, so one helper serves the Numba kernels on the CPU and the Triton kernels on
a GPU.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch.utils import benchmark

__all__ = ["best_time", "copy_bandwidth", "host_cpu"]

#: Shortest block worth timing: one short call is dominated by the timer's own overhead.
_MIN_BLOCK_S = 0.01


def best_time(fn: Callable[[], object], repeat: int = 5, warmup: int = 1) -> float:
    """Best mean time per call of ``fn()`` in seconds over ``repeat`` timed blocks.

    Each block runs ``fn`` enough times to last at least 10 ms (once for slow calls), so fast
    kernels are not timed below the clock's resolution; the best block is kept because noise
    on a shared machine only ever adds time.

    Args:
        fn: The work, with no arguments; its result is discarded.
        repeat: Timed blocks (at least 1).
        warmup: Untimed calls first (compilation, first-touch allocation).

    Returns:
        Seconds per call.
    """
    if repeat < 1 or warmup < 0:
        raise ValueError(f"repeat must be >= 1 and warmup >= 0, got {repeat}, {warmup}")
    for _ in range(warmup):
        fn()
    timer = benchmark.Timer(stmt="fn()", globals={"fn": fn},
                            num_threads=torch.get_num_threads())
    once = timer.timeit(1).mean
    number = max(1, math.ceil(_MIN_BLOCK_S / max(once, 1e-9)))
    best = once if number == 1 else float("inf")
    for _ in range(repeat - (number == 1)):
        best = min(best, timer.timeit(number).mean)
    return best


def copy_bandwidth(nbytes: int, repeat: int = 5) -> float:
    """Memory-copy bandwidth (bytes read + written per second) of a ``nbytes`` buffer copy.

    Uses :meth:`torch.Tensor.copy_`, which is multi-threaded like the kernels it is compared
    with; equivalent to ``2 * nbytes / best_time(lambda: dst.copy_(src))``.

    Args:
        nbytes: Size of the buffer (rounded down to whole float32 values).
        repeat: Timed blocks.

    Returns:
        Bytes per second.
    """
    src = torch.empty(max(1, nbytes // 4), dtype=torch.float32).fill_(1.0)
    dst = torch.empty_like(src)
    t = best_time(lambda: dst.copy_(src), repeat)
    return 2 * src.numel() * 4 / t


def host_cpu() -> str:
    """The host CPU as LLVM names it, with its widest vector instructions, e.g.
    ``"znver3 (AVX2)"``: the machine a CPU benchmark ran on (the Numba kernels compile for it,
    so the same code runs at other speeds on other CPUs)."""
    import llvmlite.binding as llvm

    features = llvm.get_host_cpu_features()
    isa = next((name for flag, name in (("avx512f", "AVX-512"), ("avx2", "AVX2"),
                                        ("sse4.2", "SSE4.2"), ("neon", "NEON"))
                if features.get(flag, False)), "no vector extension known here")
    return f"{llvm.get_host_cpu_name()} ({isa})"
