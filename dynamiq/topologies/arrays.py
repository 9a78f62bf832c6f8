"""A schedule's transfers as arrays, one step at a time, for executors that batch a step.

A :class:`~dynamiq.topologies.Schedule` holds one record per transfer: ``2n(n − 1)`` of them
for a ring of ``n`` ranks, which at thousands of ranks is more than memory holds. An executor
that processes a whole step at once (:mod:`dynamiq.collectives.batched`) needs only each step's
senders, receivers and chunks as integer arrays, and the chunking; topologies with a closed
form (ring, butterfly) produce them directly, any other topology from its schedule.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import numpy as np

from dynamiq.topologies.schedule import Schedule

__all__ = ["Chunking", "StepArrays", "schedule_chunking", "schedule_step_arrays"]


class Chunking(NamedTuple):
    """How a schedule cuts the vector.

    Attributes:
        owners: int64 ``[chunks]``, the rank that ends the reduce phase with each chunk's sum.
        weights: Fraction of the vector in each chunk, in vector order
            (:attr:`Schedule.chunk_weights <dynamiq.topologies.Schedule.chunk_weights>`).
    """

    owners: np.ndarray
    weights: tuple[float, ...]


class StepArrays(NamedTuple):
    """The transfers of one phase of one step, in the schedule's canonical order (sender,
    then receiver, then chunk).

    Attributes:
        step: The step.
        phase: ``"reduce"`` or ``"gather"``.
        src, dst, chunk: int64 ``[transfers]``.
    """

    step: int
    phase: str
    src: np.ndarray
    dst: np.ndarray
    chunk: np.ndarray


def schedule_chunking(schedule: Schedule) -> Chunking:
    """The :class:`Chunking` of a built schedule."""
    return Chunking(np.asarray(schedule.owners, dtype=np.int64), schedule.chunk_weights)


def schedule_step_arrays(schedule: Schedule) -> Iterator[StepArrays]:
    """The transfers of a built schedule as :class:`StepArrays`, step by step (within a
    step, reduce transfers first)."""
    for step in range(schedule.steps()):
        ts = schedule.transfers_at(step)
        for phase in ("reduce", "gather"):
            sel = [t for t in ts if t.phase == phase]
            if sel:
                yield StepArrays(step, phase, *(np.array([getattr(t, f) for t in sel],
                                                         dtype=np.int64)
                                                for f in ("src", "dst", "chunk")))
