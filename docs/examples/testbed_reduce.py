"""A compressed all-reduce across two ranks in network namespaces, linked at 100 Mbit/s.

    sudo python docs/examples/testbed_reduce.py

Needs root (or CAP_NET_ADMIN and CAP_SYS_ADMIN) and iproute2's ip and tc.
"""

import time

import torch

import dynamiq
from dynamiq.collectives.api import P2PStats
from dynamiq.testbed import LinkShape, Testbed, interface_counters


def reduce(rank, world_size, n):
    t = torch.randn(n, generator=torch.Generator().manual_seed(rank))
    stats = P2PStats()
    dynamiq.all_reduce(t.clone(), "requant-dq4")       # warm-up
    torch.distributed.barrier()
    before = interface_counters()                      # this rank's link, dq0
    t0 = time.perf_counter()
    dynamiq.all_reduce(t, "requant-dq4", stats=stats)
    seconds = time.perf_counter() - t0
    torch.distributed.barrier()
    wire = interface_counters() - before
    return stats.bytes_sent, wire.tx_bytes, seconds

if __name__ == "__main__":
    with Testbed(2, LinkShape("100mbit")) as bed:
        print(bed.run(reduce, (1 << 20,)))
        print(bed.counters())   # every link's totals, read from the host
