"""The counter-based RNG: host reference and Numba twin agree bit for bit; basic quality."""

from __future__ import annotations

import numba as nb
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dynamiq import rng
from dynamiq.kernels.numba import rng as nrng


@nb.njit(cache=True)
def _numba_hash(k0, k1, idx):
    out = np.empty(idx.size, np.uint32)
    for i in range(idx.size):
        out[i] = np.uint32(nrng.hash_u32(k0, k1, idx[i]))
    return out


@nb.njit(cache=True)
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


def test_negative_seed_rejected():
    with pytest.raises(ValueError):
        rng.make_key(-1)
