"""The block-scaled quantizer (:class:`BlockQuantizer`): its configuration, wire layout and the
encode / decode / fused-hop calls into the kernel backends (see :mod:`dynamiq.quantizers`).

The module is long because its one class documents every configuration field and, for each of
its three calls, every random-number key and the in-place ``rows`` variant."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch

from dynamiq.formats import NumberFormat, resolve_format
from dynamiq.kernels import (
    KIND_TABLE,
    ROUNDING,
    SCALE_ROUNDING,
    BlockCode,
    BlockKeys,
    FormatTables,
    KernelSpec,
    Purpose,
    RandKeys,
    Writeback,
    backend_for,
    element_family,
    uniform_grid,
)
from dynamiq.quantizers.checks import check_quantizer_config
from dynamiq.quantizers.layout import compact, expand, wire_layout
from dynamiq.quantizers.payload import Payload
from dynamiq.quantizers.rows import rows_length
from dynamiq.rng import MAX_WORLD, make_key, make_keys

__all__ = ["BlockQuantizer"]


@dataclass(frozen=True)
class BlockQuantizer:
    """Block-scaled quantization with any element format.

    Args:
        element: Element format (object or registered name), e.g. ``"e4m3"``, ``"dq4"``.
        group_size: Elements per scale group, a power of two; ``group_size * element.bits``
            must be a multiple of 8 so that groups are byte-aligned.
        scale: Group scale format. Flat quantizers need a format with a NaN code (or FP32) so
            that non-finite inputs stay visible; hierarchical ones store group scales relative to
            the super-group scale (typically ``"u8rel"``).
        rounding: Element rounding: ``"nearest"`` (ties to even), ``"stochastic"`` (unbiased)
            or ``"correlated"`` (unbiased, stratified across ranks; needs ``world_size``).
        scale_rounding: ``"up"`` (no element ever clips), ``"nearest"``, ``"down"``,
            ``"stochastic"`` (unbiased; elements are then normalised by the exact group max so
            that value and scale errors are independent) or ``"ocp"`` (OCP MX rule
            ``2**(floor(log2 amax) - emax_elem)``, elements saturate).
        super_group_size: Elements per super-group (hierarchical scales), a power-of-two
            multiple of ``group_size``; ``None`` for flat scales.
        super_scale: Super-group scale format (e.g. ``"bf16"``), always rounded up.
        dither: Subtractive dithering (needs stochastic or correlated rounding): the decoder
            regenerates the uniform ``u`` each element was rounded with (counter-based random
            numbers under the encoder's keys, nothing extra on the wire) and decodes the
            magnitude ``level + κ (u - 1/2)`` (``κ`` = :attr:`dither_amplitude`). Still unbiased,
            with about half the rounding noise of plain stochastic rounding. Decoding must be
            given the encoder's ``seed``/``rank``/``world_size``/``stream``/``index_offset``:
            with other keys each value is off by up to ``κ/2`` of its scale.

    Example:
        >>> q = BlockQuantizer("e4m3", group_size=32, scale="e8m0", scale_rounding="ocp")
        >>> q.bits_per_coord(1024)
        8.25
    """

    element: NumberFormat | str
    group_size: int = 32
    scale: NumberFormat | str = "e8m0"
    rounding: str = "nearest"
    scale_rounding: str = "up"
    super_group_size: int | None = None
    super_scale: NumberFormat | str | None = None
    dither: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "element", resolve_format(self.element))
        object.__setattr__(self, "scale", resolve_format(self.scale))
        if self.super_scale is not None:
            object.__setattr__(self, "super_scale", resolve_format(self.super_scale))
        check_quantizer_config(self)

    # ---- layout and accounting ---------------------------------------------------------------
    @property
    def block_size(self) -> int:
        """Elements per independent block (super-group if hierarchical, else group)."""
        return self.super_group_size or self.group_size

    def padded_length(self, n: int) -> int:
        """``n`` rounded up to a whole number of blocks."""
        b = self.block_size
        return -(-n // b) * b

    def _section_sizes(self, n: int) -> tuple[int, int, int]:
        return self._code.layout(n)

    def _wire_section_sizes(self, n: int) -> tuple[int, int, int]:
        return wire_layout(self._code, n)

    def _kernel_nbytes(self, n: int) -> int:
        """Size of the kernels' payload layout (the partial last block padded to whole)."""
        return self._code.nbytes(n)

    def nbytes(self, n: int) -> int:
        """Exact payload size in bytes for ``n`` coordinates, all metadata included.

        A partial last block is cut to the groups it touches: ``ceil(n / group_size)`` groups
        of codes and scales (and one super-group scale per started super-group).
        """
        return sum(wire_layout(self._code, n))

    def _compact(self, padded: torch.Tensor, n: int, out: torch.Tensor | None = None
                 ) -> torch.Tensor:
        return compact(self._code, padded, n, out)

    def _expand(self, data: torch.Tensor, n: int) -> torch.Tensor:
        return expand(self._code, data, n)

    def _is_cut(self, n: int) -> bool:
        return self.nbytes(n) != self._kernel_nbytes(n)

    def bits_per_coord(self, n: int | None = None) -> float:
        """Wire bits per coordinate: exact for ``n`` coordinates, asymptotic when ``None``."""
        if n is None:
            n = self.block_size * 1024
            return 8.0 * self.nbytes(n) / n
        if n <= 0:
            raise ValueError("n must be positive")
        return 8.0 * self.nbytes(n) / n

    @property
    def unbiased(self) -> bool:
        """True when E[decode(encode(x))] = x (stochastic rounding, no clipping scale)."""
        scale_ok = self.scale_rounding in ("up", "stochastic")
        return self.rounding != "nearest" and scale_ok

    @cached_property
    def dither_amplitude(self) -> float:
        """``κ`` of dithered decoding, in element-table units (0.0 without :attr:`dither`).

        The rounding error of an element between levels ``Δ`` apart, at fraction ``p`` of the
        gap, has variance ``Δ² p(1-p)``; subtracting ``κ (u - 1/2)`` leaves
        ``Δ² p(1-p) - κ Δ p(1-p) + κ²/12``, smallest on average for ``κ = E[Δ]``. The expectation
        is taken with the magnitudes of a group distributed as a half-normal whose standard
        deviation is half the group's maximum (what groups of Gaussian values look like after
        normalisation), in float64, rounded to 12 significant bits so that every platform
        agrees.
        """
        if not self.dither:
            return 0.0
        # the gaps' lower ends from zero up (a mid-rise grid's first gap spans zero)
        mags = np.union1d([0.0], self.element.magnitudes())
        gaps = self.element.level_gaps()
        top = mags[-1]
        cdf = np.array([math.erf(2.0 * m / top / math.sqrt(2.0)) for m in mags])
        mass = np.diff(cdf)
        kap = float((gaps * mass).sum() / mass.sum())
        e = math.floor(math.log2(kap))
        return float(np.float32(round(kap * 2.0 ** (11 - e)) * 2.0 ** (e - 11)))

    @cached_property
    def _scale_tables(self) -> FormatTables:
        return FormatTables.of(self.scale)

    @cached_property
    def _scale_divisor(self) -> np.float32:
        emax = self.element.max_value
        if self.scale_rounding == "ocp":
            emax = 2.0 ** math.floor(math.log2(emax))
        return np.float32(emax)

    @cached_property
    def _code(self) -> BlockCode:
        """This quantizer as the kernels of every backend see it."""
        e = FormatTables.of(self.element)
        sc, u = self._scale_tables, FormatTables.of(self.super_scale)
        efam, emant, ebias = element_family(e.search[: e.nfin], self.element.magnitude_bits)
        spec = KernelSpec(
            bits=self.element.bits, mbits=self.element.magnitude_bits,
            emode=int(ROUNDING[self.rounding]), group=self.group_size, block=self.block_size,
            hier=self.super_group_size is not None, skind=sc.kind, sbytes=sc.nbytes,
            smode=int(SCALE_ROUNDING[self.scale_rounding]), ukind=u.kind, ubytes=u.nbytes,
            dither=self.dither, ssearch=0 if sc.lut.size > 1 else sc.logp, efam=efam,
            emant=emant, ebias=ebias, midrise=self.element.midrise,
            sgrid=uniform_grid(sc.search[: sc.nfin]) if sc.kind == KIND_TABLE else 0,
        )
        return BlockCode(spec, e, sc, u, self._scale_divisor,
                         np.float32(self.dither_amplitude))

    def _rand(self, seed, rank, world_size, stream, index_offset) -> RandKeys:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size), got rank={rank}, {world_size=}")
        if index_offset < 0:
            raise ValueError("index_offset must be >= 0")
        if world_size > MAX_WORLD:
            raise ValueError(f"world_size must be at most {MAX_WORLD}, got {world_size}")
        k0, k1 = make_key(seed, *stream, rank, Purpose.ELEMENT)
        p0, p1 = make_key(seed, *stream, Purpose.PERMUTATION)
        q0, q1 = make_key(seed, *stream, rank, Purpose.SCALE)
        return RandKeys(k0, k1, p0, p1, q0, q1, rank, world_size, index_offset)

    @staticmethod
    def block_keys(seed: int, streams: tuple, ranks: np.ndarray, world_size: int,
                   offsets: np.ndarray) -> BlockKeys:
        """The keys of many blocks at once: block ``i`` gets what :meth:`encode` with
        ``rank=ranks[i]``, ``stream=tuple(c[i] for c in streams)`` and
        ``index_offset=offsets[i]`` gives its first block (the same for every quantizer).

        Args:
            seed: As for :meth:`encode`.
            streams: Stream columns, ints or int64 ``[blocks]`` arrays.
            ranks: int64 ``[blocks]``.
            world_size: As for :meth:`encode`.
            offsets: int64 ``[blocks]``, the global index of each block's first coordinate.
        """
        ranks = np.asarray(ranks, dtype=np.int64)
        offsets = np.asarray(offsets, dtype=np.int64)
        if ranks.size and (int(ranks.min()) < 0 or int(ranks.max()) >= world_size):
            raise ValueError(f"ranks must be in [0, world_size), {world_size=}")
        if offsets.size and int(offsets.min()) < 0:
            raise ValueError("offsets must be >= 0")
        if world_size > MAX_WORLD:
            raise ValueError(f"world_size must be at most {MAX_WORLD}, got {world_size}")
        k0, k1 = make_keys(seed, *streams, ranks, int(Purpose.ELEMENT))
        p0, p1 = make_keys(seed, *streams, int(Purpose.PERMUTATION))
        q0, q1 = make_keys(seed, *streams, ranks, int(Purpose.SCALE))
        p0, p1 = np.broadcast_to(p0, ranks.shape), np.broadcast_to(p1, ranks.shape)
        return BlockKeys(k0, k1, p0, p1, q0, q1, ranks, world_size, offsets)

    def roundtrip_blocks(self, x: torch.Tensor, rows: torch.Tensor, keys: BlockKeys,
                         backend: str = "auto") -> None:
        """Replace ``x``'s whole blocks ``rows[i]`` (int64 indices of blocks of
        :attr:`block_size`) in place by their quantized values, block ``i`` under
        ``keys.block(i)`` (:meth:`block_keys`): equivalent to :meth:`roundtrip` of every
        block alone with its own rank, stream and offset.

        Args:
            x: float32, contiguous, 1-D.
            rows: int64 ``[blocks]``, distinct, each a whole block of ``x``.
            keys: One entry per row.
            backend: As for :meth:`encode`.
        """
        if (not isinstance(x, torch.Tensor) or x.dtype != torch.float32 or x.dim() != 1
                or not x.is_contiguous()):
            raise ValueError("x must be a contiguous 1-D float32 tensor")
        if len(keys.offset) != rows.numel():
            raise ValueError(f"{len(keys.offset)} keys for {rows.numel()} blocks")
        if rows.numel() and (int(rows.min()) < 0
                             or (int(rows.max()) + 1) * self.block_size > x.numel()):
            raise ValueError("rows must name whole blocks of x")
        if rows.numel():
            backend_for(backend, x).block_roundtrip(self._code, x, keys, rows)

    def _check_out(self, n: int, out: torch.Tensor | None,
                   device: torch.device | None = None) -> None:
        size = self.nbytes(n)
        if out is None:
            return
        if (not isinstance(out, torch.Tensor) or out.dtype != torch.uint8 or out.dim() != 1
                or out.numel() != size or not out.is_contiguous()):
            raise ValueError(f"out must be a contiguous uint8 tensor of {size} bytes")
        if device is not None and out.device != device:
            raise ValueError(f"out is on {out.device}, expected {device} (the input's device)")

    def _check_payload(self, payload: Payload) -> int:
        """``payload.n``, once ``payload`` is checked to be this quantizer's, of the right size."""
        if payload.quantizer != self:
            raise ValueError("payload was written by a different quantizer")
        n = payload.n
        if payload.data.numel() != self.nbytes(n):
            raise ValueError(f"payload of {n} coordinates must have {self.nbytes(n)} bytes, "
                             f"got {payload.data.numel()}")
        return n

    def _check_input(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"expected a torch.Tensor, got {type(x).__name__}")
        if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise TypeError(f"expected a float32/float16/bfloat16 tensor, got {x.dtype}")
        if x.dim() != 1:
            raise ValueError(f"expected a 1-D tensor, got shape {tuple(x.shape)}")
        if x.numel() == 0:
            raise ValueError("cannot quantize an empty tensor")
        if not x.is_contiguous():
            raise ValueError("expected a contiguous tensor")
        return x if x.dtype == torch.float32 else x.float()

    def encode(
        self,
        x: torch.Tensor,
        *,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        stream: tuple[int, ...] = (),
        index_offset: int = 0,
        out: torch.Tensor | None = None,
        backend: str = "auto",
        rows: torch.Tensor | None = None,
    ) -> Payload:
        """Quantize a vector.

        Args:
            x: 1-D contiguous CPU tensor, float32 (float16/bfloat16 are widened), length ``n``.
            seed: Seed of the random numbers (shared by all ranks for correlated rounding).
            rank, world_size: This worker's rank and the number of workers whose quantized copies
                will be summed (correlated rounding stratifies across them).
            stream: Extra stream ids (e.g. step, chunk) so that successive calls draw fresh numbers.
            index_offset: Global index of ``x[0]``, when ``x`` is a slice of a longer vector.
            out: Optional preallocated ``uint8`` tensor of ``nbytes(n)`` bytes to write into.
            backend: ``"auto"`` (by ``x``'s device), ``"numba"`` (CPU) or ``"triton"`` (CUDA,
                or CPU under ``TRITON_INTERPRET=1``); every backend writes the same bytes.
            rows: Code only some blocks of ``x``, in a given order: int64 block indices
                (blocks of :attr:`block_size` coordinates), the ``i``-th coded block being
                ``x[rows[i] * block_size:][:block_size]``; only the last may be ``x``'s partial
                last block. ``n`` is then the coordinates of those blocks. Equivalent to
                encoding ``pad(x).view(-1, block_size)[rows].view(-1)[:n]``, without that copy
                where the backend's kernels read the blocks in place (Numba).

        Returns:
            A :class:`Payload` of ``nbytes(n)`` bytes. Decoding it is equivalent to
            ``sign(x) * level * group_scale`` with the level chosen by ``rounding``.
        """
        x = self._check_input(x)
        be = backend_for(backend, x)
        n = x.numel() if rows is None else rows_length(rows, self.block_size, x.numel(), x.device)
        self._check_out(n, out, x.device)
        rand = self._rand(seed, rank, world_size, stream, index_offset)
        if rows is not None and not be.block_rows:
            x, rows = be.gather_rows(x, rows, self.block_size)[:n], None
        kw = {} if rows is None else {"rows": rows, "n": n}
        if not self._is_cut(n):
            if out is None:
                out = torch.empty(self.nbytes(n), dtype=torch.uint8, device=x.device)
            be.block_encode(self._code, x, rand, out, **kw)
            return Payload(self, n, out)
        # the kernels write whole blocks: encode into their layout, cut it to the wire's
        full = torch.empty(self._kernel_nbytes(n), dtype=torch.uint8, device=x.device)
        be.block_encode(self._code, x, rand, full, **kw)
        return Payload(self, n, self._compact(full, n, out))

    def decode(
        self,
        payload: Payload,
        out: torch.Tensor | None = None,
        *,
        accumulate: bool = False,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        stream: tuple[int, ...] = (),
        index_offset: int = 0,
        backend: str = "auto",
        rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Decode a payload to float32.

        Args:
            payload: What :meth:`encode` returned (of this quantizer).
            out: Optional float32 tensor of ``payload.n`` elements to write (or add) into.
            accumulate: Add the decoded values to ``out`` instead of overwriting it.
            seed, rank, world_size, stream, index_offset: The *encoder's* random-number keys
                (as given to :meth:`encode`); only a :attr:`dither` quantizer uses them.
            backend: ``"auto"`` (by the payload's device), ``"numba"`` or ``"triton"``.
            rows: Decode into blocks of ``out`` (needed then) instead of its start: as in
                :meth:`encode`, ``out``'s block ``rows[i]`` receives the ``i``-th block, the
                rest of ``out`` is left as it was.

        Returns:
            float32 tensor of ``payload.n`` elements (``out`` itself when given).
        """
        n = self._check_payload(payload)
        data = self._expand(payload.data, n)
        rand = self._rand(seed, rank, world_size, stream, index_offset)
        be = backend_for(backend, data)
        if out is None:
            if accumulate or rows is not None:
                raise ValueError("accumulate=True and rows need an out tensor")
            out = torch.empty(n, dtype=torch.float32, device=data.device)
        elif (not isinstance(out, torch.Tensor) or out.dtype != torch.float32
              or (rows is None and out.numel() != n) or not out.is_contiguous()
              or out.dim() != 1):
            raise ValueError(f"out must be a contiguous float32 tensor of {n} elements")
        elif out.device != data.device:
            raise ValueError(f"out is on {out.device}, the payload on {data.device}")
        if rows is None:
            be.block_decode(self._code, data, out, rand, bool(accumulate))
            return out
        if rows_length(rows, self.block_size, out.numel(), out.device) != n:
            raise ValueError(f"rows hold other than the payload's {n} coordinates")
        if be.block_rows:
            be.block_decode(self._code, data, out, rand, bool(accumulate), rows=rows, n=n)
        else:
            dec = torch.empty(rows.numel() * self.block_size, dtype=torch.float32,
                              device=data.device)
            be.block_decode(self._code, data, dec[:n], rand, False)
            be.scatter_rows(dec, rows, out, bool(accumulate), self.block_size)
        return out

    def recompress(
        self,
        payload: Payload,
        acc: torch.Tensor,
        *,
        writeback: str = "none",
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        stream: tuple[int, ...] = (),
        index_offset: int = 0,
        out: torch.Tensor | None = None,
        backend: str = "auto",
        in_rank: int | None = None,
        in_stream: tuple[int, ...] | None = None,
        rows: torch.Tensor | None = None,
    ) -> Payload:
        """Fused decompress–accumulate–recompress: ``encode(acc + decode(payload))``.

        One pass per block: the incoming payload is decoded and added to ``acc`` (float32, in
        this order), and the partial sum is re-encoded with fresh scales at the same widths.

        Args:
            payload: Incoming payload of ``acc.numel()`` coordinates (this quantizer's).
            acc: float32[n] local contribution (contiguous, CPU).
            writeback: What ``acc`` holds afterwards: ``"none"`` (unchanged), ``"sum"`` (the
                partial sum) or ``"decoded"`` (``decode`` of the returned payload, as a sink
                keeps so that its result equals what every other rank will decode).
            seed, rank, world_size, stream, index_offset, out: as in :meth:`encode`.
            backend: ``"auto"`` (by ``acc``'s device), ``"numba"`` or ``"triton"``.
            in_rank, in_stream: Rank and stream of the incoming payload's encoder (default:
                ``rank`` and ``stream``); its other keys are this call's. Only a :attr:`dither`
                quantizer uses them.
            rows: The accumulator values are blocks of ``acc`` (as in :meth:`encode`); the
                write-back goes to the same blocks, the rest of ``acc`` is left as it was.

        Returns:
            The outgoing :class:`Payload`. Equivalent to
            ``encode(acc + decode(payload, <encoder keys>), ...)`` bit for bit.
        """
        wb = Writeback.parse(writeback)
        n = self._check_payload(payload)
        if (not isinstance(acc, torch.Tensor) or acc.dtype != torch.float32 or acc.dim() != 1
                or not acc.is_contiguous() or (rows is None and acc.numel() != n)):
            raise ValueError(f"acc must be a contiguous float32 tensor of {n} elements")
        be = backend_for(backend, acc)
        if rows is not None:
            if rows_length(rows, self.block_size, acc.numel(), acc.device) != n:
                raise ValueError(f"rows hold other than the payload's {n} coordinates")
            if not be.block_rows:
                dense = be.gather_rows(acc, rows, self.block_size)
                res = self.recompress(payload, dense[:n], writeback=wb, seed=seed, rank=rank,
                                      world_size=world_size, stream=stream,
                                      index_offset=index_offset, out=out, backend=backend,
                                      in_rank=in_rank, in_stream=in_stream)
                if wb != Writeback.NONE:
                    be.scatter_rows(dense, rows, acc, False, self.block_size)
                return res
        self._check_out(n, out, acc.device)
        rand = self._rand(seed, rank, world_size, stream, index_offset)
        irand = self._rand(seed, rank if in_rank is None else in_rank, world_size,
                           stream if in_stream is None else in_stream, index_offset)
        data = self._expand(payload.data, n)
        if data.device != acc.device:
            raise ValueError(f"the payload is on {data.device}, acc on {acc.device}")
        kw = {} if rows is None else {"rows": rows, "n": n}
        if not self._is_cut(n):
            if out is None:
                out = torch.empty(self.nbytes(n), dtype=torch.uint8, device=acc.device)
            elif out.data_ptr() == data.data_ptr():
                raise ValueError("out must not be the incoming payload buffer")
            be.block_recompress(self._code, data, acc, rand, irand, wb, out, **kw)
            return Payload(self, n, out)
        # the kernels work on whole blocks: run on their layout, cut the result to the wire's
        full = torch.empty(self._kernel_nbytes(n), dtype=torch.uint8, device=acc.device)
        be.block_recompress(self._code, data, acc, rand, irand, wb, full, **kw)
        return Payload(self, n, self._compact(full, n, out))

    def roundtrip(self, x: torch.Tensor, **kw: object) -> torch.Tensor:
        """``decode(encode(x, **kw), **keys)``: the quantized value of ``x`` (float32), decoded
        under the encoder's random-number keys (``kw`` without ``out``)."""
        keys = {k: v for k, v in kw.items() if k not in ("out",)}
        return self.decode(self.encode(x, **kw), **keys)  # type: ignore[arg-type]

    def level_gap(self) -> float:
        """Largest gap between neighbouring element values, relative to ``max_value`` (a
        mid-rise grid's gap across zero, twice its first level, included)."""
        return float(self.element.level_gaps().max() / self.element.max_value)

    def describe(self) -> str:
        """One-line summary."""
        s = f"{self.element} g{self.group_size} scale={self.scale}"
        if self.super_group_size:
            s += f" super{self.super_group_size}={self.super_scale}"
        s = f"{s} rounding={self.rounding}/{self.scale_rounding}"
        return s + " dither" if self.dither else s
