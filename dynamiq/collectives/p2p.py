"""P2P executor: runs a pipeline's schedule over ``torch.distributed`` point-to-point messages.

Every rank runs the per-rank logic of :mod:`dynamiq.collectives.engine` on its own data and
moves bytes with ``isend``/``irecv`` (grouped by ``batch_isend_irecv``), so its result equals
:func:`dynamiq.collectives.simulator.simulate` bit for bit, on every rank. Only the calls NCCL
also offers are used (point-to-point ops, and an ``all_reduce`` of a small int64 tensor for the
metadata check), on the caller's process ``group``; on the CPU the backend is gloo.

Tiling. A chunk larger than ``tile_elems`` coordinates is cut into tiles on block boundaries and
every tile travels as its own message, so that a leaf compresses tile ``k + 1`` while tile ``k``
is on the wire, and a receiver decodes tile ``k`` while tile ``k + 1`` arrives. The schedule
seen by :class:`~dynamiq.collectives.engine.RankState` is the original one with each chunk
replaced by its tiles (same tree, same steps). Blocks are coded independently and the random
numbers of a tile are drawn from its parent chunk's stream at the tile's global element indices,
so the decoded values, the summation order and the byte count are those of the untiled schedule.

Randomness and agreement. Before any data moves, the ranks compare a fingerprint of the call
(pipeline, length, dtype, op, call counter, tile size) with one ``all_reduce``; a mismatch
raises :class:`CallMismatchError` (a ``RuntimeError``) on every rank, naming what differs (when
the pipelines differ, a second small ``all_reduce`` brings every rank's spec string for the
message). A peer that does not show up within ``timeout`` seconds raises ``TimeoutError``
naming the step and the peer (in the metadata check, a collective, only that some rank is
missing); a peer whose connection closes (it crashed, or it gave up waiting for this rank)
raises ``RuntimeError`` naming the step and the peer. After either the process group is
unusable (gloo closes every link of the group on a timeout); destroy it, or reduce over a new
group of the surviving ranks.

Per-group state (receive buffers, codec state, and the call counters of
:mod:`dynamiq.collectives.api`) is keyed by a weak reference to the group and dropped when the
group is freed: a strong reference would keep a destroyed group's gloo worker threads running
until the interpreter exits, where one of them releasing a finished work's tensor needs the
GIL and aborts the process ("terminate called without an active exception").
"""

from __future__ import annotations

import contextlib
import datetime
import math
import numbers
import threading
import time
import weakref
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from dynamiq.codecs import HopContext, PartialSumCodec
from dynamiq.collectives.engine import (
    Plan,
    RankState,
    apply_transforms,
    center_and_prepare,
    chunk_bounds,
    local_metadata,
    undo_transforms,
)
from dynamiq.collectives.topology import Schedule, Transfer
from dynamiq.kernels.backend import resolve_backend
from dynamiq.pipeline import Pipeline, get_pipeline

__all__ = ["MAX_TIMEOUT", "TILE_ELEMS", "CallMismatchError", "P2PStats", "clear_cache",
           "last_stats", "run_p2p"]

#: Default tile: 8 MB of float32 input per message (the paper's pipelining granularity).
TILE_ELEMS = 1 << 21

#: Layouts and receive buffers kept for this many (pipeline, length, world, ...) keys; a
#: gradient bucket calls all-reduce with the same key every step.
CACHE_SIZE = 16

#: Largest accepted ``timeout``, in seconds (about 31.7 years). c10d gives gloo a deadline of
#: "system clock now + timeout" in int64 nanoseconds, which overflows once the timeout passes
#: about ``2**63`` ns minus the Unix time (about 7.4e9 s in 2026): 1e10 s then times out at once
#: and 7.5e9 s never returns. 1e9 s stays clear of that for the next two centuries.
MAX_TIMEOUT = 1e9


class CallMismatchError(RuntimeError):
    """The ranks disagree on a call (pipeline, size, dtype, op, call counter or tile size).

    Raised on every rank by the agreement check that runs before any data moves, so nothing
    was sent and the process group stays usable.

    Attributes:
        fields: Names of the fingerprint fields that differ (``"numel"``, ``"dtype"``,
            ``"pipeline"``, ``"op"``, ``"call"``, ``"tile"``).
    """

    def __init__(self, message: str, fields: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.fields = tuple(fields)


def _check_timeout(timeout) -> float:
    """``timeout`` in seconds, validated: a real number (not a bool) or a ``timedelta``, finite,
    positive and at most :data:`MAX_TIMEOUT`."""
    if isinstance(timeout, datetime.timedelta):
        seconds = timeout.total_seconds()
    elif isinstance(timeout, numbers.Real) and not isinstance(timeout, bool):
        seconds = float(timeout)
    else:
        raise TypeError(f"timeout must be a number of seconds or a datetime.timedelta, got "
                        f"{type(timeout).__name__} {timeout!r}")
    if not (math.isfinite(seconds) and 0 < seconds <= MAX_TIMEOUT):
        raise ValueError(f"timeout must be finite, positive and at most {MAX_TIMEOUT:.0e} "
                         f"seconds (what the gloo and NCCL deadlines can represent), got "
                         f"{timeout!r}")
    return seconds


@dataclass
class P2PStats:
    """What one rank did in its latest :func:`run_p2p` call.

    Attributes:
        rank, world_size: This rank in the group, and the group's size.
        numel: Coordinates reduced (before transforms).
        call: The call counter used.
        pipeline: The pipeline's spec string.
        bytes_sent, bytes_received: Payload bytes this rank put on / took off the wire (the
            metadata check is counted apart in ``metadata_bytes``).
        messages_sent: Point-to-point messages sent (tiles count one each).
        metadata_bytes: Bytes of the tensors all-reduced before the exchange (the call
            fingerprint, plus the metadata values in their float64 containers).
        metadata_bits: The metadata phase's cost as accounted in ``b̄`` (16 bits per BF16
            statistic value, 8 per fp8 one plus a shift byte; see
            :mod:`dynamiq.collectives.metadata`).
        seconds: Wall time of the call on this rank.
        stats: The global per-block statistics of the metadata phase (or ``None``).
    """

    rank: int
    world_size: int
    numel: int
    call: int
    pipeline: str
    bytes_sent: int = 0
    bytes_received: int = 0
    messages_sent: int = 0
    metadata_bytes: int = 0
    metadata_bits: int = 0
    seconds: float = 0.0
    stats: dict | None = None

    @property
    def bits_per_coord(self) -> float:
        """``8 * bytes_sent / numel``: this rank's wire cost per coordinate."""
        return 8.0 * self.bytes_sent / self.numel


#: Statistics of the latest :func:`run_p2p` call in this process (``None`` before the first).
last_stats: P2PStats | None = None


# ---- layout: the schedule with chunks cut into tiles, cached per key ---------------------------
@dataclass
class _Layout:
    pipeline: Pipeline
    world_size: int
    length: int
    schedule: Schedule
    bounds: list[tuple[int, int]]
    parent: tuple[int, ...]
    level: dict[Transfer, str | None]
    send: dict[tuple[int, int], Transfer]


def _tiles(a: int, b: int, tile: int) -> list[tuple[int, int]]:
    if b - a <= tile:
        return [(a, b)]  # an empty chunk stays one (inactive) tile so the schedule keeps its shape
    return [(s, min(b, s + tile)) for s in range(a, b, tile)]


def _build_layout(p: Pipeline, world: int, length: int, tile_elems: int) -> _Layout:
    base = p.topology.schedule(world)
    bounds = chunk_bounds(base.chunk_weights, length, p.block_size)
    align = p.block_size
    # tiles start on block boundaries, so every tile but a chunk's last is whole blocks and the
    # tiles' payloads add up to the chunk's payload, padding included
    tile = max(align, tile_elems // align * align)
    tiles = [_tiles(a, b, tile) for a, b in bounds]
    first = [0]
    for ts in tiles:
        first.append(first[-1] + len(ts))
    parent = tuple(c for c, ts in enumerate(tiles) for _ in ts)
    new_bounds = [ab for ts in tiles for ab in ts]
    weights = []
    for c, ts in enumerate(tiles):
        size = bounds[c][1] - bounds[c][0]
        w = base.chunk_weights[c]
        weights += [w * (b - a) / size for a, b in ts] if size else [w]
    base_levels = base.levels or (None,) * len(base.transfers)
    transfers, levels = [], []
    for t, lv in zip(base.transfers, base_levels):
        for k in range(len(tiles[t.chunk])):
            transfers.append(Transfer(t.step, t.src, t.dst, first[t.chunk] + k, t.phase))
            levels.append(lv)
    sched = Schedule(
        world_size=world,
        num_chunks=len(new_bounds),
        owners=tuple(base.owners[c] for c in parent),
        parents=tuple(base.parents[c] for c in parent),
        chunk_weights=tuple(weights),
        transfers=(),
        name=f"{base.name} tiled by {tile}",
    )
    sched = sched.with_transfers(transfers, levels if base.levels else ())
    lv_all = sched.levels or (None,) * len(sched.transfers)
    return _Layout(
        pipeline=p,
        world_size=world,
        length=length,
        schedule=sched,
        bounds=new_bounds,
        parent=parent,
        level=dict(zip(sched.transfers, lv_all)),
        send={(t.chunk, t.src): t for t in sched.transfers if t.phase == "reduce"},
    )


class _TiledPlan(Plan):
    """A :class:`Plan` over the tiled schedule of a cached layout.

    It answers the plan's questions per tile with the parent chunk's codec and random stream,
    so :class:`RankState` runs unchanged.
    """

    def __init__(self, layout: _Layout, call: int, backend: str = "auto") -> None:
        # not Plan's generated __init__: its __post_init__ would rebuild the untiled schedule
        # on every call
        self.pipeline = layout.pipeline
        self.world_size = layout.world_size
        self.length = layout.length
        self.call = call
        self.backend = backend
        self.schedule = layout.schedule
        self.bounds = layout.bounds
        self._layout = layout
        self.stats = None
        self.raw_stats = None
        self.prepared = None

    def codec(self, t: Transfer) -> PartialSumCodec:
        if t.phase == "gather":
            return self.pipeline.codec  # type: ignore[return-value]
        return self.pipeline.codec_for(self._layout.level[t])

    def context(self, rank: int, chunk: int) -> HopContext:
        return HopContext(stream=(self.call, self._layout.parent[chunk],
                                  self.height(chunk, rank)), rank=rank,
                          world_size=self.world_size, index_offset=self.bounds[chunk][0],
                          stats=self.stats, prepared=self.prepared, backend=self.backend)

    def outgoing_codec(self, rank: int, chunk: int) -> PartialSumCodec:
        t = self._layout.send.get((chunk, rank))
        return self.pipeline.codec if t is None else self.codec(t)  # type: ignore[return-value]


# ---- per-rank program: the transfers of each step and preallocated receive buffers ------------
# Codecs whose message sizes depend on the call (variable widths) get pools sized for the
# largest possible messages; each call then cuts its receive buffers out of them.
@dataclass
class _Step:
    index: int
    sends: list[Transfer]
    recvs: list[Transfer]
    bufs: list[torch.Tensor]
    send_peer: int  # group ranks; -1 when there is nothing to send / receive
    recv_peer: int


@dataclass
class _Program:
    layout: _Layout
    steps: list[_Step] = field(default_factory=list)
    recv_bytes: int = 0
    # bytes this rank compresses, one buffer per chunk, reused by every call (RankState fills it)
    send_buffers: dict = field(default_factory=dict)
    # the receive buffers belong to one call at a time; a second thread reducing on the same
    # group, pipeline and size waits instead of overwriting them
    lock: threading.Lock = field(default_factory=threading.Lock)
    # codec state kept between calls on this tensor (warm starts, auto-scale factors)
    states: dict = field(default_factory=dict)
    pools: tuple = ()  # (reduce pool, gather pool) when buffers are cut per call
    variable: bool = False


def _max_bytes(plan: Plan, t: Transfer) -> int:
    return plan.codec(t).max_wire_bytes(plan.size(t.chunk))


def _cut(prog: _Program, plan: Plan, size) -> None:
    """(Re)cut every step's receive buffers out of the pools for this call's sizes."""
    rpool, gpool = prog.pools
    goff = 0
    for st in prog.steps:
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


def _build_program(layout: _Layout, rank: int, device: torch.device) -> _Program:
    sched = layout.schedule
    plan = _TiledPlan(layout, 0)
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
    prog = _Program(layout, pools=(rpool, gpool), variable=variable)
    for s, sends, recvs in per_step:
        if not sends and not recvs:
            continue
        peers_out = {t.dst for t in sends}
        peers_in = {t.src for t in recvs}
        if len(peers_out) > 1 or len(peers_in) > 1:
            raise RuntimeError(f"schedule {sched.name}: rank {rank} talks to several peers at "
                               f"step {s}, which the port model forbids")
        prog.steps.append(_Step(s, sends, recvs, [], peers_out.pop() if peers_out else -1,
                                peers_in.pop() if peers_in else -1))
    if not variable:
        # sizes do not depend on the call: cut once
        _cut(prog, plan, Plan.wire_bytes)
        prog.recv_bytes = sum(b.numel() for st in prog.steps for b in st.bufs)
    return prog


# reentrant: a group's finalizer (which takes it) may run wherever the group's last reference
# goes, also in code that holds it
_lock = threading.RLock()
_layouts: OrderedDict[tuple, _Layout] = OrderedDict()
_programs: OrderedDict[tuple, _Program] = OrderedDict()
_tracked_groups: set[weakref.ref] = set()
#: Called with a group's weak reference once the group is freed (the API's call counters).
_group_freed_hooks: list[Callable[[weakref.ref], None]] = []


def _group_key(group) -> weakref.ref:
    """A weak reference to ``group`` (the world when ``None``) to key per-group state by.

    The first time a group is seen, a finalizer is attached that drops the state kept for it
    (see the module docstring for why nothing may hold a group strongly).
    """
    g = dist.group.WORLD if group is None else group
    ref = weakref.ref(g)  # without a callback: one shared object per group, equal while alive
    with _lock:
        if ref not in _tracked_groups:
            _tracked_groups.add(ref)
            weakref.finalize(g, _forget_group, ref)
    return ref


def _forget_group(ref: weakref.ref) -> None:
    with _lock:
        _tracked_groups.discard(ref)
        for key in [k for k in _programs if ref in k]:
            del _programs[key]
    for hook in list(_group_freed_hooks):
        hook(ref)


def _cached(cache: OrderedDict, key: tuple, make):
    with _lock:
        if key in cache:
            cache.move_to_end(key)
            return cache[key]
    value = make()
    with _lock:
        cache[key] = value
        while len(cache) > CACHE_SIZE:
            cache.popitem(last=False)
    return value


def clear_cache() -> None:
    """Drop the cached schedules and receive buffers (they are rebuilt on the next call)."""
    with _lock:
        _layouts.clear()
        _programs.clear()


# ---- metadata check ---------------------------------------------------------------------------
_DTYPE_CODES = {torch.float32: 1, torch.bfloat16: 2, torch.float16: 3, torch.float64: 4}
_DTYPE_NAMES = {v: str(k).removeprefix("torch.") for k, v in _DTYPE_CODES.items()}
_OPS = ("sum", "avg")
_FIELDS = ("numel", "dtype", "pipeline", "op", "call", "tile")


def _crc(text: str) -> int:
    return zlib.crc32(text.encode())


def _describe(name: str, value: int, specs: dict[int, str]) -> str:
    if name == "dtype":
        return _DTYPE_NAMES.get(value, f"dtype #{value}")
    if name == "op":
        return _OPS[value] if 0 <= value < len(_OPS) else f"op #{value}"
    if name == "pipeline":
        return repr(specs[value]) if value in specs else f"a pipeline with crc32 {value:#010x}"
    if name == "numel":
        return f"{value} elements"
    if name == "tile":
        return f"tiles of {value} elements"
    return f"call {value}"


_SPEC_CHARS = 240


def _deadline(timeout: float) -> datetime.timedelta:
    # whole milliseconds, rounded up: c10d takes milliseconds and reads 0 as "no timeout"
    return datetime.timedelta(milliseconds=math.ceil(timeout * 1000))


def _grace(timeout: float) -> float:
    """Seconds between a collective's timeout on the caller's side and on gloo's (see
    :func:`_start_all_reduce`): enough for the ranks' waits to start apart, short enough for a
    ``destroy_process_group`` right after the timeout (it waits for gloo's worker)."""
    return min(5.0, max(1.0, 0.1 * timeout))


def _start_all_reduce(t: torch.Tensor, group, timeout: float, op=None):
    """Start an asynchronous all-reduce of ``t``; off CUDA, one that the backend itself gives
    up after ``timeout``.

    ``dist.all_reduce`` runs the collective under the group's own timeout (30 minutes by
    default), whatever the caller waits: a rank that stopped waiting would keep the collective
    running in gloo's worker thread, a latecomer would still complete it and go on alone, and
    the work (holding ``t``) could still be running at interpreter exit. With the timeout in
    the options, gloo fails the collective after ``timeout`` and closes the group's links, so a
    latecomer fails at once, naming the step. NCCL keeps the group's timeout: its watchdog
    tears the process down when a collective times out.

    The backend's deadline comes a grace period after the caller's (:func:`_wait`): every rank
    that waits in vain sees its own ``TimeoutError``, not the closing of links by a rank that
    started waiting a moment earlier.
    """
    if t.device.type == "cuda":
        return dist.all_reduce(t, op=dist.ReduceOp.SUM if op is None else op, group=group,
                               async_op=True)
    pg = dist.group.WORLD if group is None else group
    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.SUM if op is None else op
    opts.timeout = _deadline(timeout + _grace(timeout))
    if hasattr(opts, "asyncOp"):
        opts.asyncOp = True
    return pg.allreduce([t], opts)


def _gather_specs(group, rank: int, world: int, device: torch.device, timeout: float,
                  spec: str) -> dict[int, str]:
    """Every rank's pipeline string (cut to ``_SPEC_CHARS``), by its crc32.

    Only run once every rank has seen that the pipelines differ, so all of them take part.
    """
    raw = spec.encode()[:_SPEC_CHARS]
    buf = torch.zeros(world, _SPEC_CHARS, dtype=torch.int32, device=device)
    buf[rank, :len(raw)] = torch.tensor(list(raw), dtype=torch.int32)
    where, late = "metadata exchange before step 0", "pipeline strings did not arrive"
    failed = "exchanging pipeline strings failed"
    with _translated(where, late, failed, "a peer"):
        work = _start_all_reduce(buf, group, timeout)
    _wait(work, timeout, where, late, failed, "a peer")
    specs = {}
    for row in buf.cpu().tolist():
        text = bytes(v for v in row if v).decode(errors="replace")
        specs[_crc(text)] = text
    specs[_crc(spec)] = spec  # this rank's full string, even when longer than the cut
    return specs


def _check_metadata(
    group, rank: int, world: int, device: torch.device, timeout: float, *, numel: int,
    dtype: torch.dtype, pipeline: str, op: str, call: int, tile_elems: int,
) -> int:
    """All-reduce every rank's fingerprint; raise on every rank if they differ.

    Returns:
        Bytes of the metadata tensor.
    """
    mine = {"numel": numel, "dtype": _DTYPE_CODES.get(dtype, _crc(str(dtype)) & 0xFFFF),
            "pipeline": _crc(pipeline), "op": _OPS.index(op), "call": call, "tile": tile_elems}
    # each rank fills its own row; the sum is an all-gather that NCCL and gloo both run
    meta = torch.zeros(world, len(_FIELDS), dtype=torch.int64, device=device)
    meta[rank] = torch.tensor([mine[f] for f in _FIELDS], dtype=torch.int64)
    where = "metadata exchange before step 0"
    late = (f"not all {world} ranks joined within {timeout}s (a rank did not call all_reduce, "
            "or is still busy in another collective)")
    with _translated(where, late, "failed", "a peer"):
        work = _start_all_reduce(meta, group, timeout)
    _wait(work, timeout, where, late, "failed", "a peer")
    rows = meta.cpu().tolist()
    specs = {mine["pipeline"]: pipeline}
    if len({row[_FIELDS.index("pipeline")] for row in rows}) > 1:
        specs = _gather_specs(group, rank, world, device, timeout, pipeline)
    problems = []
    for i, name in enumerate(_FIELDS):
        values = [row[i] for row in rows]
        if len(set(values)) == 1:
            continue
        groups: dict[int, list[int]] = {}
        for r, v in enumerate(values):
            groups.setdefault(v, []).append(r)
        parts = [f"rank{'s' if len(rs) > 1 else ''} {','.join(map(str, rs))} "
                 f"{'have' if len(rs) > 1 else 'has'} {_describe(name, v, specs)}"
                 for v, rs in groups.items()]
        problems.append(f"{name}: " + "; ".join(parts))
    if problems:
        fields = tuple(name for name in _FIELDS
                       if len({row[_FIELDS.index(name)] for row in rows}) > 1)
        if "call" in fields:
            fix = ("the call counters differ (an earlier call failed on some ranks only, or "
                   "the ranks issued different calls): call "
                   "dynamiq.reset_call_counters() on every rank at the same "
                   "point, then call again")
        else:
            fix = "call again with the same arguments on every rank"
        raise CallMismatchError(
            f"dynamiq all_reduce: the {world} ranks disagree on the call, nothing was sent "
            f"(seen from rank {rank}): " + " | ".join(problems) + f". To recover: {fix}.",
            fields,
        )
    return meta.numel() * meta.element_size()


def _exchange_metadata(group, values: dict[str, torch.Tensor], reduces: dict[str, str],
                       device: torch.device, timeout: float) -> tuple[dict[str, torch.Tensor], int]:
    """Global metadata: one float64 all-reduce per reduction kind (BF16 values inside).

    Returns:
        The global values by name, and the bytes of the all-reduced tensors.
    """
    out: dict[str, torch.Tensor] = {}
    nbytes = 0
    for kind, op in (("sum", dist.ReduceOp.SUM), ("max", dist.ReduceOp.MAX)):
        names = [n for n in values if reduces[n] == kind]
        if not names:
            continue
        t = torch.cat([values[n] for n in names]).to(device)
        where = "metadata statistics before step 0"
        late = f"not all ranks joined within {timeout}s"
        with _translated(where, late, "failed", "a peer"):
            work = _start_all_reduce(t, group, timeout, op)
        _wait(work, timeout, where, late, "failed", "a peer")
        nbytes += t.numel() * t.element_size()
        t = t.cpu()
        off = 0
        for n in names:
            k = values[n].numel()
            out[n] = t[off:off + k]
            off += k
    return out, nbytes


# ---- the exchange -----------------------------------------------------------------------------
def _global(group, r: int) -> int:
    # P2POp takes global ranks; the default group's ranks already are
    if group is None or group is dist.group.WORLD:
        return r
    return dist.get_global_rank(group, r)


def _peer(group, r: int) -> str:
    """``rank r``, with its global rank when the group numbers ranks differently."""
    g = _global(group, r)
    return f"rank {r}" if g == r else f"rank {r} (global rank {g})"


# gloo's words for a link that the other side closed or reset
_CLOSED = ("connection closed", "connection reset", "broken pipe", "connection refused",
           "socket closed", "pair closure")


def _translate(e: Exception, where: str, late: str, failed: str, who: str) -> Exception:
    """The error to raise for a backend error ``e`` at ``where``.

    A timeout becomes ``TimeoutError(where: late)``; a closed link ``RuntimeError`` naming
    ``who`` was on the other end and the likely reasons; anything else ``RuntimeError(where:
    failed)``. The backend's own text is kept at the end.
    """
    text = str(e)
    low = text.lower()
    if "application timeout" in low:
        # this rank's own earlier wait timed out, and gloo closed the group's links for it
        return RuntimeError(f"dynamiq all_reduce: {where}: {failed}: the process group was "
                            f"closed after an earlier timeout on this rank; destroy it ({text})")
    if "timed out" in low or "timeout" in low:
        return TimeoutError(f"dynamiq all_reduce: {where}: {late} ({text})")
    if any(word in low for word in _CLOSED):
        return RuntimeError(
            f"dynamiq all_reduce: {where}: {failed}: {who} closed the connection; it probably "
            f"timed out (waiting for this rank, or for another one) and gave up, or it crashed. "
            f"The process group is unusable now: destroy it, or reduce over a new group of the "
            f"live ranks ({text})"
        )
    return RuntimeError(f"dynamiq all_reduce: {where}: {failed}: {text}")


@contextlib.contextmanager
def _translated(where: str, late: str, failed: str, who: str) -> Iterator[None]:
    """Raise backend errors of the block as :func:`_translate` says (issuing an operation on a
    closed link fails at once, before there is anything to wait for)."""
    try:
        yield
    except Exception as e:
        raise _translate(e, where, late, failed, who) from e


def _wait(work, timeout: float, where: str, late: str, failed: str, who: str) -> None:
    """``work.wait`` with a deadline, errors translated by :func:`_translate`."""
    with _translated(where, late, failed, who):
        work.wait(timeout=_deadline(timeout))


def _run_step(st: _Step, state: RankState, group, timeout: float, stats: P2PStats) -> None:
    src = _global(group, st.recv_peer) if st.recvs else -1
    dst = _global(group, st.send_peer) if st.sends else -1
    where = f"step {st.index}"
    inward = _peer(group, st.recv_peer) if st.recvs else ""
    outward = _peer(group, st.send_peer) if st.sends else ""
    recv_late = f"no message from {inward} within {timeout}s"
    recv_failed = f"receiving from {inward} failed"
    send_late = f"{outward} did not take our message within {timeout}s"
    send_failed = f"sending to {outward} failed"
    # NCCL needs a round's send and receive in one group; elsewhere (gloo) batch_isend_irecv
    # issues them one by one anyway, and issuing them ourselves tells which peer's link failed
    grouped = state.acc.device.type == "cuda"
    outgoing = []  # keeps sent tensors alive until their send completes
    recv_works, send_works = [], []
    try:
        # The k-th send and the k-th receive of the step go out together: on every rank, round
        # k pairs up with round k of the peers (a rank hears from one peer per step), which
        # keeps NCCL's grouped point-to-point calls deadlock-free, and the leaf compresses the
        # tile of round k + 1 while round k is on the wire.
        for k in range(max(len(st.sends), len(st.recvs))):
            receiving, sending = k < len(st.recvs), k < len(st.sends)
            data = None
            if sending:
                data = state.message(st.sends[k])
                outgoing.append(data)
                stats.bytes_sent += data.numel() * data.element_size()
                stats.messages_sent += 1
            if grouped:
                ops = []
                if receiving:
                    ops.append(dist.P2POp(dist.irecv, st.bufs[k], src, group))
                if sending:
                    ops.append(dist.P2POp(dist.isend, data, dst, group))
                peers = " and ".join(p for p in (inward, outward) if p)
                with _translated(where, f"exchanging with {peers} timed out",
                                 f"exchanging with {peers} failed", peers):
                    works = dist.batch_isend_irecv(ops)
                per_op = works if len(works) == len(ops) else [works[-1]] * len(ops)
                if receiving:
                    recv_works.append(per_op[0])
                if sending:
                    send_works.append(per_op[-1])
                continue
            if receiving:
                with _translated(where, recv_late, recv_failed, inward):
                    recv_works.append(dist.irecv(st.bufs[k], src, group=group))
            if sending:
                with _translated(where, send_late, send_failed, outward):
                    send_works.append(dist.isend(data, dst, group=group))
        for t, buf, work in zip(st.recvs, st.bufs, recv_works):
            _wait(work, timeout, where, recv_late, recv_failed, inward)
            state.receive(t, buf)
            stats.bytes_received += buf.numel()
        for work in send_works:
            _wait(work, timeout, where, send_late, send_failed, outward)
    finally:
        # After a failure the works left are abandoned: releasing them here, in the calling
        # thread, makes gloo drop its references to their buffers now (it never touches a
        # released buffer), instead of whenever the traceback holding this frame goes away.
        recv_works.clear()
        send_works.clear()
        outgoing.clear()


def run_p2p(
    tensor: torch.Tensor,
    pipeline: str | Pipeline,
    *,
    group=None,
    call: int,
    timeout: float,
    tile_elems: int | None = None,
    dtype: torch.dtype | None = None,
    op: str = "sum",
    consume: bool = False,
    backend: str = "auto",
) -> torch.Tensor:
    """All-reduce (sum) a flat float32 tensor over ``group`` with ``pipeline``.

    Every rank of ``group`` must call it with the same pipeline, length, ``call``, ``dtype``,
    ``op`` and tile size; this is checked before any data moves.

    Args:
        tensor: float32[d], 1-D, contiguous, ``d >= 1``; not modified unless ``consume``.
        pipeline: Pipeline, registered name or spec string.
        group: Process group (default: the world).
        call: Call counter, part of every random stream; the caller counts calls so that all
            ranks pass the same value (:func:`dynamiq.collectives.api.all_reduce` does).
        timeout: Seconds (a real number or a ``timedelta``) to wait for any one message
            (and for the metadata check); finite, positive, at most :data:`MAX_TIMEOUT`.
        tile_elems: Coordinates per message for chunks larger than that (rounded down to a
            multiple of the pipeline's block size); default :data:`TILE_ELEMS`.
        dtype: The caller's dtype before widening to float32, checked to agree across ranks
            (default: ``tensor.dtype``).
        op: ``"sum"`` or ``"avg"``, only checked to agree across ranks: the result is the sum.
        consume: Use ``tensor`` itself as the accumulator instead of a copy (saves a pass over
            the data when the caller's tensor is a scratch copy anyway); its values are then
            unspecified, and the result may share its memory.
        backend: Kernel backend of the transforms, the metadata statistics and the hops:
            ``"auto"`` (Triton for CUDA tensors, i.e. NCCL; Numba for CPU tensors, i.e. gloo),
            ``"numba"`` or ``"triton"``. Backends give the same bits, so ranks need not agree.

    Returns:
        float32[d], the all-reduced sum, bit-identical on every rank and equal to
        ``simulate(pipeline, inputs, call=call).results[rank]``.

    Raises:
        TypeError: ``tensor`` is not a 1-D float32 tensor, or ``timeout`` not a number or
            ``timedelta``.
        ValueError: bad ``op``, ``backend``, ``tile_elems`` or ``timeout``, or a pipeline whose
            topology does not fit the group size (also at size 1).
        CallMismatchError: the ranks disagree on the call (raised on every rank before any
            data moves; the group stays usable).
        RuntimeError: a peer failed or closed its connection (names the step and the peer).
        TimeoutError: a peer did not take part within ``timeout`` seconds (names the step and
            the peer).
    """
    global last_stats
    t0 = time.perf_counter()
    p = get_pipeline(pipeline)
    timeout = _check_timeout(timeout)
    if not isinstance(tensor, torch.Tensor) or tensor.dtype != torch.float32 or tensor.dim() != 1:
        raise TypeError("run_p2p needs a 1-D float32 tensor")
    if not tensor.is_contiguous():
        raise ValueError("run_p2p needs a contiguous tensor")
    if tensor.numel() == 0:
        raise ValueError("cannot all-reduce an empty tensor")
    if op not in _OPS:
        raise ValueError(f"op must be one of {_OPS}, got {op!r}")
    resolve_backend(backend, tensor.device)  # a bad or unavailable backend fails here, clearly
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("torch.distributed is not initialized; call "
                           "torch.distributed.init_process_group first")
    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError("this process is not a member of the given process group")
    tile = TILE_ELEMS if tile_elems is None else int(tile_elems)
    if tile < 1:
        raise ValueError(f"tile_elems must be >= 1, got {tile_elems!r}")
    d = tensor.numel()
    spec = str(p)
    stats = P2PStats(rank, world, d, call, spec)
    # raises the same ValueError on every rank, before anyone waits for anyone (and at world
    # size 1 too, where the result is a copy: a pipeline that cannot run there is a mistake)
    p.topology.check_world_size(world)
    if world == 1:
        out = tensor if consume else tensor.clone()
        stats.seconds = time.perf_counter() - t0
        last_stats = stats
        return out
    stats.metadata_bytes = _check_metadata(
        group, rank, world, tensor.device, timeout, numel=d,
        dtype=tensor.dtype if dtype is None else dtype, pipeline=spec, op=op, call=call,
        tile_elems=tile,
    )
    y = tensor if consume else tensor.clone()
    y, lengths = apply_transforms(p, y, call, backend)
    length = y.numel()
    layout = _cached(_layouts, (p, world, length, tile),
                     lambda: _build_layout(p, world, length, tile))
    prog = _cached(_programs, (p, world, length, tile, _group_key(group), rank, str(y.device)),
                   lambda: _build_program(layout, rank, y.device))
    plan = _TiledPlan(prog.layout, call, backend)
    with prog.lock:
        values, reduces = local_metadata(p, y, prog.states, backend)
        glob: dict[str, torch.Tensor] = {}
        if values:
            glob, nbytes = _exchange_metadata(group, values, reduces, y.device, timeout)
            stats.metadata_bytes += nbytes
            stats.metadata_bits = p.metadata_bits(length)
        plan.set_metadata(glob, prog.states)
        stats.stats = plan.stats if values else None
        y = center_and_prepare(plan, y)
        if prog.variable:
            _cut(prog, plan, Plan.wire_bytes)
        state = RankState(plan, rank, y, prog.send_buffers)
        for st in prog.steps:
            _run_step(st, state, group, timeout, stats)
        y = undo_transforms(plan, state.acc, lengths, prog.states)
    stats.seconds = time.perf_counter() - t0
    last_stats = stats
    return y[:d]
