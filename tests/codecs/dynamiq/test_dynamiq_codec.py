"""The DynamiQ codec (``dynamiq``) in pipelines and its hop operations (``codec``).

What is checked:

* budgets: the reported ``b̄`` (metadata included) never exceeds ``bits`` and misses it by
  less than one upgrade's cost per coordinate; every rank ends with the same bits;
* accuracy: vNMSE falls with the budget, the butterfly beats the ring (n = 8), dithering stays
  stable along a 64-rank ring;
* tails, zeros, NaN/Inf: a partial last super-group is coded as if the vector were
  zero-padded, zeros stay exact, a non-finite input is confined to its super-group;
* the four hop operations on a hand-made :class:`WidthPlan`: error bound per group and the
  bitwise identities of accumulate / recompress / write-back;
* reproducibility: same call → same bits, another call → other random numbers.

Library bugs found while writing these tests keep a regression test each, with a minimal
reproduction ("Repro:") in its docstring.

"Equal" means bit for bit (float32 compared through ``view(int32)``).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from _dynamiq_data import SG, by_super_group, gradients, same, segment_bytes

from dynamiq import simulate
from dynamiq.codecs import HopContext
from dynamiq.codecs.dynamiq import DynamiQ, WidthPlan
from dynamiq.collectives.simulator import SimulationResult
from dynamiq.pipeline import get_pipeline

# ---- budgets, accuracy ---------------------------------------------------------------------
D = 1 << 16


@pytest.mark.parametrize("topology", ["ring", "butterfly"])
@pytest.mark.parametrize("budget", [3, 4, 5, 6, 8])
def test_reported_bits_fill_the_budget(budget, topology):
    """``b̄ = (Σ_j c(w_j) + metadata) / d`` exactly (throughput-optimal schedules move every
    chunk's message 2(n − 1) times), and the allocator leaves less than one upgrade
    (at most 2192 − 656 bits: 2 → 8) of ``bits·d − metadata`` unused."""
    n = 4
    x = gradients(n, D, seed=budget)
    p = get_pipeline(f"center+dynamiq(bits={budget})@{topology}")
    # the reference backend (the kernels' bits, by the parity tests): sizes and agreement
    # are the codec's, and the kernels of every width would compile here otherwise
    res = simulate(p, x, track_hops=False, backend="reference")
    codec = p.codec
    upgrade = (codec.quantizers[-1].nbytes(SG) - codec.quantizers[0].nbytes(SG)) * 8
    assert res.bits <= budget
    assert budget - res.bits < upgrade / D
    # the per-hop plans weigh the hops of this topology's schedule
    plan = codec.prepare(res.stats, D, n, {},
                         hop_profile=p.topology.schedule(n).hop_profile())
    assert plan.hops is not None
    assert res.bits == pytest.approx((plan.used_bits + res.metadata_bits) / D, rel=1e-12)
    # two fp8 statistics per super-group and a shift byte each per rank
    assert res.metadata_bits == 2 * (8 * (D // SG) + 8)
    for r in range(1, n):
        assert same(res.results[r], res.results[0]), r


def test_vnmse_decreases_with_the_budget():
    """Each extra bit per coordinate must cut the error clearly (measured: by 1.7× or more on
    these data; required: by 20 %)."""
    x = gradients(4, D, seed=1)
    vn = [simulate(f"center+dynamiq(bits={b})@ring", x, track_hops=False).vnmse
          for b in range(3, 9)]
    assert all(b < 0.8 * a for a, b in itertools.pairwise(vn)), vn


def test_butterfly_beats_ring_with_eight_ranks():
    """Butterfly paths have depth log2 n instead of n − 1 (the topologies of
    docs/concepts.rst); measured 0.59× the ring's vNMSE here, required < 0.8×."""
    x = gradients(8, D, seed=2, sigma=2.0)
    ring = simulate("center+dynamiq@ring", x, track_hops=False).vnmse
    fly = simulate("center+dynamiq@butterfly", x, track_hops=False).vnmse
    assert fly < 0.8 * ring, (fly, ring)


# ---- tails, zeros, non-finite values --------------------------------------------------------
def _padded_agrees(spec: str, x: torch.Tensor) -> tuple[bool, SimulationResult]:
    n, d = x.shape
    xp = torch.zeros(n, -(-d // SG) * SG)
    xp[:, :d] = x
    res = simulate(spec, x)
    ref = simulate(spec, xp)
    return same(res.results, ref.results[:, :d]), res


@pytest.mark.parametrize(("spec", "d", "scales", "widths"), [
    ("dynamiq(widths=4,group_size=32)@ring", 1000, {}, None),
    ("dynamiq(widths=4,group_size=32)@butterfly", 100, {}, None),
    # d < 256: one partial super-group
    ("dynamiq(widths=(2,4,8,16),bits=8,group_size=32)@ring", 100, {}, [1]),
    # mixed widths in the last chunk (super-groups 6 and 7), the partial one the widest
    # (one plan for every hop: the per-hop plans of the two lengths may differ)
    ("dynamiq(bits=4.5,widths=(2,8),group_size=16,per_hop=false)@ring", 7 * SG + 100,
     {5: 30.0, 7: 100.0}, [0, 0, 0, 0, 0, 1, 0, 1]),
])
def test_partial_last_super_group_codes_like_the_zero_padded_vector(spec, d, scales, widths):
    """A partial super-group is zero-padded inside the codec, so (without centering, whose
    mean depends on the count) the result equals that of the explicitly zero-padded input on
    the first d coordinates, as long as the allocation is the same. The budgets here leave
    the same widths for both lengths."""
    x = by_super_group(4, d, scales, seed=d)
    agree, res = _padded_agrees(spec, x)
    if widths is not None:
        codec = get_pipeline(spec).codec
        assert codec.prepare(res.stats, d, 4, {}).choice.tolist() == widths
    assert agree
    assert torch.isfinite(res.results).all()


def test_partial_last_super_group_narrower_than_its_chunk_loses_no_coordinates():
    """Repro: d = 7·256 + 100, n = 4 ring, widths 2/8; super-group 6 is large (8 bits) and the
    partial super-group 7 small (2 bits), both in the last chunk. Coordinates 1636..1791 (the
    last 156 of super-group 6) come back as exactly 0."""
    d = 7 * SG + 100
    x = by_super_group(4, d, {5: 10.0, 6: 100.0, 7: 0.01}, seed=d)
    spec = "dynamiq(bits=4.75,widths=(2,8),group_size=16,per_hop=false)@ring"
    res = simulate(spec, x)
    plan = DynamiQ(bits=4.75, widths=(2, 8), group_size=16,
                   per_hop=False).prepare(res.stats, d, 4, {})
    assert plan.choice.tolist() == [0, 0, 0, 0, 0, 1, 1, 0]
    lost = res.results[0, 6 * SG + 100: 7 * SG]
    assert not (lost == 0).all()
    agree, _ = _padded_agrees(spec, x)
    assert agree


@pytest.mark.parametrize("topology", ["ring", "butterfly"])
def test_partial_last_super_group_all_ranks_agree(topology):
    """Repro: as above (d = 7·256 + 100, super-groups 5, 6 large, partial 7 small): the owner
    of the last chunk differs from the other ranks on coordinates 1636..1791."""
    d = 7 * SG + 100
    x = by_super_group(4, d, {5: 10.0, 6: 100.0, 7: 0.01}, seed=d)
    res = simulate(f"dynamiq(bits=4.75,widths=(2,8),group_size=16)@{topology}", x)
    for r in range(1, 4):
        assert same(res.results[r], res.results[0]), r


@pytest.mark.parametrize("spec", ["center+dynamiq@ring", "dynamiq@butterfly",
                                  "center+dynamiq(widths=(2,4,8,16))@butterfly"])
def test_zeros_stay_exact_zeros(spec):
    """All-zero inputs decode to exact zeros (dithering included: a zero group has scale 0);
    zero energies leave every super-group at the cheapest option (2 bits in groups of 64 under
    an 8-bit super-group scale: 552 wire bits per super-group, plus 16 bits of metadata and two
    shift bytes per vector; the partial last super-group of 184 coordinates pays for 3 groups
    of 64: 3 * (128 + 8) + 8)."""
    d = 3000
    res = simulate(spec, torch.zeros(4, d))
    assert (res.results == 0).all()
    m = -(-d // SG)
    assert res.bits == ((m - 1) * 552 + 3 * 136 + 8 + m * 16 + 16) / d


@pytest.mark.parametrize("topology", ["ring", "butterfly"])
@pytest.mark.parametrize("codec", ["center+dynamiq", "dynamiq", "dynamiq(widths=(8,16),bits=12)"])
@pytest.mark.parametrize("where", ["super-group", "one"])
def test_nan_is_confined_to_its_super_group(codec, topology, where):
    """A non-finite super-group statistic gives zero energy (cheapest width, a block-coded
    one whenever a quantized width exists) and, with centering, a NaN mean for that super-group
    only; a quantizer flags a block holding NaN. So exactly that super-group's coordinates are
    NaN on every rank, everything else stays finite."""
    n, d = 4, 16 * SG
    x = gradients(n, d, seed=3)
    j = 5
    if where == "super-group":
        x[2, j * SG:(j + 1) * SG] = float("nan")
    else:
        x[1, j * SG + 17] = float("nan")
    res = simulate(f"{codec}@{topology}", x)
    want = torch.zeros(d, dtype=torch.bool)
    want[j * SG:(j + 1) * SG] = True
    for r in range(n):
        assert torch.equal(torch.isnan(res.results[r]), want), r
        assert torch.isfinite(res.results[r][~want]).all()


def test_inf_is_confined_to_its_super_group():
    n, d = 4, 16 * SG
    x = gradients(n, d, seed=4)
    x[3, 9 * SG + 5] = float("inf")
    for spec in ("center+dynamiq@ring", "dynamiq@butterfly"):
        res = simulate(spec, x)
        bad = ~torch.isfinite(res.results)
        assert bad[:, 9 * SG:10 * SG].all() and not bad[:, :9 * SG].any()
        assert not bad[:, 10 * SG:].any()


def test_inf_after_a_finite_call_with_the_kept_state():
    """Repro: ``state = {}``; ``simulate('dynamiq(bits=2.7)@ring', 1000·randn(4, 8192),
    state=state)`` leaves log2_lambda ≈ 23; the next call with one Inf entry raises
    OverflowError (a P2P run keeps the state between calls the same way)."""
    x = 1000 * by_super_group(4, 8192, {}, seed=5)
    state: dict = {}
    simulate("dynamiq(bits=2.7)@ring", x, state=state)
    x[1, 1000] = float("inf")
    res = simulate("dynamiq(bits=2.7)@ring", x, state=state, call=1)
    assert (~torch.isfinite(res.results[0])).nonzero().flatten().tolist() == list(
        range(3 * SG, 4 * SG))



# ---- the hop operations on a hand-made plan --------------------------------------------------
_CHOICES = [np.arange(8) % 4, np.array([3, 3, 1, 0, 2, 2, 0, 1])]


def _hop_setup(choice, n_coords, seed=0):
    codec = DynamiQ(widths=(2, 4, 8, 16), group_size=32)  # one option per width
    plan = WidthPlan(np.asarray(choice, dtype=np.int64), codec.width_list, 0.0, 0.0)
    ctx = HopContext(seed=0, stream=(5, 2), rank=1, world_size=4, index_offset=0,
                     prepared={codec: plan})
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n_coords, generator=g) * torch.logspace(-3, 3, n_coords)
    return codec, ctx, x


@pytest.mark.parametrize("choice", _CHOICES, ids=["alternating", "mixed"])
def test_roundtrip_error_within_level_gap_times_group_scale(choice):
    """Per group at width w ≤ 8: the element is normalised by the exact group max ``g``
    and rounded to a neighbouring level (off by at most ``gap·g``), and the decoded group scale
    is within one UINT8 step ``S/255`` of ``g`` (``S``: the super-group max, rounded up to
    BF16, ≤ (1 + 2⁻⁷)·max), so ``|x̂ − x| ≤ gap·g + S/255``. Width 16 is BF16
    round-to-nearest: ``|x̂ − x| ≤ 2⁻⁸|x|``."""
    n = len(choice) * SG
    codec, ctx, x = _hop_setup(choice, n)
    y = torch.empty(n)
    codec.decompress(codec.compress(x, ctx), y, ctx)
    err = (y.double() - x.double()).abs()
    for j, w in enumerate(choice):
        sl = slice(j * SG, (j + 1) * SG)
        q = codec.quantizers[w]
        if q is None:
            assert (err[sl] <= 2.0**-8 * x[sl].double().abs()).all(), j
            continue
        g = q.group_size
        gmax = x[sl].double().abs().view(-1, g).amax(1, keepdim=True)
        smax = float(x[sl].abs().max()) * (1 + 2.0**-7)
        bound = q.level_gap() * gmax + smax / 255
        assert (err[sl].view(-1, g) <= bound * (1 + 1e-6)).all(), (j, w)


@pytest.mark.parametrize("n_coords", [8 * SG, 7 * SG + 100])
@pytest.mark.parametrize("choice", _CHOICES[:1], ids=["alternating"])
def test_accumulate_and_recompress_identities(choice, n_coords):
    """``decompress_accumulate`` is ``acc + decompress`` (one float32 addition), the fused
    recompress equals ``compress(acc + decompress(data))`` byte for byte, and the write-backs
    leave in ``acc``: the decoded outgoing message ("decoded"), the float32 partial sum
    ("sum"), the untouched accumulator ("none")."""
    codec, ctx, x = _hop_setup(choice, n_coords)
    data = codec.compress(x, ctx)
    dec = torch.empty(n_coords)
    codec.decompress(data, dec, ctx)
    acc0 = torch.randn(n_coords, generator=torch.Generator().manual_seed(9))
    acc = acc0.clone()
    codec.decompress_accumulate(data, acc, ctx)
    assert same(acc, acc0 + dec)
    for writeback in ("none", "sum", "decoded"):
        acc = acc0.clone()
        out = codec.decompress_accumulate_recompress(data, acc, ctx, writeback=writeback)
        assert torch.equal(out, codec.compress(acc0 + dec, ctx)), writeback
        if writeback == "none":
            assert same(acc, acc0)
        elif writeback == "sum":
            assert same(acc, acc0 + dec)
        else:
            back = torch.empty(n_coords)
            codec.decompress(out, back, ctx)
            assert same(acc, back)


def test_tail_chunk_narrow_partial_super_group_hop_operations():
    """Repro: widths 2/4/8/16, chunk of 7·256 + 100 coordinates, choice [3, 2, 1, 0, 3, 2, 1, 0]
    (the partial super-group 7 is 2 bits, the chunk's widest segment BF16): the message has
    the bytes of its groups (super-group 4 travels as 256 BF16 values, super-group 7 as 4
    groups of 32 at 2 bits), and
    ``decompress(compress(x))`` is exactly 0 on coordinates 1124..1279 (super-group 4)."""
    choice = np.array([3, 2, 1, 0, 3, 2, 1, 0])
    n = 7 * SG + 100
    codec, ctx, x = _hop_setup(choice, n)
    data = codec.compress(x, ctx)
    y = torch.empty(n)
    codec.decompress(data, y, ctx)
    assert data.numel() == segment_bytes(codec, choice, n)
    err = (y.double() - x.double()).abs()
    assert (err[4 * SG:5 * SG] <= 2.0**-8 * x[4 * SG:5 * SG].double().abs()).all()
    acc = torch.zeros(n)
    out = codec.decompress_accumulate_recompress(data, acc, ctx, writeback="decoded")
    back = torch.empty(n)
    codec.decompress(out, back, ctx)
    assert same(acc, back)


def test_hop_operations_without_a_plan_raise():
    codec = DynamiQ()
    with pytest.raises(ValueError, match="width plan"):
        codec.compress(torch.zeros(SG), HopContext())


# ---- reproducibility -------------------------------------------------------------------------
@pytest.mark.parametrize("spec", ["center+dynamiq@ring",
                                  "center+dynamiq(widths=(2,4,8,16))@butterfly"])
def test_same_call_same_bits_other_call_other_bits(spec):
    x = gradients(4, 20 * SG, seed=7)
    a = simulate(spec, x, call=3)
    b = simulate(spec, x.clone(), call=3)
    c = simulate(spec, x, call=4)
    assert same(a.results, b.results)
    assert a.bytes_sent == b.bytes_sent == c.bytes_sent  # widths depend on the data only
    assert not same(a.results, c.results)
    assert a.bits == c.bits


def test_widths_do_not_depend_on_the_previous_call():
    """Repro: ``state = {}``; ``simulate(p, A, state=state)`` then
    ``simulate(p, B, call=1, state=state)`` with ``B`` = 1e-3 × other gradients, d = 40·256,
    ``p = "center+dynamiq@ring"``: vNMSE 0.099 against 0.0050 for the same call with a fresh
    state, at about the same bits."""
    d = 40 * SG
    p = get_pipeline("center+dynamiq@ring")
    state: dict = {}
    simulate(p, gradients(4, d, seed=100), state=state, track_hops=False)
    b = 1e-3 * gradients(4, d, seed=200)
    warm = simulate(p, b, call=1, state=state, track_hops=False)
    fresh = simulate(p, b, call=1, track_hops=False)
    assert warm.vnmse < 2 * fresh.vnmse, (warm.vnmse, fresh.vnmse)
    assert same(warm.results, fresh.results)


# ---- dithering along long paths -------------------------------------------------------------
# (compiles the kernels of every dithered width on a cold cache: more than the suite's
# per-test limit, meant for hangs, on a loaded 2-core machine)
@pytest.mark.timeout(3600)
def test_dithering_stays_stable_along_a_64_rank_ring():
    """Dithered widths amplify their own noise hop after hop (the dither scales with each
    group's maximum, which the previous hops' noise raises): with every width of the levels
    with a zero dithered a 64-rank ring diverges; the default (widths 3 and up) beats plain
    stochastic rounding, and so does asking for every width when the long-chain rule
    (``dither_max_growth``) keeps the ones whose growth over 63 hops is too large (width 2)
    undithered.

    The property is the coding's, not a backend's (every backend gives the same bits,
    ``tests/kernels/test_backend_parity.py``): it runs on the reference backend, which needs no
    compiled kernel for the 28 variants of width, group size and coding it goes through."""
    from dynamiq.bench.workloads import get_workload

    x = get_workload("lognormal(d=16384)").gradients(64)[0].grads

    def vnmse(spec: str) -> float:
        return simulate(spec, x, track_hops=False, backend="reference").vnmse

    default = vnmse("center+dynamiq@ring")
    plain = vnmse("center+dynamiq(dither=false)@ring")
    every = vnmse("center+dynamiq(dither_min_width=2,dither_max_growth=1e300,midrise=false)@ring")
    ruled = vnmse("center+dynamiq(dither_min_width=2)@ring")
    assert default < plain < 0.1, (default, plain)
    assert every > 10 * plain, every
    assert ruled < plain, (ruled, plain)


def test_path_correlated_rounding_lowers_a_rings_error_at_a_measured_bias():
    """``rounding="path"`` (the paper's): one permutation per chunk tree, so the roundings of a
    coordinate along the ring are stratified; it is flagged biased and lowers the error of
    one call against per-height correlation (no dither, where rounding noise dominates)."""
    import torch

    from dynamiq.bench.accuracy import bias_ratio
    from dynamiq.bench.workloads import GradientSet
    from dynamiq.codecs import DynamiQ
    from dynamiq.collectives.simulator import simulate
    from dynamiq.pipeline import Pipeline

    g = torch.Generator().manual_seed(5)
    x = torch.randn(1 << 15, generator=g) + 0.3 * torch.randn(8, 1 << 15, generator=g)
    err = {}
    for r in ("correlated", "path"):
        p = Pipeline(DynamiQ(rounding=r, dither=False, widths=(3,)), "ring")
        # on the reference backend: a property of the coding, which the backends compute alike
        # (tests/kernels/test_backend_parity.py), and no kernel to compile for these options
        err[r] = sum(simulate(p, x, call=c, track_hops=False, backend="reference").vnmse
                     for c in range(4))
        assert p.unbiased == (r == "correlated")
    assert err["path"] < 0.9 * err["correlated"]
    path = Pipeline(DynamiQ(rounding="path"), "ring")
    assert path.codec.spec().count("rounding=path") == 1
    # runs; its value is measured
    assert bias_ratio(path, [GradientSet("t", 0, x)], 4, backend="reference") > 0.5
