"""The blocked randomized Hadamard transform (RHT): every block's energy spread evenly over its
coordinates, which flattens outliers and makes low-bit quantization of the rotated vector far
more accurate. The kernels are the backends' ``rht_forward`` / ``rht_inverse``."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from dynamiq.kernels import backend_for, rht_norm
from dynamiq.kernels.abi import MAX_HADAMARD_BLOCK as MAX_BLOCK
from dynamiq.kernels.abi import MIN_HADAMARD_BLOCK as MIN_BLOCK
from dynamiq.rng import make_key
from dynamiq.transforms.base import (
    _U64,
    TRANSFORMS,
    Transform,
    _as_int,
    _check_n,
    _check_step,
    _check_vector,
)

__all__ = ["RHT_STREAM", "RandomizedHadamard"]

RHT_STREAM = 0x52485400
"""Purpose id (ASCII ``"RHT\\0"``) mixed into the RNG key of the Hadamard sign diagonal, so the
signs never coincide with random numbers drawn for another purpose under the same seed/step."""


@TRANSFORMS.register("rht")
@dataclass(frozen=True)
class RandomizedHadamard(Transform):
    """Blocked randomized Hadamard transform with a per-step random ±1 diagonal.

    The input is zero-padded to a multiple of ``B = block_size`` and every block of ``B``
    consecutive coordinates is rotated by the orthogonal matrix ``H_B @ diag(d_blk) / sqrt(B)``,
    where ``H_B`` is the Sylvester Hadamard matrix (``H_1 = [1]``,
    ``H_2k = [[H_k, H_k], [H_k, -H_k]]``) and ``d_i = +1`` if
    ``dynamiq.rng.hash_u32(k0, k1, i) & 1 == 0`` else ``-1`` for the global padded index ``i``,
    with ``(k0, k1) = make_key(seed, step, RHT_STREAM)``. All ranks share ``seed`` so they apply
    the same rotation at a given step, which makes the transform commute with summation across
    ranks. Arithmetic is float32 in the order fixed by :mod:`dynamiq.kernels.numba.hadamard`.

    Args:
        block_size: ``B``, a power of two in ``[2, 65536]``. Larger blocks spread outliers over
            more coordinates but pad short vectors more.
        seed: Non-negative integer below ``2**64``, the same on every rank.

    Raises:
        TypeError: ``block_size`` or ``seed`` is not an integer.
        ValueError: ``block_size`` is not a power of two in range, or ``seed`` is out of range.
    """

    block_size: int = 256
    seed: int = 0

    def __post_init__(self) -> None:
        b = _as_int("block_size", self.block_size)
        if not (MIN_BLOCK <= b <= MAX_BLOCK) or b & (b - 1):
            raise ValueError(
                f"block_size must be a power of two between {MIN_BLOCK} and {MAX_BLOCK}, got {b}"
            )
        s = _as_int("seed", self.seed)
        if not 0 <= s < _U64:
            raise ValueError(f"seed must be in [0, 2**64), got {s}")
        # Store plain ints so equality, hashing and repr do not depend on numpy scalar types.
        object.__setattr__(self, "block_size", b)
        object.__setattr__(self, "seed", s)

    def padded_length(self, n: int) -> int:
        """Round ``n`` up to a multiple of ``block_size``.

        Args:
            n: Input length, ``n >= 1``.

        Returns:
            ``ceil(n / block_size) * block_size``.

        Raises:
            TypeError: ``n`` is not an integer.
            ValueError: ``n < 1``.
        """
        n = _check_n(n)
        return -(-n // self.block_size) * self.block_size

    def key(self, *, step: int = 0) -> tuple[int, int]:
        """The RNG key of the sign diagonal at ``step``.

        Args:
            step: Training step, ``0 <= step < 2**64``.

        Returns:
            ``(k0, k1)``, equal to ``make_key(seed, step, RHT_STREAM)``; pass it to the kernels
            of any backend to reproduce this transform's signs.
        """
        return make_key(self.seed, _check_step(step), RHT_STREAM)

    def forward(self, x: torch.Tensor, *, step: int = 0, backend: str = "auto") -> torch.Tensor:
        """Zero-pad ``x`` to ``m = padded_length(n)`` and rotate every block.

        Equivalent, per block ``x_blk`` of the padded vector, to
        ``(H_B @ (d_blk * x_blk)) / sqrt(B)`` (see the class docstring), computed in float32.
        Non-finite inputs stay non-finite: a NaN or Inf makes its whole block's output
        non-finite and leaves other blocks untouched.

        Args:
            x: float32, shape ``(n,)``, contiguous, on the CPU, ``n >= 1``.
            step: Training step, ``0 <= step < 2**64``; each step uses a different diagonal.
            backend: ``"auto"`` (by ``x``'s device), ``"numba"`` (CPU) or ``"triton"`` (CUDA, or
                CPU under ``TRITON_INTERPRET=1``); both give the same bits.

        Returns:
            A new float32 tensor of shape ``(m,)`` on ``x``'s device. Its 2-norm equals ``x``'s
            up to rounding.

        Raises:
            TypeError: ``x`` is not a float32 tensor, or ``step`` is not an integer.
            ValueError: ``x`` is not 1-D, empty, non-contiguous or not on the CPU, or ``step``
                is out of range.
        """
        k0, k1 = self.key(step=step)
        x = _check_vector(x, "x")
        be = backend_for(backend, x)
        n = x.numel()
        out = torch.zeros(self.padded_length(n), dtype=torch.float32, device=x.device)
        out[:n] = x
        scales = None if self._fits(out) else self._range_scales(out)
        be.rht_forward(out, out, self.block_size, (k0, k1), rht_norm(self.block_size))
        return self._unscale(out, scales)

    def _fits(self, v: torch.Tensor) -> bool:
        """Whether no butterfly of any block of ``v`` can overflow float32 (one pass, no
        temporary): the unnormalised transform adds up to ``B`` values, so every magnitude
        below ``2**127 / B`` is safe. A non-finite value answers ``False``."""
        lo, hi = torch.aminmax(v)
        top = max(-float(lo), float(hi))
        return math.isfinite(top) and top < 2.0 ** (127 - (self.block_size.bit_length() - 1))

    def _range_scales(self, v: torch.Tensor) -> torch.Tensor | None:
        """Scale blocks whose butterflies would overflow float32; returns the factors to undo.

        A block whose largest finite magnitude exceeds ``2**127 / B`` would overflow
        mid-transform although its rotated values fit. Such a block is multiplied (in place)
        by the power of two that brings it below that bound, and the result by its inverse
        afterwards; both are exact, so the bits are those of an overflow-free float32
        evaluation. Only called when :meth:`_fits` says no. Returns ``None`` (no block needed
        it) or float32 ``[blocks, 1]`` factors.
        """
        b = self.block_size
        logb = b.bit_length() - 1
        rows = v.view(-1, b)
        a = torch.where(torch.isfinite(rows), rows.abs(), torch.zeros_like(rows)).amax(1)
        e = torch.frexp(a).exponent.to(torch.int64)  # a < 2**e
        shift = (e + logb - 127).clamp_min(0)
        if not bool((shift > 0).any()):
            return None
        rows.mul_(torch.ldexp(torch.ones_like(a), -shift)[:, None])
        return torch.ldexp(torch.ones_like(a), shift)[:, None]

    def _unscale(self, out: torch.Tensor, scales: torch.Tensor | None) -> torch.Tensor:
        if scales is not None:
            out.view(-1, self.block_size).mul_(scales)
        return out

    def inverse(
        self, y: torch.Tensor, n: int, *, step: int = 0, backend: str = "auto"
    ) -> torch.Tensor:
        """Undo :meth:`forward` and return the first ``n`` coordinates.

        Equivalent, per block ``y_blk``, to ``d_blk * (H_B @ y_blk) / sqrt(B)``, followed by
        ``[:n]``. Only the blocks that cover the first ``n`` coordinates are transformed.

        Args:
            y: float32, shape ``(m,)``, contiguous, on the CPU, with ``m`` a multiple of
                ``block_size`` and ``m >= n`` (normally ``m == padded_length(n)``).
            n: Length of the original vector, ``n >= 1``.
            step: The ``step`` passed to :meth:`forward`.
            backend: ``"auto"`` (by ``y``'s device), ``"numba"`` or ``"triton"`` (same bits).

        Returns:
            A new float32 tensor of shape ``(n,)`` on ``y``'s device.

        Raises:
            TypeError: ``y`` is not a float32 tensor, or ``n``/``step`` is not an integer.
            ValueError: ``y`` is malformed (see :meth:`forward`), its length is not a multiple
                of ``block_size`` or is less than ``n``, ``n < 1``, or ``step`` is out of range.
        """
        k0, k1 = self.key(step=step)
        y = _check_vector(y, "y")
        be = backend_for(backend, y)
        n = _check_n(n)
        m = y.numel()
        if m % self.block_size:
            raise ValueError(
                f"y has {m} elements, not a multiple of block_size={self.block_size}; "
                "pass the tensor returned by forward()"
            )
        if m < n:
            raise ValueError(f"y has {m} elements, fewer than n={n}")
        used = self.padded_length(n)
        out = torch.empty(used, dtype=torch.float32, device=y.device)
        src = y[:used]
        scales = None
        if not self._fits(src):
            src = src.clone()  # scaled in place: never the caller's tensor
            scales = self._range_scales(src)
        be.rht_inverse(src, out, self.block_size, (k0, k1), rht_norm(self.block_size))
        # the scale factors are powers of two and the sign flip is exact: they commute
        out = self._unscale(out, scales)
        return out if used == n else out[:n].clone()
