"""Triton device code of the blocked randomized Hadamard transform (launcher:
:mod:`dynamiq.kernels.triton.hadamard`, whose docstring states the contract and the passes)."""

from __future__ import annotations

import triton
import triton.language as tl

from dynamiq.kernels.triton.jit.elements import flip_sign
from dynamiq.kernels.triton.jit.rng import hash_u32

__all__ = ["fwht_rows", "rht_pass_kernel"]


@triton.jit
def fwht_rows(v, M: tl.constexpr, CI: tl.constexpr, NS: tl.constexpr):
    """Unnormalised Walsh–Hadamard transform along axis 0 of the float32 ``[M, CI]`` tile.

    ``M == 2**NS``. Local stage ``j`` views the rows as ``[M / 2h, 2, h]`` (``h = 2**j``), so the
    two halves of the middle axis are ``a = v[m]`` and ``b = v[m + h]``, and writes back
    ``(a + b, a - b)``; equivalent to numba ``fwht_block`` on every column.
    """
    for j in tl.static_range(NS):
        w = tl.reshape(v, (M // (2 << j), 2, 1 << j, CI))
        a, b = tl.split(tl.permute(w, (0, 2, 3, 1)))
        w = tl.permute(tl.join(a + b, a - b), (0, 3, 1, 2))
        v = tl.reshape(w, (M, CI))
    return v


@triton.jit
def rht_pass_kernel(src, dst, key, norm, S0: tl.constexpr, NS: tl.constexpr,
                    CI: tl.constexpr, FIRST: tl.constexpr, LAST: tl.constexpr,
                    INVERSE: tl.constexpr):
    """FWHT stages ``S0 .. S0 + NS - 1`` of every block, from ``src`` into ``dst``.

    ``FIRST`` applies the forward transform's sign flip on load; ``LAST`` multiplies by
    ``norm`` and applies the inverse transform's sign flip. ``key`` is int64 ``[k0, k1]``.
    ``dst`` may be ``src`` (each program reads its tile before writing it).
    """
    pid = tl.program_id(0).to(tl.int64)
    outer = pid // ((1 << S0) // CI)  # tiles of CI columns: 2**S0 // CI of them per row group
    i0 = (pid % ((1 << S0) // CI)) * CI
    m = tl.arange(0, 1 << NS)
    idx = (outer * (1 << NS) + m[:, None]) * (1 << S0) + i0 + tl.arange(0, CI)[None, :]
    v = tl.load(src + idx)
    if FIRST or LAST:
        k0 = tl.load(key + 0).to(tl.uint32)
        k1 = tl.load(key + 1).to(tl.uint32)
        neg = (hash_u32(k0, k1, idx) & 1) != 0
    if FIRST and not INVERSE:
        v = flip_sign(v, neg)
    v = fwht_rows(v, 1 << NS, CI, NS)
    if LAST:
        v = v * norm
        if INVERSE:
            v = flip_sign(v, neg)
    tl.store(dst + idx, v)
