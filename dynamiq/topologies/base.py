"""The :class:`Topology` base class, the :data:`TOPOLOGIES` registry and spec strings."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from dynamiq.registry import Registry
from dynamiq.spec import build, format_call, register_spec_type
from dynamiq.topologies.arrays import (
    Chunking,
    StepArrays,
    schedule_chunking,
    schedule_step_arrays,
)
from dynamiq.topologies.schedule import Schedule, Transfer
from dynamiq.topologies.validate import validate_schedule

__all__ = ["TOPOLOGIES", "Topology", "get_topology", "one_chunk_per_rank",
           "one_chunk_per_rank_chunking"]


@dataclass(frozen=True)
class Topology:
    """Base class of all-reduce topologies: a recipe for a :class:`Schedule` given a world size.

    Subclasses are frozen dataclasses registered in :data:`TOPOLOGIES`; their fields are the
    parameters that appear in :meth:`spec`. A subclass implements ``_build(world_size)``, which
    returns the (unvalidated) schedule, and overrides :meth:`check_world_size` if it cannot serve
    every world size; :meth:`schedule` calls both and validates the result.
    """

    def check_world_size(self, world_size: int) -> None:
        """Raise ``ValueError`` (saying what to use instead) if the topology cannot serve
        ``world_size`` ranks."""
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size must be a positive int, got {world_size!r}")

    def supports(self, world_size: int) -> bool:
        """Whether :meth:`schedule` accepts ``world_size``."""
        try:
            self.check_world_size(world_size)
        except ValueError:
            return False
        return True

    def levels(self) -> tuple[str, ...]:
        """Names of the link levels its schedules tag transfers with (none for flat ones)."""
        return ()

    def schedule(self, world_size: int) -> Schedule:
        """Build and validate the schedule for ``world_size`` ranks.

        Raises:
            ValueError: The topology does not apply to ``world_size`` (see
                :meth:`check_world_size`).
            ScheduleError: The subclass built an invalid schedule (a bug in the topology).
        """
        self.check_world_size(world_size)
        sched = self._build(world_size)
        validate_schedule(sched)
        return sched

    def chunking(self, world_size: int) -> Chunking:
        """The chunks and their owners of :meth:`schedule` ``(world_size)``, without building
        it where the topology has a closed form (see :mod:`dynamiq.topologies.arrays`)."""
        return schedule_chunking(self.schedule(world_size))

    def step_arrays(self, world_size: int) -> Iterator[StepArrays]:
        """The transfers of :meth:`schedule` ``(world_size)`` as arrays, step by step (see
        :class:`~dynamiq.topologies.arrays.StepArrays`), without building it where the
        topology has a closed form."""
        return schedule_step_arrays(self.schedule(world_size))

    def _build(self, world_size: int) -> Schedule:  # pragma: no cover - abstract
        raise NotImplementedError

    def spec(self) -> str:
        """The canonical spec string, e.g. ``ring`` or ``hierarchical(ranks_per_node=2)``.

        Parameters equal to their defaults are left out, and there are no spaces, so that
        ``get_topology(t.spec()) == t``.
        """
        name = TOPOLOGIES.name_of(type(self)) or type(self).__name__.lower()
        return format_call(name, self)

    def __str__(self) -> str:
        return self.spec()


#: Topology classes by name; :func:`get_topology` builds instances from spec strings.
TOPOLOGIES: Registry[type[Topology]] = Registry("topology")


def get_topology(spec: str | Topology) -> Topology:
    """Return ``spec`` itself, or the topology a spec string describes.

    The syntax is ``name`` or ``name(key=value,...)`` (whitespace ignored), e.g. ``ring``,
    ``butterfly``, ``hierarchical(ranks_per_node=4,inner=ring,outer=butterfly)``; values may be
    nested specs. ``get_topology(t.spec()) == t`` for every topology ``t``.

    Raises:
        UnknownNameError: The name is not in :data:`TOPOLOGIES` (the message lists known names).
        ValueError: The spec is malformed, names an unknown parameter, misses a required one or
            gives a parameter a value of the wrong type or range.
        TypeError: ``spec`` is neither a string nor a :class:`Topology`.
    """
    if isinstance(spec, Topology):
        return spec
    if not isinstance(spec, str):
        raise TypeError(f"expected a Topology or a spec string, got {type(spec).__name__}")
    return build(TOPOLOGIES, spec, "topology")  # type: ignore[return-value]


# Fields typed Topology (e.g. Hierarchical.inner) read nested specs such as
# "hierarchical(ranks_per_node=2,inner=butterfly)".
register_spec_type(Topology, get_topology)


def one_chunk_per_rank(
    n: int, parents: Sequence[Sequence[int]], transfers: Sequence[Transfer], name: str
) -> Schedule:
    """A schedule of ``n`` equal chunks, chunk ``c`` owned by rank ``c`` (ring, butterfly).

    Args:
        n: World size, also the number of chunks.
        parents: ``parents[c][r]``: rank ``r``'s parent in chunk ``c``'s tree, ``-1`` for ``c``.
        transfers: The transfers, in any order (they are sorted canonically).
        name: The topology's spec.

    Returns:
        The schedule (not validated), each chunk of weight ``1/n``.
    """
    return Schedule(
        world_size=n,
        num_chunks=n,
        owners=tuple(range(n)),
        parents=tuple(tuple(p) for p in parents),
        chunk_weights=(1.0 / n,) * n,
        transfers=tuple(sorted(transfers, key=Transfer.sort_key)),
        name=name,
    )


def one_chunk_per_rank_chunking(n: int) -> Chunking:
    """The :class:`~dynamiq.topologies.arrays.Chunking` of :func:`one_chunk_per_rank`: ``n``
    equal chunks, chunk ``c`` owned by rank ``c``."""
    return Chunking(np.arange(n, dtype=np.int64), (1.0 / n,) * n)
