"""How torch writes a float32 NaN as a 16-bit wire value (BF16 or FP16), on each device.

The cast itself is the IEEE rounding to nearest even; only NaN differs between
implementations: some write one fixed pattern whatever the NaN (torch's CPU cast writes
``0xFFFF`` for BF16), others keep its sign and top payload bits, quietened. The kernels of each
backend that cast on their own take the rule probed here, so their bytes are torch's.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["nan_pattern"]

_nan16: dict[tuple[str, str], int] = {}


def _keep_rule(bits: np.ndarray, wire: str) -> np.ndarray:
    """The 16 bits a NaN keeps under "payload kept, quietened" for ``wire``."""
    if wire == "bf16":
        return ((bits >> 16) | 0x40).astype(np.int64)
    return (((bits >> 16) & 0x8000) | 0x7E00 | ((bits >> 13) & 0x3FF)).astype(np.int64)


def nan_pattern(device: torch.device, wire: str) -> int:
    """The 16 bits torch writes for a float32 NaN converted to ``wire`` (``"bf16"`` or
    ``"fp16"``) on ``device``: a constant, or ``-1`` when it keeps the NaN's sign and top
    payload bits (quietened). Probed once per device type and format."""
    key = (str(torch.device(device).type), wire)
    hit = _nan16.get(key)
    if hit is None:
        bits = np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0xFFBFFFFF, 0x7FFFFFFF,
                         0x7FA50000, 0xFFD40000, 0x7F81FFFF] * 4, dtype=np.uint32)
        x = torch.from_numpy(bits.view(np.float32)).to(device)
        dtype = torch.bfloat16 if wire == "bf16" else torch.float16
        got = x.to(dtype).view(torch.int16).cpu().numpy().astype(np.int64) & 0xFFFF
        if (got == got[0]).all():
            hit = int(got[0])
        elif (got == _keep_rule(bits, wire)).all():
            hit = -1
        else:
            raise RuntimeError(f"torch's float32 -> {wire} NaN conversion on {device} follows "
                               f"no known rule: {[hex(v) for v in got]}")
        _nan16[key] = hit
    return hit
