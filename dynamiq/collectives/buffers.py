"""Per-rank programs (the transfers of each step, receive buffers, codec state), cached per group.

A gradient bucket calls all-reduce with the same pipeline, size and group every step, so the
tiled schedule, the receive buffers and the codecs' state between calls are built once and
kept in a :class:`ProgramCache`; a call in the steady state allocates no tensor memory.

When every codec of a pipeline is the identity (FP32 passthrough), a message *is* a slice of
the accumulator: :class:`DirectState` sends views of it, adds incoming partial sums into it in
place and lets the all-gather write straight into it, so no byte is copied besides the ones
the transport moves (the bits equal those of :class:`~dynamiq.collectives.engine.RankState`).

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
from dynamiq.collectives.tiling import Layout, TiledPlan, build_layout, is_identity
from dynamiq.pipeline import Pipeline
from dynamiq.topologies import Transfer

__all__ = ["CACHE_SIZE", "PROGRAM_CACHE", "DirectState", "Program", "ProgramCache", "Step",
           "build_program", "is_identity"]

#: Layouts and programs kept for this many (pipeline, length, world, ...) keys each.
CACHE_SIZE = 16

_T = TypeVar("_T")


@dataclass
class Step:
    """One step of a rank's program.

    Attributes:
        index: The step of the schedule.
        sends, recvs: This rank's active transfers of the step, in schedule order.
        bufs: A receive buffer per transfer of ``recvs`` (``None``: the transfer lands in the
            accumulator, see :class:`DirectState`).
        send_peer, recv_peer: The group rank sent to / received from (-1: none).
        ready: Per transfer of ``sends``, how many receives of the program's previous step
            must be taken in before its message exists (non-decreasing, so sends go out in
            schedule order).
    """

    index: int
    sends: list[Transfer]
    recvs: list[Transfer]
    bufs: list[torch.Tensor | None]
    send_peer: int
    recv_peer: int
    ready: list[int] = field(default_factory=list)


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
        pools: ``(reduce pool of even steps, of odd steps, gather pool)``, the memory the
            receive buffers are cut from (steps counted in :attr:`steps`).
        variable: Whether the message sizes depend on the call.
        direct: Whether every codec is the identity, so messages are slices of the
            accumulator (:class:`DirectState`).
    """

    layout: Layout
    steps: list[Step] = field(default_factory=list)
    recv_bytes: int = 0
    send_buffers: dict = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    states: dict = field(default_factory=dict)
    pools: tuple = ()
    variable: bool = False
    direct: bool = False

    def cut(self, plan: Plan, size: Callable[[Plan, Transfer], int] = Plan.wire_bytes) -> None:
        """(Re)cut every step's receive buffers out of the pools.

        Args:
            plan: The call's plan.
            size: Bytes of a transfer's buffer (default: what it carries in this call).
        """
        *rpools, gpool = self.pools
        goff = 0
        for i, st in enumerate(self.steps):
            # the executor posts a step's receives while the previous step's are still being
            # taken in: consecutive steps use different reduce pools
            rpool, bufs, roff = rpools[i % 2], [], 0
            for t in st.recvs:
                nb = size(plan, t)
                if t.phase == "reduce":
                    bufs.append(rpool[roff:roff + nb])
                    roff += nb
                elif self.direct:
                    bufs.append(None)
                else:
                    bufs.append(gpool[goff:goff + nb])
                    goff += nb
            st.bufs = bufs


class DirectState:
    """A rank's state for a pipeline of identity codecs: every message is a slice of ``acc``.

    It has the interface the executor uses of
    :class:`~dynamiq.collectives.engine.RankState` and gives the same bits: an incoming
    partial sum is added into the accumulator in schedule order (``acc + in`` rounds as
    ``in + acc``), and a rank forwards the slice once every child's partial sum is in.
    Between the reduce phase and the all-gather a non-owner's slice holds its partial sum
    instead of its own values; the all-gather overwrites it with the result.

    Writing into the slices is safe in any all-reduce schedule: a rank receives a chunk's
    partial sums before it sends that chunk, and the all-gather's bytes of a chunk exist only
    after every rank's contribution to it was received in full, so no message lands in a
    slice that a send still reads.

    Args:
        plan: The call's plan.
        acc: float32[plan.length], this rank's (transformed) vector; the result on return.
    """

    def __init__(self, plan: Plan, acc: torch.Tensor) -> None:
        self.plan = plan
        self.acc = acc
        self._bytes = acc.view(torch.uint8)

    def _slice(self, chunk: int) -> torch.Tensor:
        a, b = self.plan.bounds[chunk]
        return self._bytes[4 * a:4 * b]

    def message(self, t: Transfer) -> torch.Tensor:
        """The bytes sent for transfer ``t``: the chunk's slice of the accumulator."""
        return self._slice(t.chunk)

    def inbox(self, t: Transfer) -> torch.Tensor:
        """Where the all-gather transfer ``t`` lands: the chunk's slice of the accumulator."""
        return self._slice(t.chunk)

    def receive(self, t: Transfer, data: torch.Tensor) -> None:
        """Take in transfer ``t``: add a partial sum (an all-gather is already in place)."""
        if t.phase == "reduce":
            a, b = self.plan.bounds[t.chunk]
            self.acc[a:b].add_(data.view(torch.float32))


def _max_bytes(plan: Plan, t: Transfer) -> int:
    return plan.codec(t).max_wire_bytes(plan.size(t.chunk))


def _ready(prev: list[Transfer], sends: list[Transfer]) -> list[int]:
    """Per send, the receives of ``prev`` (the previous step) to take in before it exists.

    A message depends only on receives of its own chunk, and those of earlier steps are in.
    """
    last = {t.chunk: k + 1 for k, t in enumerate(prev)}
    out, need = [], 0
    for t in sends:
        need = max(need, last.get(t.chunk, 0))
        out.append(need)
    return out


def build_program(layout: Layout, rank: int, device: torch.device) -> Program:
    """``rank``'s program for ``layout``, with its receive buffers allocated on ``device``.

    Raises:
        RuntimeError: the schedule has ``rank`` talk to several peers in one step.
    """
    sched = layout.schedule
    plan = TiledPlan(layout, 0)
    variable = any(c.variable_size for c in layout.pipeline.codecs)
    direct = is_identity(layout.pipeline)
    size = _max_bytes if variable else Plan.wire_bytes
    per_step = []
    for s in range(sched.steps()):
        ts = [t for t in sched.transfers_at(s) if plan.active(t)]
        sends = [t for t in ts if t.src == rank]
        recvs = [t for t in ts if t.dst == rank]
        if sends or recvs:
            per_step.append((s, sends, recvs))
    reduce_pools, gather_pool = [0, 0], 0
    for i, (_, _, recvs) in enumerate(per_step):
        reduce_pools[i % 2] = max(reduce_pools[i % 2], sum(size(plan, t) for t in recvs
                                                           if t.phase == "reduce"))
        if not direct:
            gather_pool += sum(size(plan, t) for t in recvs if t.phase == "gather")
    # Reduce messages are consumed by RankState.receive before it returns, so a step's buffers
    # are free again two steps later; gather messages stay referenced (RankState.final,
    # forwarded later), so each gets its own slice. Together at most twice the compressed
    # vector; a direct program keeps no gather pool (the all-gather lands in the accumulator).
    pools = tuple(torch.empty(nb, dtype=torch.uint8, device=device)
                  for nb in (*reduce_pools, gather_pool))
    prog = Program(layout, pools=pools, variable=variable, direct=direct)
    prev: list[Transfer] = []
    for s, sends, recvs in per_step:
        peers_out = {t.dst for t in sends}
        peers_in = {t.src for t in recvs}
        if len(peers_out) > 1 or len(peers_in) > 1:
            raise RuntimeError(f"schedule {sched.name}: rank {rank} talks to several peers at "
                               f"step {s}, which the port model forbids")
        prog.steps.append(Step(s, sends, recvs, [], peers_out.pop() if peers_out else -1,
                               peers_in.pop() if peers_in else -1, _ready(prev, sends)))
        prev = recvs
    if not variable:
        # sizes do not depend on the call: cut once
        prog.cut(plan)
        prog.recv_bytes = sum(b.numel() for st in prog.steps for b in st.bufs if b is not None)
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
