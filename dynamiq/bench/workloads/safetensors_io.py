"""A reader of the ``.safetensors`` container in plain numpy and torch (no ``safetensors``).

The format is an 8-byte little-endian header length, a JSON header of dtype / shape / data
offsets per tensor, then the raw little-endian data.
"""

from __future__ import annotations

import itertools
import json
import math
import struct
from pathlib import Path

import numpy as np
import torch

__all__ = ["read_safetensors"]

_ST_DTYPES: dict[str, tuple[str, torch.dtype]] = {
    "F64": ("<f8", torch.float64),
    "F32": ("<f4", torch.float32),
    "F16": ("<f2", torch.float16),
    "I64": ("<i8", torch.int64),
    "I32": ("<i4", torch.int32),
    "I16": ("<i2", torch.int16),
    "I8": ("i1", torch.int8),
    "U8": ("u1", torch.uint8),
    "BOOL": ("?", torch.bool),
}


def read_safetensors(path: str | Path) -> dict[str, torch.Tensor]:
    """Read every tensor of a ``.safetensors`` file.

    Supports the F64/F32/F16/BF16 and I64/I32/I16/I8/U8/BOOL dtypes; data is little-endian
    whatever the host's byte order.

    Args:
        path: The file.

    Returns:
        ``{name: tensor}`` in header order (``__metadata__`` excluded); tensors own their memory.

    Raises:
        ValueError: The file is malformed (bad header, offsets outside the data, overlaps).
    """
    raw = Path(path).read_bytes()
    if len(raw) < 8:
        raise ValueError(f"{path}: too short for a safetensors file")
    (n,) = struct.unpack("<Q", raw[:8])
    if 8 + n > len(raw):
        raise ValueError(f"{path}: header length {n} exceeds the file size")
    header = json.loads(raw[8 : 8 + n].decode("utf-8"))
    data = memoryview(raw)[8 + n :]
    out: dict[str, torch.Tensor] = {}
    spans = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype, shape = info["dtype"], [int(s) for s in info["shape"]]
        begin, end = (int(x) for x in info["data_offsets"])
        count = math.prod(shape)
        if not 0 <= begin <= end <= len(data):
            raise ValueError(f"{path}: {name} data [{begin}, {end}) outside the data section")
        spans.append((begin, end, name))
        if dtype == "BF16":
            # numpy has no bfloat16: widen the 16 bits into a float32's upper half.
            bits = np.frombuffer(data, dtype="<u2", count=count, offset=begin).astype(np.uint32)
            t = torch.from_numpy((bits << 16).view(np.float32).copy()).to(torch.bfloat16)
        elif dtype in _ST_DTYPES:
            np_dtype, torch_dtype = _ST_DTYPES[dtype]
            size = np.dtype(np_dtype).itemsize
            if end - begin != count * size:
                raise ValueError(f"{path}: {name} has {end - begin} bytes for {count} x {dtype}")
            arr = np.frombuffer(data, dtype=np_dtype, count=count, offset=begin)
            t = torch.from_numpy(arr.astype(np.dtype(np_dtype).newbyteorder("="), copy=True))
            assert t.dtype == torch_dtype
        else:
            raise ValueError(f"{path}: unsupported dtype {dtype!r} of {name}")
        out[name] = t.reshape(shape)
    spans.sort()
    for (_, e0, a), (b1, _, b) in itertools.pairwise(spans):
        if b1 < e0:
            raise ValueError(f"{path}: tensors {a} and {b} overlap")
    return out
