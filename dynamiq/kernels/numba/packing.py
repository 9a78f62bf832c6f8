"""Numba helpers of the LSB-first bit streams that the per-coordinate codecs put on the wire.

Code ``i`` of a ``b``-bit stream occupies bits ``[i*b, (i+1)*b)``, bit ``j`` of the stream being
bit ``j % 8`` of byte ``j // 8``; the last byte is zero-padded. A writer and a reader are a few
registers (a 64-bit accumulator, its fill, the byte position) threaded through these inlined
functions, so a kernel's loop stays one pass.

Where the host has BMI2 (:data:`HAS_BMI2`), the block kernels pack a unit of codes of an odd
width in one bit extraction (:func:`pext64`) and unpack it in one deposit (:func:`pdep64`).
"""

from __future__ import annotations

import numba as nb
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

import dynamiq.kernels.numba.stamps  # noqa: F401  (the cache of its functions: see there)
from dynamiq.kernels.numba.host import host_has

__all__ = ["HAS_BMI2", "flush_codes", "pdep64", "pext64", "put_code", "put_task", "take_code",
           "take_task"]

#: Whether the kernels use the host CPU's BMI2 bit extract and deposit instructions (x86 only;
#: see :func:`~dynamiq.kernels.numba.host.host_has`). Kernels compiled without them never
#: call :func:`pext64` or :func:`pdep64`; Numba's on-disk cache is kept per CPU, so a kernel
#: cached on one host is not run on another.
HAS_BMI2 = host_has("bmi2")


def _bmi2(name: str):
    """A Numba intrinsic for the BMI2 instruction ``name``, ``f(a, mask)`` on uint64."""

    @intrinsic
    def op(typingctx, a, mask):
        sig = types.uint64(types.uint64, types.uint64)

        def codegen(context, builder, signature, args):
            fnty = ir.FunctionType(ir.IntType(64), [ir.IntType(64), ir.IntType(64)])
            fn = cgutils.get_or_insert_function(builder.module, fnty, name)
            return builder.call(fn, list(args))

        return sig, codegen

    return op


_pext = _bmi2("llvm.x86.bmi.pext.64")
_pdep = _bmi2("llvm.x86.bmi.pdep.64")


@nb.njit(inline="always", cache=True)
def pext64(a, mask):
    """The bits of ``a`` (uint64) where ``mask`` has ones, packed at the bottom, in order:
    one instruction (``pext``). Only where :data:`HAS_BMI2`."""
    return _pext(np.uint64(a), np.uint64(mask))


@nb.njit(inline="always", cache=True)
def pdep64(a, mask):
    """The inverse of :func:`pext64`: the low bits of ``a`` (uint64) placed, in order, where
    ``mask`` has ones, zeros elsewhere (``pdep``). Only where :data:`HAS_BMI2`."""
    return _pdep(np.uint64(a), np.uint64(mask))

_BYTE = np.uint64(0xFF)
_EIGHT = np.uint64(8)


@nb.njit(inline="always", cache=True)
def put_code(out, wacc, wn, pos, code, bits):
    """Append ``code`` (``bits`` wide) to the stream in ``out``; returns the new
    ``(wacc, wn, pos)`` writer state (start from ``(np.uint64(0), 0, 0)``)."""
    wacc |= np.uint64(code) << np.uint64(wn)
    wn += bits
    while wn >= 8:
        out[pos] = np.uint8(wacc & _BYTE)
        wacc >>= _EIGHT
        wn -= 8
        pos += 1
    return wacc, wn, pos


@nb.njit(inline="always", cache=True)
def flush_codes(out, wacc, wn, pos):
    """Write the writer's last, partial byte (zero-padded), if any."""
    if wn > 0:
        out[pos] = np.uint8(wacc & _BYTE)


@nb.njit(inline="always", cache=True)
def take_code(data, racc, rn, pos, bits, mask):
    """Read the next ``bits``-wide code (``mask = 2**bits - 1``) from ``data``; returns
    ``(code, racc, rn, pos)`` (start the reader from ``(np.uint64(0), 0, 0)``)."""
    while rn < bits:
        racc |= np.uint64(data[pos]) << np.uint64(rn)
        pos += 1
        rn += 8
    code = racc & mask
    racc >>= np.uint64(bits)
    rn -= bits
    return code, racc, rn, pos


@nb.njit(inline="always", cache=True)
def put_task(out, pos, cb, n, bits):
    """Write the ``bits``-wide codes ``cb[:n]`` (uint32) of a stream piece that starts at byte
    ``pos`` of ``out`` (with a partial last byte, zero-padded, when they end inside one).

    Kernels that cut a stream into tasks of a whole number of bytes write each with this, so
    the tasks are independent. 8- and 4-bit codes are stored as bytes and nibble pairs in a
    loop that vectorises, other widths through the bit stream.
    """
    p = np.uint64(pos)
    if bits == 8:
        for k in range(n):
            out[p + np.uint64(k)] = np.uint8(cb[np.uint64(k)])
        return
    if bits == 4:
        for k in range(n // 2):
            i = np.uint64(2 * k)
            out[p + np.uint64(k)] = np.uint8(cb[i] | (cb[i + np.uint64(1)] << np.uint32(4)))
        if n % 2:
            out[p + np.uint64(n // 2)] = np.uint8(cb[np.uint64(n - 1)])
        return
    done = 0
    if bits < 8:
        # eight codes fill ``bits`` whole bytes: one 64-bit word each, no per-code branch
        for u in range(n // 8):
            w = np.uint64(0)
            c = np.uint64(8 * u)
            for k in range(8):
                w |= np.uint64(cb[c + np.uint64(k)]) << np.uint64(k * bits)
            b0 = p + np.uint64(u * bits)
            for b in range(bits):
                out[b0 + np.uint64(b)] = np.uint8(np.uint64(w >> np.uint64(8 * b)) & _BYTE)
        done = n // 8 * 8
    wacc, wn, at = np.uint64(0), 0, pos + done * bits // 8
    for i in range(done, n):
        wacc, wn, at = put_code(out, wacc, wn, at, cb[i], bits)
    flush_codes(out, wacc, wn, at)


@nb.njit(inline="always", cache=True)
def take_task(data, pos, cb, n, bits):
    """Inverse of :func:`put_task`: the ``n`` codes of the piece that starts at byte ``pos``
    into ``cb`` (uint32)."""
    p = np.uint64(pos)
    if bits == 8:
        for k in range(n):
            cb[np.uint64(k)] = np.uint32(data[p + np.uint64(k)])
    elif bits == 4:
        for k in range(n // 2):
            b = np.uint32(data[p + np.uint64(k)])
            cb[np.uint64(2 * k)] = b & np.uint32(0xF)
            cb[np.uint64(2 * k + 1)] = b >> np.uint32(4)
        if n % 2:
            cb[np.uint64(n - 1)] = np.uint32(data[p + np.uint64(n // 2)]) & np.uint32(0xF)
    else:
        mask = np.uint64((1 << bits) - 1)
        done = 0
        if bits < 8:
            for u in range(n // 8):
                b0 = p + np.uint64(u * bits)
                w = np.uint64(0)
                for b in range(bits):
                    w |= np.uint64(data[b0 + np.uint64(b)]) << np.uint64(8 * b)
                c = np.uint64(8 * u)
                for k in range(8):
                    cb[c + np.uint64(k)] = np.uint32(np.uint64(w >> np.uint64(k * bits)) & mask)
            done = n // 8 * 8
        racc, rn, at = np.uint64(0), 0, pos + done * bits // 8
        for i in range(done, n):
            code, racc, rn, at = take_code(data, racc, rn, at, bits, mask)
            cb[i] = np.uint32(code)
