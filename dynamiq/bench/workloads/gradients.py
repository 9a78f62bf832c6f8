"""The :class:`GradientSet` record: one training point's per-worker gradients of a workload.

A *workload* produces the gradients that ``world_size`` data-parallel workers would all-reduce:
the same parameters on every worker, a different micro-batch per worker. Each point is one
:class:`GradientSet`, a ``[world_size, d]`` float32 matrix whose row ``r`` is worker ``r``'s
flattened gradient.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["GradientSet"]


@dataclass(frozen=True)
class GradientSet:
    """The per-worker gradients of one workload at one training point.

    Attributes:
        workload: Registered name of the workload that produced it.
        point: Training step at which the gradients were taken (before that step's update);
            for synthetic workloads, the index of the draw.
        grads: float32 ``[world_size, d]``; row ``r`` is worker ``r``'s flattened gradient.
    """

    workload: str
    point: int
    grads: torch.Tensor

    @property
    def world_size(self) -> int:
        """Number of workers (rows of :attr:`grads`)."""
        return int(self.grads.shape[0])

    @property
    def d(self) -> int:
        """Gradient length (number of trainable parameters)."""
        return int(self.grads.shape[1])
