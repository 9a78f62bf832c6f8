"""Readable NumPy statement of the block-quantization kernels (bit-exact with every backend).

Whole-array NumPy operations in float32, in the kernels' operation order, so that it writes *the
same bytes* as the compiled backends. It is slow and meant for tests, for diagnostics
(:func:`encode_with_scales` also returns the decoded scales) and as the specification other
backends are checked against. Payloads are in the kernels' layout
(:meth:`~dynamiq.kernels.abi.BlockCode.layout`: a partial last block padded to whole).
"""

from __future__ import annotations

import numpy as np

from dynamiq import rng
from dynamiq.kernels.abi import BlockCode, RandKeys, Rounding, Writeback
from dynamiq.kernels.reference.packing import pack, unpack, unwords, words

__all__ = ["decode", "encode_with_scales", "recompress", "round_table"]

_F = np.float32
NEAREST, STOCHASTIC, UP, CORRELATED = (Rounding.NEAREST, Rounding.STOCHASTIC, Rounding.UP,
                                       Rounding.CORRELATED)


def round_table(a: np.ndarray, tab: np.ndarray, nfin: int, mode: int, u=None) -> np.ndarray:
    """Vectorised twin of the kernel's ``round_index`` (``tab``: ascending finite float32)."""
    tab = tab[:nfin]
    lo = np.searchsorted(tab, a, side="right") - 1
    lo = np.clip(lo, 0, nfin - 1)
    sat = lo >= nfin - 1
    hi = np.minimum(lo + 1, nfin - 1)
    vlo, vhi = tab[lo], tab[hi]
    if mode == NEAREST:
        dlo, dhi = a - vlo, vhi - a
        up = (dhi < dlo) | ((dhi == dlo) & (lo % 2 == 1))
    elif mode == STOCHASTIC:
        up = (u * (vhi - vlo)) < (a - vlo)
    elif mode == UP:
        up = np.ones(a.shape, bool)
    else:
        up = np.zeros(a.shape, bool)
    up &= ~(a <= vlo)
    return np.where(sat, nfin - 1, np.where(up, hi, lo)).astype(np.int64)


def _uniforms(mode, rand: RandKeys, gidx):
    g = rng.uniform(rand.k0, rand.k1, gidx)
    if mode != CORRELATED:
        return g
    slot = rng.stratum(rng.hash_u32(rand.p0, rand.p1, gidx), rand.rank, rand.world)
    return ((slot.astype(_F) + g) / _F(rand.world)).astype(_F)


def _scale_encode(ratio, t, mode, u):
    if t.kind == 1:
        return ratio.astype(_F).view(np.uint32).astype(np.int64)
    return round_table(ratio, t.search, t.nfin, mode, u)


def _scale_decode(code, t):
    if t.kind == 1:
        return np.asarray(code, dtype=np.uint64).astype(np.uint32).view(_F)
    return t.dec[np.asarray(code, dtype=np.int64)]


def encode_with_scales(code: BlockCode, x: np.ndarray, rand: RandKeys
                       ) -> tuple[np.ndarray, np.ndarray]:
    """Reference encode.

    Args:
        code: The quantizer's kernel view (``BlockQuantizer._code``).
        x: float32 ``[n]``.
        rand: The random-number keys (``BlockQuantizer._rand(...)``).

    Returns:
        The payload bytes (uint8 ``[code.nbytes(n)]``, the kernels' layout) and float32
        per-group decoded scales (NaN for groups flagged non-finite).
    """
    x = np.asarray(x, dtype=_F)
    n = x.size
    spec = code.spec
    G, B = spec.group, spec.block
    npad = code.padded_length(n)
    xp = np.zeros(npad, _F)
    xp[:n] = x
    e, st, ut = code.elem, code.scale, code.sup
    sdiv = code.divisor
    emode, smode = spec.emode, spec.smode
    hier = spec.hier
    groups = xp.reshape(-1, G)
    ng = groups.shape[0]
    gpb = B // G
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        bad_g = ~np.isfinite(groups).all(1)
        amax_g = np.where(bad_g, _F(0), np.abs(groups).max(1)).astype(_F)
        parent = np.ones(ng, _F)
        bad_b = np.zeros(ng, bool)
        supers = np.zeros(0, np.uint8)
        if hier:
            blocks = xp.reshape(-1, B)
            bb = ~np.isfinite(blocks).all(1)
            amax_b = np.where(bb, _F(0), np.abs(blocks).max(1)).astype(_F)
            ucode = _scale_encode((amax_b / sdiv).astype(_F), ut, UP, None)
            pval = _scale_decode(ucode, ut)
            ucode = np.where(bb, ut.nan, ucode)
            supers = words(ucode, ut.nbytes)
            parent = np.repeat(pval, gpb).astype(_F)
            bad_b = np.repeat(bb, gpb)
        sstar = (amax_g / sdiv).astype(_F)
        gidx = rand.offset + np.arange(ng, dtype=np.int64) * G
        us = None
        if smode == STOCHASTIC:
            us = rng.uniform(rand.q0, rand.q1, gidx)
        ratio = sstar
        if hier:
            ratio = np.where(parent == 0, _F(0), sstar / parent).astype(_F)
        scode = _scale_encode(ratio, st, smode, us)
        s_hat = _scale_decode(scode, st)
        if hier:
            s_hat = (parent * s_hat).astype(_F)
        norm = sstar if smode == STOCHASTIC else s_hat
        # a subnormal normaliser is lifted by 2**64 (it has no finite inverse), a zero one not
        pre = np.where((norm >= _F(2.0**-64)) | (norm == 0), _F(1), _F(2.0**64)).astype(_F)
        inv = np.where(norm == 0, _F(0), _F(1) / (norm * pre)).astype(_F)
        lifted = (np.abs(groups) * pre[:, None]).astype(_F)
        a = (lifted * inv[:, None]).astype(_F).reshape(-1)
        eidx = rand.offset + np.arange(npad, dtype=np.int64)
        u = None
        neg = np.signbit(xp)
        if emode != NEAREST:
            u = _uniforms(emode, rand, eidx)
            if spec.midrise:
                # rounding up means towards +inf for either sign (a dithered decoder relies on it)
                u = np.where(neg, _F(1) - u, u).astype(_F)
        af = np.where(np.isfinite(a), a, _F(0))
        m = round_table(af, e.search, e.nfin, NEAREST if emode == NEAREST else STOCHASTIC, u)
        m = np.where(np.isinf(a), e.nfin - 1, m)
        if spec.midrise and emode != NEAREST:
            # a mid-rise grid has no zero: below its first level the rounding crosses zero
            t0 = _F(e.search[0])
            neg = neg ^ ((af < t0) & ((u * (t0 + t0)).astype(_F) >= (af + t0).astype(_F)))
    codes = m | (neg.astype(np.int64) << spec.mbits)
    dead = np.repeat(bad_g | bad_b, G)
    codes = np.where(dead, 0, codes)
    scode = np.where(bad_b, 0, np.where(bad_g, st.nan, scode))
    s_hat = np.where(bad_g | bad_b, np.nan, s_hat).astype(_F)
    out = np.concatenate([pack(codes, spec.bits), words(scode, st.nbytes), supers])
    return out.astype(np.uint8), s_hat


def decode(code: BlockCode, buf: np.ndarray, n: int, rand: RandKeys) -> np.ndarray:
    """Reference decode of ``buf`` (the kernels' layout) to float32 ``[n]``; ``rand`` is the
    encoder's (a dithered code regenerates its uniforms)."""
    spec = code.spec
    e, st, ut = code.elem, code.scale, code.sup
    buf = np.ascontiguousarray(buf, dtype=np.uint8)
    a, b, _ = code.layout(n)
    npad = code.padded_length(n)
    G = spec.group
    codes = unpack(buf[:a], spec.bits, npad)
    s = _scale_decode(unwords(buf[a : a + b], st.nbytes), st)
    if spec.hier:
        S = _scale_decode(unwords(buf[a + b :], ut.nbytes), ut)
        s = (np.repeat(S, spec.block // G) * s).astype(_F)
    mb = spec.mbits
    m = e.dec[codes & ((1 << mb) - 1)]
    if spec.dither:
        u = _uniforms(spec.emode, rand, rand.offset + np.arange(npad, dtype=np.int64))
        if spec.midrise:
            u = np.where((codes >> mb) & 1 == 1, _F(1) - u, u).astype(_F)
        m = (m + (_F(code.kappa) * (u - _F(0.5))).astype(_F)).astype(_F)
    with np.errstate(invalid="ignore", over="ignore"):
        v = (m * np.repeat(s, G)).astype(_F)
    top = np.finfo(_F).max
    v = np.where(v > top, top, np.where(v < -top, -top, v)).astype(_F)  # saturate, keep NaN
    v = np.where((codes >> mb) & 1 == 1, -v, v)
    return v[:n].astype(_F)


def recompress(code: BlockCode, buf: np.ndarray, acc: np.ndarray, rand: RandKeys,
               irand: RandKeys, writeback: Writeback) -> tuple[np.ndarray, np.ndarray]:
    """Reference of the fused hop: ``encode(acc + decode(buf, irand), rand)``.

    Returns:
        The outgoing payload bytes and what ``acc`` holds afterwards under ``writeback``.
    """
    acc = np.asarray(acc, dtype=_F)
    t = (acc + decode(code, buf, acc.size, irand)).astype(_F)
    out, _ = encode_with_scales(code, t, rand)
    if writeback == Writeback.SUM:
        acc = t
    elif writeback == Writeback.DECODED:
        acc = decode(code, out, acc.size, rand)
    return out, acc
