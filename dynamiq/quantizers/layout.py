"""The wire layout of a block payload: a partial last block cut to the groups it touches.

The kernels read and write whole blocks (:meth:`~dynamiq.kernels.abi.BlockCode.layout`); on the
wire a vector whose length is not a multiple of the block keeps only the ``ceil(n / group)``
groups it touches (their codes and group scales) and one super-group scale per started
super-group, so a short vector does not pay for a whole block.
"""

from __future__ import annotations

import torch

from dynamiq.kernels import BlockCode

__all__ = ["compact", "expand", "wire_layout"]


def wire_layout(code: BlockCode, n: int) -> tuple[int, int, int]:
    """Bytes of the code, group-scale and super-scale sections on the wire for ``n``
    coordinates."""
    s = code.spec
    groups = -(-n // s.group)
    return groups * s.group * s.bits // 8, groups * s.sbytes, code.layout(n)[2]


def compact(code: BlockCode, padded: torch.Tensor, n: int, out: torch.Tensor | None = None
            ) -> torch.Tensor:
    """The wire bytes (into ``out`` when given) of a payload in the kernels' layout."""
    a, b, _ = code.layout(n)
    a2, b2, c = wire_layout(code, n)
    if out is None:
        out = torch.empty(a2 + b2 + c, dtype=torch.uint8, device=padded.device)
    out[:a2] = padded[:a2]
    out[a2:a2 + b2] = padded[a:a + b2]
    out[a2 + b2:] = padded[a + b:]
    return out


def expand(code: BlockCode, data: torch.Tensor, n: int) -> torch.Tensor:
    """The kernels' layout of wire bytes (``data`` itself when nothing was cut): untouched
    groups get zero codes and scales (their decoded values lie beyond ``n``, never read)."""
    a, b, c = code.layout(n)
    a2, b2, _ = wire_layout(code, n)
    if a2 == a and b2 == b:
        return data
    padded = torch.zeros(a + b + c, dtype=torch.uint8, device=data.device)
    padded[:a2] = data[:a2]
    padded[a:a + b2] = data[a2:a2 + b2]
    padded[a + b:] = data[a2 + b2:]
    return padded
