"""Host side of the Numba block kernels: generation per spec, argument tuples, tails, threads.

Kernels are *specialised*: each :class:`~dynamiq.kernels.abi.KernelSpec` instantiates the
template :mod:`dynamiq.kernels.numba._blocks` with the spec's values as module constants (Numba
compiles module globals as literals, so loops over groups unroll and the packing scheme and
rounding modes are resolved at compile time); the generated module is written once to
:func:`kernel_cache_dir` and Numba's on-disk cache then lets later processes skip compilation.
A new format needs no kernel code: its tables are runtime arguments.

Runtime arguments travel as three tuples so that every kernel has a short, uniform signature:

* ``tables = (etab, lut, edec, stab, sdec, utab, udec, slut, ulut)`` — float32/int32 arrays;
* ``consts = (snfin, slogp, snan, sdiv, unfin, ulogp, unan, enfin, lshift, lkey0, llen, kap,
  group, slshift, slkey0, sllen, ulshift, ulkey0, ullen)`` — scale-format scalars, the element
  table size and its bucket lookup, the dither amplitude, the group size again as a runtime
  value (a literal trip count would make LLVM unroll the per-group loops instead of
  vectorising them), and the bucket lookups of the group-scale and super-scale tables;
* ``rand = (k0, k1, p0, p1, q0, q1, rank, world, offset)`` — :class:`~dynamiq.kernels.abi.RandKeys`.

Whole blocks are read and written in place; the partial last block (if any) goes through a
zero-padded scratch block, in a second call of the same kernel. The kernels' array arguments
must not overlap (tasks on other threads write their outputs while a task reads its inputs),
so the host copies an input that shares memory with an output.

Each kernel codes a range of tasks; :func:`~dynamiq.kernels.numba.tasks.run_tasks` runs the
ranges of one call on several threads.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import re
import sys
import tempfile
import weakref
from pathlib import Path
from types import ModuleType

import numba
import numpy as np
import torch

from dynamiq.kernels.abi import BlockCode, BlockKeys, KernelSpec, RandKeys, Writeback
from dynamiq.kernels.numba.stamps import source_digest
from dynamiq.kernels.numba.tasks import run_tasks

__all__ = ["SERIAL_BELOW", "block_decode", "block_encode", "block_recompress",
           "block_roundtrip", "kernel_cache_dir", "kernels"]

#: Below this many coordinates a kernel runs on the calling thread only: waking the thread pool
#: costs more than the work (milliseconds when the other cores are busy, e.g. other ranks).
SERIAL_BELOW = 1 << 17

_TEMPLATE = Path(__file__).with_name("_blocks.py")
_HEADER = re.compile(r"# --- spec ---\n.*?# --- end spec ---\n", re.S)
_loaded: dict[KernelSpec, ModuleType] = {}
#: ``(module, kernel name)`` of the generated kernels known to be compiled (see :func:`_call`).
_compiled: set[tuple[ModuleType, str]] = set()
_args: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def kernel_cache_dir() -> Path:
    """Where generated kernel modules (and Numba's compiled cache) live.

    ``$DYNAMIQ_KERNEL_CACHE`` if set, else ``~/.cache/dynamiq/kernels``, else a per-user
    temporary folder when the home folder is not writable.
    """
    env = os.environ.get("DYNAMIQ_KERNEL_CACHE")
    candidates = [Path(env)] if env else []
    candidates.append(Path.home() / ".cache" / "dynamiq" / "kernels")
    candidates.append(Path(tempfile.gettempdir()) / f"dynamiq-kernels-{os.getuid()}")
    for c in candidates:
        try:
            c.mkdir(parents=True, exist_ok=True)
            if os.access(c, os.W_OK):
                return c
        except OSError:
            continue
    raise RuntimeError(f"no writable folder for generated kernels among {candidates}")


def _source(spec: KernelSpec) -> str:
    header = "# --- spec ---\n" + "".join(
        f"{name.upper()} = {value!r}\n" for name, value in spec._asdict().items()
    ) + "# --- end spec ---\n"
    text = _TEMPLATE.read_text()
    if not _HEADER.search(text):
        raise RuntimeError(f"{_TEMPLATE} lost its spec markers")
    return _HEADER.sub(lambda _: header, text, count=1)


def kernels(spec: KernelSpec) -> ModuleType:
    """The block kernels specialised on ``spec``: ``encode``, ``decode``, ``recompress``."""
    mod = _loaded.get(spec)
    if mod is not None:
        return mod
    src = _source(spec)
    # the generated module inlines functions of the kernel modules: Numba's cache only watches
    # the generated file, so their source (all of it, as for their own cached functions: see
    # stamps) is part of its name, with the instructions it may use (the portable paths
    # compile to other code, same bits)
    from dynamiq.kernels.numba import packing, permute

    deps = f"{source_digest()} bmi2={packing.HAS_BMI2} avx2={permute.HAS_AVX2}"
    digest = hashlib.sha1((src + deps).encode()).hexdigest()[:10]
    name = f"dq_{spec.tag()}_{digest}"
    path = kernel_cache_dir() / f"{name}.py"
    if not path.exists() or path.read_text() != src:
        # write-then-rename, so concurrent processes never import a half-written file and the
        # file's timestamp (part of Numba's cache key) stays stable once written
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(src)
        os.replace(tmp, path)
    modname = f"dynamiq._generated.{name}"
    loader_spec = importlib.util.spec_from_file_location(modname, path)
    assert loader_spec is not None and loader_spec.loader is not None
    mod = importlib.util.module_from_spec(loader_spec)
    sys.modules[modname] = mod
    loader_spec.loader.exec_module(mod)
    _loaded[spec] = mod
    return mod


@contextlib.contextmanager
def _compile_lock(path: Path):
    """Hold an exclusive lock on ``path`` (created if missing); no lock where ``fcntl`` is
    missing."""
    try:
        import fcntl
    except ImportError:  # not POSIX: each process compiles for itself
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _call(mod: ModuleType, name: str, nblocks: int, *args) -> None:
    """Call kernel ``name`` of the generated module ``mod`` on the tasks of ``nblocks``
    blocks, ``args`` after the task range (see :func:`~dynamiq.kernels.numba.tasks.run_tasks`).

    The first call in a process compiles the kernel, or loads it from Numba's cache, under a
    file lock per kernel: when several processes start at once (the ranks of a job on one host,
    test workers), one compiles and the others wait and load its cached result instead of each
    compiling the same kernel. That call runs on the calling thread only.
    """
    fn = getattr(mod, name)
    ntasks = -(-nblocks // mod.TASK)
    # whether the kernel is compiled, remembered: Numba's ``signatures`` hashes every
    # signature's types on each read, which cost more than coding a small chunk
    if (mod, name) in _compiled or fn.signatures:
        _compiled.add((mod, name))
        run_tasks(fn, ntasks, *args)
        return
    with _compile_lock(Path(mod.__file__).with_suffix(f".{name}.lock")):
        fn(0, ntasks, *args)
    _compiled.add((mod, name))


def kernel_args(code: BlockCode) -> tuple[tuple, tuple]:
    """The ``tables`` and ``consts`` tuples of ``code`` (cached per code object)."""
    hit = _args.get(code)
    if hit is None:
        e, s, u = code.elem, code.scale, code.sup
        # the compare search of small element tables reads one entry past the top level
        need = (1 << code.spec.mbits) + 1
        etab = e.search
        if etab.size < need:
            etab = np.concatenate([etab, np.full(need - etab.size, np.inf, np.float32)])
        tables = (etab, e.lut, e.dec, s.search, s.dec, u.search, u.dec, s.lut, u.lut)
        consts = (s.nfin, s.logp, s.nan, code.divisor, u.nfin, u.logp, u.nan,
                  e.nfin, e.lshift, e.lkey0, len(e.lut), np.float32(code.kappa),
                  code.spec.group, s.lshift, s.lkey0, len(s.lut), u.lshift, u.lkey0,
                  len(u.lut))
        hit = _args[code] = (tables, consts)
    return hit


@contextlib.contextmanager
def threads_for(n: int):
    """Run the enclosed kernels on the calling thread only when ``n`` is small."""
    if n >= SERIAL_BELOW:
        yield
        return
    prev = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        yield
    finally:
        numba.set_num_threads(prev)


def _sections(code: BlockCode, buf: np.ndarray, n: int) -> tuple[np.ndarray, ...]:
    a, b, c = code.layout(n)
    return buf[:a], buf[a:a + b], buf[a + b:a + b + c]


_NO_ROWS = np.empty(0, np.int64)


def _split(code: BlockCode, n: int) -> tuple[int, int, np.ndarray]:
    """Whole blocks, coordinates in them, and a zeroed scratch block for a partial tail."""
    b = code.spec.block
    nfull = n // b
    return nfull, nfull * b, np.zeros(b, np.float32)


def _rows(rows: torch.Tensor | None) -> np.ndarray:
    return _NO_ROWS if rows is None else rows.numpy()


def _where(code: BlockCode, rows: np.ndarray, nfull: int) -> int:
    """Where the coded coordinate ``nfull * block`` (a partial tail's first) lies in the
    array: past the whole blocks, or at the start of block ``rows[nfull]``."""
    return int(rows[nfull]) * code.spec.block if rows.size else nfull * code.spec.block


def block_encode(code: BlockCode, x: torch.Tensor, rand: RandKeys, out: torch.Tensor,
                 rows: torch.Tensor | None = None, n: int | None = None) -> None:
    """See :meth:`dynamiq.kernels.backend.Backend.block_encode`."""
    n = x.numel() if n is None else n
    xs = x.numpy()
    rs = _rows(rows)
    nfull, cut, tail = _split(code, n)
    tables, consts, r = *kernel_args(code), tuple(rand)
    sections = _sections(code, out.numpy(), n)
    k = kernels(code.spec)
    with threads_for(n):
        if nfull:
            _call(k, "encode", nfull, xs, 0, nfull, rs, *sections, tables, consts, r)
        if n > cut:
            at = _where(code, rs, nfull)
            tail[: n - cut] = xs[at:at + n - cut]
            _call(k, "encode", 1, tail, nfull, 1, _NO_ROWS, *sections, tables, consts, r)


def block_decode(code: BlockCode, data: torch.Tensor, out: torch.Tensor, rand: RandKeys,
                 accumulate: bool, rows: torch.Tensor | None = None,
                 n: int | None = None) -> None:
    """See :meth:`dynamiq.kernels.backend.Backend.block_decode`."""
    n = out.numel() if n is None else n
    os_ = out.numpy()
    rs = _rows(rows)
    nfull, cut, tail = _split(code, n)
    tables, consts, r = *kernel_args(code), tuple(rand)
    sections = _sections(code, data.numpy(), n)
    k = kernels(code.spec)
    acc = bool(accumulate)
    with threads_for(n):
        if nfull:
            _call(k, "decode", nfull, os_, 0, nfull, rs, *sections, tables, consts, r, acc)
        if n > cut:
            at = _where(code, rs, nfull)
            if acc:
                tail[: n - cut] = os_[at:at + n - cut]
            _call(k, "decode", 1, tail, nfull, 1, _NO_ROWS, *sections, tables, consts, r, acc)
            os_[at:at + n - cut] = tail[: n - cut]


def block_recompress(code: BlockCode, data: torch.Tensor, acc: torch.Tensor, rand: RandKeys,
                     irand: RandKeys, writeback: Writeback, out: torch.Tensor,
                     rows: torch.Tensor | None = None, n: int | None = None) -> None:
    """See :meth:`dynamiq.kernels.backend.Backend.block_recompress`."""
    n = acc.numel() if n is None else n
    a = acc.numpy()
    rs = _rows(rows)
    nfull, cut, tail = _split(code, n)
    tables, consts, r, ir = *kernel_args(code), tuple(rand), tuple(irand)
    src = data.numpy()
    dst = out.numpy()
    if np.shares_memory(src, dst):
        # the kernels' arguments must not overlap (see the module's docstring)
        src = src.copy()
    isec, osec = _sections(code, src, n), _sections(code, dst, n)
    k = kernels(code.spec)
    wb = int(writeback)
    with threads_for(n):
        if nfull:
            _call(k, "recompress", nfull, a, 0, nfull, cut, rs, *isec, *osec, tables, consts,
                  r, ir, wb)
        if n > cut:
            at = _where(code, rs, nfull)
            tail[: n - cut] = a[at:at + n - cut]
            _call(k, "recompress", 1, tail, nfull, 1, n - cut, _NO_ROWS, *isec, *osec, tables,
                  consts, r, ir, wb)
            if writeback != Writeback.NONE:
                a[at:at + n - cut] = tail[: n - cut]


def block_roundtrip(code: BlockCode, x: torch.Tensor, keys: BlockKeys,
                    rows: torch.Tensor) -> None:
    """See :meth:`dynamiq.kernels.backend.Backend.block_roundtrip`: one keyed encode and one
    keyed decode (every block under its own keys) through a scratch payload."""
    nb_ = rows.numel()
    b = code.spec.block
    table = np.empty((nb_, 8), np.int64)
    for j, col in enumerate((keys.k0, keys.k1, keys.p0, keys.p1, keys.q0, keys.q1, keys.rank)):
        table[:, j] = col
    # the kernels index block i's stream from offset + i * block: store each block's own
    # offset less that
    table[:, 7] = np.asarray(keys.offset, np.int64) - np.arange(nb_, dtype=np.int64) * b
    xs, rs = x.numpy(), rows.numpy()
    tables, consts = kernel_args(code)
    sections = _sections(code, np.empty(code.nbytes(nb_ * b), np.uint8), nb_ * b)
    k = kernels(code.spec)
    with threads_for(nb_ * b):
        w = int(keys.world)
        _call(k, "encode_keyed", nb_, xs, nb_, rs, *sections, tables, consts, w, table)
        _call(k, "decode_keyed", nb_, xs, nb_, rs, *sections, tables, consts, w, table)
