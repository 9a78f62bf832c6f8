"""Triton block kernels: encode, decode (+accumulate) and fused decode-accumulate-recompress.

Twins of the Numba kernels of :mod:`dynamiq.kernels.numba._blocks`, bit for bit: same layout,
same float32 operations in the same order (see :mod:`dynamiq.kernels.triton.jit.elements`).
One kernel per operation serves every quantizer: element width and magnitude bits, rounding
modes, group and block sizes, hierarchy, scale kinds and widths are ``tl.constexpr`` parameters
(Triton compiles one variant per combination, as Numba does per
:class:`~dynamiq.kernels.abi.KernelSpec`); the format tables are runtime tensors.

A program handles a tile of ``NB`` consecutive blocks (a block is a super-group when scales are
hierarchical, else a group), held in registers as a ``[NB * GPB, GROUP]`` tile of groups. The
partial last block is read as zero-padded through masked loads, and stores outside the vector
(``n`` elements, ``nblocks`` blocks) are masked, which is what the Numba kernels' zeroed ``tail``
scratch does.

Runtime argument tensors (built by :mod:`dynamiq.kernels.triton.blocks` from the quantizer's
:class:`~dynamiq.kernels.abi.BlockCode`):

* tables ``etab, lut, edec, stab, sdec, utab, udec`` (float32 / int32),
* ``iconst`` int64 ``[snfin, slogp, snan, unfin, ulogp, unan, enfin, lshift, lkey0, llen]``,
* ``fconst`` float32 ``[sdiv, kap]`` (``kap``: the dither amplitude),
* ``rand`` int64 ``[k0, k1, p0, p1, q0, q1, rank, world, offset]``.

Scalars travel in tensors so that their values never select a compiled variant.
"""

from __future__ import annotations

import triton
import triton.language as tl

from dynamiq.kernels.triton.jit.elements import (
    STOCHASTIC,
    UP,
    absmax,
    decode_scale,
    div_rn,
    draw_uniform,
    element_code,
    element_value,
    encode_scale,
    load_word,
    pack_codes,
    store_word,
    unpack_codes,
)
from dynamiq.kernels.triton.jit.rng import uniform

__all__ = ["decode_kernel", "encode_kernel", "recompress_kernel"]

_TINY = tl.constexpr(5.421010862427522e-20)  # 2**-64: normalisers below are lifted first
_LIFT = tl.constexpr(1.8446744073709552e19)  # 2**64


@triton.jit
def _scale_consts(iconst, fconst):
    snfin = tl.load(iconst + 0).to(tl.int32)
    slogp = tl.load(iconst + 1).to(tl.int32)
    snan = tl.load(iconst + 2).to(tl.uint32)
    unfin = tl.load(iconst + 3).to(tl.int32)
    ulogp = tl.load(iconst + 4).to(tl.int32)
    unan = tl.load(iconst + 5).to(tl.uint32)
    sdiv = tl.load(fconst + 0)
    return snfin, slogp, snan, unfin, ulogp, unan, sdiv


@triton.jit
def _elem_consts(iconst):
    enfin = tl.load(iconst + 6).to(tl.int32)
    lshift = tl.load(iconst + 7).to(tl.int32)
    lkey0 = tl.load(iconst + 8).to(tl.int32)
    llen = tl.load(iconst + 9).to(tl.int32)
    return enfin, lshift, lkey0, llen


@triton.jit
def _rand(rand):
    k0 = tl.load(rand + 0).to(tl.uint32)
    k1 = tl.load(rand + 1).to(tl.uint32)
    p0 = tl.load(rand + 2).to(tl.uint32)
    p1 = tl.load(rand + 3).to(tl.uint32)
    q0 = tl.load(rand + 4).to(tl.uint32)
    q1 = tl.load(rand + 5).to(tl.uint32)
    rank = tl.load(rand + 6).to(tl.uint32)
    world = tl.load(rand + 7).to(tl.uint32)
    offset = tl.load(rand + 8)
    return k0, k1, p0, p1, q0, q1, rank, world, offset


@triton.jit
def _per_row(v, NB: tl.constexpr, GPB: tl.constexpr):
    """Broadcast a per-block ``[NB]`` tensor to the ``[NB * GPB]`` group rows."""
    return tl.reshape(tl.broadcast_to(v[:, None], (NB, GPB)), (NB * GPB,))


@triton.jit
def _tile(nblocks, NB: tl.constexpr, GPB: tl.constexpr):
    """Indices of this program's tile: first block, per-row global group, per-block validity."""
    b0 = tl.program_id(0).to(tl.int64) * NB
    grow = b0 * GPB + tl.arange(0, NB * GPB)  # global group index of every row
    blocks = b0 + tl.arange(0, NB)
    return b0, grow, blocks, blocks < nblocks


@triton.jit
def block_scales(t, grow, stab, sdec, utab, udec, iconst, fconst, q0, q1, offset,
                 NB: tl.constexpr, GPB: tl.constexpr, GROUP: tl.constexpr, HIER: tl.constexpr,
                 SKIND: tl.constexpr, SMODE: tl.constexpr, UKIND: tl.constexpr):
    """Scales of the tile ``t`` (float32 ``[NB * GPB, GROUP]``); numba ``block_scales``.

    Returns:
        ``(scode, ucode, inv, pre, keep)``: group scale codes (uint32 ``[rows]``), super-group
        scale codes (uint32 ``[NB]``; unused when flat), the element normalisation
        ``(x * pre) * inv`` per row, and ``keep`` (false for rows whose codes must be zero
        because the group or its block holds NaN/Inf).
    """
    snfin, slogp, snan, unfin, ulogp, unan, sdiv = _scale_consts(iconst, fconst)
    amax, bad = absmax(t, 1)
    if HIER:
        bmax, bbad = absmax(tl.reshape(t, (NB, GPB * GROUP)), 1)
        usc = encode_scale(div_rn(bmax, sdiv), UKIND, utab, unfin, ulogp, UP,
                           tl.zeros((NB,), tl.float32))
        ucode = tl.where(bbad, unan, usc)
        parent = _per_row(decode_scale(usc, UKIND, udec), NB, GPB)
        block_bad = _per_row(bbad, NB, GPB)
    else:
        ucode = tl.zeros((NB,), tl.uint32)
        parent = tl.full((NB * GPB,), 1.0, tl.float32)
        block_bad = tl.zeros((NB * GPB,), tl.int1)
    sstar = div_rn(amax, sdiv)
    if SMODE == STOCHASTIC:
        us = uniform(q0, q1, offset + grow * GROUP)
    else:
        us = tl.zeros((NB * GPB,), tl.float32)
    ratio = sstar
    if HIER:
        nonzero = parent != 0.0
        ratio = tl.where(nonzero, div_rn(sstar, tl.where(nonzero, parent, 1.0)), 0.0)
    sc = encode_scale(ratio, SKIND, stab, snfin, slogp, SMODE, us)
    s_hat = decode_scale(sc, SKIND, sdec)
    if HIER:
        s_hat = parent * s_hat
    # an unbiased (stochastic) scale pairs with the exact normaliser; otherwise normalise by
    # what decode uses
    if SMODE == STOCHASTIC:
        norm = sstar
    else:
        norm = s_hat
    # a subnormal normaliser has no finite float32 inverse: lift the group by 2**64 first (not
    # a zero one: x * 0 is a zero, where a lifted x could overflow and inf * 0 be a NaN)
    pre = tl.where((norm >= _TINY) | (norm == 0.0), 1.0, _LIFT)
    lifted = norm * pre
    inv = tl.where(norm == 0.0, 0.0, div_rn(1.0, tl.where(norm == 0.0, 1.0, lifted)))
    keep = ~(bad | block_bad)
    scode = tl.where(block_bad, 0, tl.where(bad, snan, sc))
    return scode, ucode, inv, pre, keep


@triton.jit
def element_codes(t, inv, pre, keep, grow, etab, lut, iconst, k0, k1, p0, p1, rank, world,
                  offset, GROUP: tl.constexpr, MBITS: tl.constexpr, EMODE: tl.constexpr,
                  MIDRISE: tl.constexpr):
    """uint32 codes of the tile ``t`` ``[rows, GROUP]`` (0 in rows not kept)."""
    enfin, lshift, lkey0, llen = _elem_consts(iconst)
    gidx = offset + grow[:, None] * GROUP + tl.arange(0, GROUP)[None, :]
    c = element_code(t * pre[:, None], inv[:, None], etab, enfin, lut, lshift, lkey0, llen,
                     MBITS, EMODE, k0, k1, p0, p1, rank, world, gidx, MIDRISE)
    return tl.where(keep[:, None], c, 0)


@triton.jit
def decode_tile(c, scode, ucode, edec, sdec, udec, fconst, rand, grow, NB: tl.constexpr,
                GPB: tl.constexpr, GROUP: tl.constexpr, MBITS: tl.constexpr, HIER: tl.constexpr,
                SKIND: tl.constexpr, UKIND: tl.constexpr, EMODE: tl.constexpr,
                DITHER: tl.constexpr, MIDRISE: tl.constexpr):
    """float32 values ``[rows, GROUP]`` of codes ``c`` (flat) under the stored scale codes.

    ``rand`` holds the encoder's keys and ``fconst[1]`` the dither amplitude: a ``DITHER``
    decoder regenerates the uniform each element was rounded with (numba ``decode_block``).
    """
    s = decode_scale(scode, SKIND, sdec)
    if HIER:
        s = _per_row(decode_scale(ucode, UKIND, udec), NB, GPB) * s
    if DITHER:
        k0, k1, p0, p1, _q0, _q1, rank, world, offset = _rand(rand)
        gidx = offset + grow[:, None] * GROUP + tl.arange(0, GROUP)[None, :]
        u = draw_uniform(EMODE, k0, k1, p0, p1, rank, world, gidx)
        kap = tl.load(fconst + 1)
    else:
        u = 0.0
        kap = 0.0
    return element_value(tl.reshape(c, (NB * GPB, GROUP)), edec, MBITS, s[:, None], DITHER,
                         kap, u, MIDRISE)


@triton.jit
def _load_tile(codes, scales, supers, nblocks, b0, grow, blocks, bvalid, NB: tl.constexpr,
               GPB: tl.constexpr, GROUP: tl.constexpr, BITS: tl.constexpr, E: tl.constexpr,
               L: tl.constexpr, HIER: tl.constexpr, SBYTES: tl.constexpr, UBYTES: tl.constexpr):
    """Read the tile's element codes (flat), group scale codes and super-group scale codes."""
    # chunks of E codes: NB * GPB * GROUP // E of them; a block is GPB * GROUP codes
    cvalid = (b0 + tl.arange(0, NB * GPB * GROUP // E) * E // (GPB * GROUP)) < nblocks
    c = unpack_codes(codes, b0 * (GPB * GROUP * BITS // 8), cvalid,
                     nblocks * (GPB * GROUP * BITS // 8), NB * GPB * GROUP // E, E, L, BITS)
    rvalid = _per_row(bvalid, NB, GPB)
    scode = load_word(scales, grow * SBYTES, SBYTES, rvalid)
    if HIER:
        ucode = load_word(supers, blocks * UBYTES, UBYTES, bvalid)
    else:
        ucode = tl.zeros((NB,), tl.uint32)
    return c, scode, ucode


@triton.jit
def _store_tile(c, scode, ucode, codes, scales, supers, nblocks, b0, grow, blocks, bvalid,
                NB: tl.constexpr, GPB: tl.constexpr, GROUP: tl.constexpr, BITS: tl.constexpr,
                E: tl.constexpr, L: tl.constexpr, HIER: tl.constexpr, SBYTES: tl.constexpr,
                UBYTES: tl.constexpr):
    """Write the tile's element codes ``[rows, GROUP]``, group and super-group scale codes."""
    cvalid = (b0 + tl.arange(0, NB * GPB * GROUP // E) * E // (GPB * GROUP)) < nblocks
    pack_codes(tl.reshape(c, (NB * GPB * GROUP,)), codes, b0 * (GPB * GROUP * BITS // 8), cvalid,
               nblocks * (GPB * GROUP * BITS // 8), NB * GPB * GROUP // E, E, L, BITS)
    store_word(scales, grow * SBYTES, SBYTES, scode, _per_row(bvalid, NB, GPB))
    if HIER:
        store_word(supers, blocks * UBYTES, UBYTES, ucode, bvalid)


@triton.jit
def encode_kernel(x, n, nblocks, codes, scales, supers, etab, lut, edec, stab, sdec, utab, udec,
                  iconst, fconst, rand, BITS: tl.constexpr, MBITS: tl.constexpr,
                  EMODE: tl.constexpr, GROUP: tl.constexpr, GPB: tl.constexpr,
                  HIER: tl.constexpr, SKIND: tl.constexpr, SBYTES: tl.constexpr,
                  SMODE: tl.constexpr, UKIND: tl.constexpr, UBYTES: tl.constexpr,
                  NB: tl.constexpr, E: tl.constexpr, L: tl.constexpr, DITHER: tl.constexpr,
                  MIDRISE: tl.constexpr):
    """Encode ``x`` (float32 ``[n]``) into the payload sections; numba ``encode``.

    ``codes`` / ``scales`` / ``supers`` are the uint8 sections of the payload buffer.
    """
    b0, grow, blocks, bvalid = _tile(nblocks, NB, GPB)
    k0, k1, p0, p1, q0, q1, rank, world, offset = _rand(rand)
    eidx = grow[:, None] * GROUP + tl.arange(0, GROUP)[None, :]
    t = tl.load(x + eidx, mask=eidx < n, other=0.0)
    scode, ucode, inv, pre, keep = block_scales(t, grow, stab, sdec, utab, udec, iconst, fconst,
                                                q0, q1, offset, NB, GPB, GROUP, HIER, SKIND,
                                                SMODE, UKIND)
    c = element_codes(t, inv, pre, keep, grow, etab, lut, iconst, k0, k1, p0, p1, rank, world,
                      offset, GROUP, MBITS, EMODE, MIDRISE)
    _store_tile(c, scode, ucode, codes, scales, supers, nblocks, b0, grow, blocks, bvalid, NB,
                GPB, GROUP, BITS, E, L, HIER, SBYTES, UBYTES)


@triton.jit
def decode_kernel(out, n, nblocks, codes, scales, supers, edec, sdec, udec, fconst, rand,
                  BITS: tl.constexpr, MBITS: tl.constexpr, GROUP: tl.constexpr,
                  GPB: tl.constexpr, HIER: tl.constexpr, SKIND: tl.constexpr,
                  SBYTES: tl.constexpr, UKIND: tl.constexpr, UBYTES: tl.constexpr,
                  NB: tl.constexpr, E: tl.constexpr, L: tl.constexpr, EMODE: tl.constexpr,
                  DITHER: tl.constexpr, ACCUMULATE: tl.constexpr, MIDRISE: tl.constexpr):
    """Decode the payload sections into ``out`` (float32 ``[n]``, ``+=`` when ``ACCUMULATE``).

    Equivalent to numba ``decode``; the accumulation is ``out + value`` in float32. ``rand``
    is the encoder's (dithered decoding).
    """
    b0, grow, blocks, bvalid = _tile(nblocks, NB, GPB)
    c, scode, ucode = _load_tile(codes, scales, supers, nblocks, b0, grow, blocks, bvalid, NB,
                                 GPB, GROUP, BITS, E, L, HIER, SBYTES, UBYTES)
    v = decode_tile(c, scode, ucode, edec, sdec, udec, fconst, rand, grow, NB, GPB, GROUP, MBITS,
                    HIER, SKIND, UKIND, EMODE, DITHER, MIDRISE)
    eidx = grow[:, None] * GROUP + tl.arange(0, GROUP)[None, :]
    emask = eidx < n
    if ACCUMULATE:
        v = tl.load(out + eidx, mask=emask, other=0.0) + v
    tl.store(out + eidx, v, mask=emask)


@triton.jit
def recompress_kernel(acc, n, nblocks, icodes, iscales, isupers, codes, scales, supers, etab,
                      lut, edec, stab, sdec, utab, udec, iconst, fconst, rand, irand,
                      BITS: tl.constexpr, MBITS: tl.constexpr, EMODE: tl.constexpr,
                      GROUP: tl.constexpr, GPB: tl.constexpr, HIER: tl.constexpr,
                      SKIND: tl.constexpr, SBYTES: tl.constexpr, SMODE: tl.constexpr,
                      UKIND: tl.constexpr, UBYTES: tl.constexpr, NB: tl.constexpr,
                      E: tl.constexpr, L: tl.constexpr, DITHER: tl.constexpr,
                      WRITEBACK: tl.constexpr, MIDRISE: tl.constexpr):
    """Fused ``encode(acc + decode(incoming))``; numba ``recompress``.

    The incoming payload (``icodes/iscales/isupers``) is decoded, added to ``acc`` (``acc + u``
    in float32, padding read as 0), and the sum is encoded with fresh scales into
    ``codes/scales/supers``. ``WRITEBACK``: 0 leaves ``acc``, 1 stores the sum, 2 stores the
    decoded outgoing values (what every receiver will decode). ``irand`` holds the incoming
    payload's encoder's keys.
    """
    b0, grow, blocks, bvalid = _tile(nblocks, NB, GPB)
    k0, k1, p0, p1, q0, q1, rank, world, offset = _rand(rand)
    ic, isc, isu = _load_tile(icodes, iscales, isupers, nblocks, b0, grow, blocks, bvalid, NB,
                              GPB, GROUP, BITS, E, L, HIER, SBYTES, UBYTES)
    u = decode_tile(ic, isc, isu, edec, sdec, udec, fconst, irand, grow, NB, GPB, GROUP, MBITS,
                    HIER, SKIND, UKIND, EMODE, DITHER, MIDRISE)
    eidx = grow[:, None] * GROUP + tl.arange(0, GROUP)[None, :]
    emask = eidx < n
    # the padding sums as zero whatever the incoming padding decodes to (dithered: not zero)
    t = tl.load(acc + eidx, mask=emask, other=0.0) + tl.where(emask, u, 0.0)
    scode, ucode, inv, pre, keep = block_scales(t, grow, stab, sdec, utab, udec, iconst, fconst,
                                                q0, q1, offset, NB, GPB, GROUP, HIER, SKIND,
                                                SMODE, UKIND)
    c = element_codes(t, inv, pre, keep, grow, etab, lut, iconst, k0, k1, p0, p1, rank, world,
                      offset, GROUP, MBITS, EMODE, MIDRISE)
    _store_tile(c, scode, ucode, codes, scales, supers, nblocks, b0, grow, blocks, bvalid, NB,
                GPB, GROUP, BITS, E, L, HIER, SBYTES, UBYTES)
    if WRITEBACK == 1:
        tl.store(acc + eidx, t, mask=emask)
    elif WRITEBACK == 2:
        v = decode_tile(tl.reshape(c, (NB * GPB * GROUP,)), scode, ucode, edec, sdec, udec,
                        fconst, rand, grow, NB, GPB, GROUP, MBITS, HIER, SKIND, UKIND, EMODE,
                        DITHER, MIDRISE)
        tl.store(acc + eidx, v, mask=emask)
