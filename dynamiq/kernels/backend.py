"""The backend protocol: one set of kernel functions, implemented once per backend.

The module is long because it is the whole kernel interface, every family documented once:
what each kernel computes, on which arguments, for every backend to implement.

Every component above the kernels calls ``backend_for(name, tensor)`` and then the kernel it
needs; no component branches on a backend's name. A backend is a sub-package of
:mod:`dynamiq.kernels` whose ``__init__`` defines ``BACKEND``, an instance of a
:class:`Backend` subclass (discovered on first use; adding a backend touches only its folder):

* :mod:`dynamiq.kernels.reference` — readable NumPy/torch, the specification the others are
  checked against (CPU, explicit only);
* :mod:`dynamiq.kernels.numba` — compiled CPU kernels (the default for CPU tensors);
* :mod:`dynamiq.kernels.triton` — GPU kernels (the default for CUDA tensors; on CPU tensors
  under Triton's interpreter, ``TRITON_INTERPRET=1``, which is how they are tested).

Kernel families (:class:`Backend`'s methods; the records come from :mod:`dynamiq.kernels.abi`):
block quantization (``block_*``), shared-scale minifloats (``shared_*``), integer sums
(``intsum_*``), wire values and row permutations (``wire_*``, ``gather_rows``,
``scatter_rows``), the randomized Hadamard transform (``rht_*``) and the metadata phase's block
statistics (``block_statistics``). Every backend writes the same bits; the wire, row and
statistics families have a torch implementation here that CPU backends share.

Buffers are allocated by the caller: every ``out`` is a tensor of the right size on the input's
device, and block payloads are in the kernels' layout (:meth:`BlockCode.layout`).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Sequence
from pathlib import Path

import torch

from dynamiq.kernels.abi import (
    STAT_OPS,
    WIRE_DTYPES,
    BlockCode,
    BlockKeys,
    LevelGrid,
    RandKeys,
    Selection,
    SharedScaleCode,
    Writeback,
)
from dynamiq.kernels.blockstats import padded_blocks

__all__ = ["Backend", "backend_for", "backend_names", "get_backend", "register_backend",
           "resolve_backend", "unregister_backend"]


class Backend:
    """Base class of kernel backends: the interface, and torch versions of the families whose
    CPU form is plain tensor operations.

    Subclasses set :attr:`name`, :attr:`auto_devices` (device types for which ``"auto"`` picks
    this backend) and implement :meth:`check_device` and the kernel families.
    """

    #: The name users pass as ``backend=``.
    name: str = ""
    #: Device types for which ``backend="auto"`` resolves to this backend.
    auto_devices: tuple[str, ...] = ()
    #: Whether :meth:`check_device` answers the same for a device type for the process's
    #: lifetime (its answer may then be cached).
    stable: bool = True
    #: Whether the block kernels take ``rows`` (blocks read and written in place, in any
    #: order); callers copy the blocks in and out themselves for a backend without.
    block_rows: bool = False

    def check_device(self, device: torch.device) -> None:
        """Raise ``ValueError`` (or ``ImportError``) naming the fix when this backend cannot run
        on tensors of ``device``."""
        raise NotImplementedError

    def _missing(self, family: str):
        return NotImplementedError(f"the {self.name!r} backend has no {family} kernels")

    # ---- block quantization (payloads in the kernels' layout) --------------------------------
    def block_encode(self, code: BlockCode, x: torch.Tensor, rand: RandKeys,
                     out: torch.Tensor, rows: torch.Tensor | None = None,
                     n: int | None = None) -> None:
        """Quantize float32 ``x [n]`` into ``out`` (uint8 ``[code.nbytes(n)]``).

        With ``rows`` (int64 block indices, only where :attr:`block_rows`), the ``n``
        coordinates coded are ``x``'s blocks ``rows[i]`` in that order, the last possibly
        ``x``'s partial last block; without, ``x``'s first ``n`` (default: all).
        """
        raise self._missing("block")

    def block_decode(self, code: BlockCode, data: torch.Tensor, out: torch.Tensor,
                     rand: RandKeys, accumulate: bool, rows: torch.Tensor | None = None,
                     n: int | None = None) -> None:
        """Decode ``data`` into float32 ``out [n]`` (``out + value`` when ``accumulate``);
        ``rand`` is the encoder's (a dithered code regenerates its uniforms). ``rows``, ``n``:
        into ``out``'s blocks ``rows[i]``, as in :meth:`block_encode`."""
        raise self._missing("block")

    def block_recompress(self, code: BlockCode, data: torch.Tensor, acc: torch.Tensor,
                         rand: RandKeys, irand: RandKeys, writeback: Writeback,
                         out: torch.Tensor, rows: torch.Tensor | None = None,
                         n: int | None = None) -> None:
        """``encode(acc + decode(data, irand), rand)`` into ``out`` (not ``data``); ``acc``
        afterwards as ``writeback`` says. ``rows``, ``n``: the accumulator is ``acc``'s blocks
        ``rows[i]``, as in :meth:`block_encode`."""
        raise self._missing("block")

    def block_roundtrip(self, code: BlockCode, x: torch.Tensor, keys: BlockKeys,
                        rows: torch.Tensor) -> None:
        """Replace ``x``'s blocks ``rows[i]`` (whole blocks, int64 indices) by their decoded
        code, block ``i`` under ``keys.block(i)``: equivalent to
        ``block_decode(block_encode(block))`` of every block alone.

        This default codes each run of blocks that share their keys
        (:meth:`~dynamiq.kernels.abi.BlockKeys.runs`) with one encode and one decode; a backend
        with per-block keys in its kernels overrides it with one call of each.
        """
        b = code.spec.block
        runs = keys.runs(b)
        for a, e in zip(runs[:-1].tolist(), runs[1:].tolist()):
            rand, n, sel = keys.block(a), (e - a) * b, rows[a:e]
            buf = torch.empty(code.nbytes(n), dtype=torch.uint8, device=x.device)
            if self.block_rows:
                self.block_encode(code, x, rand, buf, rows=sel, n=n)
                self.block_decode(code, buf, x, rand, False, rows=sel, n=n)
            else:
                dense = self.gather_rows(x, sel, b)
                self.block_encode(code, dense, rand, buf)
                self.block_decode(code, buf, dense, rand, False)
                self.scatter_rows(dense, sel, x, False, b)

    # ---- shared-scale minifloats (LSB-first bit stream of mbits+1-bit codes) ------------------
    def shared_encode(self, code: SharedScaleCode, x: torch.Tensor, scales: torch.Tensor,
                      block: int, out: torch.Tensor) -> None:
        """Codes of float32 ``x [n]``; block ``j`` of ``block`` coordinates has ``scales[j]``."""
        raise self._missing("shared-scale")

    def shared_decode(self, code: SharedScaleCode, data: torch.Tensor, scales: torch.Tensor,
                      block: int, out: torch.Tensor, accumulate: bool) -> None:
        """``out (=|+=) dec[code] * scale``."""
        raise self._missing("shared-scale")

    def shared_recompress(self, code: SharedScaleCode, data: torch.Tensor, acc: torch.Tensor,
                          scales: torch.Tensor, block: int, writeback: Writeback,
                          out: torch.Tensor) -> None:
        """Codes of ``acc + decode(data)`` with the same scales, in one pass."""
        raise self._missing("shared-scale")

    # ---- integer sums (LSB-first bit stream of bits-bit offset-binary codes) ------------------
    def intsum_encode(self, x: torch.Tensor, step: float, bits: int, key: tuple[int, int],
                      offset: int, out: torch.Tensor, shift: float = 0.0) -> None:
        """Codes of the stochastic rounding of ``x / step + shift`` to integers (uniforms keyed
        by ``key`` at global index ``offset + i``)."""
        raise self._missing("integer-sum")

    def intsum_decode(self, data: torch.Tensor, step: float, bits: int, out: torch.Tensor,
                      accumulate: bool, shift: float = 0.0) -> None:
        """``out (=|+=) (float32(w) - shift) * step`` (code 0 is NaN)."""
        raise self._missing("integer-sum")

    def intsum_recompress(self, data: torch.Tensor, acc: torch.Tensor, step: float, bits: int,
                          key: tuple[int, int], offset: int, writeback: Writeback,
                          out: torch.Tensor, shift_in: float = 0.0, shift_out: float = 0.0
                          ) -> None:
        """Codes (``shift_out``) of ``acc + decode(data)`` (``shift_in``), in one pass."""
        raise self._missing("integer-sum")

    def intsum_round(self, x: torch.Tensor, step: float, grid: LevelGrid, key: tuple[int, int],
                     offset: int, out: torch.Tensor) -> None:
        """THC's rounding of one rank's values onto ``grid``'s levels: ``out`` ← ``(c - g/2) *
        step`` with ``c`` the stochastic rounding of ``clamp(x / step + g/2, 0, g)`` between its
        two neighbouring levels (uniforms keyed by ``key`` at global index ``offset + i``); NaN
        for a non-finite ``x``. ``out`` may be ``x``."""
        raise self._missing("integer-sum")

    # ---- wire values (torch: shared by the CPU backends) -------------------------------------
    @staticmethod
    def _view(buf: torch.Tensor, count: int, wire: str, what: str) -> torch.Tensor:
        dtype, size = WIRE_DTYPES[wire]
        if buf.dtype != torch.uint8 or buf.numel() != size * count:
            raise ValueError(f"{what} must be {size * count} uint8 bytes, got {buf.numel()} "
                             f"{buf.dtype}")
        return buf.contiguous().view(dtype)

    def wire_encode(self, x: torch.Tensor, wire: str, out: torch.Tensor,
                    select: Selection | None = None) -> None:
        """``out`` ← the travelling coordinates of ``x`` as ``wire`` values (``"fp32"``, or
        ``"bf16"`` rounded to nearest even, as torch converts)."""
        idx = None if select is None else select.index()
        n = x.numel() if idx is None else idx.numel()
        self._view(out, n, wire, "out").copy_(x if idx is None else x.index_select(0, idx))

    def _values(self, data: torch.Tensor, wire: str, n: int, select: Selection | None
                ) -> torch.Tensor:
        """float32 ``[n]`` decoded values (0 where nothing travels)."""
        idx = None if select is None else select.index()
        vals = self._view(data, n if idx is None else idx.numel(), wire, "message")
        if idx is None:
            return vals if wire == "fp32" else vals.float()
        full = torch.zeros(n, dtype=torch.float32, device=data.device)
        full.index_copy_(0, idx, vals.float())
        return full

    def wire_decode(self, data: torch.Tensor, wire: str, out: torch.Tensor, accumulate: bool,
                    select: Selection | None = None) -> None:
        """``out (=|+=)`` the values of ``data`` at the travelling coordinates (0 elsewhere)."""
        vals = self._values(data, wire, out.numel(), select)
        if accumulate:
            out.add_(vals)
        else:
            out.copy_(vals)

    def wire_recompress(self, data: torch.Tensor, acc: torch.Tensor, wire: str,
                        writeback: Writeback, out: torch.Tensor,
                        select: Selection | None = None) -> None:
        """``cast(acc + value(data))`` at the travelling coordinates. ``writeback``: ``SUM``
        stores ``acc + value`` (``acc + 0`` where nothing travels), ``DECODED`` the decoded
        outgoing values (0 where nothing travels)."""
        idx = None if select is None else select.index()
        m = acc.numel() if idx is None else idx.numel()
        incoming = self._view(data, m, wire, "message")
        sent = self._view(out, m, wire, "out")
        if wire == "fp32" and idx is None:
            # one pass: the sum is written straight into the outgoing bytes
            torch.add(acc, incoming, out=sent)
            if writeback != Writeback.NONE:
                acc.copy_(sent)
            return
        picked = (acc if idx is None else acc.index_select(0, idx)) + incoming.float()
        sent.copy_(picked)
        if writeback == Writeback.SUM:
            if idx is None:
                acc.copy_(picked)
            else:
                acc.add_(0.0)  # acc + 0 elsewhere (turns -0 into +0, as the full sum would)
                acc.index_copy_(0, idx, picked)
        elif writeback == Writeback.DECODED:
            decoded = sent.float()
            if idx is None:
                acc.copy_(decoded)
            else:
                acc.zero_()
                acc.index_copy_(0, idx, decoded)

    # ---- row permutation ----------------------------------------------------------------------
    def gather_rows(self, x: torch.Tensor, order: torch.Tensor, row: int) -> torch.Tensor:
        """Rows of ``row`` coordinates of ``x`` in the order ``order`` (int64, distinct row
        indices: a permutation or a subset), zero-padded past ``x``'s end:
        ``pad(x).view(-1, row).index_select(0, order).view(-1)``.
        """
        full = -(-x.numel() // row) * row
        if x.numel() != full:
            pad = torch.zeros(full, dtype=torch.float32, device=x.device)
            pad[: x.numel()] = x
            x = pad
        return x.view(-1, row).index_select(0, order).view(-1)

    def scatter_rows(self, g: torch.Tensor, order: torch.Tensor, out: torch.Tensor, add: bool,
                     row: int) -> None:
        """Undo :meth:`gather_rows` into ``out`` (``out + value`` when ``add``): row ``k`` of
        ``g`` goes to row ``order[k]`` of ``out``, cut at ``out``'s end."""
        rows = g.view(-1, row)
        n = out.numel()
        whole = n // row
        if n % row:
            # the partial last row of ``out`` (at most one of ``order``) takes its first values
            hit = (order == whole).nonzero()
            if hit.numel():
                k = int(hit[0, 0])
                piece, vals = out[whole * row:], rows[k, : n - whole * row]
                piece.add_(vals) if add else piece.copy_(vals)
                keep = order != whole
                order, rows = order[keep], rows[keep]
        dst = out[: whole * row].view(-1, row)
        if add:  # distinct rows: read, add, write (index_add_ runs serially)
            dst.index_copy_(0, order, dst.index_select(0, order).add_(rows))
        else:
            dst.index_copy_(0, order, rows)

    # ---- randomized Hadamard transform ---------------------------------------------------------
    def rht_forward(self, x: torch.Tensor, out: torch.Tensor, block: int, key: tuple[int, int],
                    norm: float) -> None:
        """Per block: ``out = norm * H @ (d * x)`` (``d``: ±1 from ``key`` by global index)."""
        raise self._missing("Hadamard")

    def rht_inverse(self, y: torch.Tensor, out: torch.Tensor, block: int, key: tuple[int, int],
                    norm: float) -> None:
        """Per block: ``out = d * (norm * H @ y)``."""
        raise self._missing("Hadamard")

    # ---- metadata statistics --------------------------------------------------------------------
    def block_statistics(self, y: torch.Tensor, ops: Sequence[tuple[str, int]]
                         ) -> dict[tuple[str, int], torch.Tensor]:
        """float64 block reductions of the zero-padded float32 ``y``.

        Args:
            y: float32 ``[n]``.
            ops: ``(op, block)`` pairs, ``op`` in :data:`~dynamiq.kernels.abi.STAT_OPS`.

        Returns:
            ``(op, block)`` → float64 ``[ceil(n / block)]`` on the CPU: the sums, sums of squares,
            largest magnitudes (NaN for a block holding a NaN) or sums of squares about the
            block's mean (``((g - g.mean()) ** 2).sum()`` of the padded block ``g``) of every
            block.
        """
        y64 = y.detach().to(device="cpu", dtype=torch.float64)
        out = {}
        for op, block in ops:
            if op not in STAT_OPS:
                raise ValueError(f"block statistics are {STAT_OPS}, not {op!r}")
            g = padded_blocks(y64, block)
            if op == "sum":
                out[(op, block)] = g.sum(1)
            elif op == "sumsq":
                out[(op, block)] = (g * g).sum(1)
            elif op == "csumsq":
                out[(op, block)] = ((g - g.mean(1, keepdim=True)) ** 2).sum(1)
            else:
                out[(op, block)] = g.abs().amax(1)
        return out


_backends: dict[str, Backend] | None = None
_resolved: dict[tuple[str, str], str] = {}


def _discover() -> dict[str, Backend]:
    """Every backend sub-package of :mod:`dynamiq.kernels` (their ``BACKEND``), by name."""
    global _backends
    if _backends is None:
        here = Path(__file__).parent
        package = __name__.rpartition(".")[0]
        found: dict[str, Backend] = {}
        for info in sorted(pkgutil.iter_modules([str(here)]), key=lambda m: m.name):
            if not info.ispkg:
                continue
            be = getattr(importlib.import_module(f"{package}.{info.name}"), "BACKEND", None)
            if isinstance(be, Backend):
                if be.name in found:
                    raise RuntimeError(f"two kernel backends are named {be.name!r}")
                found[be.name] = be
        _backends = found
    return _backends


def register_backend(backend: Backend) -> Backend:
    """Make a backend defined outside :mod:`dynamiq.kernels` (a plug-in) known by its name.

    The backends of ``dynamiq/kernels/`` are found by themselves; this is for a backend that
    lives in another package. ``backend=backend.name`` then selects it everywhere, and
    ``backend="auto"`` considers it for the device types in its
    :attr:`~Backend.auto_devices` (after the built-in backends).

    Args:
        backend: An instance of a :class:`Backend` subclass with a non-empty :attr:`~Backend.name`.

    Returns:
        ``backend``.

    Raises:
        TypeError: ``backend`` is not a :class:`Backend` instance.
        ValueError: its name is empty, ``"auto"``, or taken by another backend.
    """
    if not isinstance(backend, Backend):
        raise TypeError(f"register_backend takes a Backend instance, got {type(backend).__name__}")
    if not backend.name or backend.name == "auto":
        raise ValueError(f"a backend needs a name other than '' and 'auto', got {backend.name!r}")
    found = _discover()
    if backend.name in found:
        raise ValueError(f"a kernel backend named {backend.name!r} exists already")
    found[backend.name] = backend
    _resolved.clear()
    return backend


def unregister_backend(name: str) -> Backend:
    """Forget a backend added with :func:`register_backend` and return it.

    Raises:
        ValueError: ``name`` is a built-in backend or names none.
    """
    found = _discover()
    be = found.get(name)
    if be is None or type(be).__module__.startswith(__name__.rpartition(".")[0] + "."):
        raise ValueError(f"{name!r} is not a registered plug-in backend")
    del found[name]
    _resolved.clear()
    return be


def backend_names() -> tuple[str, ...]:
    """Accepted values of every ``backend=`` keyword: ``"auto"`` and each backend's name."""
    return ("auto", *sorted(_discover()))


def get_backend(name: str) -> Backend:
    """The backend called ``name``.

    Raises:
        ValueError: no backend has that name (the message lists them).
    """
    be = _discover().get(name) if isinstance(name, str) else None
    if be is None:
        raise ValueError(f"backend must be one of {backend_names()}, got {name!r}")
    return be


def resolve_backend(backend: str, device: torch.device | str) -> str:
    """The name of the backend that runs ``backend=`` on tensors of ``device``.

    ``"auto"`` picks the backend whose :attr:`Backend.auto_devices` has the device's type (Numba
    for CPU tensors, Triton for CUDA tensors); a named backend is checked against the device.

    Raises:
        ValueError: ``backend`` names no backend, no backend runs on the device, or the named
            one cannot run there (the message says what to do instead).
        ImportError: the backend's package is missing (e.g. triton).
    """
    dev = device if isinstance(device, torch.device) else torch.device(device)
    key = (backend, dev.type)
    hit = _resolved.get(key) if isinstance(backend, str) else None
    if hit is not None:
        return hit
    if backend == "auto":
        choice = [b for b in _discover().values() if dev.type in b.auto_devices]
        if not choice:
            kinds = sorted({t for b in _discover().values() for t in b.auto_devices})
            raise ValueError(f"no backend runs on {dev.type!r} tensors: use "
                             f"{' or '.join(k.upper() for k in kinds)} tensors")
        be = choice[0]
    else:
        be = get_backend(backend)
    be.check_device(dev)
    if be.stable:
        _resolved[key] = be.name
    return be.name


def backend_for(backend: str, t: object) -> Backend:
    """The backend that runs ``backend=`` on tensor ``t`` (a non-tensor counts as CPU)."""
    device = t.device if isinstance(t, torch.Tensor) else torch.device("cpu")
    return get_backend(resolve_backend(backend, device))
