"""Data and comparisons shared by the DynamiQ codec's tests. "Equal" means bit for bit (float32
compared through ``view(int32)``)."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np
import torch

from dynamiq.codecs.dynamiq import DynamiQ
from dynamiq.metadata import SUPER_GROUP

SG = SUPER_GROUP


def bits_of(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(bits_of(a), bits_of(b))


def gradients(n: int, d: int, seed: int = 0, sigma: float = 1.0, rho: float = 0.5
              ) -> torch.Tensor:
    """Gradient-like float32 [n, d]: per-super-group log-normal scales (log-sd ``sigma``),
    entries partially correlated across ranks (correlation ``rho²``)."""
    g = torch.Generator().manual_seed(seed)
    scale = torch.exp(sigma * torch.randn(-(-d // SG), generator=g, dtype=torch.float64))
    scale = scale.repeat_interleave(SG)[:d]
    common = torch.randn(d, generator=g, dtype=torch.float64)
    own = torch.randn(n, d, generator=g, dtype=torch.float64)
    return (scale * (rho * common + math.sqrt(1 - rho * rho) * own)).float()


def by_super_group(n: int, d: int, scales: dict[int, float], seed: int = 0) -> torch.Tensor:
    """Gaussian float32 [n, d] with super-group ``j`` scaled by ``scales.get(j, 1)``."""
    g = torch.Generator().manual_seed(seed)
    s = torch.ones(-(-d // SG))
    for j, v in scales.items():
        s[j] = v
    return torch.randn(n, d, generator=g) * s.repeat_interleave(SG)[:d]


def segment_bytes(codec: DynamiQ, choice: np.ndarray, n: int) -> int:
    """Independent size of a chunk's message: a quantized super-group costs, per group of
    ``g`` coordinates it touches, ``g * w / 8`` code bytes and a UINT8 scale, plus its
    super-group scale (1 byte for E8M0, 2 for BF16; a partial super-group only pays for its
    groups); a BF16 super-group costs 2 bytes per real coordinate."""
    total = 0
    for j, w in enumerate(choice):
        coords = min(SG, n - j * SG)
        q = codec.quantizers[w]
        if q is None:
            total += 2 * coords
            continue
        g = q.group_size
        total += -(-coords // g) * (g * q.element.bits // 8 + 1) + q.super_scale.bits // 8
    return total


def run_with_fresh_kernel_cache(tmp_path, code: str) -> tuple[str, list[str]]:
    """Run ``code`` in a new Python process with empty kernel and Numba caches: its standard
    output, and the names of the files it wrote into the kernel cache."""
    kernels = tmp_path / "kernels"
    env = dict(os.environ, DYNAMIQ_KERNEL_CACHE=str(kernels),
               NUMBA_CACHE_DIR=str(tmp_path / "numba"))
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=300,
                         capture_output=True, text=True).stdout
    return out, sorted(p.name for p in kernels.rglob("*")) if kernels.exists() else []
