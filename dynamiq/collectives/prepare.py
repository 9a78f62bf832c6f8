"""The codecs' per-call decisions from the metadata phase, shared by every executor."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from dynamiq.pipeline import Pipeline

__all__ = ["prepare_codecs"]


def prepare_codecs(
    pipeline: Pipeline,
    stats: Mapping[str, torch.Tensor],
    length: int,
    world_size: int,
    states: dict,
    compression_factors: Callable[[], tuple[float, float]],
    hop_profile: Callable[[], tuple[tuple[int, float, float], ...]],
) -> tuple[dict[str, torch.Tensor], dict[Any, Any]]:
    """Adjust the global statistics by the pipeline's statistical transforms and let every
    codec decide (``prepare``).

    Args:
        pipeline: The pipeline.
        stats: Global statistics by name, as combined across ranks.
        length: Length of the (transformed) vector.
        world_size: Number of ranks.
        states: Per-tensor state the executor keeps between calls: codec → dict (created here
            when missing).
        compression_factors, hop_profile: The schedule's
            :meth:`~dynamiq.topologies.Schedule.compression_factors` and
            :meth:`~dynamiq.topologies.Schedule.hop_profile`, computed only for a codec that
            asks for them.

    Returns:
        ``(adjusted statistics, codec → prepared value)``.
    """
    adjusted = dict(stats)
    for t in pipeline.transforms:
        if getattr(t, "statistics", ()):
            adjusted = t.adjust_statistics(adjusted, world_size, length)
    prepared: dict[Any, Any] = {}
    for c in pipeline.codecs:
        # a codec whose decision models the error of the whole tree gets its shape
        kw: dict = {}
        if getattr(c, "wants_compression_factors", False):
            kw["compression_factors"] = compression_factors()
        if getattr(c, "wants_hop_profile", False):
            kw["hop_profile"] = hop_profile()
        prepared[c] = c.prepare(adjusted, length, world_size, states.setdefault(c, {}), **kw)
    return adjusted, prepared
