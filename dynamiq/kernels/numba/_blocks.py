"""Template of the block-level Numba kernels (encode, decode, fused recompress).

:func:`dynamiq.kernels.numba.blocks.kernels` instantiates this file once per
:class:`~dynamiq.kernels.abi.KernelSpec`, replacing the constants between the spec
markers; importing it directly gives the variant below (8-bit elements, groups of 32), which is
what linters and readers see. Numba compiles module constants as literals, so every branch on
them below is resolved at compile time.

Runtime arguments (see :mod:`dynamiq.kernels.numba.blocks`): ``tables``, ``consts``, ``rand``
tuples; byte streams ``codes``, ``scales``, ``supers``; whole blocks live in
``x``/``out``/``acc`` and the partial last block (if any) in ``tail``.
"""

import numba as nb
import numpy as np

from dynamiq.kernels.numba.elements import (
    STOCHASTIC,
    UP,
    absmax,
    decode_scale,
    draw_uniform,
    element_code,
    element_value,
    encode_scale,
    load_word,
    store_word,
    uniform,
)

# --- spec ---
BITS = 8
MBITS = 7
EMODE = 0
GROUP = 32
BLOCK = 32
HIER = False
SKIND = 0
SBYTES = 1
SMODE = 2
UKIND = 0
UBYTES = 1
DITHER = False
# --- end spec ---

GPB = BLOCK // GROUP  # groups per block
GBYTES = GROUP * BITS // 8  # code bytes per group
PER = 8 // BITS if 8 % BITS == 0 else 0  # codes per byte when codes do not straddle bytes
CMASK = np.uint64((1 << BITS) - 1)
CHUNK = max(1, 4096 // BLOCK)  # blocks per parallel task (amortises scratch allocation)
TINY = np.float32(2.0**-64)  # normalisers below this are lifted before inversion
LIFT = np.float32(2.0**64)


@nb.njit(inline="always", cache=True)
def encode_group(src, base, gidx0, inv, pre, codes, cpos, tables, consts, rand, cb):
    """Code ``src[base:base+GROUP]`` (normalised: ``(x * pre) * inv``); pack at ``codes[cpos:]``.

    Codes are first computed into the scratch ``cb`` by a loop free of loop-carried state (so
    the compiler can vectorise it, gathers included), then packed.
    """
    etab, lut = tables[0], tables[1]
    enfin, lshift, lkey0, llen = consts[7], consts[8], consts[9], consts[10]
    k0, k1, p0, p1, rank, world = rand[0], rand[1], rand[2], rand[3], rand[6], rand[7]
    for j in range(GROUP):
        cb[j] = element_code(src[base + j] * pre, inv, etab, enfin, lut, lshift, lkey0, llen,
                             MBITS, EMODE, k0, k1, p0, p1, rank, world, gidx0 + j)
    if PER == 1:
        for k in range(GROUP):
            codes[cpos + k] = np.uint8(cb[k])
    elif PER > 1:
        for k in range(GBYTES):
            acc = np.uint32(0)
            for t in range(PER):
                acc |= cb[k * PER + t] << np.uint32(t * BITS)
            codes[cpos + k] = np.uint8(acc)
    else:
        acc = np.uint64(0)
        nacc = 0
        pos = cpos
        for j in range(GROUP):
            acc |= np.uint64(cb[j]) << np.uint64(nacc)
            nacc += BITS
            while nacc >= 8:
                codes[pos] = np.uint8(acc & np.uint64(0xFF))
                acc >>= np.uint64(8)
                nacc -= 8
                pos += 1


@nb.njit(inline="always", cache=True)
def byte_codes(src, s0, k, ginv, gpre, gkeep, g0, etab, lut, enfin, lshift, lkey0, llen,
               k0, k1, p0, p1, rank, world, gidx0):
    """The ``PER`` codes packed in byte ``k`` of the span starting at ``src[s0]``.

    Element ``j`` of the span belongs to group ``g0 + j // GROUP``, is normalised by
    ``(x * gpre) * ginv`` of that group and coded as 0 when the group's ``gkeep`` is 0. Arrays
    come as separate arguments (not inside tuples): a parallel loop then knows they do not
    alias, which is what lets the compiler vectorise it.
    """
    if PER == 1:  # no inner loop: keeps the callers' loops vectorisable
        g = g0 + k // GROUP
        c = element_code(src[s0 + k] * gpre[g], ginv[g], etab, enfin, lut, lshift, lkey0, llen,
                         MBITS, EMODE, k0, k1, p0, p1, rank, world, gidx0 + k)
        return np.uint8(c * gkeep[g])
    acc = np.uint32(0)
    for t in range(PER):
        j = k * PER + t
        g = g0 + j // GROUP
        c = element_code(src[s0 + j] * gpre[g], ginv[g], etab, enfin, lut, lshift, lkey0, llen,
                         MBITS, EMODE, k0, k1, p0, p1, rank, world, gidx0 + j)
        acc |= (c * gkeep[g]) << np.uint32(t * BITS)
    return np.uint8(acc)


@nb.njit(inline="always", cache=True)
def group_codes(src, s0, q, ginv, gpre, gkeep, g0, codes, c0, tables, consts, rand, gidx0, cb):
    """Codes of group ``q`` of the span at ``src[s0]`` for widths that straddle bytes."""
    g = g0 + q
    pos = c0 + q * GBYTES
    encode_group(src, s0 + q * GROUP, gidx0 + q * GROUP, ginv[g], gpre[g], codes, pos, tables,
                 consts, rand, cb)
    if gkeep[g] == 0:
        for k in range(GBYTES):
            codes[pos + k] = 0


@nb.njit(inline="always", cache=True)
def code_span(src, s0, count, ginv, gpre, gkeep, g0, codes, c0, tables, consts, rand, gidx0,
              cb):
    """Element codes of ``src[s0:s0+count]`` (whole groups) into ``codes[c0:]`` (serially)."""
    if PER > 0:
        etab, lut = tables[0], tables[1]
        enfin, lshift, lkey0, llen = consts[7], consts[8], consts[9], consts[10]
        k0, k1, p0, p1, rank, world = rand[0], rand[1], rand[2], rand[3], rand[6], rand[7]
        for k in range(count // PER):
            codes[c0 + k] = byte_codes(src, s0, k, ginv, gpre, gkeep, g0, etab, lut, enfin,
                                       lshift, lkey0, llen, k0, k1, p0, p1, rank, world, gidx0)
    else:
        for q in range(count // GROUP):
            group_codes(src, s0, q, ginv, gpre, gkeep, g0, codes, c0, tables, consts, rand,
                        gidx0, cb)


@nb.njit(cache=True)
def block_scales(src, base, b, scales, supers, tables, consts, rand, ginv, gpre, gkeep, goff):
    """Scales of block ``b`` (elements ``src[base:base+BLOCK]``), and how to code its elements.

    Writes the super-group and group scale codes, and for each group ``gi`` of the block the
    element normalisation ``(x * gpre) * ginv`` and ``gkeep`` (0 for a group whose codes must be
    zero because the group or its block holds NaN/Inf) at index ``goff + gi``.
    """
    stab, sdec, utab, udec = tables[3], tables[4], tables[5], tables[6]
    snfin, slogp, snan, sdiv, unfin, ulogp, unan = consts[:7]
    offset = rand[8]
    parent = np.float32(1.0)
    block_bad = False
    if HIER:
        amax, block_bad = absmax(src, base, BLOCK)
        if block_bad:
            store_word(supers, b * UBYTES, UBYTES, unan)
        else:
            sc = encode_scale(amax / sdiv, UKIND, utab, unfin, ulogp, UP, np.float32(0.0))
            store_word(supers, b * UBYTES, UBYTES, sc)
            parent = decode_scale(sc, UKIND, udec)
    for gi in range(GPB):
        g = b * GPB + gi
        gs = base + gi * GROUP
        gidx = offset + b * BLOCK + gi * GROUP
        ginv[goff + gi] = np.float32(0.0)
        gpre[goff + gi] = np.float32(1.0)
        gkeep[goff + gi] = np.uint32(0)
        if block_bad:
            store_word(scales, g * SBYTES, SBYTES, 0)
            continue
        amax, bad = absmax(src, gs, GROUP)
        if bad:
            store_word(scales, g * SBYTES, SBYTES, snan)
            continue
        sstar = amax / sdiv
        us = np.float32(0.0)
        if SMODE == STOCHASTIC:
            us = uniform(rand[4], rand[5], gidx)
        ratio = sstar
        if HIER:
            ratio = np.float32(0.0) if parent == 0 else sstar / parent
        sc = encode_scale(ratio, SKIND, stab, snfin, slogp, SMODE, us)
        store_word(scales, g * SBYTES, SBYTES, sc)
        s_hat = decode_scale(sc, SKIND, sdec)
        if HIER:
            s_hat = parent * s_hat
        # An unbiased (stochastic) scale pairs with the exact normaliser, so that
        # E[decoded] = E[level] * E[scale] = x; otherwise normalise by what decode uses.
        norm = sstar if SMODE == STOCHASTIC else s_hat
        # A subnormal normaliser has no finite float32 inverse: lift the group by an exact
        # power of two first, so that 0 stays 0 and |x| / norm keeps its value.
        pre = np.float32(1.0) if norm >= TINY else LIFT
        ginv[goff + gi] = np.float32(0.0) if norm == 0 else np.float32(1.0) / (norm * pre)
        gpre[goff + gi] = pre
        gkeep[goff + gi] = np.uint32(1)


@nb.njit(cache=True)
def decode_block(dst, base, b, codes, scales, supers, tables, consts, rand):
    """Decode block ``b`` into ``dst[base:base+BLOCK]``.

    ``consts`` and ``rand`` are those of the *encoder* of the payload: a dithered decoder
    regenerates the uniform each element was rounded with (unused otherwise).
    """
    edec, sdec, udec = tables[2], tables[4], tables[6]
    kap = np.float32(consts[11])
    k0, k1, p0, p1, rank, world = rand[0], rand[1], rand[2], rand[3], rand[6], rand[7]
    gbase = rand[8] + b * BLOCK
    parent = np.float32(1.0)
    if HIER:
        parent = decode_scale(load_word(supers, b * UBYTES, UBYTES), UKIND, udec)
    for gi in range(GPB):
        g = b * GPB + gi
        gs = base + gi * GROUP
        gidx = gbase + gi * GROUP
        s = decode_scale(load_word(scales, g * SBYTES, SBYTES), SKIND, sdec)
        if HIER:
            s = parent * s
        cpos = g * GBYTES
        if PER > 0:
            for k in range(GBYTES):
                byte = np.uint64(codes[cpos + k])
                for t in range(PER):
                    j = k * PER + t
                    c = (byte >> np.uint64(t * BITS)) & CMASK
                    u = np.float32(0.0)
                    if DITHER:
                        u = draw_uniform(EMODE, k0, k1, p0, p1, rank, world, gidx + j)
                    dst[gs + j] = element_value(c, edec, MBITS, s, DITHER, kap, u)
        else:
            acc = np.uint64(0)
            nacc = 0
            pos = cpos
            for j in range(GROUP):
                while nacc < BITS:
                    acc |= np.uint64(codes[pos]) << np.uint64(nacc)
                    pos += 1
                    nacc += 8
                u = np.float32(0.0)
                if DITHER:
                    u = draw_uniform(EMODE, k0, k1, p0, p1, rank, world, gidx + j)
                dst[gs + j] = element_value(acc & CMASK, edec, MBITS, s, DITHER, kap, u)
                acc >>= np.uint64(BITS)
                nacc -= BITS


@nb.njit(parallel=True, cache=True)
def encode(x, tail, nfull, nblocks, codes, scales, supers, tables, consts, rand):
    """Encode ``nblocks`` blocks of ``x`` (the last, if partial, from the padded ``tail``).

    Two passes: every block's scales first, then the element codes of the whole blocks in one
    flat parallel loop, then the partial block.
    """
    ng = nblocks * GPB
    ginv = np.empty(ng, np.float32)
    gpre = np.empty(ng, np.float32)
    gkeep = np.empty(ng, np.uint32)
    nchunks = (nblocks + CHUNK - 1) // CHUNK
    for c in nb.prange(nchunks):
        # int64 block indices throughout, so each device function compiles once
        for b in range(np.int64(c) * CHUNK, min(nblocks, (np.int64(c) + 1) * CHUNK)):
            full = b < nfull
            src = x if full else tail
            base = b * BLOCK if full else b - b
            block_scales(src, base, b, scales, supers, tables, consts, rand, ginv, gpre, gkeep,
                         b * GPB)
    # one flat parallel loop over all bytes (or groups) of the whole blocks: the compiler
    # vectorises it, table gathers included
    if PER > 0:
        etab, lut = tables[0], tables[1]
        enfin, lshift, lkey0, llen = consts[7], consts[8], consts[9], consts[10]
        k0, k1, p0, p1, rank, world, off = (rand[0], rand[1], rand[2], rand[3], rand[6], rand[7],
                                            rand[8])
        for k in nb.prange(nfull * BLOCK // PER):
            codes[k] = byte_codes(x, 0, k, ginv, gpre, gkeep, 0, etab, lut, enfin, lshift, lkey0,
                                  llen, k0, k1, p0, p1, rank, world, off)
    else:
        for q in nb.prange(nfull * GPB):
            cb = np.empty(GROUP, np.uint32)
            group_codes(x, 0, q, ginv, gpre, gkeep, 0, codes, 0, tables, consts, rand, rand[8],
                        cb)
    if nblocks > nfull:
        cb = np.empty(GROUP, np.uint32)
        code_span(tail, 0, BLOCK, ginv, gpre, gkeep, nfull * GPB, codes,
                  nfull * BLOCK * BITS // 8, tables, consts, rand, rand[8] + nfull * BLOCK, cb)


@nb.njit(parallel=True, cache=True)
def decode(out, tail, nfull, nblocks, codes, scales, supers, tables, consts, rand, accumulate):
    """Decode into ``out`` (``+=`` in float32 when ``accumulate``); partial block into ``tail``.

    Accumulation decodes each block into a scratch first, so the add loop is branch-free.
    ``consts``/``rand`` are the encoder's (dithered decoding regenerates its uniforms).
    """
    nchunks = (nblocks + CHUNK - 1) // CHUNK
    for c in nb.prange(nchunks):
        t = np.empty(BLOCK, np.float32)
        for b in range(np.int64(c) * CHUNK, min(nblocks, (np.int64(c) + 1) * CHUNK)):
            full = b < nfull
            base = b * BLOCK if full else b - b
            dst = out if full else tail
            if accumulate:
                decode_block(t, b - b, b, codes, scales, supers, tables, consts, rand)
                for j in range(BLOCK):
                    dst[base + j] += t[j]
            else:
                decode_block(dst, base, b, codes, scales, supers, tables, consts, rand)


@nb.njit(parallel=True, cache=True)
def recompress(acc, tail, nfull, nblocks, nvalid, ic, isc, isu, codes, scales, supers, tables,
               consts, rand, irand, writeback):
    """Fused ``decompress_accumulate_recompress``.

    Per task of ``CHUNK`` blocks, in one pass over the data: ``t = acc + decode(in)`` (float32,
    staged in a task-sized buffer), then ``encode(t)`` with fresh scales into
    ``codes/scales/supers``. ``writeback`` chooses what ``acc`` holds afterwards:
    0 unchanged, 1 the sum ``t``, 2 ``decode(encode(t))`` (what a sink keeps so that it equals
    what every receiver decodes).
    """
    nchunks = (nblocks + CHUNK - 1) // CHUNK
    for c in nb.prange(nchunks):
        b0 = np.int64(c) * CHUNK
        b1 = min(nblocks, b0 + CHUNK)
        # the partial sums of the task's blocks are staged in a task-sized buffer
        t = np.empty(CHUNK * BLOCK, np.float32)
        u = np.empty(BLOCK, np.float32)
        cb = np.empty(GROUP, np.uint32)
        ginv = np.empty(CHUNK * GPB, np.float32)
        gpre = np.empty(CHUNK * GPB, np.float32)
        gkeep = np.empty(CHUNK * GPB, np.uint32)
        for b in range(b0, b1):
            full = b < nfull
            base = b * BLOCK if full else b - b
            src = acc if full else tail
            tb = (b - b0) * BLOCK
            decode_block(u, b - b, b, ic, isc, isu, tables, consts, irand)
            if not full:
                for j in range(nvalid - b * BLOCK, BLOCK):
                    u[j] = np.float32(0.0)
            for j in range(BLOCK):
                t[tb + j] = src[base + j] + u[j]
            block_scales(t, tb, b, scales, supers, tables, consts, rand, ginv, gpre, gkeep,
                         (b - b0) * GPB)
        code_span(t, 0, (b1 - b0) * BLOCK, ginv, gpre, gkeep, 0, codes, b0 * BLOCK * BITS // 8,
                  tables, consts, rand, rand[8] + b0 * BLOCK, cb)
        if writeback == 1:
            for b in range(b0, b1):
                full = b < nfull
                base = b * BLOCK if full else b - b
                src = acc if full else tail
                for j in range(BLOCK):
                    src[base + j] = t[(b - b0) * BLOCK + j]
        elif writeback == 2:
            for b in range(b0, b1):
                full = b < nfull
                decode_block(acc if full else tail, b * BLOCK if full else b - b, b, codes,
                             scales, supers, tables, consts, rand)
