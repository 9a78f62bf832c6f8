"""Tests of :mod:`dynamiq.transforms` and the Numba Hadamard kernels.

Error bounds
------------
``u = 2**-24`` is the float32 unit roundoff and ``gamma(k) = k*u / (1 - k*u)``. Every float32
addition in the FWHT returns ``(a ± b)(1 + δ)`` with ``|δ| <= u`` (an addition whose result is
subnormal is exact, so this holds there too). Each block output is ``±`` a sum of all ``B`` inputs
of its block, and each input reaches the output through exactly ``L = log2(B)`` additions, so the
unnormalized sum carries an error of at most ``gamma(L) * ||x_blk||_1``. Rounding ``1/sqrt(B)`` to
float32 and the final multiply add two more factors ``(1 + δ)``, giving the *componentwise* bound

    |y_hat_k - y_k| <= gamma(L + 2) * ||x_blk||_1 / sqrt(B) + 2**-150

where the last term covers a final multiply that underflows into the subnormals.

For *2-norm* statements a sharper argument works stage by stage: a stage maps ``v`` to ``S v``
with ``||S v|| = sqrt(2) ||v||`` and its rounding error vector is at most ``u ||S v||``; later
stages only scale that error by ``sqrt(2)`` each, so after dividing by ``sqrt(B)`` the relative
2-norm error of the whole forward (or inverse) transform is at most ``(1 + u)**(L + 2) - 1 <=
gamma(L + 2)`` (plus ``sqrt(m) * 2**-150`` for underflow). Because the exact transform is
orthogonal this bounds ``| ||y_hat|| - ||x|| |`` directly, and composes for round trips and for
the linearity check. Float64 reference computations add ``gamma64`` terms that are negligible but
are included so every bound is rigorous.
"""

from __future__ import annotations

import dataclasses
import math
from decimal import Decimal, getcontext
from functools import cache

import numba as nb
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dynamiq.kernels.abi import rht_norm
from dynamiq.kernels.numba.hadamard import rht_forward, rht_inverse
from dynamiq.rng import hash_u32, make_key
from dynamiq.transforms import (
    RHT_STREAM,
    TRANSFORMS,
    Identity,
    RandomizedHadamard,
    Transform,
)

U32 = 2.0**-24
U64 = 2.0**-53
UNDERFLOW = 2.0**-150  # largest error of one float32 multiply whose result is subnormal
PURPOSE = 0x52485400  # spelled out so a change of RHT_STREAM is caught here
PROPS = settings(max_examples=30, deadline=None)


def gamma(k: int, u: float = U32) -> float:
    return k * u / (1.0 - k * u)


def log2(b: int) -> int:
    return b.bit_length() - 1


# ---- references ---------------------------------------------------------------------------------


@cache
def sylvester(b: int) -> np.ndarray:
    """Dense float64 Sylvester Hadamard matrix: H_1 = [1], H_2k = kron([[1, 1], [1, -1]], H_k)."""
    h = np.ones((1, 1))
    while h.shape[0] < b:
        h = np.kron(np.array([[1.0, 1.0], [1.0, -1.0]]), h)
    return h


def fwht_rows(a: np.ndarray) -> np.ndarray:
    """FWHT of every row of ``a`` in ``a``'s dtype, stage by stage exactly as the kernel contract.

    In stage ``h`` the row is viewed as ``(groups, 2, h)``: ``[:, 0]`` are offsets with bit ``h``
    clear (``a``) and ``[:, 1]`` their partners ``p + h`` (``b``).
    """
    rows, b = a.shape
    h = 1
    while h < b:
        v = a.reshape(rows, b // (2 * h), 2, h)
        lo, hi = v[:, :, 0, :], v[:, :, 1, :]
        a = np.stack((lo + hi, lo - hi), axis=2).reshape(rows, b)
        h *= 2
    return a


def ref_signs(seed: int, step: int, m: int) -> np.ndarray:
    k0, k1 = make_key(seed, step, PURPOSE)
    return np.where(hash_u32(k0, k1, np.arange(m)) & 1, -1.0, 1.0)


def pad64(x: np.ndarray, b: int) -> np.ndarray:
    out = np.zeros(-(-x.size // b) * b)
    out[: x.size] = x
    return out


def ref_forward_dense(x: np.ndarray, b: int, seed: int, step: int) -> np.ndarray:
    xp = pad64(x, b)
    dx = (ref_signs(seed, step, xp.size) * xp).reshape(-1, b)
    # H is symmetric, so rows @ H are the rows of H @ block.
    return (dx @ sylvester(b)).ravel() / math.sqrt(b)


def ref_forward_fast(x: np.ndarray, b: int, seed: int, step: int) -> np.ndarray:
    xp = pad64(x, b)
    dx = (ref_signs(seed, step, xp.size) * xp).reshape(-1, b)
    return fwht_rows(dx).ravel() / math.sqrt(b)


def block_l1(x: np.ndarray, b: int) -> np.ndarray:
    """``||x_blk||_1`` of the block each padded coordinate belongs to."""
    return np.repeat(np.abs(pad64(x, b)).reshape(-1, b).sum(axis=1), b)


def contract_forward32(x: np.ndarray, b: int, k0: int, k1: int) -> np.ndarray:
    """The documented float32 arithmetic of ``rht_forward``, emulated with NumPy float32."""
    odd = (hash_u32(k0, k1, np.arange(x.size)) & 1).astype(bool)
    v = np.where(odd, -x, x).astype(np.float32)
    return fwht_rows(v.reshape(-1, b)).ravel() * rht_norm(b)


def contract_inverse32(y: np.ndarray, b: int, k0: int, k1: int) -> np.ndarray:
    odd = (hash_u32(k0, k1, np.arange(y.size)) & 1).astype(bool)
    v = fwht_rows(y.reshape(-1, b)).ravel() * rht_norm(b)
    return np.where(odd, -v, v).astype(np.float32)


def norm64(v: np.ndarray) -> float:
    return float(np.linalg.norm(np.asarray(v, dtype=np.float64)))


def fwd(t: Transform, x: np.ndarray, step: int = 0) -> np.ndarray:
    return t.forward(torch.from_numpy(x), step=step).numpy()


# ---- strategies ---------------------------------------------------------------------------------

KINDS = ("normal", "cauchy", "spiky", "scales", "constant", "integers")


@st.composite
def generated(draw, n=None, max_n=3000):
    """Vectors of a drawn shape, built by NumPy from a drawn seed (fast even when long)."""
    if n is None:
        n = draw(st.integers(1, max_n))
    kind = draw(st.sampled_from(KINDS))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if kind == "normal":
        v = rng.standard_normal(n)
    elif kind == "cauchy":
        v = np.clip(rng.standard_cauchy(n), -1e6, 1e6)
    elif kind == "spiky":
        v = 1e-3 * rng.standard_normal(n)
        v[rng.integers(0, n, size=1 + n // 100)] = 1e4
    elif kind == "scales":
        v = rng.standard_normal(n) * np.exp2(rng.integers(-30, 31, size=n))
    elif kind == "constant":
        v = np.full(n, draw(st.floats(-4.0, 4.0)))
    else:
        v = rng.integers(-1000, 1001, size=n).astype(np.float64)
    # Exponents down to -140 push values into the float32 subnormals; the top end keeps a sum of
    # 2**16 of them far below float32 overflow.
    return (v * 2.0 ** draw(st.integers(-140, 60))).astype(np.float32)


def raw(n=None):
    """Arbitrary float32 elements: zeros, -0.0, subnormals, exact cancellations."""
    lo, hi = (1, 200) if n is None else (n, n)
    elem = st.floats(-(2.0**100), 2.0**100, width=32)
    return st.lists(elem, min_size=lo, max_size=hi).map(lambda v: np.array(v, dtype=np.float32))


vectors = st.one_of(generated(), raw())
log_blocks = st.integers(1, 12)
seeds = st.integers(0, 2**64 - 1)
steps = st.integers(0, 2**64 - 1)


@st.composite
def same_length_pair(draw):
    n = draw(st.integers(1, 2000))
    # Element-by-element lists that long would overrun hypothesis' buffer.
    kinds = generated(n=n) if n > 200 else st.one_of(generated(n=n), raw(n))
    return draw(kinds), draw(kinds)


# ---- registry and configuration ----------------------------------------------------------------


def test_registry_holds_both_transforms():
    assert "identity" in TRANSFORMS and "rht" in TRANSFORMS
    assert TRANSFORMS["identity"] is Identity
    assert TRANSFORMS["rht"] is RandomizedHadamard
    assert TRANSFORMS.name_of(RandomizedHadamard) == "rht"
    assert all(issubclass(cls, Transform) for _, cls in TRANSFORMS.items())
    assert RHT_STREAM == PURPOSE


def test_defaults_and_frozen():
    t = RandomizedHadamard()
    assert (t.block_size, t.seed) == (256, 0)
    assert t == RandomizedHadamard(np.int64(256), np.uint32(0))
    assert type(RandomizedHadamard(np.int64(64)).block_size) is int
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.seed = 1  # type: ignore[misc]
    assert hash(t) == hash(RandomizedHadamard(256, 0))


@pytest.mark.parametrize("bad", [0, 1, 3, 96, -4, 2**17])
def test_block_size_must_be_power_of_two_in_range(bad):
    with pytest.raises(ValueError, match="power of two"):
        RandomizedHadamard(block_size=bad)


@pytest.mark.parametrize("bad", [256.0, True, "256", None])
def test_block_size_must_be_an_integer(bad):
    with pytest.raises(TypeError, match="block_size must be an integer"):
        RandomizedHadamard(block_size=bad)


def test_seed_validation():
    RandomizedHadamard(seed=2**64 - 1)
    for bad in (-1, 2**64):
        with pytest.raises(ValueError, match="seed"):
            RandomizedHadamard(seed=bad)
    with pytest.raises(TypeError, match="seed must be an integer"):
        RandomizedHadamard(seed=1.0)


def test_extreme_block_sizes_accepted():
    assert RandomizedHadamard(2).padded_length(3) == 4
    assert RandomizedHadamard(2**16).padded_length(1) == 2**16


def test_rht_norm_is_correctly_rounded():
    getcontext().prec = 60
    for lg in range(1, 17):
        b = 1 << lg
        got = rht_norm(b)
        assert isinstance(got, np.float32)
        exact = Decimal(1) / Decimal(b).sqrt()
        neighbours = (np.nextafter(got, np.float32(0)), np.nextafter(got, np.float32(1)))
        err = abs(Decimal(float(got)) - exact)
        assert all(err < abs(Decimal(float(f)) - exact) for f in neighbours)
        if lg % 2 == 0:
            assert float(got) == 2.0 ** (-lg // 2)


def test_padded_length():
    t = RandomizedHadamard(8)
    assert [t.padded_length(n) for n in (1, 7, 8, 9, 16, 17)] == [8, 8, 8, 16, 16, 24]
    assert Identity().padded_length(13) == 13
    for tr in (t, Identity()):
        with pytest.raises(ValueError, match="n must be >= 1"):
            tr.padded_length(0)
        with pytest.raises(TypeError, match="n must be an integer"):
            tr.padded_length(2.5)


# ---- agreement with dense references -----------------------------------------------------------


def test_fast_reference_matches_dense_reference():
    rng = np.random.default_rng(0)
    for lg in range(1, 9):
        b = 1 << lg
        a = rng.standard_normal((3, b))
        np.testing.assert_allclose(fwht_rows(a), a @ sylvester(b), rtol=0, atol=1e-12 * b)


def check_against_reference(x: np.ndarray, b: int, seed: int, step: int, reference) -> None:
    lg = log2(b)
    got = fwd(RandomizedHadamard(b, seed), x, step).astype(np.float64)
    want = reference(x.astype(np.float64), b, seed, step)
    assert got.shape == want.shape == (-(-x.size // b) * b,)
    # gamma(L+2) is the float32 kernel (module docstring); the float64 reference sums B terms
    # in an unknown order (BLAS) and divides by a rounded sqrt: at most gamma64(B + 1).
    ref_err = gamma(b + 1, U64) if reference is ref_forward_dense else gamma(lg + 2, U64)
    tol = (gamma(lg + 2) + ref_err) * block_l1(x, b) / math.sqrt(b) + UNDERFLOW
    bad = np.abs(got - want) > tol
    assert not bad.any(), (np.flatnonzero(bad)[:5], got[bad][:5], want[bad][:5], tol[bad][:5])


@pytest.mark.parametrize("lg", range(1, 11))
def test_forward_matches_dense_hadamard(lg):
    b = 1 << lg
    rng = np.random.default_rng(lg)
    x = (rng.standard_normal(3 * b + 1) * np.exp2(rng.integers(-20, 21, 3 * b + 1))).astype(
        np.float32
    )
    check_against_reference(x, b, seed=11, step=lg, reference=ref_forward_dense)


@PROPS
@given(lg=st.integers(1, 10), x=vectors, seed=seeds, step=steps)
def test_forward_matches_dense_hadamard_property(lg, x, seed, step):
    check_against_reference(x, 1 << lg, seed, step, ref_forward_dense)


@pytest.mark.parametrize("lg", range(11, 17))
def test_large_blocks_match_reference(lg):
    b = 1 << lg
    x = np.random.default_rng(lg).standard_normal(b + 3).astype(np.float32)
    check_against_reference(x, b, seed=5, step=1, reference=ref_forward_fast)


@PROPS
@given(lg=log_blocks, x=vectors, seed=seeds, step=steps)
def test_kernels_follow_the_float32_contract_bit_for_bit(lg, x, seed, step):
    # This is the arithmetic a Triton port must reproduce: same signs, stage order, rounding.
    b = 1 << lg
    t = RandomizedHadamard(b, seed)
    k0, k1 = t.key(step=step)
    xp = np.zeros(t.padded_length(x.size), dtype=np.float32)
    xp[: x.size] = x
    y = fwd(t, x, step)
    assert y.dtype == np.float32
    want = contract_forward32(xp, b, k0, k1)
    np.testing.assert_array_equal(y.view(np.uint32), want.view(np.uint32))
    back = t.inverse(torch.from_numpy(y), xp.size, step=step).numpy()
    want = contract_inverse32(y, b, k0, k1)
    np.testing.assert_array_equal(back.view(np.uint32), want.view(np.uint32))


# ---- properties --------------------------------------------------------------------------------


@PROPS
@given(lg=log_blocks, x=vectors, seed=seeds, step=steps)
def test_forward_preserves_the_norm(lg, x, seed, step):
    b = 1 << lg
    y = fwd(RandomizedHadamard(b, seed), x, step)
    nx, ny = norm64(x), norm64(y)
    # Orthogonal exact map => | ||y_hat|| - ||x|| | <= ||y_hat - y|| <= gamma(L+2) ||x||.
    tol = gamma(lg + 2) * nx + math.sqrt(y.size) * UNDERFLOW + gamma(y.size + 2, U64) * (nx + ny)
    assert abs(ny - nx) <= tol


@PROPS
@given(lg=log_blocks, x=vectors, seed=seeds, step=steps)
def test_inverse_undoes_forward(lg, x, seed, step):
    b = 1 << lg
    t = RandomizedHadamard(b, seed)
    y = t.forward(torch.from_numpy(x), step=step)
    back = t.inverse(y, x.size, step=step).numpy()
    assert back.shape == x.shape and back.dtype == np.float32
    # forward error c||x||, inverse error c||y_hat|| <= c(1+c)||x||, c = gamma(L+2); the exact
    # inverse is orthogonal so it carries the forward error over unchanged.
    c = gamma(lg + 2)
    nx = norm64(x)
    tol = (2 * c + c * c) * nx + 2 * math.sqrt(y.numel()) * UNDERFLOW + gamma(3, U64) * nx
    assert norm64(back.astype(np.float64) - x.astype(np.float64)) <= tol


@PROPS
@given(lg=log_blocks, pair=same_length_pair(), seed=seeds, step=steps)
def test_forward_is_linear_across_ranks(lg, pair, seed, step):
    # Two ranks rotate their own gradients with the shared seed/step; summing the rotated
    # vectors must equal rotating the summed gradient, or the all-reduce would be wrong.
    x1, x2 = pair
    b = 1 << lg
    t = RandomizedHadamard(b, seed)
    lhs = fwd(t, x1, step) + fwd(t, x2, step)  # float32 addition, as a reduction would do it
    rhs = fwd(t, x1 + x2, step)  # float32 sum of the inputs
    n1, n2 = norm64(x1), norm64(x2)
    n12 = norm64(x1.astype(np.float64) + x2)
    c = gamma(lg + 2)
    # ||fl(y1+y2) - F(x1+x2)|| <= c(||x1||+||x2||) + u(||x1+x2|| + c(||x1||+||x2||)) and
    # ||F(fl(x1+x2)) - F(x1+x2)|| <= c(1+u)||x1+x2|| + u||x1+x2||.
    tol = c * (1 + U32) * (n1 + n2 + n12) + 2 * U32 * n12
    tol += 3 * math.sqrt(lhs.size) * UNDERFLOW + gamma(lhs.size + 4, U64) * (n1 + n2 + n12)
    assert norm64(lhs.astype(np.float64) - rhs) <= tol


@PROPS
@given(seed=seeds, s1=steps, gap=st.integers(1, 2**64 - 1))
def test_different_steps_use_different_signs(seed, s1, gap):
    s2 = (s1 + gap) % 2**64
    b, n = 256, 1024
    t = RandomizedHadamard(b, seed)
    # Strictly positive inputs make the signs recoverable: H y / sqrt(B) = d * x.
    x = np.random.default_rng(0).uniform(1.0, 2.0, n).astype(np.float32)
    recovered = []
    for s in (s1, s2):
        y = fwd(t, x, s).astype(np.float64).reshape(-1, b)
        d = np.sign(fwht_rows(y).ravel())
        np.testing.assert_array_equal(d, ref_signs(seed, s, n))
        recovered.append(d)
    # Independent fair signs: the fraction that differ is 0.5 +- 0.016 (1 sd) for n = 1024.
    assert 0.4 < np.mean(recovered[0] != recovered[1]) < 0.6
    assert not np.array_equal(fwd(t, x, s1), fwd(t, x, s2))


def test_different_seeds_use_different_signs():
    x = np.ones(512, dtype=np.float32)
    assert not np.array_equal(fwd(RandomizedHadamard(64, 0), x), fwd(RandomizedHadamard(64, 1), x))
    assert np.mean(ref_signs(0, 0, 4096) != ref_signs(1, 0, 4096)) > 0.4


@PROPS
@given(lg=log_blocks, x=vectors, seed=seeds, step=steps)
def test_same_seed_and_step_is_bit_identical(lg, x, seed, step):
    b = 1 << lg
    a = fwd(RandomizedHadamard(b, seed), x, step)
    again = fwd(RandomizedHadamard(b, seed), x, step)  # a different instance, as on another rank
    assert a.tobytes() == again.tobytes()
    # Out of place must equal in place.
    t = RandomizedHadamard(b, seed)
    k0, k1 = t.key(step=step)
    xp = np.zeros(a.size, dtype=np.float32)
    xp[: x.size] = x
    out = np.empty_like(xp)
    rht_forward(xp, out, b, k0, k1, rht_norm(b))
    assert out.tobytes() == a.tobytes()


def test_result_does_not_depend_on_thread_count():
    x = np.random.default_rng(3).standard_normal(64 * 37).astype(np.float32)
    t = RandomizedHadamard(64, 9)
    many = fwd(t, x, 4)
    old = nb.get_num_threads()
    try:
        nb.set_num_threads(1)
        one = fwd(t, x, 4)
    finally:
        nb.set_num_threads(old)
    assert many.tobytes() == one.tobytes()


# ---- non-finite values, padding, identity ------------------------------------------------------


@pytest.mark.parametrize("poison", [math.nan, math.inf, -math.inf])
def test_non_finite_values_propagate(poison):
    b, n = 16, 40  # three blocks, the last one padded
    t = RandomizedHadamard(b, 2)
    clean = np.random.default_rng(1).standard_normal(n).astype(np.float32)
    dirty = clean.copy()
    dirty[20] = poison  # in block 1
    y_clean, y = fwd(t, clean, 3), fwd(t, dirty, 3)
    # Every output of a block mixes every input of that block, so the whole block is poisoned.
    assert not np.isfinite(y[16:32]).any()
    assert y[:16].tobytes() == y_clean[:16].tobytes()
    assert y[32:].tobytes() == y_clean[32:].tobytes()
    back = t.inverse(torch.from_numpy(y), n, step=3).numpy()
    assert not np.isfinite(back[16:32]).any()
    assert np.isfinite(back[:16]).all() and np.isfinite(back[32:]).all()
    # A non-finite value arriving after the reduction must also survive the inverse.
    y_clean[5] = poison
    assert not np.isfinite(t.inverse(torch.from_numpy(y_clean), n, step=3).numpy()[:16]).any()


@pytest.mark.parametrize("n", [1, 31, 33, 95, 96, 100])
def test_lengths_that_are_not_a_multiple_of_the_block(n):
    b = 32
    t = RandomizedHadamard(b, 4)
    x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    y = fwd(t, x, 1)
    assert y.shape == (t.padded_length(n),) and y.size % b == 0
    # Padding is with zeros: equal to transforming the explicitly padded vector.
    xp = np.zeros(y.size, dtype=np.float32)
    xp[:n] = x
    assert fwd(t, xp, 1).tobytes() == y.tobytes()
    back = t.inverse(torch.from_numpy(y), n, step=1)
    assert back.shape == (n,) and back.is_contiguous()
    np.testing.assert_allclose(back.numpy(), x, rtol=0, atol=1e-5 * np.abs(x).max())
    # A longer y (e.g. padded further for sharding) gives the same first n coordinates.
    longer = np.concatenate([y, np.ones(2 * b, dtype=np.float32)])
    same = t.inverse(torch.from_numpy(longer), n, step=1)
    assert same.numpy().tobytes() == back.numpy().tobytes()


def test_forward_does_not_modify_its_input():
    x = torch.randn(50)
    before = x.clone()
    y = RandomizedHadamard(16).forward(x)
    RandomizedHadamard(16).inverse(y, 50)
    assert torch.equal(x, before)
    y_before = y.clone()
    RandomizedHadamard(16).inverse(y, 50)
    assert torch.equal(y, y_before)


def test_accepts_tensors_that_require_grad():
    x = torch.randn(10, requires_grad=True)
    assert RandomizedHadamard(8).forward(x).shape == (16,)


def test_identity():
    t = Identity()
    x = torch.tensor([1.0, -2.0, math.nan, math.inf])
    y = t.forward(x, step=7)
    assert y.data_ptr() != x.data_ptr()
    assert y.numpy().tobytes() == x.numpy().tobytes()
    y[0] = 5.0
    assert x[0] == 1.0
    back = t.inverse(torch.arange(6, dtype=torch.float32), 4)
    assert back.tolist() == [0.0, 1.0, 2.0, 3.0]
    with pytest.raises(ValueError, match="fewer than n"):
        t.inverse(torch.ones(3), 4)


# ---- bad input ---------------------------------------------------------------------------------

TRANSFORM_INSTANCES = [Identity(), RandomizedHadamard(8)]


@pytest.mark.parametrize("t", TRANSFORM_INSTANCES)
@pytest.mark.parametrize(
    "dtype", [torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.complex64]
)
def test_wrong_dtype_is_named(t, dtype):
    x = torch.ones(8, dtype=dtype)
    with pytest.raises(TypeError, match=f"float32, got {dtype}"):
        t.forward(x)
    with pytest.raises(TypeError, match=f"float32, got {dtype}"):
        t.inverse(x, 8)


@pytest.mark.parametrize("t", TRANSFORM_INSTANCES)
@pytest.mark.parametrize(
    ("bad", "exc", "msg"),
    [
        (np.ones(8, dtype=np.float32), TypeError, "torch.Tensor"),
        (torch.ones(2, 8), ValueError, "1-D"),
        (torch.tensor(1.0), ValueError, "1-D"),
        (torch.ones(0), ValueError, "empty"),
        (torch.ones(32)[::2], ValueError, "contiguous"),
        (torch.ones(8, device="meta"), ValueError, "CPU"),
    ],
)
def test_malformed_tensors(t, bad, exc, msg):
    with pytest.raises(exc, match=msg):
        t.forward(bad)
    with pytest.raises(exc, match=msg):
        t.inverse(bad, 1)


@pytest.mark.parametrize("t", TRANSFORM_INSTANCES)
def test_bad_step(t):
    x = torch.ones(8)
    for bad in (-1, 2**64):
        with pytest.raises(ValueError, match="step"):
            t.forward(x, step=bad)
        with pytest.raises(ValueError, match="step"):
            t.inverse(x, 8, step=bad)
    with pytest.raises(TypeError, match="step must be an integer"):
        t.forward(x, step=1.5)


def test_bad_inverse_lengths():
    t = RandomizedHadamard(8)
    with pytest.raises(ValueError, match="multiple of block_size"):
        t.inverse(torch.ones(12), 4)
    with pytest.raises(ValueError, match="fewer than n"):
        t.inverse(torch.ones(8), 9)
    with pytest.raises(ValueError, match="n must be >= 1"):
        t.inverse(torch.ones(8), 0)
    with pytest.raises(TypeError, match="n must be an integer"):
        t.inverse(torch.ones(8), 8.0)


def test_kernels_reject_bad_shapes():
    x = np.ones(12, dtype=np.float32)
    norm = rht_norm(8)
    with pytest.raises(ValueError, match="multiple of block"):
        rht_forward(x, x, 8, 1, 2, norm)
    with pytest.raises(ValueError, match="same length"):
        rht_inverse(x[:8], np.empty(16, dtype=np.float32), 8, 1, 2, norm)
    with pytest.raises(ValueError, match="power of two"):
        rht_forward(x, x, 6, 1, 2, norm)
    with pytest.raises(ValueError, match="power of two"):
        rht_norm(3)
