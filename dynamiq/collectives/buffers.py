"""Per-rank programs (the transfers of each step, receive buffers, codec state), cached per group.

A gradient bucket calls all-reduce with the same pipeline, size and group every step, so the
tiled schedule, the receive buffers and the codecs' state between calls are built once and
kept in a :class:`ProgramCache`.

Per-group state is keyed by a weak reference to the group and dropped when the group is freed:
a strong reference would keep a destroyed group's gloo worker threads running until the
interpreter exits, where one of them releasing a finished work's tensor needs the GIL and
aborts the process ("terminate called without an active exception").
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import torch
import torch.distributed as dist

from dynamiq.collectives.engine import Plan
from dynamiq.collectives.tiling import Layout, TiledPlan, build_layout
from dynamiq.pipeline import Pipeline
from dynamiq.topologies import Transfer

__all__ = ["CACHE_SIZE", "PROGRAM_CACHE", "Program", "ProgramCache", "Step", "build_program"]

#: Layouts and programs kept for this many (pipeline, length, world, ...) keys each.
CACHE_SIZE = 16

_T = TypeVar("_T")


@dataclass
class Step:
    """One step of a rank's program.

    Attributes:
        index: The step of the schedule.
        sends, recvs: This rank's active transfers of the step, in schedule order.
        bufs: A receive buffer per transfer of ``recvs``.
        send_peer, recv_peer: The group rank sent to / received from (-1: none).
    """

    index: int
    sends: list[Transfer]
    recvs: list[Transfer]
    bufs: list[torch.Tensor]
    send_peer: int
    recv_peer: int


@dataclass
class Program:
    """What one rank does in every call with one (pipeline, length, tile size, group).

    Codecs whose message sizes depend on the call (variable widths) get pools sized for the
    largest possible messages; each call then cuts its receive buffers out of them.

    Attributes:
        layout: The tiled layout.
        steps: The steps in which this rank sends or receives.
        recv_bytes: Bytes of the receive buffers (0 when they are cut per call).
        send_buffers: The bytes this rank compresses, one buffer per chunk, reused by every
            call (:class:`~dynamiq.collectives.engine.RankState` fills it).
        lock: Held by the call using the receive buffers: a second thread reducing on the same
            group, pipeline and size waits instead of overwriting them.
        states: Codec state kept between calls on this tensor (warm starts, auto-scale
            factors).
        pools: ``(reduce pool, gather pool)``, the memory the receive buffers are cut from.
        variable: Whether the message sizes depend on the call.
    """

    layout: Layout
    steps: list[Step] = field(default_factory=list)
    recv_bytes: int = 0
    send_buffers: dict = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    states: dict = field(default_factory=dict)
    pools: tuple = ()
    variable: bool = False

    def cut(self, plan: Plan, size: Callable[[Plan, Transfer], int] = Plan.wire_bytes) -> None:
        """(Re)cut every step's receive buffers out of the pools.

        Args:
            plan: The call's plan.
            size: Bytes of a transfer's buffer (default: what it carries in this call).
        """
        rpool, gpool = self.pools
        goff = 0
        for st in self.steps:
            bufs, roff = [], 0
            for t in st.recvs:
                nb = size(plan, t)
                if t.phase == "reduce":
                    bufs.append(rpool[roff:roff + nb])
                    roff += nb
                else:
                    bufs.append(gpool[goff:goff + nb])
                    goff += nb
            st.bufs = bufs


def _max_bytes(plan: Plan, t: Transfer) -> int:
    return plan.codec(t).max_wire_bytes(plan.size(t.chunk))


def build_program(layout: Layout, rank: int, device: torch.device) -> Program:
    """``rank``'s program for ``layout``, with its receive buffers allocated on ``device``.

    Raises:
        RuntimeError: the schedule has ``rank`` talk to several peers in one step.
    """
    sched = layout.schedule
    plan = TiledPlan(layout, 0)
    variable = any(c.variable_size for c in layout.pipeline.codecs)
    size = _max_bytes if variable else Plan.wire_bytes
    per_step = []
    reduce_pool = gather_pool = 0
    for s in range(sched.steps()):
        ts = [t for t in sched.transfers_at(s) if plan.active(t)]
        sends = [t for t in ts if t.src == rank]
        recvs = [t for t in ts if t.dst == rank]
        per_step.append((s, sends, recvs))
        reduce_pool = max(reduce_pool, sum(size(plan, t) for t in recvs
                                           if t.phase == "reduce"))
        gather_pool += sum(size(plan, t) for t in recvs if t.phase == "gather")
    # Reduce messages are consumed by RankState.receive before it returns, so one step's worth
    # is reused by every step; gather messages stay referenced (RankState.final, forwarded
    # later), so each gets its own slice. Both total at most the compressed vector.
    rpool = torch.empty(reduce_pool, dtype=torch.uint8, device=device)
    gpool = torch.empty(gather_pool, dtype=torch.uint8, device=device)
    prog = Program(layout, pools=(rpool, gpool), variable=variable)
    for s, sends, recvs in per_step:
        if not sends and not recvs:
            continue
        peers_out = {t.dst for t in sends}
        peers_in = {t.src for t in recvs}
        if len(peers_out) > 1 or len(peers_in) > 1:
            raise RuntimeError(f"schedule {sched.name}: rank {rank} talks to several peers at "
                               f"step {s}, which the port model forbids")
        prog.steps.append(Step(s, sends, recvs, [], peers_out.pop() if peers_out else -1,
                               peers_in.pop() if peers_in else -1))
    if not variable:
        # sizes do not depend on the call: cut once
        prog.cut(plan)
        prog.recv_bytes = sum(b.numel() for st in prog.steps for b in st.bufs)
    return prog


class ProgramCache:
    """Layouts and programs, least recently used first out, and the groups they belong to.

    Args:
        size: Layouts and programs kept, each.
    """

    def __init__(self, size: int = CACHE_SIZE) -> None:
        self.size = size
        # reentrant: a group's finalizer (which takes it) may run wherever the group's last
        # reference goes, also in code that holds it
        self._lock = threading.RLock()
        self._layouts: OrderedDict[tuple, Layout] = OrderedDict()
        self._programs: OrderedDict[tuple, Program] = OrderedDict()
        self._tracked: set[weakref.ref] = set()
        self._freed_hooks: list[Callable[[weakref.ref], None]] = []

    def group_key(self, group: dist.ProcessGroup | None) -> weakref.ref:
        """A weak reference to ``group`` (the world when ``None``) to key per-group state by.

        The first time a group is seen, a finalizer is attached that drops the state kept for
        it (see the module docstring for why nothing may hold a group strongly).
        """
        g = dist.group.WORLD if group is None else group
        ref = weakref.ref(g)  # without a callback: one shared object per group, equal while alive
        with self._lock:
            if ref not in self._tracked:
                self._tracked.add(ref)
                weakref.finalize(g, self._forget_group, ref)
        return ref

    def on_group_freed(self, hook: Callable[[weakref.ref], None]) -> None:
        """Call ``hook`` with a group's key (see :meth:`group_key`) once the group is freed."""
        with self._lock:
            self._freed_hooks.append(hook)

    def _forget_group(self, ref: weakref.ref) -> None:
        with self._lock:
            self._tracked.discard(ref)
            for key in [k for k in self._programs if ref in k]:
                del self._programs[key]
            hooks = list(self._freed_hooks)
        for hook in hooks:
            hook(ref)

    def holds(self, ref: weakref.ref) -> bool:
        """Whether a program of the group with key ``ref`` is cached."""
        with self._lock:
            return any(ref in k for k in self._programs)

    def _get(self, cache: OrderedDict[tuple, _T], key: tuple, make: Callable[[], _T]) -> _T:
        with self._lock:
            if key in cache:
                cache.move_to_end(key)
                return cache[key]
        value = make()
        with self._lock:
            cache[key] = value
            while len(cache) > self.size:
                cache.popitem(last=False)
        return value

    def program(self, p: Pipeline, world: int, length: int, tile: int,
                group: dist.ProcessGroup | None, rank: int, device: torch.device) -> Program:
        """``rank``'s program for ``p`` on a vector of ``length`` over ``group``, cached.

        Args:
            p: The pipeline.
            world: The group's size.
            length: Length of the (transformed) vector being summed.
            tile: Coordinates per message at most (rounded as
                :func:`~dynamiq.collectives.tiling.build_layout` says).
            group: The process group (``None``: the world).
            rank: This rank in ``group``.
            device: Where the vector lives.
        """
        layout = self._get(self._layouts, (p, world, length, tile),
                           lambda: build_layout(p, world, length, tile))
        return self._get(self._programs,
                         (p, world, length, tile, self.group_key(group), rank, str(device)),
                         lambda: build_program(layout, rank, device))

    def clear(self) -> None:
        """Drop every layout and program (they are rebuilt on the next call)."""
        with self._lock:
            self._layouts.clear()
            self._programs.clear()


#: The cache of :func:`dynamiq.collectives.p2p.run_p2p`.
PROGRAM_CACHE = ProgramCache()
