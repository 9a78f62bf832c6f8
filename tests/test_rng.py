"""The counter-based RNG: host reference and Numba twin agree bit for bit; basic quality."""

from __future__ import annotations

import numba as nb
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dynamiq import rng
from dynamiq.kernels.numba import rng as nrng


# not cache=True: Numba's cache of a test file would not see a change to the kernel modules
# it calls (dynamiq.kernels.numba.stamps covers the package's own files only)
@nb.njit
def _numba_hash(k0, k1, idx):
    out = np.empty(idx.size, np.uint32)
    for i in range(idx.size):
        out[i] = np.uint32(nrng.hash_u32(k0, k1, idx[i]))
    return out


@nb.njit
def _numba_uniform(k0, k1, idx):
    out = np.empty(idx.size, np.float32)
    for i in range(idx.size):
        out[i] = nrng.uniform(k0, k1, idx[i])
    return out


@given(
    seed=st.integers(0, 2**64 - 1),
    streams=st.lists(st.integers(0, 2**40), max_size=4),
    start=st.integers(0, 2**40),
)
def test_numba_matches_reference(seed, streams, start):
    k0, k1 = rng.make_key(seed, *streams)
    idx = np.arange(start, start + 257, dtype=np.int64)
    assert np.array_equal(_numba_hash(k0, k1, idx), rng.hash_u32(k0, k1, idx))
    assert np.array_equal(_numba_uniform(k0, k1, idx), rng.uniform(k0, k1, idx))


def test_uniform_range_and_moments():
    k0, k1 = rng.make_key(7, 1, 2)
    n = 1 << 20
    u = rng.uniform(k0, k1, np.arange(n)).astype(np.float64)
    assert u.min() >= 0.0 and u.max() < 1.0
    # mean and variance of U[0,1): 1/2 and 1/12; standard errors sqrt(1/12/n) and ~sqrt(1/180/n)
    assert abs(u.mean() - 0.5) < 6 * np.sqrt(1 / 12 / n)
    assert abs(u.var() - 1 / 12) < 6 * np.sqrt(1 / 180 / n)
    # lag-1 correlation of an iid sequence has standard error 1/sqrt(n)
    c = np.corrcoef(u[:-1], u[1:])[0, 1]
    assert abs(c) < 6 / np.sqrt(n)


def test_streams_are_distinct():
    idx = np.arange(4096)
    a = rng.hash_u32(*rng.make_key(1, 0), idx)
    b = rng.hash_u32(*rng.make_key(1, 1), idx)
    c = rng.hash_u32(*rng.make_key(2, 0), idx)
    assert (a != b).mean() > 0.99 and (a != c).mean() > 0.99


def _pair_chi2_pvalue(a: np.ndarray, b: np.ndarray, bits: int = 6) -> float:
    """Chi-square p-value of the joint histogram of ``bits``-bit values ``a``, ``b``: uniform
    and independent pairs spread evenly over its ``4**bits`` cells."""
    from scipy import stats

    cells = 1 << (2 * bits)
    counts = np.bincount(a.astype(np.int64) * (1 << bits) + b, minlength=cells)
    expect = a.size / cells
    return float(stats.chi2.sf(((counts - expect) ** 2 / expect).sum(), cells - 1))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_hash_pairs_are_uniform_and_independent(seed):
    """The hashes of consecutive indices (an odd-stride sequence under the finalizer) must look
    independent: pairs of draws at the lags where the stride nearly wraps (Fibonacci numbers,
    for the golden-ratio stride), in the high bits (the uniforms) and the low bits (the
    strata), and the draws of two streams at the same index (two ranks rounding one
    coordinate). A weak mixer (the stride alone, say) fails these by a wide margin."""
    n = 1 << 20
    idx = np.arange(n, dtype=np.uint64)
    h = rng.hash_u32(*rng.make_key(seed, 5), idx)
    other = rng.hash_u32(*rng.make_key(seed, 6), idx)
    for shift in (26, 0):
        v = (h >> np.uint32(shift)) & np.uint32(63)
        for lag in (1, 2, 89, 4181, 46368, 317811):
            assert _pair_chi2_pvalue(v[:-lag], v[lag:]) > 1e-6, (shift, lag)
        w = (other >> np.uint32(shift)) & np.uint32(63)
        assert _pair_chi2_pvalue(v, w) > 1e-6, shift


def test_negative_seed_rejected():
    with pytest.raises(ValueError):
        rng.make_key(-1)


@pytest.mark.parametrize("world", [1, 2, 3, 5, 8, 12, 64, 100, 512, 1000])
def test_stratum_is_a_permutation_of_the_ranks_per_element(world):
    h = rng.hash_u32(11, 22, np.arange(200, dtype=np.uint64))
    strata = np.stack([rng.stratum(h, r, world) for r in range(world)])
    # every element: the ranks occupy every stratum exactly once
    assert np.array_equal(np.sort(strata, axis=0),
                          np.broadcast_to(np.arange(world, dtype=np.uint64)[:, None], strata.shape))


def test_stratum_decorrelates_neighbouring_ranks():
    """Successive hops of a ring are consecutive ranks: their strata must not be adjacent
    systematically (a cyclic shift would make |s(r+1) - s(r)| = 1 almost always)."""
    world = 64
    h = rng.hash_u32(3, 4, np.arange(20000, dtype=np.uint64))
    a, b = rng.stratum(h, 10, world).astype(np.int64), rng.stratum(h, 11, world).astype(np.int64)
    gap = np.abs(a - b)
    assert (gap == 1).mean() < 0.1
    # the correlation of neighbouring strata is near the -1/(n-1) of a uniform permutation
    assert abs(np.corrcoef(a, b)[0, 1]) < 0.1


def test_stratum_numba_twin_matches():
    from dynamiq.kernels.numba.rng import stratum as nb_stratum

    h = rng.hash_u32(5, 6, np.arange(300, dtype=np.uint64))
    for world in (1, 3, 8, 37, 512):
        for r in (0, world - 1, world // 2):
            want = rng.stratum(h, r, world)
            got = np.array([nb_stratum(np.uint64(v), r, world) for v in h], dtype=np.uint64)
            assert np.array_equal(got, want)


def test_stratum_rejects_huge_worlds():
    with pytest.raises(ValueError, match="world size"):
        rng.stratum(np.zeros(1, np.uint64), 0, rng.MAX_WORLD + 1)


def _fold_key(seed: int, *streams: int) -> tuple[int, int]:
    """The key derivation written out as one loop (what every stream of the library is keyed
    by, so its values must not move between versions)."""
    k0 = rng.fmix32(seed ^ 0x243F6A88)
    k1 = rng.fmix32((seed >> 32) ^ 0x85A308D3 ^ k0)
    for s in streams:
        k0 = rng.fmix32(k0 ^ rng.fmix32(s & rng.MASK32) ^ rng.fmix32((s >> 32) + 0x13198A2E))
        k1 = rng.fmix32((k1 + rng.GOLDEN) ^ k0)
    return k0, k1


@given(seed=st.integers(0, 2**64 - 1), streams=st.lists(st.integers(0, 2**40), max_size=6))
def test_make_key_is_the_fold_over_its_streams(seed, streams):
    rng.make_key.cache_clear()
    assert rng.make_key(seed, *streams) == _fold_key(seed, *streams)
    # cached prefixes give the same keys as a cold derivation
    for k in range(len(streams) + 1):
        assert rng.make_key(seed, *streams[:k]) == _fold_key(seed, *streams[:k])


def test_make_key_golden_values():
    assert rng.make_key(0) == _fold_key(0) == (327721211, 2376633223)
    assert rng.make_key(12345, 7, 2**33 + 5, 0) == (3509706389, 1913203313)
    with pytest.raises(ValueError):
        rng.make_key(1, 2, -1)


@given(
    seed=st.integers(0, 2**64 - 1),
    lead=st.lists(st.integers(0, 2**40), max_size=2),
    cols=st.lists(st.lists(st.integers(0, 2**62), min_size=3, max_size=3), min_size=1,
                  max_size=3),
    tail=st.lists(st.integers(0, 2**33), max_size=2),
)
def test_make_keys_matches_make_key(seed, lead, cols, tail):
    arrays = [np.array(c, dtype=np.int64) for c in cols]
    k0, k1 = rng.make_keys(seed, *lead, *arrays, *tail)
    assert k0.shape == k1.shape == (3,)
    for i in range(3):
        want = rng.make_key(seed, *lead, *(int(a[i]) for a in arrays), *tail)
        assert (int(k0[i]), int(k1[i])) == want


def test_make_keys_rejects_negative_streams():
    with pytest.raises(ValueError, match="non-negative"):
        rng.make_keys(0, np.array([1, -1]))
