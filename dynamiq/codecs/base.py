"""Partial-sum codecs: the base interface, the hop context and the registry.

A multi-hop all-reduce moves *partial sums*. A codec defines the four hop operations every
executor uses, on a flat float32 chunk ``x`` of ``n`` coordinates and its wire bytes:

* ``compress(x)`` — a leaf's message;
* ``decompress(data)`` — a receiver's view of a message;
* ``decompress_accumulate(data, acc)`` — ``acc += decompress(data)`` (every incoming message of
  an internal node but the last);
* ``decompress_accumulate_recompress(data, acc)`` — ``compress(acc + decompress(data))`` fused
  in one pass (an internal node's last incoming message; the sink's final compression, which
  with ``writeback="decoded"`` also leaves in ``acc`` exactly what every receiver will decode).

Codecs that adapt to the data take part in the call's *metadata phase*: they name the
per-block statistics they need (:attr:`PartialSumCodec.statistics`), may add statistics of their
own (:meth:`PartialSumCodec.local_metadata`), turn the global values into a per-call decision
(:meth:`PartialSumCodec.prepare`, e.g. DynamiQ's bit widths) that reaches every hop through
:class:`HopContext`, and may learn from the final result (:meth:`PartialSumCodec.observe`, e.g.
an auto-scale factor). Their per-tensor state lives in a dict the executor keeps between calls.

Every hop runs its kernels on the backend that ``ctx.backend`` names (:func:`hop_kernels`,
an object of the kernel interface :class:`dynamiq.kernels.Backend`): Numba (and torch) for CPU
tensors, Triton for CUDA tensors by default; every backend gives the same bits.

Codecs are frozen dataclasses registered by name in :data:`CODECS`; their canonical spec string
(``passthrough``, ``passthrough(wire=bf16)``, ``requant(quantizer=dq4_hier)``; parameters at
their defaults are left out) is what pipelines print and parse.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from dynamiq.kernels import Backend, Writeback, backend_for
from dynamiq.registry import Registry
from dynamiq.spec import build

__all__ = [
    "CODECS",
    "HopContext",
    "Metadata",
    "PartialSumCodec",
    "get_codec",
    "hop_kernels",
]

CODECS: Registry[type] = Registry("partial-sum codec")

#: A codec's own metadata of one rank's vector (:meth:`PartialSumCodec.local_metadata`):
#: ``name → (float64 tensor, reduce)``, ``reduce`` in ``("sum", "max")``.
Metadata = dict[str, tuple[torch.Tensor, str]]


@dataclass(frozen=True)
class HopContext:
    """Where a compression happens: it keys the random numbers so that every hop is distinct.

    Attributes:
        seed: Seed shared by all ranks (from the codec).
        stream: Stream ids, e.g. ``(call, chunk)``.
        rank, world_size: The compressing rank and the number of ranks.
        index_offset: Global index of the chunk's first coordinate in the flat vector.
        stats: The metadata phase's global statistics (name → float64 tensor over the whole
            vector), for components that declare ``statistics``.
        prepared: Per-call decisions of the codecs (codec → value of
            :meth:`PartialSumCodec.prepare`), identical on every rank.
        backend: Kernel backend of the hop operations: ``"auto"`` (Triton for CUDA tensors,
            Numba for CPU tensors) or a backend's name (see
            :func:`dynamiq.kernels.resolve_backend`); every backend gives the same bits.
        source: For a hop that *reads* a message, the context its producer compressed it
            under (:attr:`producer`): codecs whose decoding depends on the encoder's random
            numbers (subtractive dithering) regenerate them from its rank and stream. ``None``
            means the message was compressed under this context itself.
        summands: Number of ranks whose contributions a message compressed under this context
            sums (1 at a leaf, the rank's subtree size in the chunk's aggregation tree, the
            world size at the owner); THC's codes of an odd grid depend on its parity.
    """

    seed: int = 0
    stream: tuple[int, ...] = ()
    rank: int = 0
    world_size: int = 1
    index_offset: int = 0
    stats: Mapping[str, torch.Tensor] | None = field(default=None, compare=False, hash=False)
    prepared: Mapping[Any, Any] | None = field(default=None, compare=False, hash=False)
    backend: str = field(default="auto", compare=False, hash=False)
    source: HopContext | None = field(default=None, compare=False, hash=False)
    summands: int = 1

    @property
    def producer(self) -> HopContext:
        """The context the message a hop reads was compressed under (:attr:`source`, else
        this one)."""
        return self if self.source is None else self.source


class PartialSumCodec:
    """Base class of partial-sum codecs (subclasses are frozen dataclasses).

    Attributes:
        block_size: Chunk boundaries must fall on multiples of it (blocks are coded
            independently, so a chunk can be coded alone with the same result).
        lossless: Whether ``decompress(compress(x)) == x`` exactly.
        unbiased: Whether every rank's result is an unbiased estimate of the exact sum.
        statistics: Names (in :data:`dynamiq.metadata.STATISTICS`) of the
            per-block statistics the codec needs from the metadata phase.
        variable_size: Whether :meth:`wire_bytes` depends on the call (it then needs the
            :class:`HopContext` with the prepared decisions).
        wants_compression_factors: Whether :meth:`prepare` takes the keyword
            ``compression_factors`` (the schedule's
            :meth:`~dynamiq.topologies.Schedule.compression_factors`), which the executors
            then pass.
        wants_hop_profile: Whether :meth:`prepare` takes the keyword ``hop_profile`` (the
            schedule's :meth:`~dynamiq.topologies.Schedule.hop_profile`), which the
            executors then pass.
    """

    block_size: int = 1
    lossless: bool = False
    unbiased: bool = False
    statistics: tuple[str, ...] = ()
    variable_size: bool = False
    wants_compression_factors: bool = False
    wants_hop_profile: bool = False
    #: Whether every rank's own contribution is rounded once by :meth:`round_own` before any
    #: hop (the executors then call it on every chunk a rank sends or owns), so that the hops
    #: only add values on a shared grid.
    rounds_own: bool = False

    @classmethod
    def examples(cls) -> list[PartialSumCodec]:
        """Representative instances for tests that run every registered codec (the
        conformance, fuzz and backend-parity tests): its notable configurations. The default
        instance by default; a codec without defaults must override this."""
        try:
            return [cls()]
        except TypeError:
            return []

    def wire_bytes(self, n: int, ctx: HopContext | None = None) -> int:  # pragma: no cover
        """Bytes on the wire for the chunk of ``n`` coordinates that ``ctx`` locates."""
        raise NotImplementedError

    def max_wire_bytes(self, n: int) -> int:
        """An upper bound of :meth:`wire_bytes` over all calls (receive-buffer sizing)."""
        return self.wire_bytes(n)

    def metadata_bits(self, length: int) -> int:
        """Bits per rank this codec adds to the metadata phase for a vector of ``length``,
        beyond its registered :attr:`statistics` (see :meth:`local_metadata`)."""
        return 0

    def local_metadata(self, y: torch.Tensor, state: dict, backend: str = "auto") -> Metadata:
        """Codec-specific metadata of one rank's vector: ``name → (float64 tensor, reduce)``
        with ``reduce`` in ``("sum", "max")``; combined across ranks like the statistics.
        ``backend`` is the call's kernel backend, for a codec that codes values here (the
        same as its hops use, so that a call compiles no other backend's kernels)."""
        return {}

    def prepare(self, stats: Mapping[str, torch.Tensor], length: int, world_size: int,
                state: dict) -> Any:
        """Per-call decision from the global metadata, identical on every rank.

        Args:
            stats: Global statistics (and :meth:`local_metadata` values) by name.
            length: Length of the vector being reduced.
            world_size: Number of ranks.
            state: This codec's per-tensor state (warm starts); the executor keeps it between
                calls of the same pipeline and tensor size.

        Returns:
            Any value; it reaches every hop as ``ctx.prepared[self]``. ``None`` by default.
        """
        return None

    def plan_in(self, ctx: HopContext | None) -> Any:
        """This codec's per-call decision from ``ctx``; ``None`` outside a collective.

        Raises:
            ValueError: ``ctx`` carries the decisions of a call but none for this codec.
        """
        if ctx is None or ctx.prepared is None:
            return None
        if self not in ctx.prepared:
            raise ValueError(f"{self.spec()}: the HopContext carries no prepared plan for this "
                             "codec (run it inside a pipeline: simulate / all_reduce)")
        return ctx.prepared[self]

    def round_own(self, x: torch.Tensor, ctx: HopContext) -> None:
        """Round one rank's own float32 chunk ``x`` in place, once per call, before it enters
        any hop (for codecs with :attr:`rounds_own`): a rounding that cannot be applied to a
        partial sum (THC's non-uniform levels) happens here, where the rank's value is still
        alone. Nothing by default."""

    def observe(self, result: torch.Tensor, prepared: Any, world_size: int, state: dict) -> None:
        """Learn from the all-reduced ``result`` (bit-identical on every rank, so every rank
        updates ``state`` identically without communication). Nothing by default."""

    def compress(self, x: torch.Tensor, ctx: HopContext, out: torch.Tensor | None = None
                 ) -> torch.Tensor:  # pragma: no cover - abstract
        """``uint8[wire_bytes(n)]`` message for the float32 chunk ``x``."""
        raise NotImplementedError

    def decompress(self, data: torch.Tensor, out: torch.Tensor, ctx: HopContext | None = None
                   ) -> torch.Tensor:
        """Decode ``data`` into the float32 tensor ``out`` (its length is the chunk size).

        ``ctx`` may be ``None`` (outside a collective); the backend is then ``"auto"``,
        resolved from ``out``'s device.
        """
        raise NotImplementedError  # pragma: no cover - abstract

    def decompress_accumulate(self, data: torch.Tensor, acc: torch.Tensor,
                              ctx: HopContext | None = None) -> None:
        """``acc += decompress(data)`` in float32 (``ctx``: as in :meth:`decompress`)."""
        raise NotImplementedError  # pragma: no cover - abstract

    def decompress_accumulate_recompress(
        self,
        data: torch.Tensor,
        acc: torch.Tensor,
        ctx: HopContext,
        out: torch.Tensor | None = None,
        writeback: str = "none",
    ) -> torch.Tensor:  # pragma: no cover - abstract
        """``compress(acc + decompress(data))``.

        ``writeback``: ``"none"`` (``acc`` is scratch afterwards), ``"sum"`` (``acc`` holds the
        float32 sum) or ``"decoded"`` (``acc`` holds exactly ``decompress`` of the result: the
        sink's compress-once rule).
        """
        raise NotImplementedError

    def roundtrip_batch(self, values: torch.Tensor, batch: Any) -> np.ndarray:
        """Every row of a :class:`~dynamiq.codecs.batch.HopBatch` replaced by what a receiver
        decodes of its message: ``decompress(compress(chunk, ctx_i), ctx_i)`` in place, where
        ``ctx_i`` is :meth:`HopBatch.context(i) <dynamiq.codecs.batch.HopBatch.context>`.

        This default runs the per-message operations row by row (correct for every codec
        whose hops add in float32); codecs override it with one kernel call per batch.

        Args:
            values: float32 ``[batch.total]``, the rows' values side by side.
            batch: The rows.

        Returns:
            int64 ``[k]``, each row's message bytes (``wire_bytes`` under its context).
        """
        batch.check(values)
        out = np.zeros(len(batch), dtype=np.int64)
        for i, (a, n) in enumerate(zip(batch.starts.tolist(), batch.sizes.tolist())):
            if n == 0:
                continue
            ctx = batch.context(i)
            view = values[a:a + n]
            data = self.compress(view, ctx)
            self.decompress(data, view, ctx)
            out[i] = data.numel()
        return out

    def spec(self) -> str:  # pragma: no cover - abstract
        """Canonical spec string."""
        raise NotImplementedError

    def __str__(self) -> str:
        return self.spec()


class DecodeHops:
    """``decompress`` and ``decompress_accumulate`` of a codec whose one decoder
    ``_decode(data, out, ctx, accumulate)`` writes (or, with ``accumulate``, adds) the decoded
    chunk into ``out``."""

    def _decode(self, data: torch.Tensor, out: torch.Tensor, ctx: HopContext | None,
                accumulate: bool) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def decompress(self, data, out, ctx=None):
        """Decode into the float32 ``out`` ``[n]``."""
        self._decode(data, out, ctx, False)
        return out

    def decompress_accumulate(self, data, acc, ctx=None):
        """``acc += decompress(data)`` (one float32 add per coordinate)."""
        self._decode(data, acc, ctx, True)


def hop_kernels(ctx: HopContext | None, t: torch.Tensor) -> Backend:
    """The kernel backend of a hop on tensor ``t``.

    Args:
        ctx: The hop's context (``None``: ``"auto"``).
        t: A tensor the hop reads or writes (its device decides ``"auto"``).

    Raises:
        ValueError, ImportError: as :func:`~dynamiq.kernels.resolve_backend`.
    """
    return backend_for("auto" if ctx is None else ctx.backend, t)


def hop_backend(ctx: HopContext | None, t: torch.Tensor) -> str:
    """The name of the backend of a hop on tensor ``t`` (see :func:`hop_kernels`); what a
    codec passes on to components that take ``backend=`` (e.g. a quantizer)."""
    return hop_kernels(ctx, t).name


def check_writeback(writeback: str | Writeback) -> Writeback:
    """``writeback`` as a :class:`~dynamiq.kernels.Writeback` (``"none"``, ``"sum"`` or
    ``"decoded"``); a clear ``ValueError`` otherwise."""
    return Writeback.parse(writeback)


def message_buffer(nbytes: int, out: torch.Tensor | None, device: torch.device
                   ) -> torch.Tensor:
    """``out`` checked as a message buffer of ``nbytes`` bytes, or a new one on ``device``."""
    if out is None:
        return torch.empty(nbytes, dtype=torch.uint8, device=device)
    if out.dtype != torch.uint8 or out.numel() != nbytes or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous uint8 tensor of {nbytes} bytes")
    return out


def check_message(data: torch.Tensor, nbytes: int) -> torch.Tensor:
    """``data`` (contiguous) if it is a message of ``nbytes`` uint8 bytes; else ``ValueError``."""
    if data.dtype != torch.uint8 or data.numel() != nbytes:
        raise ValueError(f"message must be {nbytes} uint8 bytes, got {data.numel()} "
                         f"{data.dtype}")
    return data.contiguous()


def _check_chunk(x: torch.Tensor, what: str = "chunk") -> None:
    if not isinstance(x, torch.Tensor) or x.dtype != torch.float32 or x.dim() != 1:
        raise TypeError(f"{what} must be a 1-D float32 tensor")
    if not x.is_contiguous():
        raise ValueError(f"{what} must be contiguous")


def get_codec(spec: str | PartialSumCodec) -> PartialSumCodec:
    """Return ``spec`` itself, or build the codec from a spec like ``requant(quantizer=mxfp8)``."""
    if isinstance(spec, PartialSumCodec):
        return spec
    return build(CODECS, spec, "codec")  # type: ignore[return-value]
