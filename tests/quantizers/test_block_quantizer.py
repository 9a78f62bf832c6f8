"""Block quantizers: accounting, bad input, unbiasedness, correlated rounding, properties."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from dynamiq import QUANTIZERS, BlockQuantizer, UnknownNameError
from dynamiq.formats import EpsilonFormat, LevelFormat
from dynamiq.kernels import get_backend
from dynamiq.quantizers.rows import rows_length
from dynamiq.testing import element_error_bound, reference_scales


def _heavy(n: int, seed: int) -> np.ndarray:
    rs = np.random.default_rng(seed)
    return (rs.standard_normal(n) * np.exp(1.5 * rs.standard_normal(n))).astype(np.float32)


# ---------------------------------------------------------------- accounting
@pytest.mark.parametrize(
    ("name", "bits"),
    [("mxfp8", 8.25), ("mxfp6", 6.25), ("mxfp4", 4.25), ("nvfp4", 4.625), ("dq4_hier", 4.5625)],
)
def test_bits_per_coordinate(name, bits):
    q = QUANTIZERS[name]
    assert q.bits_per_coord() == bits
    assert q.bits_per_coord(1024) == bits
    p = q.encode(torch.randn(1000))
    assert p.nbytes == q.nbytes(1000) and p.bits_per_coord == 8 * q.nbytes(1000) / 1000


def test_payload_layout_sections():
    q = QUANTIZERS["dq4_hier"]
    p = q.encode(torch.randn(600))
    codes, scales, supers = p.sections()
    # the partial last super-group keeps the 38 groups of 16 that 600 coordinates touch
    assert len(codes) == 608 * 4 // 8 and len(scales) == 608 // 16 and len(supers) == 3 * 2
    assert sum(map(len, (codes, scales, supers))) == p.nbytes


@pytest.mark.parametrize("name", ["dq4_hier", "dq4_dither", "mxfp8", "int4_sr"])
@pytest.mark.parametrize("n", [1, 17, 300, 600])
def test_partial_block_is_cut_to_its_groups(name, n):
    q = QUANTIZERS[name]
    x = torch.randn(n)
    groups = -(-n // q.group_size)
    spec = q._code.spec
    supers = -(-n // q.super_group_size) * spec.ubytes if q.super_group_size else 0
    assert q.nbytes(n) == groups * (q.group_size * q.element.bits // 8 + spec.sbytes) + supers
    # the cut payload decodes to what the whole-block kernels decode
    full = torch.empty(q._kernel_nbytes(n), dtype=torch.uint8)
    get_backend("numba").block_encode(q._code, x, q._rand(3, 0, 1, (), 0), full)
    cut = q.encode(x, seed=3)
    assert torch.equal(q._compact(full, n), cut.data)
    assert torch.equal(q.decode(cut, seed=3), q.decode(cut, seed=3))
    acc = torch.randn(n)
    out = q.recompress(cut, acc.clone(), seed=3, writeback="none")
    assert out.nbytes == q.nbytes(n)
    assert torch.equal(out.data, q.encode(acc + q.decode(cut, seed=3), seed=3).data)


def test_half_precision_inputs_are_widened():
    q = QUANTIZERS["mxfp8"]
    x = torch.randn(100)
    for dt in (torch.float16, torch.bfloat16):
        xh = x.to(dt)
        assert torch.equal(q.roundtrip(xh), q.roundtrip(xh.float()))


def test_out_buffers_are_reused():
    q = QUANTIZERS["mxfp4"]
    x = torch.randn(333)
    p = q.encode(x)
    buf = torch.empty(q.nbytes(333), dtype=torch.uint8)
    p2 = q.encode(x, out=buf)
    assert p2.data.data_ptr() == buf.data_ptr() and torch.equal(p.data, buf)
    y = torch.full((333,), 1.0)
    q.decode(p, out=y, accumulate=True)
    assert torch.allclose(y, q.decode(p) + 1.0)


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    ("x", "exc", "match"),
    [
        (torch.randn(10, dtype=torch.float64), TypeError, "float64"),
        (torch.arange(10), TypeError, "int64"),
        (torch.randn(4, 4), ValueError, "1-D"),
        (torch.randn(20)[::2], ValueError, "contiguous"),
        (torch.empty(0), ValueError, "empty"),
        (np.zeros(4, np.float32), TypeError, "torch.Tensor"),
    ],
)
def test_bad_inputs(x, exc, match):
    with pytest.raises(exc, match=match):
        QUANTIZERS["mxfp8"].encode(x)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"group_size": 24}, "power of two"),
        ({"group_size": 0}, "power of two"),
        ({"element": "e2m1", "group_size": 1}, "multiple of 8"),
        ({"rounding": "floor"}, "rounding"),
        ({"scale_rounding": "sideways"}, "scale_rounding"),
        ({"scale": "u8rel"}, "NaN"),
        ({"super_group_size": 256}, "together"),
        ({"super_group_size": 16, "super_scale": "bf16", "scale": "u8rel"}, ">= group_size"),
        ({"super_group_size": 256, "super_scale": "bf16", "scale": "e8m0"}, r"\[0, 1\]"),
        ({"element": "e8m0"}, "signed"),
        ({"element": "nope"}, "unknown number format"),
    ],
)
def test_invalid_quantizer_parameters(kwargs, match):
    args = {"element": "e4m3", "group_size": 32, **kwargs}
    with pytest.raises((ValueError, UnknownNameError), match=match):
        BlockQuantizer(**args)


def test_bad_rank_and_mismatched_payload():
    q = QUANTIZERS["mxfp8"]
    with pytest.raises(ValueError, match="rank"):
        q.encode(torch.randn(8), rank=3, world_size=2)
    p = QUANTIZERS["mxfp4"].encode(torch.randn(8))
    with pytest.raises(ValueError, match="different quantizer"):
        q.decode(p)
    with pytest.raises(ValueError, match="out must be"):
        q.encode(torch.randn(8), out=torch.empty(3, dtype=torch.uint8))
    with pytest.raises(UnknownNameError, match="mxfp8"):
        QUANTIZERS["mxfp9"]


def test_nonfinite_blocks_decode_as_nan_everywhere_else_finite():
    q = QUANTIZERS["dq4_hier"]
    x = torch.randn(1024)
    x[300] = float("inf")
    y = q.roundtrip(x)
    assert torch.isnan(y[256:512]).all()
    assert torch.isfinite(y[:256]).all() and torch.isfinite(y[512:]).all()
    q = QUANTIZERS["mxfp8"]
    x[300] = float("nan")
    y = q.roundtrip(x)
    assert torch.isnan(y[288:320]).all() and torch.isfinite(y[:288]).all()


# ---------------------------------------------------------------- unbiasedness
def _bias_statistic(q: BlockQuantizer, x: np.ndarray, trials: int, **kw) -> tuple[float, float]:
    """Global and worst per-group z-statistics of the mean error over independent encodes.

    Errors are summed per group first (elements of a group share a stochastically rounded
    scale, so only groups are independent). Under unbiasedness each group's mean error over
    ``trials`` draws has standard error sqrt(var/trials), so both statistics are ~N(0, 1):
    the global one exactly by the CLT, the per-group ones as the max of |N(0,1)| over groups.
    """
    G = q.group_size
    xt = torch.from_numpy(x)
    errs = []
    for k in range(trials):
        y = q.roundtrip(xt, seed=1000 + k, **kw).numpy().astype(np.float64)
        errs.append((y - x).reshape(-1, G).sum(1))
    e = np.array(errs)
    mean, var = e.mean(0), e.var(0, ddof=1)
    keep = var > 0
    z_global = mean.sum() / np.sqrt(var.sum() / trials)
    z_group = np.max(np.abs(mean[keep]) / np.sqrt(var[keep] / trials))
    return float(z_global), float(z_group)


UNBIASED = [n for n in QUANTIZERS.names() if QUANTIZERS[n].unbiased] + ["correlated_dq4"]


@pytest.mark.parametrize("name", UNBIASED)
def test_stochastic_quantizers_are_unbiased(name):
    if name == "correlated_dq4":
        q = BlockQuantizer("dq4", group_size=16, scale="u8rel", rounding="correlated",
                           scale_rounding="stochastic", super_group_size=256, super_scale="bf16")
        kw = {"rank": 3, "world_size": 8}
    else:
        q, kw = QUANTIZERS[name], {}
    x = _heavy(2048, 5)
    zg, zmax = _bias_statistic(q, x, 300, **kw)
    # |N(0,1)| > 5 has probability 6e-7; the max over 128 groups exceeds 5.5 w.p. < 1e-5
    assert abs(zg) < 5.0, (name, zg)
    assert zmax < 5.5, (name, zmax)


def test_bias_statistic_detects_a_biased_quantizer():
    # stochastic elements under an OCP (round-down) scale saturate the largest values: biased
    q = BlockQuantizer("e2m1", group_size=32, scale="e8m0", rounding="stochastic",
                       scale_rounding="ocp")
    assert not q.unbiased
    zg, zmax = _bias_statistic(q, _heavy(2048, 5), 100)
    assert abs(zg) > 10 or zmax > 10


# ---------------------------------------------------------------- correlated rounding
def _sum_error(q: BlockQuantizer, xs: list[np.ndarray], seed: int) -> float:
    n = len(xs)
    total = sum(x.astype(np.float64) for x in xs)
    est = sum(
        q.roundtrip(torch.from_numpy(x), seed=seed, rank=r, world_size=n).numpy().astype(
            np.float64
        )
        for r, x in enumerate(xs)
    )
    return float(((est - total) ** 2).sum() / (total**2).sum())


@pytest.mark.parametrize("scenario", ["identical", "correlated-gradients"])
def test_correlated_rounding_lowers_sum_error(scenario, capsys):
    n = 8
    rs = np.random.default_rng(11)
    g = rs.standard_normal(1 << 15).astype(np.float32)
    if scenario == "identical":
        xs = [g.copy() for _ in range(n)]
    else:  # workers' gradients share a common part, as in data-parallel training
        xs = [(g + 0.5 * rs.standard_normal(g.size)).astype(np.float32) for _ in range(n)]
    kw = {"group_size": 32, "scale": "bf16", "scale_rounding": "up"}
    sr = BlockQuantizer("dq4", rounding="stochastic", **kw)
    cr = BlockQuantizer("dq4", rounding="correlated", **kw)
    e_sr = np.mean([_sum_error(sr, xs, s) for s in range(4)])
    e_cr = np.mean([_sum_error(cr, xs, s) for s in range(4)])
    ratio = e_cr / e_sr
    with capsys.disabled():
        print(f"\n[correlated rounding, n={n}, {scenario}] vNMSE stochastic {e_sr:.3e} "
              f"correlated {e_cr:.3e} ratio {ratio:.3f}")
    assert ratio < (0.3 if scenario == "identical" else 0.9)


# ---------------------------------------------------------------- properties
PROPERTY_QUANTIZERS = ["mxfp8", "nvfp4", "dq4_hier", "int8_sr"]


@given(
    name=st.sampled_from(PROPERTY_QUANTIZERS),
    data=st.lists(
        st.floats(-2.0**100, 2.0**100, allow_nan=False, width=32)
        | st.sampled_from([0.0, -0.0, 1e-40, -3e-39, 448.0, 1.0]),
        min_size=1,
        max_size=700,
    ),
    scale_exp=st.integers(-60, 60),
    seed=st.integers(0, 2**32),
    offset=st.integers(0, 2**33),
)
def test_kernel_matches_reference_and_error_bound(name, data, scale_exp, seed, offset):
    q = QUANTIZERS[name]
    with np.errstate(over="ignore"):  # overflow to inf is expected; such values are dropped
        x = (np.array(data, np.float32) * np.float32(2.0**scale_exp)).astype(np.float32)
    x = np.where(np.isfinite(x), x, 0).astype(np.float32)
    kw = {"seed": seed, "rank": 0, "world_size": 1, "index_offset": offset}
    p = q.encode(torch.from_numpy(x), **kw)
    ref = q.encode(torch.from_numpy(x), backend="reference", **kw)
    assert torch.equal(p.data, ref.data)
    scales = reference_scales(q, x, **kw)
    y = q.decode(p).numpy().astype(np.float64)
    err = np.abs(y - x)
    assert np.all(err <= element_error_bound(q, x, scales))


# ---- subtractive dithering -----------------------------------------------------------------
_DITHER = QUANTIZERS["dq4_dither"]
_KEYS = {"seed": 3, "rank": 1, "world_size": 4, "stream": (2, 5), "index_offset": 512}


def test_dither_needs_random_rounding():
    with pytest.raises(ValueError, match="dither needs stochastic or correlated"):
        BlockQuantizer("dq4", rounding="nearest", scale="bf16", dither=True)
    with pytest.raises(TypeError, match="dither must be a bool"):
        BlockQuantizer("dq4", rounding="stochastic", scale="bf16", dither=1)


def test_dither_amplitude_is_the_mean_level_gap():
    """κ is a weighted mean of the level gaps: between the smallest and the largest gap, equal
    to the gap for uniform levels, and 0 without dithering."""
    mags = _DITHER.element.magnitudes()
    gaps = np.diff(mags)
    assert gaps.min() < _DITHER.dither_amplitude < gaps.max()
    uni = BlockQuantizer("uniform4", rounding="stochastic", scale="bf16", dither=True)
    assert uni.dither_amplitude == pytest.approx(float(np.diff(uni.element.magnitudes())[0]),
                                                 rel=2**-11)
    assert QUANTIZERS["dq4_hier"].dither_amplitude == 0.0


@pytest.mark.parametrize("n", [1024, 1000, 77])
def test_dithered_decode_uses_the_encoders_keys(n):
    x = torch.randn(n, generator=torch.Generator().manual_seed(n))
    p = _DITHER.encode(x, **_KEYS)
    y = _DITHER.decode(p, **_KEYS)
    assert torch.equal(y, _DITHER.decode(p, backend="reference", **_KEYS))
    other = _DITHER.decode(p, **{**_KEYS, "rank": 2})
    assert not torch.equal(y, other)  # the keys matter
    # the undithered values are the same codes: the difference is within κ/2 of a scale
    assert (y - other).abs().max() > 0


@pytest.mark.parametrize("n", [1024, 1000, 77])
def test_dithered_recompress_decodes_the_incoming_payload_with_its_keys(n):
    """recompress == encode(acc + decode(payload, <incoming keys>)), also when the last block is
    partial (the incoming padding decodes to non-zero dither, and must not enter the sum)."""
    g = torch.Generator().manual_seed(7)
    x, acc = torch.randn(n, generator=g), torch.randn(n, generator=g)
    p = _DITHER.encode(x, **_KEYS)
    mine = {**_KEYS, "rank": 2, "stream": (2, 6)}
    a = acc.clone()
    out = _DITHER.recompress(p, a, writeback="decoded", in_rank=1, in_stream=(2, 5), **mine)
    want = _DITHER.encode(acc + _DITHER.decode(p, **_KEYS), **mine)
    assert torch.equal(out.data, want.data)
    assert torch.equal(a, _DITHER.decode(want, **mine))


def _roundtrip(q: BlockQuantizer, x: torch.Tensor, seed: int) -> torch.Tensor:
    """``decode(encode(x))`` on the reference backend: the statistical tests below check the
    coding itself, which every backend computes bit for bit alike (``tests/kernels/
    test_backend_parity.py``), and the reference compiles no kernel for their quantizers."""
    return q.roundtrip(x, seed=seed, backend="reference")


def test_dithering_is_unbiased_and_halves_the_noise():
    """Mean over 400 seeds converges to x (bound: 5 standard errors of the per-element noise)
    and the noise is well below plain stochastic rounding's (about 1.7x on Gaussian data)."""
    x = torch.randn(4096, generator=torch.Generator().manual_seed(0))
    plain = BlockQuantizer("dq4", group_size=32, scale="u8rel", rounding="stochastic",
                           scale_rounding="stochastic", super_group_size=256, super_scale="e8m0")
    dith = BlockQuantizer("dq4", group_size=32, scale="u8rel", rounding="stochastic",
                          scale_rounding="stochastic", super_group_size=256, super_scale="e8m0",
                          dither=True)
    k = 400
    ys = torch.stack([_roundtrip(dith, x, s) for s in range(k)]).double()
    err = ys - x.double()
    se = err.std(0) / k**0.5
    assert ((err.mean(0)).abs() <= 5 * se + 1e-7).float().mean() > 0.999
    mse_d = float((err**2).mean())
    mse_p = float(np.mean([((_roundtrip(plain, x, s) - x) ** 2).mean().item()
                           for s in range(20)]))
    assert mse_d < 0.7 * mse_p


# ---------------------------------------------------------------- mid-rise grids
@pytest.mark.parametrize("dither", [False, True])
def test_midrise_rounding_crosses_zero_and_stays_unbiased(dither):
    """Values between the innermost levels ``±m₀`` (zeros of either sign included) round to
    either level, so they decode with both signs; every value's mean over 400 seeds converges
    to it (bound: 5 standard errors of the rounding, ``Δ √(p(1-p))`` or, dithered, ``Δ/√12``,
    on the grid of step ``Δ = 2/15``)."""
    q = BlockQuantizer(EpsilonFormat(4, 0.0, midrise=True), group_size=32, scale="bf16",
                       rounding="stochastic", dither=dither)
    x = torch.randn(4096, generator=torch.Generator().manual_seed(1)) * 0.03
    x[::32] = 1.0  # every group's maximum: scale 1, innermost levels ±1/15
    x[1::32] = 0.0
    x[2::32] = -0.0
    k = 400
    ys = torch.stack([_roundtrip(q, x, s) for s in range(k)]).double()
    small = x.abs() < 1 / 15
    assert ((ys[:, small] > 0).any(0) & (ys[:, small] < 0).any(0)).float().mean() > 0.99
    if not dither:  # undithered codes decode to the levels themselves
        assert ys[:, 1].unique().tolist() == pytest.approx([-1 / 15, 1 / 15])
    step = 2 / 15
    p = torch.frac((x.double() + 1) / step)
    sd = step * (torch.full_like(p, 12**-0.5) if dither else (p * (1 - p)).sqrt())
    err = (ys - x.double()).mean(0)
    assert (err.abs() <= 5 * sd / k**0.5 + 1e-6).all()


def test_midrise_levels_lower_the_dithered_error_by_the_step_ratio():
    """Uniform levels dithered err by ``Δ²/12``; the mid-rise grid's step is ``2/15`` of the
    range at width 4 against ``2/14``, so its error is about ``(14/15)² = 0.87`` as large."""
    x = torch.randn(1 << 15, generator=torch.Generator().manual_seed(2))
    mse = {}
    for mid in (False, True):
        q = BlockQuantizer(EpsilonFormat(4, 0.0, midrise=mid), group_size=32, scale="bf16",
                           rounding="stochastic", dither=True)
        mse[mid] = float(np.mean([((_roundtrip(q, x, s) - x) ** 2).mean().item()
                                  for s in range(8)]))
    assert 0.82 < mse[True] / mse[False] < 0.92, mse


def test_a_table_without_zero_must_say_it_is_midrise():
    with pytest.raises(ValueError, match="represents zero, or a mid-rise one"):
        BlockQuantizer(LevelFormat((0.25, 1.0)), scale="bf16")


# ---------------------------------------------------------------- blocks in place (rows)
def _rows_case(q, data):
    """A chunk of whole blocks plus maybe a partial one, and some of its blocks in a random
    order (a partial last block, when drawn, last)."""
    b = q.block_size
    nblocks = data.draw(st.integers(1, 12), label="blocks")
    tail = data.draw(st.sampled_from([0, 1, b // 2 + 3]), label="tail") % b
    total = nblocks * b + tail
    last = nblocks if tail else None
    whole = data.draw(st.permutations(range(nblocks)), label="order")
    k = data.draw(st.integers(0 if last is not None else 1, nblocks), label="taken")
    rows = list(whole[:k]) + ([last] if last is not None and (k == 0 or data.draw(
        st.booleans(), label="partial")) else [])
    return total, torch.tensor(rows, dtype=torch.int64)


def _gathered(x, rows, b, n):
    full = -(-x.numel() // b) * b
    pad = torch.cat([x, x.new_zeros(full - x.numel())])
    return pad.view(-1, b)[rows].reshape(-1)[:n].contiguous()


@pytest.mark.parametrize("native", [True, False], ids=["kernel-rows", "copied-rows"])
@pytest.mark.parametrize("name", ["dq4_dither", "int4_sr", "mxfp8"])
@given(data=st.data())
def test_rows_code_blocks_in_place_as_if_gathered(name, native, data):
    """``rows=`` encodes, decodes (and adds) and recompresses blocks where they lie, byte for
    byte and bit for bit what the same calls do on the gathered blocks; the rest of the array
    is never written. ``copied-rows``: a backend without row-reading kernels (the quantizer
    copies the blocks in and out)."""
    be = get_backend("numba")
    cls = type(be)
    saved, cls.block_rows = cls.block_rows, native
    try:
        _check_rows_against_gathered(QUANTIZERS[name], be, data)
    finally:
        cls.block_rows = saved


def _check_rows_against_gathered(q, be, data):
    total, rows = _rows_case(q, data)
    n = rows_length(rows, q.block_size, total, torch.device("cpu"))
    seed = data.draw(st.integers(0, 2**16), label="seed")
    g = torch.Generator().manual_seed(seed)
    x, acc0 = torch.randn(total, generator=g), torch.randn(total, generator=g)
    kw = {"seed": seed, "rank": 1, "world_size": 4, "stream": (3, 1), "index_offset": 512}
    want = q.encode(_gathered(x, rows, q.block_size, n), **kw)
    got = q.encode(x, rows=rows, **kw)
    assert got.n == n and torch.equal(got.data, want.data)
    dec = q.decode(want, **kw)
    for accumulate in (False, True):
        out = acc0.clone()
        q.decode(want, out, accumulate=accumulate, rows=rows, **kw)
        ref = acc0.clone()
        be.scatter_rows(torch.cat([dec, dec.new_zeros(rows.numel() * q.block_size - n)]), rows,
                        ref, accumulate, q.block_size)
        assert torch.equal(out.view(torch.int32), ref.view(torch.int32)), accumulate
    for writeback in ("none", "sum", "decoded"):
        dense = _gathered(acc0, rows, q.block_size, n)
        want_r = q.recompress(want, dense, writeback=writeback, **kw)
        acc = acc0.clone()
        got_r = q.recompress(want, acc, writeback=writeback, rows=rows, **kw)
        assert torch.equal(got_r.data, want_r.data), writeback
        ref = acc0.clone()
        if writeback != "none":
            be.scatter_rows(torch.cat([dense, dense.new_zeros(rows.numel() * q.block_size - n)]),
                            rows, ref, False, q.block_size)
        assert torch.equal(acc.view(torch.int32), ref.view(torch.int32)), writeback


def test_bad_rows_are_refused_before_any_kernel_runs():
    q = QUANTIZERS["dq4_hier"]
    x = torch.randn(3 * 256 + 10)
    for rows, match in [(torch.tensor([0, 4]), r"in \[0, 3\]"), (torch.tensor([-1]), "in"),
                        (torch.tensor([3, 0]), "only the last"),
                        (torch.tensor([0.0]), "int64"), (torch.tensor([], dtype=torch.int64),
                                                         "non-empty")]:
        with pytest.raises(ValueError, match=match):
            q.encode(x, rows=rows)
    p = q.encode(torch.randn(256))
    with pytest.raises(ValueError, match="payload's 256"):
        q.decode(p, torch.zeros(x.numel()), rows=torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="need an out"):
        q.decode(p, rows=torch.tensor([0]))
    with pytest.raises(ValueError, match="payload's 256"):
        q.recompress(p, torch.zeros(x.numel()), rows=torch.tensor([3]))
