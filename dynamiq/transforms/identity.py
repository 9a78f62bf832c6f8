"""The identity transform: the vector as it is (a copy)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dynamiq.transforms.base import TRANSFORMS, Transform, _check_n, _check_step, _check_vector

__all__ = ["Identity"]


@TRANSFORMS.register("identity")
@dataclass(frozen=True)
class Identity(Transform):
    """The no-op transform: ``forward(x) == x`` and ``padded_length(n) == n``."""

    def padded_length(self, n: int) -> int:
        """Return ``n`` (no padding).

        Args:
            n: Input length, ``n >= 1``.

        Returns:
            ``n``.

        Raises:
            TypeError: ``n`` is not an integer.
            ValueError: ``n < 1``.
        """
        return _check_n(n)

    def forward(self, x: torch.Tensor, *, step: int = 0) -> torch.Tensor:
        """Return a copy of ``x``; equivalent to ``x.clone()``.

        Args:
            x: float32, shape ``(n,)``, contiguous, on the CPU, ``n >= 1``.
            step: Ignored (validated like the other transforms' ``step``).

        Returns:
            A new float32 tensor of shape ``(n,)`` equal to ``x``.

        Raises:
            TypeError: ``x`` is not a float32 tensor, or ``step`` is not an integer.
            ValueError: ``x`` is not 1-D, empty, non-contiguous or not on the CPU, or
                ``step < 0``.
        """
        _check_step(step)
        return _check_vector(x, "x").clone()

    def inverse(self, y: torch.Tensor, n: int, *, step: int = 0) -> torch.Tensor:
        """Return a copy of the first ``n`` coordinates; equivalent to ``y[:n].clone()``.

        Args:
            y: float32, shape ``(m,)`` with ``m >= n``, contiguous, on the CPU.
            n: Number of coordinates to keep, ``1 <= n <= m``.
            step: Ignored (validated).

        Returns:
            A new float32 tensor of shape ``(n,)``.

        Raises:
            TypeError: ``y`` is not a float32 tensor, or ``n``/``step`` is not an integer.
            ValueError: ``y`` is malformed (see :meth:`forward`), ``n < 1`` or ``n > m``.
        """
        _check_step(step)
        y = _check_vector(y, "y")
        n = _check_n(n)
        if y.numel() < n:
            raise ValueError(f"y has {y.numel()} elements, fewer than n={n}")
        return y[:n].clone()
