"""The on-disk gradient cache: where it lives, and reading and writing one point's file.

Results are cached under :func:`cache_dir` as one ``.pt`` file per (workload configuration,
world size, seed, point), so benchmarks pay for training once per machine; the file names are
chosen by :meth:`~dynamiq.bench.workloads.base.Workload.cache_path`.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch

__all__ = ["CACHE_FORMAT", "cache_dir", "load_gradients", "save_gradients"]

#: Bumped whenever the meaning of a cached file changes, so stale caches are never read.
CACHE_FORMAT = 1


def cache_dir() -> Path:
    """Where gradients are cached: ``$DYNAMIQ_CACHE/gradients`` or ``~/.cache/dynamiq/gradients``.

    The directory is not created here; writers create it on demand.
    """
    root = os.environ.get("DYNAMIQ_CACHE")
    base = Path(root).expanduser() if root else Path.home() / ".cache" / "dynamiq"
    return base / "gradients"


def save_gradients(path: Path, grads: torch.Tensor) -> None:
    """Write one point's gradients to ``path``, creating its directory.

    Args:
        path: The point's cache file.
        grads: float32 ``[world_size, d]``.
    """
    _atomic_save({"format": CACHE_FORMAT, "grads": grads.contiguous()}, path)


def load_gradients(path: Path, world_size: int) -> torch.Tensor | None:
    """One point's gradients from ``path``, if the file holds a usable result.

    Args:
        path: The point's cache file.
        world_size: Rows the gradients must have.

    Returns:
        float32 ``[world_size, d]``, or ``None`` when the file is missing, unreadable, of
        another cache format or another shape (the point is then recomputed).
    """
    if not path.is_file():
        return None
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # a truncated or foreign file is recomputed, not trusted
        return None
    if not isinstance(obj, dict) or obj.get("format") != CACHE_FORMAT:
        return None
    g = obj.get("grads")
    if not isinstance(g, torch.Tensor) or g.dtype != torch.float32 or g.dim() != 2:
        return None
    if g.shape[0] != world_size:
        return None
    return g


def _atomic_save(obj: Any, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide a shared cache from other users
        os.replace(tmp, path)  # readers see the old file or the whole new one, never a part
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
