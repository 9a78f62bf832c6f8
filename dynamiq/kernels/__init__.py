"""Kernels: one interface (:mod:`~dynamiq.kernels.abi`, :mod:`~dynamiq.kernels.backend`), one
implementation per backend folder (``reference/``, ``numba/``, ``triton/``).

Importing this package imports no backend: they are discovered and imported on first use.
"""

from dynamiq.kernels.abi import (
    FLT_MAX,
    KIND_FP32,
    KIND_TABLE,
    ROUNDING,
    SCALE_ROUNDING,
    STAT_OPS,
    TILE,
    WIRE_DTYPES,
    BlockCode,
    BlockKeys,
    KernelSpec,
    LevelGrid,
    Purpose,
    RandKeys,
    Rounding,
    Selection,
    SharedScaleCode,
    Writeback,
    rht_norm,
)
from dynamiq.kernels.backend import (
    Backend,
    backend_for,
    backend_names,
    get_backend,
    register_backend,
    resolve_backend,
    unregister_backend,
)
from dynamiq.kernels.tables import FormatTables, bucket_lut, element_family, uniform_grid

__all__ = [
    "FLT_MAX",
    "KIND_FP32",
    "KIND_TABLE",
    "ROUNDING",
    "SCALE_ROUNDING",
    "STAT_OPS",
    "TILE",
    "WIRE_DTYPES",
    "Backend",
    "BlockCode",
    "BlockKeys",
    "FormatTables",
    "KernelSpec",
    "LevelGrid",
    "Purpose",
    "RandKeys",
    "Rounding",
    "Selection",
    "SharedScaleCode",
    "Writeback",
    "backend_for",
    "backend_names",
    "bucket_lut",
    "element_family",
    "get_backend",
    "register_backend",
    "resolve_backend",
    "rht_norm",
    "uniform_grid",
    "unregister_backend",
]
