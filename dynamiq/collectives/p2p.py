"""P2P executor: runs a pipeline's schedule over ``torch.distributed`` point-to-point messages.

Every rank runs the per-rank logic of :mod:`dynamiq.collectives.engine` on its own data and
moves bytes with point-to-point sends and receives (grouped by ``batch_isend_irecv`` on CUDA),
so its result equals :func:`dynamiq.collectives.simulator.simulate` bit for bit, on every rank.
Only the calls NCCL also offers are used (point-to-point ops, and an ``all_reduce`` of a small
int64 tensor for the metadata check), on the caller's process ``group``; on the CPU the
backend is gloo.

A call goes through the modules next to this one:

* :mod:`~dynamiq.collectives.agreement`: the ranks check that they agree on the call (raising
  :class:`CallMismatchError` on every rank if not), on every call or on the first of each kind
  (``check=``), and combine the metadata statistics;
* :mod:`~dynamiq.collectives.buffers`: the rank's cached program (tiled schedule, receive
  buffers, codec state), per process group;
* :mod:`~dynamiq.collectives.tiling`: chunks larger than ``tile_elems`` travel as several
  messages, so compression and transfer overlap, with the bits of the untiled schedule;
* :mod:`~dynamiq.collectives.transport`: every wait has a deadline and every backend error is
  translated into a ``TimeoutError`` or ``RuntimeError`` naming the step and the peer.

Off CUDA the steps overlap: a step's receives are posted while the previous step's are still
being taken in, and each message goes out as soon as the receives it depends on are in, so a
tile travels on while the next one arrives. Per-call statistics (bytes, messages, metadata
cost, and where the time went) are written into a :class:`P2PStats` that the caller passes in
(``stats=``).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from dynamiq.collectives.agreement import (
    AGREED_CALLS,
    OPS,
    CallMismatchError,
    check_call,
    exchange_metadata,
)
from dynamiq.collectives.buffers import PROGRAM_CACHE, DirectState, Program, Step
from dynamiq.collectives.engine import (
    Plan,
    RankState,
    apply_transforms,
    center_and_prepare,
    local_metadata,
    undo_transforms,
)
from dynamiq.collectives.tiling import TILE_ELEMS, TiledPlan, default_tile
from dynamiq.collectives.transport import MAX_TIMEOUT, StepExchange, check_timeout
from dynamiq.kernels.backend import resolve_backend
from dynamiq.pipeline import Pipeline, get_pipeline

__all__ = ["ACCUMULATOR_WRITTEN", "CHECKS", "MAX_TIMEOUT", "TILE_ELEMS", "CallMismatchError",
           "P2PStats", "clear_cache", "run_p2p"]

#: When the ranks exchange the call's fingerprint: on ``"every"`` call, or on the ``"first"``
#: call of each kind (group, pipeline, size, dtype, op, tile size) until
#: :func:`~dynamiq.collectives.agreement.reset_call_counters`.
CHECKS = ("every", "first")

#: Attribute set to ``True`` on an exception that :func:`run_p2p` raised, with ``consume``,
#: after it began writing into the caller's tensor (whose values are then unspecified).
ACCUMULATOR_WRITTEN = "dynamiq_accumulator_written"


@dataclass
class P2PStats:
    """What one rank did in one all-reduce call.

    Pass an instance as ``stats=`` to :func:`dynamiq.all_reduce` or :func:`run_p2p`: every
    field is written when the call succeeds (after ``wait()`` for an asynchronous call), and
    the instance is left as it was when the call raises. One instance can be reused for
    successive calls; it then describes the latest one.

    The four ``*_seconds`` parts are disjoint; ``seconds`` also counts what lies between them
    (transforms, local statistics, the program lookup, Python bookkeeping).

    Attributes:
        rank, world_size: This rank in the group, and the group's size.
        numel: Coordinates reduced (before transforms).
        call: The call counter used.
        pipeline: The pipeline's spec string.
        bytes_sent, bytes_received: Payload bytes this rank put on / took off the wire (the
            metadata check is counted apart in ``metadata_bytes``).
        messages_sent: Point-to-point messages sent (tiles count one each).
        metadata_bytes: Bytes of the tensors this rank all-reduced or all-gathered before the
            exchange (the call fingerprint when it was exchanged, plus the metadata values:
            16 bits each below 8 ranks, float64 containers from 8 on).
        metadata_bits: The metadata phase's cost as accounted in ``b̄`` (16 bits per BF16
            statistic value, 8 per fp8 one plus a shift byte; see
            :mod:`dynamiq.metadata`).
        checked: Whether this call exchanged the fingerprint (see ``check`` of
            :func:`run_p2p`).
        seconds: Wall time of the call on this rank.
        metadata_seconds: Time in the collectives before the first step: the fingerprint
            check and the exchange of metadata statistics, waiting for the peers included.
        codec_seconds: Time in the codec: compressing messages, and decompressing,
            accumulating and recompressing what arrives (for FP32 passthrough, adding the
            partial sums into the accumulator).
        wire_seconds: Time spent posting sends and receives to the backend (on gloo a send
            may write its bytes to the socket right there).
        wait_seconds: Time blocked in ``wait()`` for messages to arrive or leave.
        stats: The global per-block statistics of the metadata phase (or ``None``).
    """

    rank: int = 0
    world_size: int = 0
    numel: int = 0
    call: int = 0
    pipeline: str = ""
    bytes_sent: int = 0
    bytes_received: int = 0
    messages_sent: int = 0
    metadata_bytes: int = 0
    metadata_bits: int = 0
    checked: bool = False
    seconds: float = 0.0
    metadata_seconds: float = 0.0
    codec_seconds: float = 0.0
    wire_seconds: float = 0.0
    wait_seconds: float = 0.0
    stats: dict | None = None

    @property
    def bits_per_coord(self) -> float:
        """``8 * bytes_sent / numel``: this rank's wire cost per coordinate (0 before a call)."""
        return 8.0 * self.bytes_sent / self.numel if self.numel else 0.0

    def update(self, other: P2PStats) -> None:
        """Overwrite every field with ``other``'s."""
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(other, f.name))


def clear_cache() -> None:
    """Drop the cached schedules, receive buffers and codec state (rebuilt on the next call)."""
    PROGRAM_CACHE.clear()


def _begin_step(st: Step, run: StepExchange, i: int) -> None:
    """The first thing this rank does for program step ``i`` (``st``): post its receives (on
    CUDA, all of its operations). Off CUDA it runs while step ``i - 1`` is being taken in."""
    if run.grouped:
        run.post_grouped(i)
    else:
        run.post_recvs(i)


def _run_step(st: Step, run: StepExchange, i: int) -> None:
    """Run program step ``i`` (``st``): take in its receives, sending on what becomes ready."""
    last = i + 1 == len(run.steps)
    if run.grouped:
        _begin_step(st, run, i)
    elif not last:
        # the peers can send the next step's messages as soon as they are made
        _begin_step(run.steps[i + 1], run, i + 1)
    for k in range(len(st.recvs)):
        run.take(i, k)
        if not run.grouped and not last and (end := run.ready(i + 1, k + 1)) > run.sent.get(
                i + 1, 0):
            # A send posted while an earlier one to the same peer is still leaving queues
            # behind it for gloo's I/O thread instead of being written here and now: wait for
            # this step's sends up to the same round first (they left while this round's
            # receive arrived; later rounds' tiles may stay on their way).
            run.finish_sends(i, end)
            run.post_sends(i + 1, end)
    run.finish_sends(i)
    if not run.grouped and not last:
        run.post_sends(i + 1, run.ready(i + 1))


def _execute(prog: Program, state: RankState | DirectState, group: dist.ProcessGroup | None,
             timeout: float, stats: P2PStats) -> None:
    """Run every step of ``prog`` on ``state``."""
    run = StepExchange(prog, state, group, timeout, stats)
    try:
        if prog.steps and not run.grouped:
            _begin_step(prog.steps[0], run, 0)
            run.post_sends(0, run.ready(0))
        for i, st in enumerate(prog.steps):
            # both looked up here on every step (not bound once), so that tests can wrap them
            _run_step(st, run, i)
    finally:
        run.release()


def run_p2p(
    tensor: torch.Tensor,
    pipeline: str | Pipeline,
    *,
    group: dist.ProcessGroup | None = None,
    call: int,
    timeout: float,
    tile_elems: int | None = None,
    dtype: torch.dtype | None = None,
    op: str = "sum",
    consume: bool = False,
    backend: str = "auto",
    stats: P2PStats | None = None,
    check: str = "every",
    states: dict | None = None,
) -> torch.Tensor:
    """All-reduce (sum) a flat float32 tensor over ``group`` with ``pipeline``.

    Every rank of ``group`` must call it with the same pipeline, length, ``call``, ``dtype``,
    ``op`` and tile size; this is checked before any data moves (with ``check="first"``, only
    on the first call of each kind, see below).

    Args:
        tensor: float32[d], 1-D, contiguous, ``d >= 1``; not modified unless ``consume``.
        pipeline: Pipeline, registered name or spec string.
        group: Process group (default: the world).
        call: Call counter, part of every random stream; the caller counts calls so that all
            ranks pass the same value (:func:`dynamiq.collectives.api.all_reduce` does).
        timeout: Seconds (a real number or a ``timedelta``) to wait for any one message
            (and for the metadata check); finite, positive, at most :data:`MAX_TIMEOUT`.
        tile_elems: Coordinates per message for chunks larger than that (rounded down to a
            multiple of the pipeline's block size); default
            :func:`~dynamiq.collectives.tiling.default_tile` (:data:`TILE_ELEMS` for the FP32
            passthrough, at least two tiles per chunk for compressed pipelines).
        dtype: The caller's dtype before widening to float32, checked to agree across ranks
            (default: ``tensor.dtype``).
        op: ``"sum"`` or ``"avg"``, only checked to agree across ranks: the result is the sum.
        consume: Use ``tensor`` itself as the accumulator instead of a copy (saves a pass over
            the data when the caller's tensor is a scratch copy anyway); its values are then
            unspecified, and the result may share its memory. When the call raises after it
            began writing into ``tensor``, the exception has the attribute
            :data:`ACCUMULATOR_WRITTEN` set to ``True``; without it, ``tensor`` is untouched.
        backend: Kernel backend of the transforms, the metadata statistics and the hops:
            ``"auto"`` (Triton for CUDA tensors, i.e. NCCL; Numba for CPU tensors, i.e. gloo),
            ``"numba"`` or ``"triton"``. Backends give the same bits, so ranks need not agree.
        stats: Filled with this rank's statistics of the call when it succeeds (see
            :class:`P2PStats`).
        check: ``"every"``: exchange the call's fingerprint on every call. ``"first"``: only
            when this process has not yet seen every rank agree on a call of the same group,
            pipeline, size, dtype, op and tile size (since the last
            :func:`~dynamiq.collectives.agreement.reset_call_counters`); a call that skips it
            trusts ``call`` to agree, as it does when the caller counts calls per kind.
        states: The codecs' state carried between calls (allocator warm starts, auto-scale
            factors), updated in place: a caller that keeps its own, e.g. one per DDP bucket
            that goes into a checkpoint, passes it here (start with ``{}``). Default: the
            executor's own, one per (group, pipeline, size). Every rank's must hold the same
            values, as the executor's own do.

    Returns:
        float32[d], the all-reduced sum, bit-identical on every rank and equal to
        ``simulate(pipeline, inputs, call=call).results[rank]``.

    Raises:
        TypeError: ``tensor`` is not a 1-D float32 tensor, ``timeout`` not a number or
            ``timedelta``, ``stats`` not a :class:`P2PStats`, or ``states`` not a dict.
        ValueError: bad ``op``, ``backend``, ``check``, ``tile_elems`` or ``timeout``, or a
            pipeline whose topology does not fit the group size (also at size 1).
        CallMismatchError: the ranks that exchanged the fingerprint disagree on the call
            (raised on every rank before any data moves; the group stays usable). When only
            some ranks exchange it (``check="first"``, and the others have seen their own call
            agreed before), the ranks time out instead: those in the exchange name it, the
            others the step they waited in.
        RuntimeError: a peer failed or closed its connection (names the step and the peer).
        TimeoutError: a peer did not take part within ``timeout`` seconds (names the step and
            the peer).
    """
    t0 = time.perf_counter()
    p = get_pipeline(pipeline)
    timeout = check_timeout(timeout)
    if not isinstance(tensor, torch.Tensor) or tensor.dtype != torch.float32 or tensor.dim() != 1:
        raise TypeError("run_p2p needs a 1-D float32 tensor")
    if not tensor.is_contiguous():
        raise ValueError("run_p2p needs a contiguous tensor")
    if tensor.numel() == 0:
        raise ValueError("cannot all-reduce an empty tensor")
    if op not in OPS:
        raise ValueError(f"op must be one of {OPS}, got {op!r}")
    if check not in CHECKS:
        raise ValueError(f"check must be one of {CHECKS}, got {check!r}")
    if stats is not None and not isinstance(stats, P2PStats):
        raise TypeError(f"stats must be a P2PStats, got {type(stats).__name__}")
    if states is not None and not isinstance(states, dict):
        raise TypeError(f"states must be a dict, got {type(states).__name__}")
    resolve_backend(backend, tensor.device)  # a bad or unavailable backend fails here, clearly
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("torch.distributed is not initialized; call "
                           "torch.distributed.init_process_group first")
    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError("this process is not a member of the given process group")
    tile = default_tile(p, tensor.numel(), world) if tile_elems is None else int(tile_elems)
    if tile < 1:
        raise ValueError(f"tile_elems must be >= 1, got {tile_elems!r}")
    d = tensor.numel()
    spec = str(p)
    done = P2PStats(rank, world, d, call, spec)
    # raises the same ValueError on every rank, before anyone waits for anyone (and at world
    # size 1 too, where the result is a copy: a pipeline that cannot run there is a mistake)
    p.topology.check_world_size(world)
    if world == 1:
        out = tensor if consume else tensor.clone()
        done.seconds = time.perf_counter() - t0
        if stats is not None:
            stats.update(done)
        return out
    dtype = tensor.dtype if dtype is None else dtype
    kind = (PROGRAM_CACHE.group_key(group), spec, d, dtype, op, tile)
    if check == "every" or kind not in AGREED_CALLS:
        t1 = time.perf_counter()
        done.metadata_bytes = check_call(group, rank, world, tensor.device, timeout, numel=d,
                                         dtype=dtype, pipeline=spec, op=op, call=call,
                                         tile_elems=tile)
        done.metadata_seconds = time.perf_counter() - t1
        done.checked = True
        AGREED_CALLS.add(kind)
    y = tensor if consume else tensor.clone()
    y, lengths = apply_transforms(p, y, call, backend)
    # only the caller's own memory makes a failure worth flagging (transforms may copy)
    in_place = consume and y.data_ptr() == tensor.data_ptr()
    writing = False
    try:
        length = y.numel()
        prog = PROGRAM_CACHE.program(p, world, length, tile, group, rank, y.device)
        plan = TiledPlan(prog.layout, call, backend)
        states = prog.states if states is None else states
        with prog.lock:
            values, reduces = local_metadata(p, y, states, backend)
            glob: dict[str, torch.Tensor] = {}
            if values:
                t1 = time.perf_counter()
                glob, nbytes = exchange_metadata(group, values, reduces, y.device, timeout)
                done.metadata_seconds += time.perf_counter() - t1
                done.metadata_bytes += nbytes
                done.metadata_bits = p.metadata_bits(length)
            plan.set_metadata(glob, states)
            done.stats = plan.stats if values else None
            writing = in_place  # centering and the steps write into the accumulator
            y = center_and_prepare(plan, y)
            if prog.variable:
                prog.cut(plan, Plan.wire_bytes)
            state = (DirectState(plan, y) if prog.direct
                     else RankState(plan, rank, y, prog.send_buffers))
            _execute(prog, state, group, timeout, done)
            y = undo_transforms(plan, state.acc, lengths, states)
    except BaseException as e:
        if writing:
            setattr(e, ACCUMULATOR_WRITTEN, True)
        raise
    done.seconds = time.perf_counter() - t0
    if stats is not None:
        stats.update(done)
    return y[:d]
