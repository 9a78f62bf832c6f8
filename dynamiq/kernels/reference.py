"""Readable NumPy reference of the block-quantization kernels (bit-exact with every backend).

This module restates :mod:`dynamiq.kernels.numba.codec` with whole-array NumPy operations in
float32, in the same operation order, so that it writes *the same bytes*. It is slow and meant
for tests, for diagnostics (it also returns the decoded scales) and as the specification other
backends are checked against.
"""

from __future__ import annotations

import numpy as np
import torch

from dynamiq import rng
from dynamiq.kernels.numba.codec import CORRELATED, NEAREST, STOCHASTIC, UP

__all__ = ["decode", "encode", "round_table"]

_F = np.float32


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


def _uniforms(mode, keys, rank, world, gidx):
    (k0, k1), (p0, p1) = keys
    g = rng.uniform(k0, k1, gidx)
    if mode != CORRELATED:
        return g
    slot = rng.stratum(rng.hash_u32(p0, p1, gidx), rank, world)
    return ((slot.astype(_F) + g) / _F(world)).astype(_F)


def _pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """LSB-first packing of ``bits``-bit codes into bytes."""
    shifts = np.arange(bits, dtype=np.uint64)
    bitmat = ((codes.astype(np.uint64)[:, None] >> shifts) & np.uint64(1)).astype(np.uint8)
    return np.packbits(bitmat.reshape(-1), bitorder="little")


def _unpack(buf: np.ndarray, bits: int, count: int) -> np.ndarray:
    bitv = np.unpackbits(buf, bitorder="little")[: count * bits].reshape(count, bits)
    return (bitv.astype(np.int64) << np.arange(bits, dtype=np.int64)).sum(1)


def _words(codes: np.ndarray, nbytes: int) -> np.ndarray:
    c = codes.astype(np.uint64)
    out = np.stack([(c >> np.uint64(8 * k)) & np.uint64(0xFF) for k in range(nbytes)], 1)
    return out.astype(np.uint8).reshape(-1)


def _unwords(buf: np.ndarray, nbytes: int) -> np.ndarray:
    b = buf.reshape(-1, nbytes).astype(np.uint64)
    return sum(b[:, k] << np.uint64(8 * k) for k in range(nbytes))


def _scale_encode(ratio, t, mode, u):
    if t.kind == 1:
        return ratio.astype(_F).view(np.uint32).astype(np.int64)
    return round_table(ratio, t.search, t.nfin, mode, u)


def _scale_decode(code, t):
    if t.kind == 1:
        return np.asarray(code, dtype=np.uint64).astype(np.uint32).view(_F)
    return t.dec[np.asarray(code, dtype=np.int64)]


def encode(q, x: np.ndarray, *, seed=0, rank=0, world_size=1, stream=(), index_offset=0):
    """Reference encode. Returns ``(payload_bytes, decoded_group_scales)``.

    Args:
        q: A :class:`dynamiq.quantizers.BlockQuantizer`.
        x: float32[n].
        seed, rank, world_size, stream, index_offset: as :meth:`BlockQuantizer.encode`.

    Returns:
        ``uint8`` array equal to ``q.encode(...).data`` and float32 per-group decoded scales
        (NaN for groups flagged non-finite).
    """
    from dynamiq.quantizers import _MODE, _P_ELEM, _P_PERM, _P_SCALE, _SMODE

    x = np.asarray(x, dtype=_F)
    n = x.size
    G, B = q.group_size, q.block_size
    npad = q.padded_length(n)
    xp = np.zeros(npad, _F)
    xp[:n] = x
    e, st, ut = q._elem_tables, q._scale_tables, q._super_tables
    sdiv = q._scale_divisor
    emode, smode = _MODE[q.rounding], _SMODE[q.scale_rounding]
    hier = q.super_group_size is not None
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
            supers = _words(ucode, ut.nbytes)
            parent = np.repeat(pval, gpb).astype(_F)
            bad_b = np.repeat(bb, gpb)
        sstar = (amax_g / sdiv).astype(_F)
        gidx = index_offset + np.arange(ng, dtype=np.int64) * G
        us = None
        if smode == STOCHASTIC:
            k = rng.make_key(seed, *stream, rank, _P_SCALE)
            us = rng.uniform(*k, gidx)
        ratio = sstar
        if hier:
            ratio = np.where(parent == 0, _F(0), sstar / parent).astype(_F)
        scode = _scale_encode(ratio, st, smode, us)
        s_hat = _scale_decode(scode, st)
        if hier:
            s_hat = (parent * s_hat).astype(_F)
        norm = sstar if smode == STOCHASTIC else s_hat
        pre = np.where(norm >= _F(2.0**-64), _F(1), _F(2.0**64)).astype(_F)
        inv = np.where(norm == 0, _F(0), _F(1) / (norm * pre)).astype(_F)
        lifted = (np.abs(groups) * pre[:, None]).astype(_F)
        a = (lifted * inv[:, None]).astype(_F).reshape(-1)
        eidx = index_offset + np.arange(npad, dtype=np.int64)
        u = None
        if emode != NEAREST:
            keys = (
                rng.make_key(seed, *stream, rank, _P_ELEM),
                rng.make_key(seed, *stream, _P_PERM),
            )
            u = _uniforms(emode, keys, rank, world_size, eidx)
        m = round_table(np.where(np.isfinite(a), a, _F(0)), e.search, e.nfin,
                        NEAREST if emode == NEAREST else STOCHASTIC, u)
        m = np.where(np.isinf(a), e.nfin - 1, m)
    codes = m | (np.signbit(xp).astype(np.int64) << q.element.magnitude_bits)
    dead = np.repeat(bad_g | bad_b, G)
    codes = np.where(dead, 0, codes)
    scode = np.where(bad_b, 0, np.where(bad_g, st.nan, scode))
    s_hat = np.where(bad_g | bad_b, np.nan, s_hat).astype(_F)
    out = np.concatenate([_pack(codes, q.element.bits), _words(scode, st.nbytes), supers])
    # on the wire a partial last block keeps only the groups it touches
    wire = q._compact(torch.from_numpy(out.astype(np.uint8)), n).numpy()
    return wire, s_hat


def decode(q, buf: np.ndarray, n: int, *, seed=0, rank=0, world_size=1, stream=(),
           index_offset=0) -> np.ndarray:
    """Reference decode of ``buf`` (bytes from :func:`encode`) to float32[n].

    The keyword arguments are the encoder's (a dithered quantizer regenerates its uniforms).
    """
    from dynamiq.quantizers import _MODE, _P_ELEM, _P_PERM

    e, st, ut = q._elem_tables, q._scale_tables, q._super_tables
    buf = q._expand(torch.from_numpy(np.ascontiguousarray(buf, dtype=np.uint8)), n).numpy()
    a, b, _ = q._section_sizes(n)
    npad = q.padded_length(n)
    G = q.group_size
    codes = _unpack(buf[:a], q.element.bits, npad)
    s = _scale_decode(_unwords(buf[a : a + b], st.nbytes), st)
    if q.super_group_size is not None:
        S = _scale_decode(_unwords(buf[a + b :], ut.nbytes), ut)
        s = (np.repeat(S, q.super_group_size // G) * s).astype(_F)
    mb = q.element.magnitude_bits
    m = e.dec[codes & ((1 << mb) - 1)]
    if q.dither:
        keys = (rng.make_key(seed, *stream, rank, _P_ELEM), rng.make_key(seed, *stream, _P_PERM))
        u = _uniforms(_MODE[q.rounding], keys, rank, world_size,
                      index_offset + np.arange(npad, dtype=np.int64))
        m = (m + (_F(q.dither_amplitude) * (u - _F(0.5))).astype(_F)).astype(_F)
    with np.errstate(invalid="ignore", over="ignore"):
        v = (m * np.repeat(s, G)).astype(_F)
    top = np.finfo(_F).max
    v = np.where(v > top, top, np.where(v < -top, -top, v)).astype(_F)  # saturate, keep NaN
    v = np.where((codes >> mb) & 1 == 1, -v, v)
    return v[:n].astype(_F)
