"""All-reduce topologies and the schedules they build.

A :class:`Topology` turns a world size into a :class:`Schedule`: plain data (chunks, aggregation
trees, timed :class:`Transfer` records) that can be validated (:func:`validate_schedule`),
printed, simulated and executed without knowing which topology produced it. Topologies are
registered by name in :data:`TOPOLOGIES` and built from spec strings by :func:`get_topology`.

Modules: ``schedule`` (the format), ``validate`` (the validator), ``render`` (text views),
``base`` (the base class, registry and spec strings), and one module per built-in topology.
"""

from dynamiq.topologies.base import TOPOLOGIES, Topology, get_topology
from dynamiq.topologies.butterfly import Butterfly
from dynamiq.topologies.hierarchical import Hierarchical
from dynamiq.topologies.ring import Ring
from dynamiq.topologies.schedule import PHASES, Schedule, ScheduleError, Transfer
from dynamiq.topologies.validate import validate_schedule

__all__ = [
    "PHASES",
    "TOPOLOGIES",
    "Butterfly",
    "Hierarchical",
    "Ring",
    "Schedule",
    "ScheduleError",
    "Topology",
    "Transfer",
    "get_topology",
    "validate_schedule",
]
