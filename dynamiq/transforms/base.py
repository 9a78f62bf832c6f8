"""The transform interface, its registry and the argument checks every transform shares.

A transform maps a 1-D float32 vector of length ``n`` to a (possibly zero-padded) vector of
length ``padded_length(n)``; see :mod:`dynamiq.transforms`.
"""

from __future__ import annotations

import operator

import torch

from dynamiq.kernels import resolve_backend
from dynamiq.registry import Registry

__all__ = ["TRANSFORMS", "Transform"]

TRANSFORMS: Registry[type] = Registry("transform")
"""Transform classes by name: ``"identity"`` → :class:`Identity`, ``"rht"`` →
:class:`RandomizedHadamard`."""

_U64 = 1 << 64


def _as_int(name: str, value: object) -> int:
    # bool is an int subclass, but block_size=True is always a mistake.
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an integer, got bool {value!r}")
    try:
        return operator.index(value)  # accepts numpy integers, rejects floats
    except TypeError:
        kind = type(value).__name__
        raise TypeError(f"{name} must be an integer, got {kind} {value!r}") from None


def _check_step(step: object) -> int:
    s = _as_int("step", step)
    # make_key only mixes the low 64 bits; larger steps would silently reuse rotations.
    if not 0 <= s < _U64:
        raise ValueError(f"step must be in [0, 2**64), got {s}")
    return s


def _check_n(n: object) -> int:
    m = _as_int("n", n)
    if m < 1:
        raise ValueError(f"n must be >= 1, got {m}")
    return m


def _check_vector(t: object, what: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.float32:
        raise TypeError(f"{what} must have dtype torch.float32, got {t.dtype}")
    resolve_backend("auto", t.device)  # a device no backend runs on fails here, clearly
    if t.dim() != 1:
        raise ValueError(f"{what} must be 1-D, got shape {tuple(t.shape)}")
    if t.numel() == 0:
        raise ValueError(f"{what} must not be empty")
    if not t.is_contiguous():
        raise ValueError(f"{what} must be contiguous (call .contiguous() first)")
    # The kernels work on the raw storage; autograd cannot follow them anyway.
    return t.detach()


class Transform:
    """Base class of transforms (concrete transforms are frozen dataclasses).

    A transform is a linear map ``T_step: R^n -> R^padded_length(n)`` with a left inverse, the
    same on every rank for the same configuration and ``step``. Subclasses implement
    :meth:`padded_length`, :meth:`forward` and :meth:`inverse`.
    """

    def padded_length(self, n: int) -> int:
        """Length of ``forward``'s output for an input of length ``n``.

        Args:
            n: Input length, ``n >= 1``.

        Returns:
            The output length (``>= n``).
        """
        raise NotImplementedError

    def forward(self, x: torch.Tensor, *, step: int = 0) -> torch.Tensor:
        """Apply the transform.

        Args:
            x: float32, shape ``(n,)``, contiguous, on the CPU, ``n >= 1``.
            step: Training step (``>= 0``); randomized transforms draw a fresh rotation per step.

        Returns:
            A new float32 tensor of shape ``(padded_length(n),)``.
        """
        raise NotImplementedError

    def inverse(self, y: torch.Tensor, n: int, *, step: int = 0) -> torch.Tensor:
        """Undo :meth:`forward` and keep the first ``n`` coordinates.

        Args:
            y: float32, shape ``(m,)`` with ``m >= padded_length(n)``, contiguous, on the CPU.
            n: Length of the original vector.
            step: The ``step`` that was passed to :meth:`forward`.

        Returns:
            A new float32 tensor of shape ``(n,)``.
        """
        raise NotImplementedError
