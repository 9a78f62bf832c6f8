"""A bandwidth-limited testbed on one machine: every rank in its own Linux network namespace,
joined to a bridge by a veth link shaped with ``tc``.

.. code-block:: python

   import torch
   import dynamiq
   from dynamiq.testbed import LinkShape, Testbed, interface_counters

   def reduce(rank, world_size):
       t = torch.randn(1 << 20)
       before = interface_counters()
       dynamiq.all_reduce(t, "requant-dq4")
       return (interface_counters() - before).tx_bytes

   if __name__ == "__main__":
       with Testbed(2, LinkShape("100mbit")) as bed:   # needs root
           print(bed.run(reduce))                      # bytes each rank's link sent

Modules: :mod:`~dynamiq.testbed.shape` (:class:`LinkShape`), :mod:`~dynamiq.testbed.netns`
(namespaces, ``ip`` and ``tc``, stale testbeds), :mod:`~dynamiq.testbed.bed` (:class:`Testbed`),
:mod:`~dynamiq.testbed.world` and :mod:`~dynamiq.testbed.rank` (ranks inside namespaces),
:mod:`~dynamiq.testbed.counters` (interface counters), :mod:`~dynamiq.testbed.check` (the
``dynamiq testbed check`` measurement). See :doc:`/testbed`.
"""

from __future__ import annotations

from dynamiq.testbed.bed import IFNAME, Testbed
from dynamiq.testbed.counters import LinkCounters, interface_counters
from dynamiq.testbed.netns import (
    TestbedError,
    TestbedUnavailable,
    clean_stale,
    list_testbeds,
    unavailable_reason,
)
from dynamiq.testbed.shape import LinkShape, parse_rate

__all__ = ["IFNAME", "LinkCounters", "LinkShape", "Testbed", "TestbedError",
           "TestbedUnavailable", "clean_stale", "interface_counters", "list_testbeds",
           "parse_rate", "unavailable_reason"]
