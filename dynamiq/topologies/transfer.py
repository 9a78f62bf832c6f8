"""One timed transfer of a schedule, the phases of an all-reduce and the schedule error."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PHASES", "ScheduleError", "Transfer"]

#: The two phases of an all-reduce, in execution order.
PHASES: tuple[str, ...] = ("reduce", "gather")
_PHASE_ORDER = {p: i for i, p in enumerate(PHASES)}


class ScheduleError(ValueError):
    """Raised when a schedule is malformed; the message names the chunk, ranks and step at fault."""


@dataclass(frozen=True)
class Transfer:
    """One chunk moving over one link at one step.

    Args:
        step: The time step (0-based) at which the transfer happens.
        src: The sending rank.
        dst: The receiving rank.
        chunk: Index of the chunk being sent.
        phase: ``"reduce"`` (``src`` sends its current partial sum of the chunk, which ``dst``
            accumulates) or ``"gather"`` (``src`` forwards the owner's final bytes unchanged).

    Raises:
        ScheduleError: ``phase`` is not one of :data:`PHASES`.
    """

    step: int
    src: int
    dst: int
    chunk: int
    phase: str

    def __post_init__(self) -> None:
        if self.phase not in _PHASE_ORDER:
            raise ScheduleError(f"transfer phase must be one of {PHASES}, got {self.phase!r}")

    def sort_key(self) -> tuple[int, int, int, int, int]:
        """The canonical order of transfers in a schedule: step, phase (reduce first), src, dst,
        chunk."""
        return (self.step, _PHASE_ORDER[self.phase], self.src, self.dst, self.chunk)

    def __str__(self) -> str:
        return f"{self.src}->{self.dst} c{self.chunk}"
