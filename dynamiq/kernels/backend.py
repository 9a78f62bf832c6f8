"""Choice of compute backend for the kernels: Numba on CPU tensors, Triton on CUDA tensors.

``"auto"`` picks by the tensor's device: ``"triton"`` for CUDA tensors, ``"numba"`` for CPU
tensors. ``"triton"`` may also be asked for explicitly on CPU tensors when Triton's interpreter is
switched on (``TRITON_INTERPRET=1``, set before :mod:`dynamiq.kernels.triton` is imported): that
is how the Triton kernels are tested on machines without a GPU.

This module never imports :mod:`triton` itself (it only asks whether it is installed), so that
``import dynamiq`` stays free of it; the Triton kernels are imported on first use.
"""

from __future__ import annotations

import importlib.util
import os

import torch

__all__ = ["BACKENDS", "TRITON_MISSING", "interpreting", "resolve_backend", "triton_available"]

#: Accepted values of every ``backend=`` keyword.
BACKENDS = ("auto", "numba", "triton")

#: The message raised (as :class:`ImportError`) when the Triton backend is wanted but missing.
TRITON_MISSING = "backend='triton' needs the triton package: pip install 'dynamiq[triton]'"


def triton_available() -> bool:
    """Whether the :mod:`triton` package can be imported (checked without importing it)."""
    try:
        return importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):  # a broken or stubbed-out module entry
        return False


def interpreting() -> bool:
    """Whether Triton's interpreter is requested (``TRITON_INTERPRET`` set to a true value)."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on", "yes")


def resolve_backend(backend: str, device: torch.device | str) -> str:
    """The concrete backend (``"numba"`` or ``"triton"``) that runs on tensors of ``device``.

    Args:
        backend: One of :data:`BACKENDS`.
        device: The device of the tensors the kernels will read and write.

    Returns:
        ``"numba"`` or ``"triton"``.

    Raises:
        ValueError: ``backend`` is not one of :data:`BACKENDS`; ``"numba"`` was asked for with a
            non-CPU tensor; ``"triton"`` was asked for with a CPU tensor while the Triton
            interpreter is off; or the device type has no backend at all.
        ImportError: Triton is needed (``"triton"``, or ``"auto"`` with a CUDA tensor) but not
            installed; the message is :data:`TRITON_MISSING`.
    """
    if (backend == "auto" or backend == "numba") and isinstance(device, torch.device) \
            and device.type == "cpu":
        return "numba"  # the common case, asked once per hop: no further checks needed
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    dev = torch.device(device)
    if backend == "auto":
        if dev.type == "cpu":
            return "numba"
        if dev.type != "cuda":
            raise ValueError(
                f"no backend runs on {dev.type!r} tensors: use CPU tensors (numba) or CUDA "
                "tensors (triton)"
            )
        backend = "triton"
    if backend == "numba":
        if dev.type != "cpu":
            raise ValueError(
                f"backend='numba' runs on CPU tensors only, got a tensor on {dev}; use "
                "backend='triton' (or 'auto') for CUDA tensors, or move the tensor to the CPU"
            )
        return "numba"
    if not triton_available():
        raise ImportError(TRITON_MISSING)
    if dev.type == "cuda":
        return "triton"
    if dev.type == "cpu":
        if interpreting():
            return "triton"
        raise ValueError(
            "backend='triton' on a CPU tensor needs Triton's interpreter: set TRITON_INTERPRET=1 "
            "before dynamiq.kernels.triton is imported (slow; meant for tests), or use a CUDA "
            "tensor, or backend='numba'"
        )
    raise ValueError(f"backend='triton' needs CUDA tensors, got a tensor on {dev}")
