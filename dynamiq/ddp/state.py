""":class:`DynamiQState`: what the DDP communication hook keeps between buckets and steps.

The state follows the shape of torch's PowerSGD hook: an object the user builds once per
process and passes to ``register_comm_hook`` with :func:`~dynamiq.ddp.hook.dynamiq_hook`. It
holds the settings, the step counter, the call counter that keys every compressed call's
random numbers, the codecs' per-bucket state (auto-scale factors, the allocator's last
multiplier) and running statistics of what was sent. Everything but the process group
survives pickling, so a checkpoint of the state resumes the same sequence of calls.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

from dynamiq.collectives.p2p import P2PStats
from dynamiq.collectives.transport import check_timeout
from dynamiq.kernels.backend import backend_names
from dynamiq.pipeline import get_pipeline

__all__ = ["DEFAULT_MIN_COMPRESS_NUMEL", "BucketKey", "DynamiQState", "HookStats"]

#: Buckets with fewer coordinates go through the plain all-reduce by default: a message that
#: small is bound by latency, not by bytes, so compressing it saves nothing.
DEFAULT_MIN_COMPRESS_NUMEL = 1 << 16

#: A bucket's identity for its codec state: (bucket index, coordinates, dtype name).
BucketKey = tuple[int, int, str]


@dataclass
class HookStats:
    """Running totals of what the hook did on this rank since the last :meth:`reset`.

    Attributes:
        compressed_calls, plain_calls: Buckets reduced through the pipeline, and through the
            plain all-reduce (the first ``start_iter`` steps, small buckets, world size 1).
        compressed_numel, plain_numel: Coordinates in those buckets.
        bytes_sent: Payload bytes this rank sent in compressed calls (metadata excluded).
        metadata_bytes: Bytes of the compressed calls' metadata collectives.
        plain_bytes: Bytes a ring all-reduce of the plain buckets sends per rank,
            ``2 (w - 1) / w`` times their size in their dtype (an estimate: torch's backend
            chooses its own algorithm).
        seconds: Wall time of the compressed calls on the background thread.
        codec_seconds, wire_seconds, wait_seconds, metadata_seconds: Its split (see
            :class:`~dynamiq.collectives.p2p.P2PStats`).
        plain_seconds: Wall time of the plain all-reduces on the background thread.
    """

    compressed_calls: int = 0
    plain_calls: int = 0
    compressed_numel: int = 0
    plain_numel: int = 0
    bytes_sent: int = 0
    metadata_bytes: int = 0
    plain_bytes: int = 0
    seconds: float = 0.0
    codec_seconds: float = 0.0
    wire_seconds: float = 0.0
    wait_seconds: float = 0.0
    metadata_seconds: float = 0.0
    plain_seconds: float = 0.0

    @property
    def bits_per_coord(self) -> float:
        """Payload bits per coordinate of the compressed calls (0 before any)."""
        return 8.0 * self.bytes_sent / self.compressed_numel if self.compressed_numel else 0.0

    def add_compressed(self, s: P2PStats) -> None:
        """Count one compressed call's statistics."""
        self.compressed_calls += 1
        self.compressed_numel += s.numel
        self.bytes_sent += s.bytes_sent
        self.metadata_bytes += s.metadata_bytes
        self.seconds += s.seconds
        self.codec_seconds += s.codec_seconds
        self.wire_seconds += s.wire_seconds
        self.wait_seconds += s.wait_seconds
        self.metadata_seconds += s.metadata_seconds

    def add_plain(self, numel: int, nbytes: int, world_size: int, seconds: float) -> None:
        """Count one plain all-reduce of ``numel`` coordinates taking ``nbytes``."""
        self.plain_calls += 1
        self.plain_numel += numel
        self.plain_bytes += int(2 * (world_size - 1) * nbytes / max(world_size, 1))
        self.plain_seconds += seconds

    def reset(self) -> HookStats:
        """Zero every total; returns a copy of the totals before."""
        before = dataclasses.replace(self)
        for f in dataclasses.fields(self):
            setattr(self, f.name, f.default)
        return before


class DynamiQState:
    """State of :func:`~dynamiq.ddp.hook.dynamiq_hook` on one process.

    Build one per process, on every rank with the same arguments, after
    ``torch.distributed.init_process_group``::

        state = DynamiQState(pipeline="dynamiq", start_iter=1)
        ddp_model.register_comm_hook(state, dynamiq_hook)

    Args:
        pipeline: Pipeline (registered name such as ``"dynamiq"``, ``"mxfp8"``,
            ``"passthrough-fp32"``, a spec string, or a :class:`~dynamiq.pipeline.Pipeline`);
            its topology must fit the group size.
        process_group: The group DDP reduces over (default: the world).
        start_iter: Steps (backward passes that reach DDP's last bucket) reduced with the plain
            all-reduce before compression starts. DDP rebuilds its buckets after the first
            step, so ``1`` (the default) compresses the rebuilt buckets only.
        min_compress_numel: Buckets with fewer coordinates always take the plain all-reduce.
        timeout: Seconds to wait for any one peer in a compressed call (see
            :func:`dynamiq.all_reduce`).
        backend: Kernel backend (``"auto"``: Numba for CPU tensors, Triton for CUDA ones).
        private_group: Reduce over a new process group with the same ranks (created here, so
            every rank must build its state at the same point of the program), so that the
            hook's traffic, which runs on a background thread, never interleaves with other
            collectives on ``process_group`` (e.g. DDP's own, or the unused-parameter map).
            ``False`` uses ``process_group`` itself: then nothing else may communicate on it
            while a backward pass runs.

    Attributes:
        iter: Steps seen so far.
        calls: Compressed calls issued so far (numbers each call's random streams).
        bucket_states: Codec state per bucket, keyed by :data:`BucketKey`.
        layout: DDP's rebuilt buckets as positions of their parameters (see
            :meth:`positions`), recorded in this process's second step; after a resume the
            hook splits DDP's first-step bucket into them, so that the resumed run reduces
            exactly the vectors the uninterrupted one did. (A state pickled before that
            has none: its first resumed step reduces DDP's single first-step bucket.)
        stats: :class:`HookStats` totals (call ``stats.reset()`` to read and restart them).

    Raises:
        ValueError: a bad ``start_iter``, ``min_compress_numel``, ``timeout`` or ``backend``,
            an unknown pipeline, or one whose topology does not fit the group.
        RuntimeError: ``torch.distributed`` is not initialized.
    """

    def __init__(self, pipeline="dynamiq", process_group: dist.ProcessGroup | None = None, *,
                 start_iter: int = 1, min_compress_numel: int = DEFAULT_MIN_COMPRESS_NUMEL,
                 timeout: float = 300.0, backend: str = "auto",
                 private_group: bool = True) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("DynamiQState needs torch.distributed to be initialized; call "
                               "torch.distributed.init_process_group first")
        for name, v in (("start_iter", start_iter), ("min_compress_numel", min_compress_numel)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{name} must be an int >= 0, got {v!r}")
        if backend not in backend_names():
            raise ValueError(f"unknown kernel backend {backend!r}; known: {backend_names()}")
        p = get_pipeline(pipeline)
        world = dist.get_world_size(process_group)
        if world > 1:
            p.topology.check_world_size(world)
        self.pipeline = str(p)
        self.start_iter = start_iter
        self.min_compress_numel = min_compress_numel
        self.timeout = check_timeout(timeout)
        self.backend = backend
        self.private_group = private_group
        self.iter = 0
        self.calls = 0
        self.bucket_states: dict[BucketKey, dict] = {}
        self.stats = HookStats()
        self.layout: tuple[tuple[int, ...], ...] | None = None
        self._forget_process_local()
        self._bind(process_group)

    def _forget_process_local(self) -> None:
        # which parameter tensor is which in this process (not pickled: ids are per process)
        self._positions: dict[int, int] = {}
        self._local_steps = 0
        self._seen: dict[int, tuple[int, ...]] = {}

    def _bind(self, process_group: dist.ProcessGroup | None) -> None:
        self.process_group = process_group
        self.world_size = dist.get_world_size(process_group)
        self.group = process_group
        if self.private_group and self.world_size > 1:
            ranks = dist.get_process_group_ranks(process_group or dist.group.WORLD)
            self.group = dist.new_group(ranks)

    def compresses(self, numel: int) -> bool:
        """Whether a bucket of ``numel`` coordinates is compressed at the current step."""
        return (self.world_size > 1 and self.iter >= self.start_iter
                and numel >= max(self.min_compress_numel, 1))

    def next_call(self) -> int:
        """The next compressed call's number (counted on every rank alike)."""
        c = self.calls
        self.calls += 1
        return c

    def codec_state(self, key: BucketKey) -> dict:
        """The codec state of bucket ``key`` (a new empty one at first)."""
        return self.bucket_states.setdefault(key, {})

    def positions(self, params: list[torch.Tensor]) -> tuple[int, ...]:
        """The positions of a bucket's parameters in this process's canonical order: the order
        in which the hook first met them, i.e. DDP's order in its first step (built the same
        way by every process that wraps the same model, resumed ones included)."""
        out = []
        for p in params:
            out.append(self._positions.setdefault(id(p), len(self._positions)))
        return tuple(out)

    def note_bucket(self, index: int, positions: tuple[int, ...]) -> None:
        """Record bucket ``index``'s parameters during this process's second step, when DDP
        runs its rebuilt buckets; at the end of that step they become :attr:`layout`."""
        if self._local_steps == 1 and self.layout is None:
            self._seen[index] = positions

    def split(self, positions: tuple[int, ...]) -> list[int] | None:
        """The :attr:`layout` buckets that make up a bucket holding ``positions``, in index
        order, when it is a union of them other than one bucket in the same order (DDP's
        first-step bucket in a process that resumed from a checkpoint: one bucket of every
        parameter, which may also be a single rebuilt bucket in another order); else
        ``None``."""
        if self.layout is None:
            return None
        have = set(positions)
        parts = [k for k, b in enumerate(self.layout) if have.issuperset(b)]
        if not parts or sum(len(self.layout[k]) for k in parts) != len(positions):
            return None
        if len(parts) == 1 and self.layout[parts[0]] == tuple(positions):
            return None  # already the recorded bucket
        return parts

    def end_step(self) -> None:
        """Count a step (the hook calls it after DDP's last bucket)."""
        self.iter += 1
        self._local_steps += 1
        if self._local_steps == 2 and self.layout is None and self._seen:
            self.layout = tuple(self._seen[k] for k in sorted(self._seen))
            self._seen = {}

    def __getstate__(self) -> dict:
        """Everything but the process groups (not picklable); see :meth:`__setstate__`."""
        local = ("process_group", "group", "_positions", "_local_steps", "_seen")
        d = {k: v for k, v in self.__dict__.items() if k not in local}
        d["bucket_states"] = _to_cpu(self.bucket_states)
        return d

    def __setstate__(self, d: dict) -> None:
        """Restore a pickled state over the default group (the world), or over
        ``process_group`` when :meth:`bind` is called next. The codec state stays on the CPU
        until the next call moves what it needs."""
        self.__dict__.update(d)
        self._forget_process_local()
        self.process_group = self.group = None
        if dist.is_available() and dist.is_initialized():
            self._bind(None)

    def bind(self, process_group: dist.ProcessGroup | None) -> DynamiQState:
        """Reduce over ``process_group`` from now on (after unpickling a state for a subgroup;
        creates the private group again). Returns ``self``."""
        self._bind(process_group)
        return self

    def __repr__(self) -> str:
        return (f"DynamiQState(pipeline={self.pipeline!r}, world_size={self.world_size}, "
                f"iter={self.iter}, calls={self.calls}, start_iter={self.start_iter}, "
                f"min_compress_numel={self.min_compress_numel}, "
                f"bits_per_coord={_fmt(self.stats.bits_per_coord)})")


def _fmt(x: float) -> str:
    return "nan" if math.isnan(x) else f"{x:.3g}"


def _to_cpu(obj):
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj
