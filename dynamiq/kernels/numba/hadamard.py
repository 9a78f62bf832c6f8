"""Numba kernels for the blocked randomized Hadamard transform (RHT).

A float32 vector whose length is a multiple of ``block`` (a power of two, ``2 <= block <= 2**16``)
is cut into consecutive blocks of ``block`` elements, and every block is rotated independently:

* forward:  ``y_blk = norm * FWHT(d_blk * x_blk)``
* inverse:  ``x_blk = d_blk * (norm * FWHT(y_blk))``

``norm`` is the float32 value of ``1/sqrt(block)`` (:func:`dynamiq.kernels.abi.rht_norm`) and
``d`` is a ±1 diagonal drawn from the counter-based RNG: ``d_i = +1`` if
``hash_u32(k0, k1, i) & 1 == 0`` else ``-1``, where ``i`` is the *global* element index
(position in the whole vector, not in the block). Because ``FWHT`` is the Sylvester Hadamard
matrix ``H`` (``H @ H == block * I``), the inverse undoes the forward transform exactly in real
arithmetic.

Arithmetic contract (another backend, e.g. a Triton kernel, must follow it to match bit for bit):

1. Sign: ``v = -x[i]`` when the sign bit is odd, else ``v = x[i]``. This is an exact sign-bit
   flip; do not multiply by ``-1.0`` (on x86 a multiply leaves a NaN's sign bit alone).
2. FWHT, in float32, in *stages* ``h = 1, 2, 4, ..., block/2``. Stage ``h`` pairs every in-block
   offset ``p`` with ``(p & h) == 0`` with ``p + h`` and replaces ``(a, b) = (v[p], v[p + h])`` by
   ``(a + b, a - b)``, always written ``a + b`` and ``a - b`` with ``a`` the lower index. Every
   output of a stage depends only on that stage's inputs, so the order of pairs *within* a stage
   is free (a GPU may do a whole stage at once); the order of stages is not.
3. Scale: one float32 multiply ``v * norm`` per element after the last stage (forward), or before
   the sign flip (inverse). When ``log2(block)`` is even ``norm`` is a power of two and the
   multiply is exact.

No fused multiply-add can occur: there is no multiply feeding an add anywhere.
"""

from __future__ import annotations

import numba as nb
import numpy as np

import dynamiq.kernels.numba.stamps  # noqa: F401  (the cache of its functions: see there)
from dynamiq.kernels.abi import MAX_HADAMARD_BLOCK, MIN_HADAMARD_BLOCK
from dynamiq.kernels.numba.rng import hash_u32

__all__ = ["fwht_block", "rht_forward", "rht_inverse"]

MIN_BLOCK = MIN_HADAMARD_BLOCK
MAX_BLOCK = MAX_HADAMARD_BLOCK

_ONE = np.uint64(1)


@nb.njit(cache=True)
def _check_shapes(n, n_out, block):
    if block < MIN_BLOCK or block > MAX_BLOCK or (block & (block - 1)) != 0:
        raise ValueError("block must be a power of two in [2, 65536]")
    if n % block != 0:
        raise ValueError("input length must be a multiple of block")
    if n_out != n:
        raise ValueError("out must have the same length as the input")


#: Coordinates of the cache-resident tiles in which the early stages run (a power of two).
_TILE = 2048
_U = np.uint64


@nb.njit(cache=True)
def _stages(buf, lo, hi, h0, h1):
    """Stages ``h = h0, 2 h0, … < h1`` over ``buf[lo:hi]`` (unsigned bounds): every pair
    ``(p, p + h)`` with ``(p - lo) & h == 0`` becomes ``(a + b, a - b)``."""
    h = h0
    while h < h1:
        hu = _U(h)
        for j in range(lo, hi, _U(2 * h)):
            for i in range(j, j + hu):
                a = buf[i]
                b = buf[i + hu]
                buf[i] = a + b
                buf[i + hu] = a - b
        h *= 2


@nb.njit(cache=True)
def fwht_block(buf, start, block):
    """Unnormalized in-place Walsh–Hadamard transform of ``buf[start:start + block]``.

    Equivalent to ``buf[start:start+block] = H @ buf[start:start+block]`` with ``H`` the
    Sylvester Hadamard matrix of order ``block``; the stage order is the module's contract.

    Stages ``h < _TILE`` pair elements inside aligned tiles of ``_TILE``, so each tile runs
    all of them while it sits in the first-level cache (every element still goes through its
    stages in order, with the same additions: the bits do not change), and the later stages
    sweep the block; indices are unsigned, which spares Numba's negative-index checks and
    lets the pair loops vectorise.
    """
    tile = min(block, _TILE)
    one = _U(1)
    for t0 in range(start, start + block, tile):
        s0 = _U(t0)
        for i in range(s0, s0 + _U(tile), _U(2)):
            a = buf[i]
            b = buf[i + one]
            buf[i] = a + b
            buf[i + one] = a - b
        _stages(buf, s0, s0 + _U(tile), 2, tile)
    _stages(buf, _U(start), _U(start + block), tile, block)


@nb.njit(parallel=True, cache=True)
def rht_forward(x, out, block, k0, k1, norm):
    """Forward blocked RHT: ``out_blk = norm * (H @ (d_blk * x_blk))`` for every block.

    Args:
        x: float32 1-D array, length a multiple of ``block``.
        out: float32 1-D array of the same length; may be ``x`` itself (in place) but must not
            otherwise overlap it.
        block: Block size, a power of two in ``[2, 2**16]``.
        k0, k1: RNG key (from :func:`dynamiq.rng.make_key`) selecting the ±1 diagonal ``d``.
        norm: ``rht_norm(block)`` as a ``np.float32``.
    """
    n = x.shape[0]
    _check_shapes(n, out.shape[0], block)
    # Casting here keeps every multiply in float32 even if a caller passes a Python float.
    s = np.float32(norm)
    for blk in nb.prange(n // block):
        start = blk * block
        for i in range(start, start + block):
            v = x[i]
            if hash_u32(k0, k1, i) & _ONE:
                v = -v
            out[i] = v
        fwht_block(out, start, block)
        for i in range(start, start + block):
            out[i] = out[i] * s


@nb.njit(parallel=True, cache=True)
def rht_inverse(y, out, block, k0, k1, norm):
    """Inverse blocked RHT: ``out_blk = d_blk * (norm * (H @ y_blk))`` for every block.

    The exact inverse of :func:`rht_forward` (in real arithmetic) for the same ``block``,
    ``(k0, k1)`` and ``norm``, because ``H`` is symmetric with ``H @ H == block * I`` and
    ``d * d == 1``.

    Args:
        y: float32 1-D array, length a multiple of ``block``.
        out: float32 1-D array of the same length; may be ``y`` itself (in place) but must not
            otherwise overlap it.
        block: Block size, a power of two in ``[2, 2**16]``.
        k0, k1: RNG key used for the forward transform.
        norm: ``rht_norm(block)`` as a ``np.float32``.
    """
    n = y.shape[0]
    _check_shapes(n, out.shape[0], block)
    s = np.float32(norm)
    for blk in nb.prange(n // block):
        start = blk * block
        for i in range(start, start + block):
            out[i] = y[i]
        fwht_block(out, start, block)
        for i in range(start, start + block):
            v = out[i] * s
            if hash_u32(k0, k1, i) & _ONE:
                v = -v
            out[i] = v
