"""Which instructions of the host CPU the Numba block kernels may use.

The kernels take faster paths where the host has BMI2 (bit extract and deposit, for packing)
and AVX2 (a vector permute, for the levels of small tables), and portable paths elsewhere (an
ARM host, an old x86 one). Setting ``DYNAMIQ_PORTABLE_KERNELS=1`` makes a process take the
portable paths on any host, the same bits either way: that is how the tests check them on
a host that has the instructions. Generated kernels are cached apart for each choice.
"""

from __future__ import annotations

import os

import llvmlite.binding as llvm

__all__ = ["PORTABLE", "host_has"]

#: Whether ``$DYNAMIQ_PORTABLE_KERNELS`` asks for the portable paths only (read at import).
PORTABLE = os.environ.get("DYNAMIQ_PORTABLE_KERNELS", "").strip() not in ("", "0")


def host_has(feature: str) -> bool:
    """Whether the kernels may use the host CPU's ``feature`` (LLVM's name, e.g. ``"avx2"``):
    the host has it, and :data:`PORTABLE` is not set."""
    return not PORTABLE and bool(llvm.get_host_cpu_features().get(feature, False))
