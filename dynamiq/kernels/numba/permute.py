"""Level lookups of small tables by a vector permute (AVX2), for the block kernels' decodes.

A decode of a table of at most 16 levels (DynamiQ's widths 2–5, ``dq2``/``dq4`` ε-levels) finds
each element's level without a load: :func:`~dynamiq.kernels.numba.levels.select_tree`, one
select per pair of entries, 15 selects and 4 bit tests for 16 levels. Where the host has AVX2
(:data:`HAS_AVX2`), :func:`permute_levels` does the same lookup for eight elements at a time
with one ``vpermps`` per eight entries (the table's two halves held in two registers, a select
on bit 3 between them): the level pass becomes a loop of a handful of instructions, and the
loop that applies scale, dither and sign reads the levels like a loaded table's.

LLVM's loop vectoriser never emits a variable permute from scalar code (a select tree stays a
select tree, a lookup in a local array becomes a gather or scalar loads), so the eight-wide
loop is written here in LLVM IR.
"""

from __future__ import annotations

import numba as nb
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

import dynamiq.kernels.numba.stamps  # noqa: F401  (the cache of its functions: see there)
from dynamiq.kernels.numba.host import host_has
from dynamiq.kernels.numba.levels import select_tree

__all__ = ["HAS_AVX2", "permute_levels"]

#: Whether the kernels use the host CPU's AVX2 ``vpermps`` (see
#: :func:`~dynamiq.kernels.numba.host.host_has`). Kernels compiled without it never call
#: :func:`permute_levels`; Numba's on-disk cache is kept per CPU, so a kernel cached on one
#: host is not run on another.
HAS_AVX2 = host_has("avx2")

_LANES = 8


@intrinsic
def _permute8(typingctx, cb, lb, count, mask, lv):
    """``lb[j] = lv[cb[j] & mask]`` for ``j < 8 * count``, eight elements per step
    (``cb``: contiguous uint8 codes, ``lb``: contiguous float32, ``lv``: 16 float32)."""
    # contiguous arrays only: the loop reads and writes through their data pointers
    if not (isinstance(cb, types.Array) and cb.dtype == types.uint8 and cb.ndim == 1
            and cb.layout == "C" and isinstance(lb, types.Array)
            and lb.dtype == types.float32 and lb.ndim == 1 and lb.layout == "C"
            and isinstance(lv, types.UniTuple) and lv.count == 16
            and lv.dtype == types.float32):
        return None
    sig = types.void(cb, lb, types.uint64, types.uint32, lv)

    def codegen(context, builder, signature, args):
        cbv, lbv, countv, maskv, lvv = args
        codes = context.make_array(signature.args[0])(context, builder, cbv)
        levels = context.make_array(signature.args[1])(context, builder, lbv)
        i32 = ir.IntType(32)
        v8f = ir.VectorType(ir.FloatType(), _LANES)
        v8i = ir.VectorType(i32, _LANES)
        v8b = ir.VectorType(ir.IntType(8), _LANES)
        lo = hi = ir.Constant(v8f, ir.Undefined)
        for k in range(_LANES):
            at = ir.Constant(i32, k)
            lo = builder.insert_element(lo, builder.extract_value(lvv, k), at)
            hi = builder.insert_element(hi, builder.extract_value(lvv, _LANES + k), at)
        m = builder.insert_element(ir.Constant(v8i, ir.Undefined), maskv, ir.Constant(i32, 0))
        m = builder.shuffle_vector(m, ir.Constant(v8i, ir.Undefined),
                                   ir.Constant(v8i, [0] * _LANES))
        bit3 = ir.Constant(v8i, [_LANES] * _LANES)
        zero = ir.Constant(v8i, [0] * _LANES)
        # vpermps reads the low three bits of each index: entry k of one half
        perm = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(v8f, [v8f, v8i]), "llvm.x86.avx2.permps")
        src = builder.bitcast(codes.data, v8b.as_pointer())
        dst = builder.bitcast(levels.data, v8f.as_pointer())
        with cgutils.for_range(builder, countv) as loop:
            i = loop.index
            idx = builder.and_(builder.zext(builder.load(builder.gep(src, [i]), align=1), v8i),
                               m)
            upper = builder.icmp_unsigned("!=", builder.and_(idx, bit3), zero)
            value = builder.select(upper, builder.call(perm, [hi, idx]),
                                   builder.call(perm, [lo, idx]))
            builder.store(value, builder.gep(dst, [i]), align=4)
        return context.get_dummy_value()

    return sig, codegen


@nb.njit(forceinline=True, cache=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def permute_levels(cb, lb, n, mask, lv):
    """``lb[j] = lv[cb[j] & mask]`` for ``j < n``: the level of each element's magnitude code.

    Args:
        cb: uint8[>= n], contiguous, the codes (sign bit above the magnitude).
        lb: float32[>= n], contiguous, written.
        n: Number of elements (any; the last ``n % 8`` through :func:`select_tree`).
        mask: uint32, the magnitude bits (``2**mbits - 1``, at most 15).
        lv: The 16 entries of :func:`~dynamiq.kernels.numba.levels.tree_levels`.

    Equivalent to ``select_tree(cb[j] & mask, lv)`` for each ``j``. Only where
    :data:`HAS_AVX2`.
    """
    full = np.uint64(n) // np.uint64(_LANES)
    _permute8(cb, lb, full, np.uint32(mask), lv)
    done = full * np.uint64(_LANES)
    for k in range(np.int64(np.uint64(n) - done)):
        j = done + np.uint64(k)
        lb[j] = select_tree(np.uint32(np.uint32(cb[j]) & np.uint32(mask)), lv)
