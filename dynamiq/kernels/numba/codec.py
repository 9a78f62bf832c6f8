"""Numba kernels for block-scaled quantization: the CPU reference and CPU execution path.

The data layout and the arithmetic (float32 throughout, fixed operation order) are the contract
that other backends reproduce bit for bit:

* The input is processed in *blocks*: a super-group when scales are hierarchical, else a group.
  Blocks are independent, so kernels run in parallel over blocks. A partial last block is read as
  if zero-padded.
* A group of ``G`` elements with ``b``-bit codes occupies ``G*b/8`` bytes of the code stream,
  codes packed LSB-first (element ``i``'s code starts at bit ``i*b`` of its group).
* Group scale codes are little-endian ``sbytes``-byte words; super-group scale codes likewise.
* Normalised magnitude ``a = |x| * (1 / norm)``; decoded value
  ``sign * elem_table[mag] * s`` with ``s = scale_table[code]`` (flat) or
  ``s = S * scale_table[code]``, ``S = super_table[super_code]`` (hierarchical).
* A block containing NaN/Inf gets its top-level scale set to the scale format's NaN code, so the
  whole block decodes to NaN: non-finite input is never silently made finite.

Kernels are *generated*: :func:`encoder` and :func:`decoder` specialise one generic body on the
quantizer's compile-time parameters (code width, rounding modes, table sizes, group sizes), so
the inner loops are branch-free and vectorisable and a newly registered format needs no kernel
code. Each piece of maths is one device function below.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numba as nb
import numpy as np

from dynamiq.kernels.numba.rng import hash_u32, uniform

# rounding modes shared by every backend (see dynamiq.quantizers)
NEAREST = 0
STOCHASTIC = 1
UP = 2
DOWN = 3
CORRELATED = 4

KIND_TABLE = 0
KIND_FP32 = 1


class KernelSpec(NamedTuple):
    """Compile-time parameters of a generated codec kernel (one compiled variant each)."""

    bits: int  # element code width
    mbits: int  # element magnitude bits
    enfin: int  # finite element magnitudes
    lshift: int  # bucket LUT: key = (float32 bits of a) >> lshift
    lkey0: int  # first key of the LUT
    llen: int  # LUT length
    emode: int  # NEAREST | STOCHASTIC | CORRELATED
    group: int  # G
    block: int  # super-group size if hierarchical, else G
    hier: bool
    skind: int
    sbytes: int
    smode: int  # NEAREST | STOCHASTIC | UP | DOWN
    ukind: int
    ubytes: int


@nb.njit(inline="always", cache=True)
def round_bracket(a, lo, tab, nfin, mode, u):
    """Round ``a >= 0`` given ``lo``, the last table index with ``tab[lo] <= a`` (or 0).

    ``mode`` is NEAREST (ties to the even index), STOCHASTIC (up with probability
    ``(a-lo)/(hi-lo)``, decided by ``u * (hi - lo) < a - lo`` with the uniform ``u``), UP or
    DOWN. Values beyond the last finite entry (including +inf) saturate to it; values below
    ``tab[0]`` give 0. Branch-free so that element loops vectorise.
    """
    hi = min(lo + 1, nfin - 1)
    vlo = tab[lo]
    vhi = tab[hi]
    if mode == NEAREST:
        dlo = a - vlo
        dhi = vhi - a
        up = (dhi < dlo) | ((dhi == dlo) & ((lo & 1) == 1))
    elif mode == STOCHASTIC:
        up = u * (vhi - vlo) < a - vlo
    elif mode == UP:
        up = vlo < a
    else:
        up = False
    return lo + np.int64(up & (lo < hi))


@nb.njit(inline="always", cache=True)
def search_bracket(a, tab, nfin, logp):
    """Binary search: last index ``lo < nfin`` with ``tab[lo] <= a`` (0 if none).

    ``tab`` holds ``nfin`` finite ascending values padded with +inf to ``2**logp + 1`` entries.
    """
    lo = 0
    step = (1 << logp) >> 1
    while step > 0:
        if tab[lo + step] <= a:
            lo += step
        step >>= 1
    return min(lo, nfin - 1)


@nb.njit(inline="always", cache=True)
def lut_bracket(a, lut, lshift, lkey0, llen, tab, nfin):
    """Bucket lookup equal to :func:`search_bracket` for ``a >= 0``, in O(1).

    The float32 bit pattern of ``a`` shifted right by ``lshift`` is a monotone bucket key; the
    host-built ``lut`` gives, per bucket, the last table index at or below the bucket start, and
    buckets are fine enough to hold at most one table value, so one compare finishes the job.
    """
    k = np.int64(np.float32(a).view(np.uint32) >> np.uint32(lshift)) - lkey0
    k = min(max(k, 0), llen - 1)
    lo = np.int64(lut[k])
    return min(lo + np.int64(tab[lo + 1] <= a), nfin - 1)


@nb.njit(inline="always", cache=True)
def round_index(a, tab, nfin, logp, mode, u):
    """Index of the table entry that ``a >= 0`` rounds to (binary search + rounding)."""
    return round_bracket(a, search_bracket(a, tab, nfin, logp), tab, nfin, mode, u)


@nb.njit(inline="always", cache=True)
def draw_uniform(mode, k0, k1, p0, p1, rank, world, gidx):
    """The uniform used to round element ``gidx``: independent, or stratified across ranks.

    CORRELATED: ``u = ((rank + shift) mod world + γ) / world`` where ``shift`` is a per-element
    random cyclic shift drawn from the *shared* key ``(p0, p1)`` (the same on every rank) and
    ``γ`` comes from the rank's own key ``(k0, k1)``: each rank's ``u`` is uniform on [0, 1), and
    for every element exactly one rank falls in each stratum ``[k/world, (k+1)/world)``.
    """
    g = uniform(k0, k1, gidx)
    if mode != CORRELATED:
        return g
    shift = hash_u32(p0, p1, gidx) % np.uint64(world)
    slot = (np.uint64(rank) + shift) % np.uint64(world)
    return (np.float32(slot) + g) / np.float32(world)


@nb.njit(inline="always", cache=True)
def element_code(v, inv, etab, enfin, lut, lshift, lkey0, llen, mbits, emode,
                 k0, k1, p0, p1, rank, world, gidx):
    """Sign-magnitude code of ``v`` normalised by ``inv`` (the quantizer's element maths)."""
    a = abs(v) * inv
    u = np.float32(0.0)
    if emode != NEAREST:
        u = draw_uniform(emode, k0, k1, p0, p1, rank, world, gidx)
    lo = lut_bracket(a, lut, lshift, lkey0, llen, etab, enfin)
    m = round_bracket(a, lo, etab, enfin, NEAREST if emode == NEAREST else STOCHASTIC, u)
    sign = np.uint64(np.float32(v).view(np.uint32) >> np.uint32(31))
    return np.uint64(m) | (sign << np.uint64(mbits))


@nb.njit(inline="always", cache=True)
def element_value(c, edec, mbits, s):
    """Decoded value of element code ``c`` under group scale ``s``."""
    v = edec[c & np.uint64((1 << mbits) - 1)] * s
    return -v if (c >> np.uint64(mbits)) & np.uint64(1) else v


@nb.njit(inline="always", cache=True)
def store_word(buf, pos, nbytes, code):
    c = np.uint64(code)
    for k in range(nbytes):
        buf[pos + k] = np.uint8((c >> np.uint64(8 * k)) & np.uint64(0xFF))


@nb.njit(inline="always", cache=True)
def load_word(buf, pos, nbytes):
    c = np.uint64(0)
    for k in range(nbytes):
        c |= np.uint64(buf[pos + k]) << np.uint64(8 * k)
    return c


@nb.njit(inline="always", cache=True)
def encode_scale(ratio, kind, tab, nfin, logp, mode, u):
    """Code of a non-negative scale ``ratio`` (FP32 kind: its raw bits)."""
    if kind == KIND_FP32:
        return np.uint64(np.float32(ratio).view(np.uint32))
    return np.uint64(round_index(ratio, tab, nfin, logp, mode, u))


@nb.njit(inline="always", cache=True)
def decode_scale(code, kind, dec):
    if kind == KIND_FP32:
        return np.uint32(code).view(np.float32)
    return dec[code]


@nb.njit(inline="always", cache=True)
def absmax(src, start, count):
    """``(max |src[start:start+count]|, any non-finite)``; branch-free so it vectorises."""
    amax = np.float32(0.0)
    chk = np.float32(0.0)
    for i in range(start, start + count):
        v = src[i]
        amax = max(amax, abs(v))
        chk += v - v  # 0 for finite values, NaN for NaN/Inf
    return amax, chk != 0.0 or chk != chk


def _group_bytes(spec: KernelSpec) -> int:
    return spec.group * spec.bits // 8


# Runtime arguments travel as three tuples so that every generated kernel has a short, uniform
# signature (built by dynamiq.quantizers):
#   tables  = (etab, lut, edec, stab, sdec, utab, udec)       float32/int32 arrays
#   consts  = (snfin, slogp, snan, sdiv, unfin, ulogp, unan)  scale-format scalars
#   rand    = (k0, k1, p0, p1, q0, q1, rank, world, offset)   random-number keys and position


@functools.cache
def _device(spec: KernelSpec):
    """Block-level device functions specialised on ``spec`` (shared by all kernels below)."""
    bits, mbits, enfin, emode = spec.bits, spec.mbits, spec.enfin, spec.emode
    lshift, lkey0, llen = spec.lshift, spec.lkey0, spec.llen
    G, block, hier = spec.group, spec.block, spec.hier
    skind, sbytes, smode, ukind, ubytes = (
        spec.skind, spec.sbytes, spec.smode, spec.ukind, spec.ubytes
    )
    gpb = block // G
    gbytes = _group_bytes(spec)
    per = 8 // bits if 8 % bits == 0 else 0
    cmask = np.uint64((1 << bits) - 1)

    @nb.njit(inline="always", cache=True)
    def code_at(src, i, inv, etab, lut, rand, gidx):
        return element_code(src[i], inv, etab, enfin, lut, lshift, lkey0, llen, mbits, emode,
                            rand[0], rand[1], rand[2], rand[3], rand[6], rand[7], gidx)

    @nb.njit(inline="always", cache=True)
    def encode_group(src, base, gidx0, inv, codes, cpos, etab, lut, rand):
        if per > 0:
            for k in range(gbytes):
                acc = np.uint64(0)
                for t in range(per):
                    j = k * per + t
                    acc |= code_at(src, base + j, inv, etab, lut, rand, gidx0 + j) << np.uint64(
                        t * bits
                    )
                codes[cpos + k] = np.uint8(acc)
        else:
            acc = np.uint64(0)
            nacc = 0
            pos = cpos
            for j in range(G):
                acc |= code_at(src, base + j, inv, etab, lut, rand, gidx0 + j) << np.uint64(nacc)
                nacc += bits
                while nacc >= 8:
                    codes[pos] = np.uint8(acc & np.uint64(0xFF))
                    acc >>= np.uint64(8)
                    nacc -= 8
                    pos += 1

    @nb.njit(cache=True)
    def encode_block(src, base, b, codes, scales, supers, tables, consts, rand):
        """Encode block ``b`` whose elements are ``src[base:base+block]``."""
        etab, lut, _, stab, sdec, utab, udec = tables
        snfin, slogp, snan, sdiv, unfin, ulogp, unan = consts
        offset = rand[8]
        parent = np.float32(1.0)
        block_bad = False
        if hier:
            amax, block_bad = absmax(src, base, block)
            if block_bad:
                store_word(supers, b * ubytes, ubytes, unan)
            else:
                sc = encode_scale(amax / sdiv, ukind, utab, unfin, ulogp, UP, np.float32(0.0))
                store_word(supers, b * ubytes, ubytes, sc)
                parent = decode_scale(sc, ukind, udec)
        for gi in range(gpb):
            g = b * gpb + gi
            gs = base + gi * G
            gidx = offset + b * block + gi * G
            if block_bad:
                store_word(scales, g * sbytes, sbytes, 0)
                for k in range(gbytes):
                    codes[g * gbytes + k] = 0
                continue
            amax, bad = absmax(src, gs, G)
            if bad:
                store_word(scales, g * sbytes, sbytes, snan)
                for k in range(gbytes):
                    codes[g * gbytes + k] = 0
                continue
            sstar = amax / sdiv
            us = np.float32(0.0)
            if smode == STOCHASTIC:
                us = uniform(rand[4], rand[5], gidx)
            ratio = sstar
            if hier:
                ratio = np.float32(0.0) if parent == 0 else sstar / parent
            sc = encode_scale(ratio, skind, stab, snfin, slogp, smode, us)
            store_word(scales, g * sbytes, sbytes, sc)
            s_hat = decode_scale(sc, skind, sdec)
            if hier:
                s_hat = parent * s_hat
            # An unbiased (stochastic) scale pairs with the exact normaliser, so that
            # E[decoded] = E[level] * E[scale] = x; otherwise normalise by what decode uses.
            norm = sstar if smode == STOCHASTIC else s_hat
            inv = np.float32(0.0) if norm == 0 else np.float32(1.0) / norm
            encode_group(src, gs, gidx, inv, codes, g * gbytes, etab, lut, rand)

    @nb.njit(inline="always", cache=True)
    def put(dst, i, v, accumulate):
        if accumulate:
            dst[i] += v
        else:
            dst[i] = v

    @nb.njit(cache=True)
    def decode_block(dst, base, b, codes, scales, supers, tables, accumulate):
        """Decode block ``b`` into ``dst[base:base+block]`` (``+=`` when ``accumulate``)."""
        edec, sdec, udec = tables[2], tables[4], tables[6]
        parent = np.float32(1.0)
        if hier:
            parent = decode_scale(load_word(supers, b * ubytes, ubytes), ukind, udec)
        for gi in range(gpb):
            g = b * gpb + gi
            gs = base + gi * G
            s = decode_scale(load_word(scales, g * sbytes, sbytes), skind, sdec)
            if hier:
                s = parent * s
            cpos = g * gbytes
            if per > 0:
                for k in range(gbytes):
                    byte = np.uint64(codes[cpos + k])
                    for t in range(per):
                        c = (byte >> np.uint64(t * bits)) & cmask
                        put(dst, gs + k * per + t, element_value(c, edec, mbits, s), accumulate)
            else:
                acc = np.uint64(0)
                nacc = 0
                pos = cpos
                for j in range(G):
                    while nacc < bits:
                        acc |= np.uint64(codes[pos]) << np.uint64(nacc)
                        pos += 1
                        nacc += 8
                    put(dst, gs + j, element_value(acc & cmask, edec, mbits, s), accumulate)
                    acc >>= np.uint64(bits)
                    nacc -= bits

    return encode_block, decode_block


@functools.cache
def encoder(spec: KernelSpec):
    """Generate the encode kernel for ``spec`` (compiled on first call, cached on disk).

    Signature ``(x, tail, nfull, nblocks, codes, scales, supers, tables, consts, rand)``: ``x``
    holds ``nfull`` whole blocks and ``tail`` the zero-padded partial last block (used when
    ``nblocks > nfull``); codes, group scales and super scales are written.
    """
    encode_block, _ = _device(spec)
    block = spec.block

    @nb.njit(parallel=True, cache=True)
    def encode(x, tail, nfull, nblocks, codes, scales, supers, tables, consts, rand):
        for b in nb.prange(nblocks):
            if b < nfull:
                encode_block(x, b * block, b, codes, scales, supers, tables, consts, rand)
            else:
                encode_block(tail, 0, b, codes, scales, supers, tables, consts, rand)

    return encode


@functools.cache
def decoder(spec: KernelSpec, accumulate: bool):
    """Generate the decode kernel for ``spec``.

    Signature ``(out, tail, nfull, nblocks, codes, scales, supers, tables)``: whole blocks are
    written to (or, with ``accumulate``, added in float32 to) ``out``; the partial last block to
    ``tail`` (the caller pre-fills it when accumulating and copies its valid part back).
    """
    _, decode_block = _device(spec)
    block = spec.block

    @nb.njit(parallel=True, cache=True)
    def decode(out, tail, nfull, nblocks, codes, scales, supers, tables):
        for b in nb.prange(nblocks):
            if b < nfull:
                decode_block(out, b * block, b, codes, scales, supers, tables, accumulate)
            else:
                decode_block(tail, 0, b, codes, scales, supers, tables, accumulate)

    return decode


@functools.cache
def recompressor(spec: KernelSpec, writeback: int):
    """Generate the fused ``decompress_accumulate_recompress`` kernel for ``spec``.

    Signature ``(acc, tail, nfull, nblocks, in_codes, in_scales, in_supers, codes, scales,
    supers, tables, consts, rand)``. Per block, in one pass: ``t = acc + decode(in)`` (float32),
    then ``encode(t)`` with fresh scales into ``codes/scales/supers``. ``writeback`` chooses what
    ``acc`` holds afterwards: 0 unchanged, 1 the sum ``t``, 2 ``decode(encode(t))`` (what a sink
    keeps so that it matches the bytes it sends). The block is staged in a small scratch buffer.
    """
    encode_block, decode_block = _device(spec)
    block = spec.block

    @nb.njit(cache=True)
    def hop_block(src, base, b, ic, isc, isu, codes, scales, supers, tables, consts, rand):
        t = np.empty(block, np.float32)
        for j in range(block):
            t[j] = src[base + j]
        decode_block(t, 0, b, ic, isc, isu, tables, True)
        encode_block(t, 0, b, codes, scales, supers, tables, consts, rand)
        if writeback == 1:
            for j in range(block):
                src[base + j] = t[j]
        elif writeback == 2:
            decode_block(src, base, b, codes, scales, supers, tables, False)

    @nb.njit(parallel=True, cache=True)
    def recompress(acc, tail, nfull, nblocks, ic, isc, isu, codes, scales, supers, tables,
                   consts, rand):
        for b in nb.prange(nblocks):
            if b < nfull:
                hop_block(acc, b * block, b, ic, isc, isu, codes, scales, supers, tables,
                          consts, rand)
            else:
                hop_block(tail, 0, b, ic, isc, isu, codes, scales, supers, tables, consts, rand)

    return recompress
