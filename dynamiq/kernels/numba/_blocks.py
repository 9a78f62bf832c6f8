"""Template of the block-level Numba kernels (encode, decode, fused recompress).

:func:`dynamiq.kernels.numba.blocks.kernels` instantiates this file once per
:class:`~dynamiq.kernels.abi.KernelSpec`, replacing the constants between the spec
markers; importing it directly gives the variant below (8-bit elements, groups of 32), which is
what linters and readers see. Numba compiles module constants as literals, so every branch on
them below is resolved at compile time.

Each kernel covers ``nblocks`` whole blocks of one array, the ``b0``-th block of the stream
onwards (the host calls it a second time for a zero-padded partial last block). The work is
cut into *tasks* of whole blocks (about 4096 coordinates, so a task's scratch stays in the
first-level cache); a call codes tasks ``c0 .. c1``, and the host runs ranges of tasks on
several threads at once (the kernels release the GIL). Within a task every per-element pass
is a loop without loop-carried state, which LLVM vectorises:

1. unpack the codes into one byte (or 16-bit word) per element,
2. decode them under the per-group scales (and add, for a hop),
3. compute the new scales (group maxima, super-group scales, then all group scales in one
   loop) and each element's normalised value,
4. draw every element's uniform (a loop of its own), then code every element from its
   normalised value and uniform,
5. pack the codes.

What keeps these loops vectorised (checked in the generated code):

* the passes work on the task's own scratch arrays, allocated in the kernel, so the few
  overlap checks LLVM adds before a vector loop always pass;
* indices are unsigned (``uint64``): Numba adds a negative-index wrap-around to every signed
  index, and that select defeats the vectoriser;
* per-group loops run to a runtime trip count (``consts[12]``, the group size), so LLVM
  vectorises them instead of unrolling them into scalar code;
* element levels are found by arithmetic (minifloat and integer grids) or by compares (at
  most 16 levels) rather than by table gathers, whenever the format allows it;
* the passes below are ``forceinline`` functions, inlined by LLVM into the kernel's loop over
  tasks, not by Numba's IR inlining, which re-types a pass at every call site and made cold
  compiles about 2.5 times slower.

The kernels are plain serial functions (``nogil``), not ``parallel=True`` loops: Numba's
parallel lowering compiles every kernel a second time as the body of a parallel region, which
made a spec's cold compile about twice as long for the same machine code speed.

Runtime arguments (see :mod:`dynamiq.kernels.numba.blocks`): ``tables``, ``consts``, ``rand``
tuples; byte streams ``codes``, ``scales``, ``supers``.

The module is long because it is one template: each spec's kernels are generated as one module,
and every pass they inline must be in it to see the spec's constants.
"""

import math

import numba as nb
import numpy as np

from dynamiq.kernels.numba.elements import (
    CORRELATED,
    NEAREST,
    STOCHASTIC,
    UP,
    absmax,
    decode_scale,
    draw_uniform,
    draw_weyl,
    element_code,
    element_value,
    encode_scale,
    encode_scale_bucket,
    halving_levels,
    level_to_value,
    load_word,
    lut_finish,
    lut_key,
    round_code,
    store_word,
    stratified,
    walked,
)
from dynamiq.kernels.numba.levels import round_grid, select_tree, tree_levels
from dynamiq.kernels.numba.packing import HAS_BMI2, pdep64, pext64
from dynamiq.kernels.numba.permute import HAS_AVX2, permute_levels
from dynamiq.kernels.numba.rng import (
    WEYL_STEP,
    stratum_params,
    weyl_hash,
    weyl_state,
    weyl_uniform,
    window_end,
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
SSEARCH = 0
EFAM = 1
EMANT = 3
EBIAS = 7
MIDRISE = False
SGRID = 0
# --- end spec ---

#: The passes below: compiled once per spec and inlined by LLVM into the kernels, never called
#: from Python, so they are compiled without the wrappers that a call from Python needs (an
#: argument-unboxing function each, a fifth of a spec's cold compile).
_pass = nb.njit(forceinline=True, cache=True, no_cpython_wrapper=True, no_cfunc_wrapper=True,
                error_model="numpy")

U = np.uint64
U32 = np.uint32
GPB = BLOCK // GROUP  # groups per block
TASK = max(1, 4096 // BLOCK)  # blocks per parallel task
TN = TASK * BLOCK  # coordinates per task
TG = TASK * GPB  # groups per task
# Groups of fewer than 32 elements are decoded and normalised two at a time, in one loop of
# twice the group size that picks each element's scale by a compare: LLVM vectorises a loop
# 32 elements at a time (8 lanes, 4 interleaved), so a loop of 16 ran its scalar remainder
# only. Pairs are taken where a block holds an even number of groups (any hierarchical block:
# both sizes are powers of two), so a pair never spans two blocks.
PAIRS = GROUP < 32 and GPB % 2 == 0
GSTEP = 2 if PAIRS else 1
# Codes are packed PACK at a time into PACK * BITS / 8 whole bytes (LSB first); widths whose
# unit would not fit a 64-bit word fall back to a serial bit stream.
PACK = 8 // math.gcd(BITS, 8)
PBYTES = PACK * BITS // 8
WORDS = PACK * BITS <= 64 and BLOCK % PACK == 0
# Units of codes of widths 3, 5, 6 and 7 pack by one bit extraction from their PACK code bytes
# read as one word (unpack: one deposit), where the host has it, instead of a shift, mask and
# or per code (measured: 5-bit units 2.5× faster to pack, 8× faster to unpack); 1-, 2- and
# 4-bit units pack in loops that vectorise already.
PEXT = HAS_BMI2 and WORDS and BITS in (3, 5, 6, 7)
# the codes' bits within their PACK bytes, and where code t of a unit starts in the word that
# packs into the unit's bytes (with PEXT, the word of its code bytes)
BYTEMASK = U(sum(((1 << BITS) - 1) << (8 * t) for t in range(PACK)) if BITS < 8 else 0)
CSHIFT = 8 if PEXT else BITS
CODE_T = np.uint8 if BITS <= 8 else np.uint16
MMASK = U((1 << BITS) - 1)
# (a deposited word holds each code in a byte of its own, stored whole: one 8-byte store)
CMASK = U(0xFF) if PEXT else MMASK
MMAG = (1 << MBITS) - 1  # magnitude bits of a code
# how levels are decoded (see level_value): the element search's family but for the bucket
# lookup's (0), which decodes by table load; and whether that decoding holds for the finite
# codes only (minifloat and integer arithmetic), so that the others need a fix-up pass
DFAM = EFAM if EFAM in (1, 2, 3) else 0
# whether the levels of codes of at most 16 magnitudes, whatever their family, are looked up
# eight at a time by a vector permute of the decode table, in a loop of their own, where the
# host has one (measured, 1 thread: the decode of 4-bit ε-levels about 1.8 times faster, of
# DynamiQ's dithered 5-bit levels about 1.5 times, than by the select tree in the decoding loop)
PERMUTED = HAS_AVX2 and MBITS <= 4
FIXUP = DFAM in (1, 2) and not PERMUTED
# whether decoding reads the levels from the table in a loop of their own (see load_levels),
# and the scratch that a task's levels need then
LOADED = DFAM == 0 and not PERMUTED
# whether the decoding loop reads each level from the task's scratch (one name, so that Numba
# prunes the branches on it before typing), or finds it by the select tree
IN_SCRATCH = LOADED or PERMUTED
TREE = DFAM == 3 and not PERMUTED
LN = TN if IN_SCRATCH else 1
CBYTES = BLOCK * BITS // 8  # code bytes per block
# whether encoding finds the element brackets by table loads in a loop of their own (see
# table_brackets), whether it draws its uniforms in one too (see code_elements), and the
# scratch these need for a task (one element when nothing uses it)
TABLED = EFAM == 0
DRAWN = EMODE != NEAREST and (TABLED or EMODE == CORRELATED)
UN_ENC = TN if DRAWN else 1
BN = TN if TABLED else 1
UN_DEC = TN if DITHER else 1
# steps of the stratum's cycle walk taken in vector lanes (see draw_loop)
WALK = 6
# whether a hop draws the sender's uniforms (a dithered decode) and its own (correlated
# rounding) in one loop, from one hash of their shared key (see draw_pairs)
PAIRED = DITHER and EMODE == CORRELATED
# whether group scales are searched by arithmetic on their uniform grid (round_grid), in a
# vector loop, rather than through the table (a single name, so Numba prunes the branch)
GRIDDED = SGRID > 0
TINY = np.float32(2.0**-64)  # normalisers below this are lifted before inversion
LIFT = np.float32(2.0**64)


@_pass
def pack(cb, n, codes, c0):
    """Pack the codes ``cb[:n]`` into ``codes[c0:]`` (``n`` whole blocks)."""
    if PACK == 1 and BITS == 8:
        for j in range(n):
            codes[c0 + U(j)] = cb[j]
    elif WORDS:
        for k in range(n // PACK):
            ku = U(k)
            w = U(0)
            for t in range(PACK):
                w |= U(cb[ku * U(PACK) + U(t)]) << U(t * CSHIFT)
            if PEXT:
                w = pext64(w, BYTEMASK)
            for q in range(PBYTES):
                codes[c0 + ku * U(PBYTES) + U(q)] = np.uint8((w >> U(8 * q)) & U(0xFF))
    else:
        acc = U(0)
        nacc = 0
        pos = c0
        for j in range(n):
            acc |= U(cb[j]) << U(nacc)
            nacc += BITS
            while nacc >= 8:
                codes[pos] = np.uint8(acc & U(0xFF))
                acc >>= U(8)
                nacc -= 8
                pos += U(1)


@_pass
def unpack(codes, c0, n, cb):
    """Inverse of :func:`pack`: the ``n`` codes at ``codes[c0:]`` into ``cb[:n]``."""
    if PACK == 1 and BITS == 8:
        for j in range(n):
            cb[j] = codes[c0 + U(j)]
    elif WORDS:
        for k in range(n // PACK):
            ku = U(k)
            w = U(0)
            for q in range(PBYTES):
                w |= U(codes[c0 + ku * U(PBYTES) + U(q)]) << U(8 * q)
            if PEXT:
                w = pdep64(w, BYTEMASK)
            for t in range(PACK):
                cb[ku * U(PACK) + U(t)] = CODE_T((w >> U(t * CSHIFT)) & CMASK)
    else:
        acc = U(0)
        nacc = 0
        pos = c0
        for j in range(n):
            while nacc < BITS:
                acc |= U(codes[pos]) << U(nacc)
                pos += U(1)
                nacc += 8
            cb[j] = CODE_T(acc & MMASK)
            acc >>= U(BITS)
            nacc -= BITS


@_pass
def group_scales(scales, supers, sdec, udec, b0, nb_, sv):
    """Decoded scale of every group of stream blocks ``b0 .. b0+nb_`` into ``sv``."""
    for i in range(nb_):
        b = b0 + U(i)
        parent = np.float32(1.0)
        if HIER:
            parent = decode_scale(load_word(supers, b * U(UBYTES), UBYTES), UKIND, udec)
        for gi in range(GPB):
            g = b * U(GPB) + U(gi)
            s = decode_scale(load_word(scales, g * U(SBYTES), SBYTES), SKIND, sdec)
            sv[i * GPB + gi] = parent * s if HIER else s


@_pass
def draw_loop(n, rand, gidx0, ub, pow2):
    """``ub[j]`` = the uniform that element ``gidx0 + j`` is rounded with, ``j < n`` (``pow2``:
    a literal, see ``draw_uniform``; correlated rounding over a world that is not a power of
    two takes the walk below).

    The stratum's cycle walk has a data-dependent number of steps, which kept the loop scalar
    (measured: about 18 ns per element for DynamiQ's 5-bit encode over 3 ranks). The walk's
    first ``WALK`` steps run in vector lanes instead, as a loop without exits; the few elements
    whose walk is longer (under 2 %, each step leaving the world's range with probability
    below one half) are marked -1 and drawn again by the full walk in a second loop, which
    runs only when the first counted one.
    """
    k0, k1, p0, p1, rank, world = rand[0], rand[1], rand[2], rand[3], rand[6], rand[7]
    m, s = stratum_params(world)
    missed = np.uint32(0)
    # one run but where the indices' high words change (see window_end): the elements' stream
    # states are induction variables of the inner loop
    j = np.int64(0)
    while j < n:
        end = window_end(gidx0, j, n, 1)
        w, c = weyl_state(k0, k1, gidx0 + U(j))
        wp, cp = weyl_state(p0, p1, gidx0 + U(j))
        for jj in range(j, end):
            if EMODE == CORRELATED and not pow2:
                u = walked(weyl_uniform(w, c), weyl_hash(wp, cp), rank, world, m, s, WALK)
                missed = np.uint32(missed + np.uint32(u < np.float32(0.0)))
            else:
                u = draw_weyl(EMODE, w, c, wp, cp, rank, world, pow2)
            ub[U(jj)] = u
            w = U32(w + WEYL_STEP)
            wp = U32(wp + WEYL_STEP)
        j = end
    if missed != 0:
        redraw_walks(n, k0, k1, p0, p1, rank, world, gidx0, ub)


@_pass
def draw_uniforms(n, rand, gidx0, ub):
    """The uniforms of ``n`` elements into ``ub``, in a loop of their own.

    Drawn inside the loop that codes or decodes the elements, next to the level search or
    the table load, the hash keeps LLVM from vectorising that loop (measured: a dithered
    decode three times slower); alone, each loop vectorises. Correlated rounding over a
    power-of-two world takes the stratum without the cycle walk (the condition on spec
    constants is pruned when Numba compiles).
    """
    if EMODE == CORRELATED and (rand[7] & (rand[7] - 1)) == 0:
        draw_loop(n, rand, gidx0, ub, True)
    else:
        draw_loop(n, rand, gidx0, ub, False)


@_pass
def redraw_walks(n, k0, k1, p0, p1, rank, world, gidx0, ub):
    """The full cycle walk of every element ``j < n`` whose walk in vector lanes ended
    unfinished (``ub[j]`` is -1 then): its uniform under the keys and rank given."""
    for j in range(n):
        ju = U(j)
        if ub[ju] < np.float32(0.0):
            ub[ju] = draw_uniform(EMODE, k0, k1, p0, p1, rank, world, gidx0 + ju, False)


@_pass
def draw_pairs(n, irand, rand, gidx0, ui, uo):
    """The uniforms of a correlated hop's two roundings of elements ``gidx0 .. gidx0+n``: the
    sender's (``irand``, which a dithered decode subtracts) into ``ui`` and this rank's
    (``rand``) into ``uo``, equal to :func:`draw_uniforms` of each.

    The two share the permutation's key (``irand[2:4] == rand[2:4]``, the caller's
    condition), so each element hashes it once for both ranks: three hashes per element
    instead of four.
    """
    ik0, ik1, irank = irand[0], irand[1], irand[6]
    k0, k1, p0, p1, rank, world = rand[0], rand[1], rand[2], rand[3], rand[6], rand[7]
    pow2 = (world & (world - 1)) == 0
    m, s = stratum_params(world)
    missed = np.uint32(0)
    j = np.int64(0)
    while j < n:
        end = window_end(gidx0, j, n, 1)
        wi, ci = weyl_state(ik0, ik1, gidx0 + U(j))
        w, c = weyl_state(k0, k1, gidx0 + U(j))
        wp, cp = weyl_state(p0, p1, gidx0 + U(j))
        if pow2:
            for jj in range(j, end):
                h = weyl_hash(wp, cp)
                ui[U(jj)] = stratified(weyl_uniform(wi, ci), h, irank, world, True)
                uo[U(jj)] = stratified(weyl_uniform(w, c), h, rank, world, True)
                wi, w, wp = U32(wi + WEYL_STEP), U32(w + WEYL_STEP), U32(wp + WEYL_STEP)
        else:
            for jj in range(j, end):
                h = weyl_hash(wp, cp)
                a = walked(weyl_uniform(wi, ci), h, irank, world, m, s, WALK)
                b = walked(weyl_uniform(w, c), h, rank, world, m, s, WALK)
                ui[U(jj)] = a
                uo[U(jj)] = b
                missed = np.uint32(missed + np.uint32((a < np.float32(0.0))
                                                      | (b < np.float32(0.0))))
                wi, w, wp = U32(wi + WEYL_STEP), U32(w + WEYL_STEP), U32(wp + WEYL_STEP)
        j = end
    if missed != 0:
        redraw_walks(n, ik0, ik1, p0, p1, irank, world, gidx0, ui)
        redraw_walks(n, k0, k1, p0, p1, rank, world, gidx0, uo)


@_pass
def load_levels(cb, n, edec, lb):
    """``lb[j]`` = the table level of code ``cb[j]``, ``j < n``.

    A table load in the loop that decodes keeps that whole loop scalar (LLVM does not turn it
    into a gather here): alone, the loads run as a short scalar loop and the decoding loop,
    without them, vectorises (measured: dithered 8-bit ε-level decodes about 2.5 times faster).
    """
    for j in range(n):
        ju = U(j)
        lb[ju] = edec[np.uint32(cb[ju]) & np.uint32(MMAG)]


@_pass
def group_value(cb, j, s, edec, kap, ub, lb, lv, family):
    """Decoded value of element ``j`` (``family``: a literal, see ``level_value``; with
    ``IN_SCRATCH``, its level is ``lb[j]``; ``lv``: the table's :func:`tree_levels`, which a
    small table's family reads)."""
    u = ub[j] if DITHER else np.float32(0.0)
    if IN_SCRATCH:
        return level_to_value(cb[j], lb[j], MBITS, s, DITHER, kap, u, MIDRISE)
    # TREE first: a branch on a module constant is pruned before typing, so the other specs
    # never type the select tree
    if TREE and family == 3:
        mag = np.uint32(np.uint32(cb[j]) & np.uint32(MMAG))
        return level_to_value(cb[j], select_tree(mag, lv), MBITS, s, DITHER, kap, u, MIDRISE)
    return element_value(cb[j], edec, MBITS, s, DITHER, kap, u, MIDRISE, family, EMANT, EBIAS)


@_pass
def put(dst, i, v, add):
    """``dst[i] = v``, or ``dst[i] += v`` when ``add`` (a literal)."""
    if add:
        dst[i] += v
    else:
        dst[i] = v


@_pass
def group_pass(cb, base, gsize, s, s2, dst, d0, edec, kap, ub, lb, lv, enfin, add):
    """``dst[d0 + j] = decode(cb[j])`` (``+=`` when ``add``, a literal) for the group at
    ``base`` under scale ``s``, and with ``PAIRS`` the next group too, under ``s2`` (``ub``:
    the uniforms; ``lb``: the levels, with ``LOADED``; ``lv``: the table's
    :func:`tree_levels`).

    Levels come from ``level_value`` with the decode family ``DFAM``. An arithmetic one
    (minifloat and integer grids, ``FIXUP``) holds for the finite codes only: the codes beyond
    them, which no encoder writes, add -0 in the vectorised loop (which leaves every value
    unchanged) and are decoded through the table in a second loop, run only in a group that
    has one.
    """
    top = np.uint32(0)
    span = gsize * GSTEP
    for k in range(span):
        j = base + U(k)
        sk = (s if U(k) < U(gsize) else s2) if PAIRS else s
        v = group_value(cb, j, sk, edec, kap, ub, lb, lv, DFAM)
        if FIXUP:
            mag = np.uint32(np.uint32(cb[j]) & np.uint32(MMAG))
            top = max(top, mag)
            v = v if mag < np.uint32(enfin) else np.float32(-0.0)
        put(dst, d0 + j, v, add)
    if FIXUP and top >= np.uint32(enfin):
        for k in range(span):
            j = base + U(k)
            sk = (s if U(k) < U(gsize) else s2) if PAIRS else s
            if (np.uint32(cb[j]) & np.uint32(MMAG)) >= np.uint32(enfin):
                put(dst, d0 + j, group_value(cb, j, sk, edec, kap, ub, lb, lv, 0), add)


@_pass
def decode_drawn(cb, sv, ng, gsize, dst, d0, edec, kap, ub, lb, enfin, add):
    """``dst[d0:d0 + ng*gsize] = decode(cb)`` (``+=`` when ``add``, a literal) under the group
    scales ``sv[:ng]``, a dithered decode's uniforms already in ``ub``."""
    if LOADED:
        load_levels(cb, ng * gsize, edec, lb)
    if PERMUTED:
        permute_levels(cb, lb, ng * gsize, np.uint32(MMAG), tree_levels(edec, MBITS))
    # the small table's entries where its family reads them (a one-entry stand-in elsewhere,
    # which keeps the other specs' passes free of a 16-value argument)
    if TREE:
        lv = tree_levels(edec, MBITS)
    else:
        lv = (edec[0],)
    for g in range(0, ng, GSTEP):
        s2 = sv[g + 1] if PAIRS else sv[g]
        group_pass(cb, U(g) * U(gsize), gsize, sv[g], s2, dst, d0, edec, kap, ub, lb, lv,
                   enfin, add)


@_pass
def decode_codes(cb, sv, ng, gsize, dst, d0, edec, kap, rand, gidx0, ub, lb, enfin):
    """``dst[d0:d0 + ng*gsize] = decode(cb)`` under the group scales ``sv[:ng]``.

    ``rand`` is the encoder's: a dithered decoder regenerates, into the scratch ``ub``, the
    uniform each element was rounded with. With ``LOADED``, the levels are read into the
    scratch ``lb`` first.
    """
    if DITHER:
        draw_uniforms(ng * gsize, rand, gidx0, ub)
    decode_drawn(cb, sv, ng, gsize, dst, d0, edec, kap, ub, lb, enfin, False)


@_pass
def add_codes(cb, sv, ng, gsize, dst, d0, edec, kap, rand, gidx0, ub, lb, enfin):
    """As :func:`decode_codes`, adding to ``dst``."""
    if DITHER:
        draw_uniforms(ng * gsize, rand, gidx0, ub)
    decode_drawn(cb, sv, ng, gsize, dst, d0, edec, kap, ub, lb, enfin, True)


@_pass
def task_scales(src, s0, b0, cnt, scales, supers, tables, consts, rand, w):
    """Scales of the ``cnt`` blocks at ``src[s0:]`` (stream blocks ``b0 ..``), and how to
    normalise each group: ``(x * gpre) * ginv``, with ``gkeep`` 0 for a group whose codes
    must be zero because the group or its block holds NaN/Inf (``w``: the task's
    :func:`scratch`, which holds these).

    Group maxima first, then the super-group scales block by block, then the group scales in
    three loops over the groups: each group's ratio to its parent and uniform (a vector
    loop), the scale search, whose table loads run alone in a scalar loop (the table's bucket
    lookup, or a binary search of literal depth when the table has none; arithmetic without
    loads, which vectorises, for a uniform grid such as ``u8rel``), and the normalisers and
    codes (a vector loop again). With the search in the loop, the whole loop was scalar
    (measured: the scale pass of 16-element groups about a third slower).
    """
    gmax, gbad, ginv, gpre, gkeep = w[0], w[1], w[2], w[3], w[4]
    pg, pgbad, gr, gus, gsc, gsh = w[9], w[10], w[11], w[12], w[13], w[14]
    stab, sdec, utab, udec, slut = tables[3], tables[4], tables[5], tables[6], tables[7]
    snfin, _, snan, sdiv, unfin, ulogp, unan = consts[:7]
    slshift, slkey0, sllen = consts[13], consts[14], consts[15]
    ulut, ulshift, ulkey0, ullen = tables[8], consts[16], consts[17], consts[18]
    ng = cnt * GPB
    gsize = consts[12]
    for g in range(ng):
        amax, bad = absmax(src, s0 + U(g) * U(GROUP), gsize)
        gmax[g] = amax
        gbad[g] = np.uint8(bad)
    if HIER:
        for i in range(cnt):
            amax = np.float32(0.0)
            bad = np.uint8(0)
            for gi in range(GPB):
                amax = max(amax, gmax[i * GPB + gi])
                bad |= gbad[i * GPB + gi]
            b = b0 + U(i)
            # the super-scale table's bucket lookup when it has one (a BF16 table has): a
            # binary search of the 32640 BF16 magnitudes is 15 dependent loads (measured: the
            # scale pass of 4-bit ε-levels under BF16 super-groups of 256 went from 0.8-1.2
            # to 0.65-0.7 ns per coordinate)
            if ullen > 1:
                sc = encode_scale_bucket(amax / sdiv, UKIND, utab, unfin, ulut, ulshift,
                                         ulkey0, ullen, UP, np.float32(0.0))
            else:
                sc = encode_scale(amax / sdiv, UKIND, utab, unfin, ulogp, UP, np.float32(0.0))
            store_word(supers, b * U(UBYTES), UBYTES, U(unan) if bad != 0 else U(sc))
            parent = decode_scale(sc, UKIND, udec)
            # each group's copy of its block's scale and flag, so that the loops over the
            # groups below read contiguous arrays only
            for gi in range(GPB):
                pg[i * GPB + gi] = parent
                pgbad[i * GPB + gi] = bad
    q0, q1 = rand[4], rand[5]
    # the scale rounding's uniform of group g is that of its first coordinate's index: a
    # stride of GROUP, carried as an induction variable (see draw_loop)
    first = U(rand[8]) + b0 * U(BLOCK)
    step = U32(WEYL_STEP * U32(GROUP))
    j = np.int64(0)
    while j < ng:
        end = window_end(first, j, ng, GROUP)
        w, c = weyl_state(q0, q1, first + U(j) * U(GROUP))
        for g in range(j, end):
            gu = U(g)
            sstar = gmax[gu] / sdiv
            if HIER:
                parent = pg[gu]
                sstar = np.float32(0.0) if parent == 0 else sstar / parent
            gr[gu] = sstar
            if SMODE == STOCHASTIC:
                gus[gu] = weyl_uniform(w, c)
            w = U32(w + step)
        j = end
    for g in range(ng):
        gu = U(g)
        us = gus[gu] if SMODE == STOCHASTIC else np.float32(0.0)
        if GRIDDED:
            sc = U(round_grid(gr[gu], SGRID, SMODE, us))
        elif SSEARCH == 0:
            sc = encode_scale_bucket(gr[gu], SKIND, stab, snfin, slut, slshift, slkey0, sllen,
                                     SMODE, us)
        else:
            sc = encode_scale(gr[gu], SKIND, stab, snfin, SSEARCH, SMODE, us)
        gsc[gu] = np.uint32(sc)
        if not GRIDDED:
            gsh[gu] = decode_scale(sc, SKIND, sdec)
    if GRIDDED:
        # the decode table's loads in a loop of their own: in the search's loop, a gather
        # kept that loop scalar (measured: the scale pass of dq4_hier three times slower)
        for g in range(ng):
            gsh[U(g)] = decode_scale(gsc[U(g)], SKIND, sdec)
    for g in range(ng):
        gu = U(g)
        sstar = gmax[gu] / sdiv
        s_hat = gsh[gu]
        if HIER:
            s_hat = pg[gu] * s_hat
        # An unbiased (stochastic) scale pairs with the exact normaliser, so that
        # E[decoded] = E[level] * E[scale] = x; otherwise normalise by what decode uses.
        norm = sstar if SMODE == STOCHASTIC else s_hat
        # A subnormal normaliser has no finite float32 inverse: lift the group by an exact
        # power of two first, so that 0 stays 0 and |x| / norm keeps its value.
        # (A zero normaliser keeps pre = 1: x * 0 is then a zero with x's sign, where a lifted
        # x could overflow to inf and inf * 0 would give a NaN of arbitrary sign.)
        pre = np.float32(1.0) if (norm >= TINY) | (norm == 0) else LIFT
        ginv[gu] = np.float32(0.0) if norm == 0 else np.float32(1.0) / (norm * pre)
        gpre[gu] = pre
        flags = (pgbad[gu] << np.uint8(1)) | gbad[gu] if HIER else gbad[gu]
        code = U(gsc[gu]) if flags == 0 else (U(snan) if flags == 1 else U(0))
        store_word(scales, (b0 * U(GPB) + gu) * U(SBYTES), SBYTES, code)
        gkeep[gu] = np.uint8(flags == 0)


@_pass
def normalise(src, s0, ng, gsize, ginv, gpre, gkeep, y, dead):
    """``y[j] = (src[s0 + j] * gpre) * ginv`` of each element's group, or ``dead`` unless kept.

    ``dead`` is the element table's first level, which codes to 0 under every rounding: +0
    for a table with a zero level, and for a mid-rise table the level itself (a +0 there could
    round across zero to the code of the negative level).
    """
    span = gsize * GSTEP
    for g in range(0, ng, GSTEP):
        base = U(g) * U(gsize)
        # with PAIRS, the second half of the span is the next group's (values picked by a
        # compare: an index picked so would make every load a gather)
        h = g + 1 if PAIRS else g
        inv, inv2, pre, pre2 = ginv[g], ginv[h], gpre[g], gpre[h]
        keep, keep2 = gkeep[g] != 0, gkeep[h] != 0
        for k in range(span):
            first = U(k) < U(gsize)
            v = (src[s0 + base + U(k)] * (pre if first else pre2)) * (inv if first else inv2)
            y[base + U(k)] = v if (keep if first else keep2) else dead


@_pass
def code_loop(y, n, cb, tables, consts, rand, gidx0):
    """``cb[j]`` = code of the normalised value ``y[j]``, ``j < n``, each uniform (independent
    stochastic rounding) drawn here."""
    etab, lut = tables[0], tables[1]
    enfin, lshift, lkey0, llen = consts[7], consts[8], consts[9], consts[10]
    k0, k1 = rand[0], rand[1]
    lv = halving_levels(etab, MBITS)
    j = np.int64(0)
    while j < n:
        end = window_end(gidx0, j, n, 1)
        w, c = weyl_state(k0, k1, gidx0 + U(j))
        for jj in range(j, end):
            ju = U(jj)
            u = np.float32(0.0)
            if EMODE != NEAREST:
                u = weyl_uniform(w, c)
            cb[ju] = CODE_T(element_code(y[ju], u, etab, enfin, lut, lshift, lkey0, llen,
                                         MBITS, EFAM, EMANT, EBIAS, EMODE, MIDRISE, lv))
            w = U32(w + WEYL_STEP)
        j = end


@_pass
def code_given(y, n, cb, tables, consts, ub):
    """As :func:`code_loop`, with the uniforms read from ``ub``."""
    etab, lut = tables[0], tables[1]
    enfin, lshift, lkey0, llen = consts[7], consts[8], consts[9], consts[10]
    lv = halving_levels(etab, MBITS)
    for j in range(n):
        ju = U(j)
        cb[ju] = CODE_T(element_code(y[ju], ub[ju], etab, enfin, lut, lshift, lkey0, llen,
                                     MBITS, EFAM, EMANT, EBIAS, EMODE, MIDRISE, lv))


@_pass
def table_brackets(y, n, kb, vl, vh, tables, consts):
    """The bracket of every ``|y[j]|`` (``j < n``) in the element table, by its bucket lookup:
    ``kb[j]`` the floor index, ``vl[j]`` its level and ``vh[j]`` the next one up (the top
    level for the top index).

    The keys are computed in a vector loop; the table loads, three per element, run in a
    scalar loop that does nothing else. In the loop that rounds, they kept everything there
    scalar (measured: 8-bit ε-level encodes about twice as slow).
    """
    etab, lut = tables[0], tables[1]
    enfin, lshift, lkey0, llen = consts[7], consts[8], consts[9], consts[10]
    for j in range(n):
        ju = U(j)
        kb[ju] = lut_key(abs(y[ju]), lshift, lkey0, llen)
    top = np.uint32(enfin - 1)
    for j in range(n):
        ju = U(j)
        lo = lut_finish(abs(y[ju]), kb[ju], lut, etab, enfin)
        kb[ju] = lo
        vl[ju] = etab[lo]
        vh[ju] = etab[min(np.uint32(lo + np.uint32(1)), top)]


@_pass
def code_bracketed(y, n, cb, kb, vl, vh, ub, t0, top):
    """``cb[j]`` = code of ``y[j]`` from its bracket (:func:`table_brackets`) and, unless
    rounding to nearest, its uniform ``ub[j]``; ``t0`` the first level, ``top`` the top
    index."""
    for j in range(n):
        ju = U(j)
        u = ub[ju] if EMODE != NEAREST else np.float32(0.0)
        cb[ju] = CODE_T(round_code(y[ju], u, kb[ju], vl[ju], vh[ju], top, t0, MBITS, EMODE,
                                   MIDRISE, False))


@_pass
def code_elements(y, n, cb, tables, consts, rand, gidx0, w, drawn):
    """``cb[j]`` = code of the normalised value ``y[j]``, ``j < n`` (``w``: the task's
    :func:`scratch`; ``drawn``: the uniforms are in its ``w[5]`` already).

    Levels found by arithmetic or compares (element families 1–3) vectorise with an
    independent uniform drawn in the same loop (drawn apart, 4-bit encodes were slower); a
    correlated one, two hashes and the stratum, is drawn in a loop of its own (measured: 10 %
    faster for DynamiQ's 5-bit encode over 4 ranks). A table lookup (family 0) does not
    vectorise: its uniforms are drawn in a loop of their own (measured: 1.6–2.4× faster
    encodes at widths 6–8), its brackets found in another (:func:`table_brackets`), and the
    rounding, in a third loop, vectorises.
    """
    ub, kb, vl, vh = w[5], w[6], w[7], w[8]
    if DRAWN and not drawn:
        draw_uniforms(n, rand, gidx0, ub)
    if TABLED:
        table_brackets(y, n, kb, vl, vh, tables, consts)
        code_bracketed(y, n, cb, kb, vl, vh, ub, tables[0][0], np.uint32(consts[7] - 1))
    elif DRAWN:
        code_given(y, n, cb, tables, consts, ub)
    else:
        code_loop(y, n, cb, tables, consts, rand, gidx0)


@_pass
def encode_task(src, s0, b0, cnt, codes, scales, supers, tables, consts, rand, w, y, cb,
                drawn):
    """Encode the ``cnt`` blocks at ``src[s0:]`` as stream blocks ``b0 ..``.

    ``w`` is the task's :func:`scratch`; ``drawn`` (a bool): the elements' uniforms are in its
    ``w[5]`` already.
    """
    task_scales(src, s0, b0, cnt, scales, supers, tables, consts, rand, w)
    normalise(src, s0, cnt * GPB, consts[12], w[2], w[3], w[4], y, tables[0][0])
    n = cnt * BLOCK
    code_elements(y, n, cb, tables, consts, rand, U(rand[8]) + b0 * U(BLOCK), w, drawn)
    pack(cb, n, codes, b0 * U(CBYTES))


@_pass
def row_start(rows, t0, i):
    """First coordinate of the task's ``i``-th block: block ``rows[t0 + i]`` of the array when
    ``rows`` is given (non-empty), else block ``t0 + i``."""
    b = t0 + U(i)
    if rows.size:
        b = U(rows[b])
    return b * U(BLOCK)


@_pass
def load_rows(src, rows, t0, cnt, t):
    """``t`` = the task's ``cnt`` blocks of ``src`` (see :func:`row_start`), contiguous."""
    if not rows.size:
        # one loop over the whole task: a loop of BLOCK (a literal) per block is unrolled
        # into scalar moves
        s0 = t0 * U(BLOCK)
        for j in range(cnt * BLOCK):
            t[U(j)] = src[s0 + U(j)]
        return
    for i in range(cnt):
        s0 = row_start(rows, t0, i)
        d0 = U(i) * U(BLOCK)
        for j in range(BLOCK):
            t[d0 + U(j)] = src[s0 + U(j)]


@_pass
def store_rows(t, rows, t0, cnt, dst, add):
    """Inverse of :func:`load_rows`: the task's blocks from ``t`` into ``dst`` (``+=`` when
    ``add``, one float32 addition per element)."""
    if not rows.size:
        d0 = t0 * U(BLOCK)
        if add:
            for j in range(cnt * BLOCK):
                dst[d0 + U(j)] += t[U(j)]
        else:
            for j in range(cnt * BLOCK):
                dst[d0 + U(j)] = t[U(j)]
        return
    for i in range(cnt):
        d0 = row_start(rows, t0, i)
        s0 = U(i) * U(BLOCK)
        if add:
            for j in range(BLOCK):
                dst[d0 + U(j)] += t[s0 + U(j)]
        else:
            for j in range(BLOCK):
                dst[d0 + U(j)] = t[s0 + U(j)]


@_pass
def scratch():
    """Per-task arrays, by index: 0–1 group maxima and flags, 2–4 group normalisers
    (inverse, lift) and keep flags, 5 the elements' uniforms, 6–8 their brackets in the
    element table (:func:`table_brackets`), and 9–14 the scale pass's per-group copies of the
    super-group scales and flags, ratios, uniforms, codes and decoded scales."""
    return (np.empty(TG, np.float32), np.empty(TG, np.uint8), np.empty(TG, np.float32),
            np.empty(TG, np.float32), np.empty(TG, np.uint8),
            np.empty(max(UN_ENC, UN_DEC), np.float32),
            np.empty(BN, np.uint32), np.empty(BN, np.float32), np.empty(BN, np.float32),
            np.empty(TG, np.float32), np.empty(TG, np.uint8), np.empty(TG, np.float32),
            np.empty(TG, np.float32), np.empty(TG, np.uint32), np.empty(TG, np.float32))


@_pass
def task_range(c, nblocks):
    """First block and block count of task ``c`` (uint64, int64)."""
    t0 = U(c) * U(TASK)
    return t0, np.int64(min(U(nblocks), t0 + U(TASK)) - t0)


@nb.njit(nogil=True, cache=True, error_model="numpy")
def encode(c0, c1, x, b0, nblocks, rows, codes, scales, supers, tables, consts, rand):
    """Encode ``nblocks`` blocks of ``x`` as stream blocks ``b0 ..``: blocks ``rows[i]`` of
    ``x`` in that order (``rows`` non-empty), else its first ``nblocks``.

    Each task copies its blocks into a cache-resident scratch first, so that blocks spread
    over ``x`` (a segment of a reordered message) are coded without a gathered copy of ``x``.
    """
    t = np.empty(TN, np.float32)
    y = np.empty(TN, np.float32)
    cb = np.empty(TN, CODE_T)
    w = scratch()
    for c in range(c0, c1):
        t0, cnt = task_range(c, nblocks)
        if rows.size:
            load_rows(x, rows, t0, cnt, t)
            src, s0 = t, U(0)
        else:
            src, s0 = x, t0 * U(BLOCK)
        # a bool, not a literal False: a literal would compile encode_task a second time
        encode_task(src, s0, U(b0) + t0, cnt, codes, scales, supers, tables, consts, rand,
                    w, y, cb, np.bool_(False))


@nb.njit(nogil=True, cache=True, error_model="numpy")
def decode(c0, c1, out, b0, nblocks, rows, codes, scales, supers, tables, consts, rand,
           accumulate):
    """Decode stream blocks ``b0 .. b0+nblocks`` into ``out`` (``+=`` when ``accumulate``):
    into blocks ``rows[i]`` of ``out`` (``rows`` non-empty), else its first ``nblocks``.

    ``consts``/``rand`` are the encoder's (dithered decoding regenerates its uniforms).
    """
    gsize = consts[12]
    kap = np.float32(consts[11])
    enfin = consts[7]
    sv = np.empty(TG, np.float32)
    cb = np.empty(TN, CODE_T)
    ub = np.empty(UN_DEC, np.float32)
    lb = np.empty(LN, np.float32)
    t = np.empty(TN if rows.size else 1, np.float32)
    for c in range(c0, c1):
        t0, cnt = task_range(c, nblocks)
        s = U(b0) + t0
        unpack(codes, s * U(CBYTES), cnt * BLOCK, cb)
        group_scales(scales, supers, tables[4], tables[6], s, cnt, sv)
        if rows.size:
            # decoded into scratch, then put in place: ``out + value`` either way
            decode_codes(cb, sv, cnt * GPB, gsize, t, U(0), tables[2], kap, rand,
                         U(rand[8]) + s * U(BLOCK), ub, lb, enfin)
            store_rows(t, rows, t0, cnt, out, accumulate)
        elif accumulate:
            add_codes(cb, sv, cnt * GPB, gsize, out, t0 * U(BLOCK), tables[2], kap, rand,
                      U(rand[8]) + s * U(BLOCK), ub, lb, enfin)
        else:
            decode_codes(cb, sv, cnt * GPB, gsize, out, t0 * U(BLOCK), tables[2], kap, rand,
                         U(rand[8]) + s * U(BLOCK), ub, lb, enfin)


@nb.njit(nogil=True, cache=True, error_model="numpy")
def recompress(c0, c1, acc, b0, nblocks, nvalid, rows, ic, isc, isu, codes, scales, supers,
               tables, consts, rand, irand, writeback):
    """Fused ``decompress_accumulate_recompress`` of stream blocks ``b0 .. b0+nblocks``, whose
    accumulator values are blocks ``rows[i]`` of ``acc`` (``rows`` non-empty), else its first
    ``nblocks``.

    Per task, in one pass over the data: ``t = acc + decode(in)`` (float32, in a task-sized
    scratch), then ``encode(t)`` with fresh scales into ``codes/scales/supers``. Elements at
    and beyond ``nvalid`` (the padding of a partial block) are summed as zero. ``writeback``
    chooses what ``acc`` holds afterwards: 0 unchanged, 1 the sum ``t``, 2
    ``decode(encode(t))`` (what a sink keeps so that it equals what every receiver decodes).

    With ``PAIRED`` and the sender's permutation key equal to this rank's (every hop of a
    chunk rounds under one permutation), both ranks' uniforms are drawn in one loop
    (:func:`draw_pairs`).
    """
    gsize = consts[12]
    kap = np.float32(consts[11])
    enfin = consts[7]
    t = np.empty(TN, np.float32)
    y = np.empty(TN, np.float32)
    sv = np.empty(TG, np.float32)
    cb = np.empty(TN, CODE_T)
    w = scratch()
    ub = w[5]
    lb = np.empty(LN, np.float32)
    ui = np.empty(TN if PAIRED else 1, np.float32)
    paired = ((irand[2] == rand[2]) & (irand[3] == rand[3]) & (irand[7] == rand[7])
              & (irand[8] == rand[8]))
    for c in range(c0, c1):
        t0, cnt = task_range(c, nblocks)
        n = cnt * BLOCK
        a0 = t0 * U(BLOCK)
        s = U(b0) + t0
        load_rows(acc, rows, t0, cnt, t)
        unpack(ic, s * U(CBYTES), n, cb)
        group_scales(isc, isu, tables[4], tables[6], s, cnt, sv)
        valid = np.int64(U(nvalid) - min(U(nvalid), a0))
        if PAIRED and paired:
            draw_pairs(n, irand, rand, U(rand[8]) + s * U(BLOCK), ui, ub)
            decode_drawn(cb, sv, cnt * GPB, gsize, t, U(0), tables[2], kap, ui, lb, enfin,
                         True)
        else:
            add_codes(cb, sv, cnt * GPB, gsize, t, U(0), tables[2], kap, irand,
                      U(irand[8]) + s * U(BLOCK), ub, lb, enfin)
        for j in range(min(valid, n), n):
            t[j] = np.float32(0.0)
        encode_task(t, U(0), s, cnt, codes, scales, supers, tables, consts, rand, w, y, cb,
                    np.bool_(PAIRED and paired))
        if writeback == 1:
            store_rows(t, rows, t0, cnt, acc, False)
        elif writeback == 2:
            # what every receiver decodes (the codes are still unpacked in cb), decoded into
            # the normalised values' scratch, which the encode is done with
            group_scales(scales, supers, tables[4], tables[6], s, cnt, sv)
            decode_codes(cb, sv, cnt * GPB, gsize, y, U(0), tables[2], kap, rand,
                         U(rand[8]) + s * U(BLOCK), ub, lb, enfin)
            store_rows(y, rows, t0, cnt, acc, False)


@_pass
def block_rand(keys, i, world):
    """The ``rand`` tuple of block ``i`` of a keyed call: its keys and rank (``keys[i, :7]``)
    and an offset that the stream formulas turn into the block's own (``keys[i, 7]`` is its
    first coordinate's index minus ``i * BLOCK``, wrapping like the unsigned indices)."""
    k = keys[i]
    return (k[0], k[1], k[2], k[3], k[4], k[5], k[6], world, k[7])


@nb.njit(nogil=True, cache=True, error_model="numpy")
def encode_keyed(c0, c1, x, nblocks, rows, codes, scales, supers, tables, consts, world,
                 keys):
    """:func:`encode` of blocks ``rows[i]`` of ``x`` as stream blocks ``0 .. nblocks``, block
    ``i`` under its own keys (:func:`block_rand`): the blocks of many chunks and ranks in one
    call. Each block is coded exactly as a call of its own would code it."""
    t = np.empty(TN, np.float32)
    y = np.empty(TN, np.float32)
    cb = np.empty(TN, CODE_T)
    w = scratch()
    for c in range(c0, c1):
        t0, cnt = task_range(c, nblocks)
        load_rows(x, rows, t0, cnt, t)
        for i in range(cnt):
            b = t0 + U(i)
            # a count of one as int64, the type encode passes: a literal 1 would compile
            # encode_task and its passes a second time
            encode_task(t, U(i) * U(BLOCK), b, np.int64(1), codes, scales, supers, tables,
                        consts, block_rand(keys, b, world), w, y, cb, np.bool_(False))


@nb.njit(nogil=True, cache=True, error_model="numpy")
def decode_keyed(c0, c1, out, nblocks, rows, codes, scales, supers, tables, consts, world,
                 keys):
    """:func:`decode` of stream blocks ``0 .. nblocks`` into blocks ``rows[i]`` of ``out``
    (overwritten), a dithered block regenerating its uniforms under its own keys."""
    gsize = consts[12]
    kap = np.float32(consts[11])
    enfin = consts[7]
    sv = np.empty(TG, np.float32)
    cb = np.empty(TN, CODE_T)
    ub = np.empty(UN_DEC, np.float32)
    lb = np.empty(LN, np.float32)
    t = np.empty(TN, np.float32)
    for c in range(c0, c1):
        t0, cnt = task_range(c, nblocks)
        unpack(codes, t0 * U(CBYTES), cnt * BLOCK, cb)
        group_scales(scales, supers, tables[4], tables[6], t0, cnt, sv)
        for i in range(cnt):
            b = t0 + U(i)
            r = block_rand(keys, b, world)
            decode_codes(cb[U(i) * U(BLOCK):], sv[U(i) * U(GPB):], GPB, gsize, t,
                         U(i) * U(BLOCK), tables[2], kap, r, U(r[8]) + b * U(BLOCK), ub, lb,
                         enfin)
        store_rows(t, rows, t0, cnt, out, False)
