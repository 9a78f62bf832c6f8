"""What the ranks agree on before any data moves: the call, its counter, the global metadata.

Randomness and agreement. Each process counts its calls per (group, pipeline, size) in
:class:`CallCounters`; the count keys the random numbers, so successive calls draw fresh
randomness and every rank agrees on it without communication. Before any data moves, the ranks
compare a fingerprint of the call (pipeline, length, dtype, op, call counter, tile size) with
one ``all_reduce`` (:func:`check_call`); a mismatch raises :class:`CallMismatchError` (a
``RuntimeError``) on every rank, naming what differs (when the pipelines differ, a second small
``all_reduce`` brings every rank's spec string for the message). A peer that does not show up
within ``timeout`` seconds raises ``TimeoutError`` (the check is a collective: it knows that
some rank is missing, not which). Then :func:`exchange_metadata` combines the pipeline's
metadata statistics across ranks.

The fingerprint exchange is a full collective round trip (milliseconds on a loaded machine),
so an executor may run it once per kind of call: :class:`AgreedCalls` remembers the calls
(group, pipeline, size, dtype, op, tile size) whose check succeeded, and later calls of the same
kind skip it. Their call counters still agree, because every rank counts the same calls of that
kind and a refused call is counted nowhere. A refused call that stays counted (later calls of
its group, pipeline and size were already queued behind it, see :mod:`dynamiq.collectives.api`)
makes those kinds be checked again (:meth:`AgreedCalls.forget`), so the shifted count is caught.
"""

from __future__ import annotations

import threading
import weakref
import zlib

import torch
import torch.distributed as dist

from dynamiq.collectives.transport import start_all_gather, start_all_reduce, translated, wait
from dynamiq.metadata import STATISTICS, combine, pack_bf16, unpack_bf16

__all__ = ["AGREED_CALLS", "CALL_COUNTERS", "GATHER_BELOW", "OPS", "AgreedCalls", "CallCounters",
           "CallMismatchError", "check_call", "exchange_metadata", "reset_call_counters"]


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


# ---- call counters ----------------------------------------------------------------------------
class CallCounters:
    """Calls issued so far per ``(group key, pipeline spec, numel)``.

    The group key is a weak reference (see :mod:`dynamiq.collectives.buffers`): a counter must
    not keep a destroyed process group alive, and goes with its group (:meth:`forget_group`).
    """

    def __init__(self) -> None:
        # reentrant: a group's finalizer (forget_group) may run wherever the group's last
        # reference goes, also while this thread holds the lock
        self._lock = threading.RLock()
        self._calls: dict[tuple, int] = {}

    def next(self, key: tuple) -> int:
        """Count a call of ``key`` and return its number (0 for the first)."""
        with self._lock:
            call = self._calls.get(key, 0)
            self._calls[key] = call + 1
        return call

    def undo(self, key: tuple, call: int) -> bool:
        """Uncount ``call`` of ``key`` (refused on every rank), unless a later call of the same
        key was issued meanwhile: renumbering that one is impossible once it is queued.

        Returns:
            Whether the call was uncounted.
        """
        with self._lock:
            if self._calls.get(key) != call + 1:
                return False
            if call:
                self._calls[key] = call
            else:
                del self._calls[key]
            return True

    def reset(self) -> None:
        """Restart every counter at 0."""
        with self._lock:
            self._calls.clear()

    def forget_group(self, group_ref: weakref.ref) -> None:
        """Drop the counters of a freed group."""
        with self._lock:
            for key in [k for k in self._calls if k[0] is group_ref]:
                del self._calls[key]

    def holds(self, group_ref: weakref.ref) -> bool:
        """Whether a counter of the group with key ``group_ref`` is kept."""
        with self._lock:
            return any(k[0] is group_ref for k in self._calls)


#: The counters of :func:`dynamiq.all_reduce`.
CALL_COUNTERS = CallCounters()


class AgreedCalls:
    """Kinds of calls whose fingerprint check succeeded, per group (see the module docstring).

    A kind is ``(group key, pipeline spec, numel, dtype, op, tile size)``; the group key is the
    weak reference of :mod:`dynamiq.collectives.buffers`, so the kinds of a freed group go
    with it (:meth:`forget_group`).
    """

    def __init__(self) -> None:
        # reentrant for the same reason as CallCounters
        self._lock = threading.RLock()
        self._kinds: set[tuple] = set()

    def __contains__(self, kind: tuple) -> bool:
        with self._lock:
            return kind in self._kinds

    def add(self, kind: tuple) -> None:
        """Remember that every rank agreed on a call of ``kind``."""
        with self._lock:
            self._kinds.add(kind)

    def reset(self) -> None:
        """Forget every kind: the next call of each is checked again."""
        with self._lock:
            self._kinds.clear()

    def forget(self, key: tuple) -> None:
        """Forget the kinds of the calls counted under ``key`` (``(group key, pipeline spec,
        numel)``, as :class:`CallCounters` counts them): their next calls are checked again."""
        with self._lock:
            self._kinds = {k for k in self._kinds if k[:3] != key}

    def forget_group(self, group_ref: weakref.ref) -> None:
        """Drop the kinds of a freed group."""
        with self._lock:
            self._kinds = {k for k in self._kinds if k[0] is not group_ref}

    def holds(self, group_ref: weakref.ref) -> bool:
        """Whether a kind of the group with key ``group_ref`` is kept."""
        with self._lock:
            return any(k[0] is group_ref for k in self._kinds)


#: The agreed kinds of calls of the P2P executor (``check="first"``).
AGREED_CALLS = AgreedCalls()


def reset_call_counters() -> None:
    """Restart every call counter at 0 (all ranks must do it at the same point).

    The fingerprint of the next call of every kind is exchanged again, so counters that had
    drifted apart are caught there.
    """
    CALL_COUNTERS.reset()
    AGREED_CALLS.reset()


# ---- the call's fingerprint -------------------------------------------------------------------
_DTYPE_CODES = {torch.float32: 1, torch.bfloat16: 2, torch.float16: 3, torch.float64: 4}
_DTYPE_NAMES = {v: str(k).removeprefix("torch.") for k, v in _DTYPE_CODES.items()}
#: The reduction ops an executor accepts.
OPS = ("sum", "avg")
_FIELDS = ("numel", "dtype", "pipeline", "op", "call", "tile")
_SPEC_CHARS = 240


def _crc(text: str) -> int:
    return zlib.crc32(text.encode())


def _describe(name: str, value: int, specs: dict[int, str]) -> str:
    if name == "dtype":
        return _DTYPE_NAMES.get(value, f"dtype #{value}")
    if name == "op":
        return OPS[value] if 0 <= value < len(OPS) else f"op #{value}"
    if name == "pipeline":
        return repr(specs[value]) if value in specs else f"a pipeline with crc32 {value:#010x}"
    if name == "numel":
        return f"{value} elements"
    if name == "tile":
        return f"tiles of {value} elements"
    return f"call {value}"


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
    with translated(where, late, failed, "a peer"):
        work = start_all_reduce(buf, group, timeout)
    wait(work, timeout, where, late, failed, "a peer")
    specs = {}
    for row in buf.cpu().tolist():
        text = bytes(v for v in row if v).decode(errors="replace")
        specs[_crc(text)] = text
    specs[_crc(spec)] = spec  # this rank's full string, even when longer than the cut
    return specs


def check_call(
    group: dist.ProcessGroup | None, rank: int, world: int, device: torch.device,
    timeout: float, *, numel: int, dtype: torch.dtype, pipeline: str, op: str, call: int,
    tile_elems: int,
) -> int:
    """All-reduce every rank's fingerprint of the call; raise on every rank if they differ.

    Args:
        group: The process group (``None``: the world).
        rank, world: This rank in ``group``, and the group's size.
        device: Where the fingerprint travels from (the data's device).
        timeout: Seconds to wait for every rank.
        numel, dtype, pipeline, op, call, tile_elems: The call: the caller's size and dtype,
            the pipeline's spec string, ``"sum"`` or ``"avg"``, the call counter and the tile
            size.

    Returns:
        Bytes of the all-reduced fingerprint.

    Raises:
        CallMismatchError: the ranks disagree (on every rank; the group stays usable).
        TimeoutError: not every rank took part within ``timeout``.
        RuntimeError: a peer closed its connection.
    """
    mine = {"numel": numel, "dtype": _DTYPE_CODES.get(dtype, _crc(str(dtype)) & 0xFFFF),
            "pipeline": _crc(pipeline), "op": OPS.index(op), "call": call, "tile": tile_elems}
    # each rank fills its own row; the sum is an all-gather that NCCL and gloo both run
    meta = torch.zeros(world, len(_FIELDS), dtype=torch.int64, device=device)
    meta[rank] = torch.tensor([mine[f] for f in _FIELDS], dtype=torch.int64)
    where = "metadata exchange before step 0"
    late = (f"not all {world} ranks joined within {timeout}s (a rank did not call all_reduce, "
            "or is still busy in another collective)")
    with translated(where, late, "failed", "a peer"):
        work = start_all_reduce(meta, group, timeout)
    wait(work, timeout, where, late, "failed", "a peer")
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


# ---- the metadata phase -----------------------------------------------------------------------
#: Below this many ranks the statistics travel as an all-gather of 16 bits per value, which
#: then sends ``2 (n − 1)`` bytes per value and rank against ``16 (n − 1) / n`` for a float64
#: all-reduce.
GATHER_BELOW = 8


def exchange_metadata(group: dist.ProcessGroup | None, values: dict[str, torch.Tensor],
                      reduces: dict[str, str], device: torch.device, timeout: float
                      ) -> tuple[dict[str, torch.Tensor], int]:
    """Global metadata: the declared statistics, and any codec's own values.

    Below :data:`GATHER_BELOW` ranks the declared statistics (names of
    :data:`~dynamiq.metadata.STATISTICS`, combined as they declare) travel in one all-gather of
    16 bits per value (:func:`~dynamiq.metadata.pack_bf16`, exact) and every rank combines them
    in rank order; everything else goes through one float64 all-reduce per reduction kind.
    The global values are the same either way (exact float64 sums, maxima).

    Args:
        group: The process group (``None``: the world).
        values: This rank's metadata, name → float64 tensor.
        reduces: How each is combined across ranks, name → ``"sum" | "max"``.
        device: Where the values travel from.
        timeout: Seconds to wait for every rank.

    Returns:
        The global values by name, and the bytes this rank contributed (the tensors it
        all-gathered or all-reduced).
    """
    out: dict[str, torch.Tensor] = {}
    nbytes = 0
    where = "metadata statistics before step 0"
    late = f"not all ranks joined within {timeout}s"
    world = dist.get_world_size(group)
    packed = {n: v for n, v in values.items()
              if world < GATHER_BELOW and n in STATISTICS and reduces[n] == STATISTICS[n].reduce}
    if packed:
        # as bytes: gloo all-gathers no int16
        mine = pack_bf16({n: v.cpu() for n, v in packed.items()}).view(torch.uint8).to(device)
        parts = [torch.empty_like(mine) for _ in range(world)]
        with translated(where, late, "failed", "a peer"):
            work = start_all_gather(mine, parts, group, timeout)
        wait(work, timeout, where, late, "failed", "a peer")
        nbytes += mine.numel() * mine.element_size()
        sizes = {n: v.numel() for n, v in packed.items()}
        per_rank = [unpack_bf16(p.cpu().view(torch.int16), sizes) for p in parts]
        out.update(combine(per_rank, {n: reduces[n] for n in packed}))
    for kind, op in (("sum", dist.ReduceOp.SUM), ("max", dist.ReduceOp.MAX)):
        names = [n for n in values if reduces[n] == kind and n not in packed]
        if not names:
            continue
        t = torch.cat([values[n] for n in names]).to(device)
        with translated(where, late, "failed", "a peer"):
            work = start_all_reduce(t, group, timeout, op)
        wait(work, timeout, where, late, "failed", "a peer")
        nbytes += t.numel() * t.element_size()
        t = t.cpu()
        off = 0
        for n in names:
            k = values[n].numel()
            out[n] = t[off:off + k]
            off += k
    return {n: out[n] for n in values}, nbytes
