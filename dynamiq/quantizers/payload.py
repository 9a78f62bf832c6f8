"""The encoded form of a vector: one contiguous ``uint8`` buffer (what goes on the wire) plus
views into its sections."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

__all__ = ["Payload"]


@dataclass
class Payload:
    """The encoded form of a vector: one contiguous ``uint8`` buffer plus views into it.

    Attributes:
        quantizer: The quantizer that wrote it.
        n: Number of coordinates encoded (before padding).
        data: ``torch.uint8`` tensor of ``quantizer.nbytes(n)`` bytes: element codes, then group
            scale codes, then super-group scale codes. This buffer is what is sent on the wire.
    """

    quantizer: Any
    n: int
    data: torch.Tensor

    @property
    def nbytes(self) -> int:
        """Size of :attr:`data` in bytes."""
        return int(self.data.numel())

    @property
    def bits_per_coord(self) -> float:
        """Exact wire cost: ``8 * nbytes / n``."""
        return 8.0 * self.nbytes / self.n

    def sections(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """NumPy views ``(codes, scales, supers)`` of the buffer."""
        q = self.quantizer
        a, b, c = (q._section_sizes(self.n) if self.data.numel() == q._kernel_nbytes(self.n)
                   else q._wire_section_sizes(self.n))
        buf = self.data.numpy()
        return buf[:a], buf[a : a + b], buf[a + b : a + b + c]
