"""P2P executor: runs a pipeline's schedule over ``torch.distributed`` point-to-point messages.

Every rank runs the per-rank logic of :mod:`dynamiq.collectives.engine` on its own data and
moves bytes with ``isend``/``irecv`` (grouped by ``batch_isend_irecv`` on CUDA), so its result
equals :func:`dynamiq.collectives.simulator.simulate` bit for bit, on every rank. Only the calls
NCCL also offers are used (point-to-point ops, and an ``all_reduce`` of a small int64 tensor for
the metadata check), on the caller's process ``group``; on the CPU the backend is gloo.

A call goes through the modules next to this one:

* :mod:`~dynamiq.collectives.agreement`: the ranks check that they agree on the call (raising
  :class:`CallMismatchError` on every rank if not) and combine the metadata statistics;
* :mod:`~dynamiq.collectives.buffers`: the rank's cached program (tiled schedule, receive
  buffers, codec state), per process group;
* :mod:`~dynamiq.collectives.tiling`: chunks larger than ``tile_elems`` travel as several
  messages, so compression and transfer overlap, with the bits of the untiled schedule;
* :mod:`~dynamiq.collectives.transport`: every wait has a deadline and every backend error is
  translated into a ``TimeoutError`` or ``RuntimeError`` naming the step and the peer.

Per-call statistics (bytes sent, messages, metadata cost, time) are written into a
:class:`P2PStats` that the caller passes in (``stats=``).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from dynamiq.collectives.agreement import OPS, CallMismatchError, check_call, exchange_metadata
from dynamiq.collectives.buffers import PROGRAM_CACHE, Step
from dynamiq.collectives.engine import (
    Plan,
    RankState,
    apply_transforms,
    center_and_prepare,
    local_metadata,
    undo_transforms,
)
from dynamiq.collectives.tiling import TILE_ELEMS, TiledPlan
from dynamiq.collectives.transport import (
    MAX_TIMEOUT,
    check_timeout,
    global_rank,
    peer_name,
    translated,
    wait,
)
from dynamiq.kernels.backend import resolve_backend
from dynamiq.pipeline import Pipeline, get_pipeline

__all__ = ["MAX_TIMEOUT", "TILE_ELEMS", "CallMismatchError", "P2PStats", "clear_cache",
           "run_p2p"]


@dataclass
class P2PStats:
    """What one rank did in one all-reduce call.

    Pass an instance as ``stats=`` to :func:`dynamiq.all_reduce` or :func:`run_p2p`: every
    field is written when the call succeeds (after ``wait()`` for an asynchronous call), and
    the instance is left as it was when the call raises. One instance can be reused for
    successive calls; it then describes the latest one.

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
            :mod:`dynamiq.metadata`).
        seconds: Wall time of the call on this rank.
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
    seconds: float = 0.0
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


def _run_step(st: Step, state: RankState, group: dist.ProcessGroup | None, timeout: float,
              stats: P2PStats) -> None:
    """Run one step of this rank's program: its sends and receives, round by round."""
    src = global_rank(group, st.recv_peer) if st.recvs else -1
    dst = global_rank(group, st.send_peer) if st.sends else -1
    where = f"step {st.index}"
    inward = peer_name(group, st.recv_peer) if st.recvs else ""
    outward = peer_name(group, st.send_peer) if st.sends else ""
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
                with translated(where, f"exchanging with {peers} timed out",
                                 f"exchanging with {peers} failed", peers):
                    works = dist.batch_isend_irecv(ops)
                per_op = works if len(works) == len(ops) else [works[-1]] * len(ops)
                if receiving:
                    recv_works.append(per_op[0])
                if sending:
                    send_works.append(per_op[-1])
                continue
            if receiving:
                with translated(where, recv_late, recv_failed, inward):
                    recv_works.append(dist.irecv(st.bufs[k], src, group=group))
            if sending:
                with translated(where, send_late, send_failed, outward):
                    send_works.append(dist.isend(data, dst, group=group))
        for t, buf, work in zip(st.recvs, st.bufs, recv_works):
            wait(work, timeout, where, recv_late, recv_failed, inward)
            state.receive(t, buf)
            stats.bytes_received += buf.numel()
        for work in send_works:
            wait(work, timeout, where, send_late, send_failed, outward)
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
    group: dist.ProcessGroup | None = None,
    call: int,
    timeout: float,
    tile_elems: int | None = None,
    dtype: torch.dtype | None = None,
    op: str = "sum",
    consume: bool = False,
    backend: str = "auto",
    stats: P2PStats | None = None,
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
        stats: Filled with this rank's statistics of the call when it succeeds (see
            :class:`P2PStats`).

    Returns:
        float32[d], the all-reduced sum, bit-identical on every rank and equal to
        ``simulate(pipeline, inputs, call=call).results[rank]``.

    Raises:
        TypeError: ``tensor`` is not a 1-D float32 tensor, ``timeout`` not a number or
            ``timedelta``, or ``stats`` not a :class:`P2PStats`.
        ValueError: bad ``op``, ``backend``, ``tile_elems`` or ``timeout``, or a pipeline whose
            topology does not fit the group size (also at size 1).
        CallMismatchError: the ranks disagree on the call (raised on every rank before any
            data moves; the group stays usable).
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
    if stats is not None and not isinstance(stats, P2PStats):
        raise TypeError(f"stats must be a P2PStats, got {type(stats).__name__}")
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
    done.metadata_bytes = check_call(
        group, rank, world, tensor.device, timeout, numel=d,
        dtype=tensor.dtype if dtype is None else dtype, pipeline=spec, op=op, call=call,
        tile_elems=tile,
    )
    y = tensor if consume else tensor.clone()
    y, lengths = apply_transforms(p, y, call, backend)
    length = y.numel()
    prog = PROGRAM_CACHE.program(p, world, length, tile, group, rank, y.device)
    plan = TiledPlan(prog.layout, call, backend)
    with prog.lock:
        values, reduces = local_metadata(p, y, prog.states, backend)
        glob: dict[str, torch.Tensor] = {}
        if values:
            glob, nbytes = exchange_metadata(group, values, reduces, y.device, timeout)
            done.metadata_bytes += nbytes
            done.metadata_bits = p.metadata_bits(length)
        plan.set_metadata(glob, prog.states)
        done.stats = plan.stats if values else None
        y = center_and_prepare(plan, y)
        if prog.variable:
            prog.cut(plan, Plan.wire_bytes)
        state = RankState(plan, rank, y, prog.send_buffers)
        for st in prog.steps:
            _run_step(st, state, group, timeout, done)
        y = undo_transforms(plan, state.acc, lengths, prog.states)
    done.seconds = time.perf_counter() - t0
    if stats is not None:
        stats.update(done)
    return y[:d]
