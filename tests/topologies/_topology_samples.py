"""Built-in topologies to test, and the world sizes each one serves (written independently of
``Topology.supports`` so that the two can be checked against each other)."""

from __future__ import annotations

import functools

from dynamiq.topologies import Butterfly, Hierarchical, Ring, Schedule, Topology

MAX_N = 64
BASIC = ("ring", "butterfly")

SAMPLES: list[Topology] = [
    Ring(),
    Butterfly(),
    *(Hierarchical(p, inner, outer) for p in (1, 2, 4) for inner in BASIC for outer in BASIC),
]


def is_pow2(k: int) -> bool:
    return k & (k - 1) == 0


def applies(t: Topology, n: int) -> bool:
    """Whether topology ``t`` serves ``n`` ranks."""
    if isinstance(t, Ring):
        return n >= 1
    if isinstance(t, Butterfly):
        return n >= 1 and is_pow2(n)
    if isinstance(t, Hierarchical):
        p = t.ranks_per_node
        return n % p == 0 and applies(t.inner, p) and applies(t.outer, n // p)
    raise AssertionError(f"no expectation for {t!r}; add it to SAMPLES and applies")


CASES = [(t, n) for t in SAMPLES for n in range(1, MAX_N + 1) if applies(t, n)]


@functools.cache
def schedule(t: Topology, n: int) -> Schedule:
    """``t.schedule(n)``, built once per test process."""
    return t.schedule(n)


def ids(t: Topology) -> str:
    return t.spec()
