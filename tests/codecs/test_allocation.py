"""Width allocation under a budget (:mod:`dynamiq.codecs.allocation`).

The allocator minimises the modelled error ``Σ_j E_j v(w_j)`` subject to ``Σ_j c(w_j) ≤ B`` by a
Lagrangian bisection followed by a greedy settle of the super-groups that flip inside the final
bracket. What such a method guarantees, and what is checked here:

* feasibility: the chosen widths never cost more than the budget (when the cheapest width
  fits at all), and the unused budget is smaller than the upgrade the greedy stopped at;
* with **two** options every upgrade costs the same, so "Lagrangian order + stop at the first
  upgrade that does not fit" is exactly optimal (checked against brute force), independent of
  the bisection's warm start, and monotone in the energies;
* more budget never narrows a super-group, never costs less and never models more error;
* per super-group, the Lagrangian rule itself (``lagrangian_choice``) is monotone in the energy
  and in ``λ`` for any option set.

With **three or more** options a super-group may cross several widths inside the final bracket;
the settle step walks its convex hull one upgrade at a time in threshold order, so the result
does not depend on the warm start, leaves no affordable upgrade of equal energies unused, is
monotone in the energy and stays within the Lagrangian duality gap (fixed counterexamples of an
earlier settle step that jumped several widths at once with an averaged slope).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

from dynamiq.codecs.allocation import RELATIVE_FLOOR, WidthOption, allocate, lagrangian_choice
from dynamiq.codecs.dynamiq import DynamiQ

# Widths {2, 4, 8} at the codec's exact wire cost per super-group (256 w value bits + 16 UINT8
# group scales + a BF16 super scale), with the codec's measured error per width (paper ε) and
# with the paper's 4^-w model (see test_codec_options_are_the_ones_modelled_here).
MEASURED = [WidthOption(2, 0.695883153771611, 656.0), WidthOption(4, 0.012803541990753967, 1168.0),
            WidthOption(8, 5.8924613275970216e-05, 2192.0)]
PAPER = [WidthOption(w, 4.0**-w, 256.0 * w + 144.0) for w in (2, 4, 8)]


def _arrays(options):
    return (np.array([o.cost for o in options]), np.array([o.error for o in options]))


def _cost(options, choice) -> float:
    return float(_arrays(options)[0][choice].sum())


def _error(options, energy, choice) -> float:
    return float((energy * _arrays(options)[1][choice]).sum())


def _brute_force(options, energy, budget) -> float:
    """Smallest modelled error of any assignment that costs at most ``budget``."""
    cost, err = _arrays(options)
    every = np.array(list(itertools.product(range(len(options)), repeat=energy.size)))
    total = cost[every].sum(1)
    model = (energy[None, :] * err[every]).sum(1)
    return float(model[total <= budget].min())


# ---- strategies --------------------------------------------------------------------------------
# energies: exact zeros, ties (a small pool) and a dynamic range of 1e-30 .. 1e30
_energy = st.one_of(
    st.just(0.0),
    st.sampled_from([1.0, 2.0, 1e3]),
    st.floats(-30.0, 30.0).map(lambda e: 10.0**e),
)


@st.composite
def _options(draw, k=None):
    """``k`` options (2–4 when ``None``): strictly increasing integer costs, strictly decreasing
    positive errors (not necessarily convex)."""
    k = draw(st.integers(2, 4)) if k is None else k
    steps = draw(st.lists(st.integers(1, 4096), min_size=k - 1, max_size=k - 1))
    c0 = draw(st.integers(1, 4096))
    costs = np.cumsum([c0, *steps]).astype(float)
    e0 = draw(st.floats(1e-3, 1.0))
    ratios = draw(st.lists(st.floats(1e-4, 0.9), min_size=k - 1, max_size=k - 1))
    errs = e0 * np.cumprod([1.0, *ratios])
    return [WidthOption(i, float(e), float(c)) for i, (e, c) in enumerate(zip(errs, costs))]


# the default codec's options (six widths) as configured now, too
_option_sets = st.one_of(st.just(MEASURED), st.just(PAPER), st.just(DynamiQ().width_options),
                         _options())


def _budget(options, m: int, frac: float) -> float:
    """A budget ``frac`` of the way from all-cheapest to all-best (frac may leave [0, 1])."""
    cost = _arrays(options)[0]
    return float(m * (cost[0] + frac * (cost[-1] - cost[0])))


# ---- feasibility and the unused budget ---------------------------------------------------------
@given(st.lists(_energy, min_size=1, max_size=60), _option_sets,
       st.one_of(st.floats(0.0, 1.0), st.floats(-0.5, 1.5)))
def test_budget_is_never_exceeded_and_leftover_is_below_one_upgrade(energies, options, frac):
    """Never over budget; what is left is smaller than the upgrade the greedy stopped at.

    The settle step upgrades the flipping super-groups in threshold order and stops at the first
    upgrade ``a → b`` that does not fit, so the leftover is below ``c(b) − c(a) ≤ c(best) − c(a)``
    for some super-group with positive energy (zero-energy super-groups never gain from an
    upgrade and are left at the cheapest width).
    """
    e = np.array(energies)
    m = e.size
    budget = _budget(options, m, frac)
    cost, _ = _arrays(options)
    choice = allocate(e, options, budget, {})
    assert choice.dtype == np.int64 and choice.shape == (m,)
    assert ((choice >= 0) & (choice < len(options))).all()
    if cost[0] * m >= budget:
        assert (choice == 0).all()  # infeasible (or exactly the cheapest): all cheapest
        return
    used = cost[choice].sum()
    assert used <= budget
    if cost[-1] * m <= budget:
        assert (choice == len(options) - 1).all()
        return
    below = (e > 0) & (choice < len(options) - 1)
    if below.any():
        assert budget - used < (cost[-1] - cost[choice[below]]).max()


def test_infeasible_budget_gives_every_super_group_the_cheapest_width():
    e = np.array([0.0, 1.0, 1e30, 5.0])
    for budget in (0.0, 100.0, 4 * 656.0 - 1, 4 * 656.0):
        assert allocate(e, MEASURED, budget, {}).tolist() == [0, 0, 0, 0]


def test_huge_budget_gives_every_super_group_the_best_width():
    e = np.array([0.0, 1e-30, 1.0, 1e30])
    for budget in (4 * 2192.0, 1e12, float("inf")):
        assert allocate(e, MEASURED, budget, {}).tolist() == [2, 2, 2, 2]


def test_degenerate_inputs():
    """No super-groups, a single option, and non-finite energies (NaN counts as zero energy,
    +Inf as the largest)."""
    assert allocate(np.zeros(0), MEASURED, 1e6, {}).shape == (0,)
    assert allocate(np.array([1.0, 2.0]), MEASURED[:1], 1e6, {}).tolist() == [0, 0]
    e = np.array([np.nan, np.inf, 1.0])
    choice = allocate(e, MEASURED, 656.0 + 2192.0 + 656.0 + 100.0, {})
    assert choice.tolist() == [0, 2, 0]


# ---- two options: exactly optimal, warm-start free, monotone in the energy ---------------------
@given(st.lists(_energy, min_size=1, max_size=8), _options(k=2), st.floats(-0.2, 1.2))
def test_two_options_match_brute_force(energies, options, frac):
    """With two widths every upgrade costs the same ``Δc``, so the best assignment under the
    budget upgrades the ``⌊(B − m c₀)/Δc⌋`` largest energies; the Lagrangian order followed by
    the greedy stop reaches exactly that error."""
    e = np.array(energies)
    budget = _budget(options, e.size, frac)
    assume(_arrays(options)[0][0] * e.size < budget)  # the infeasible case is checked above
    choice = allocate(e, options, budget, {})
    assert _cost(options, choice) <= budget
    best = _brute_force(options, e, budget)
    assert _error(options, e, choice) <= best * (1 + 1e-12)


@given(st.lists(_energy, min_size=1, max_size=300), _options(k=2), st.floats(0.0, 1.0),
       st.lists(st.floats(-300.0, 300.0), min_size=1, max_size=3))
def test_two_options_result_does_not_depend_on_the_warm_start(energies, options, frac, starts):
    e = np.array(energies)
    budget = _budget(options, e.size, frac)
    want = allocate(e, options, budget, {})
    for s in starts:
        state = {"log2_lambda": s}
        got = allocate(e, options, budget, state)
        np.testing.assert_array_equal(got, want)


@given(st.lists(_energy, min_size=1, max_size=100), _options(k=2), st.floats(0.0, 1.0))
def test_two_options_larger_energy_never_gets_a_narrower_width(energies, options, frac):
    e = np.sort(np.array(energies))
    choice = allocate(e, options, _budget(options, e.size, frac), {})
    for i in range(e.size - 1):
        if e[i + 1] > e[i]:
            assert choice[i + 1] >= choice[i], (e, choice)


# ---- any option set: monotone in the budget ----------------------------------------------------
@given(st.lists(_energy, min_size=1, max_size=60), _option_sets,
       st.lists(st.floats(-0.1, 1.1), min_size=2, max_size=5))
def test_more_budget_never_narrows_a_super_group(energies, options, fracs):
    """As the budget grows: every super-group's width is nondecreasing, the total cost
    nondecreasing and the modelled error nonincreasing."""
    e = np.array(energies)
    prev = None
    for frac in sorted(fracs):
        choice = allocate(e, options, _budget(options, e.size, frac), {})
        if prev is not None:
            assert (choice >= prev).all(), (prev, choice)
            assert _cost(options, choice) >= _cost(options, prev)
            assert _error(options, e, choice) <= _error(options, e, prev) * (1 + 1e-12)
        prev = choice


@given(st.lists(_energy, min_size=2, max_size=40), _option_sets,
       st.floats(-100.0, 100.0), st.floats(-100.0, 100.0))
def test_lagrangian_rule_is_monotone_in_energy_and_lambda(energies, options, l1, l2):
    """Per super-group, ``argmin_w E v(w) + λ c(w)``: a larger ``E`` never picks a cheaper
    option, a larger ``λ`` never a dearer one (exchange argument; ties go to the cheapest)."""
    e = np.sort(np.array(energies))
    lo, hi = sorted((2.0**l1, 2.0**l2))
    a = lagrangian_choice(e, options, lo)
    b = lagrangian_choice(e, options, hi)
    assert (np.diff(a) >= 0).all() and (np.diff(b) >= 0).all()
    assert (b <= a).all()


# ---- three options: multi-width jumps inside the final bracket -------------------------

def test_three_options_result_does_not_depend_on_the_warm_start():
    # one super-group, budget between the 4- and the 8-bit cost: 4 bits fit and are best
    e = np.array([1.0])
    want = allocate(e, MEASURED, 1424.0, {})
    assert want.tolist() == [1]
    for s in (-40.0, -20.0, 0.0, 20.0):
        assert allocate(e, MEASURED, 1424.0, {"log2_lambda": s}).tolist() == [1], s


def test_three_options_leave_no_affordable_upgrade_of_equal_energies():
    # [4, 4, 8] bits cost exactly the budget (2·1168 + 2192 = 4528); allocate returns
    # [2, 2, 8] (cost 3504), leaving 1024 bits although each 2 -> 4 upgrade costs 512
    e = np.array([1.0, 1.0, 100.0])
    choice = allocate(e, PAPER, 4528.0, {})
    assert choice.tolist() == [1, 1, 2]


def test_three_options_larger_energy_never_gets_a_narrower_width():
    # returns [2, 1, 2, 2, 2]: the smallest energy gets 8 bits, the next one 4
    e = np.array([7.23322623e-03, 1.70623863e-01, 8.27573035e-01, 3.41751432e00, 1.20560417e01])
    choice = allocate(e, MEASURED, 10157.0, {})
    assert (np.diff(choice) >= 0).all(), choice


def _three_option_instances(count: int = 60):
    rng = np.random.default_rng(20260211)
    for _ in range(count):
        m = int(rng.integers(2, 7))
        e = np.exp(rng.normal(0.0, 3.0, m))
        e[rng.random(m) < 0.15] = 0.0
        yield e, _budget(MEASURED, m, float(rng.uniform(0.0, 1.0)))


def test_three_options_within_the_lagrangian_duality_gap():
    """A Lagrangian + greedy result is a minimiser of ``Σ E v + λ_b Σ c`` at the threshold
    ``λ_b`` of the upgrade it stopped at, hence (i) optimal among assignments that cost no more
    than it does, and (ii) within that upgrade's error reduction of the optimum under the
    budget: ``err ≤ OPT(B) + max_j E_j (v(w_j) − v_min)``. Checked by brute force on small
    random instances (m ≤ 6, 3 options)."""
    _, err = _arrays(MEASURED)
    for e, budget in _three_option_instances():
        choice = allocate(e, MEASURED, budget, {})
        got = _error(MEASURED, e, choice)
        assert got <= _brute_force(MEASURED, e, _cost(MEASURED, choice)) * (1 + 1e-12), (e, budget)
        gap = float((e * (err[choice] - err.min())).max())
        assert got <= _brute_force(MEASURED, e, budget) + gap * (1 + 1e-12), (e, budget)


# ---- non-finite energies and a warm start far from the answer --------------------
def test_infinite_energy_with_a_distant_warm_start_does_not_overflow():
    e = np.array([np.inf, 1.0])
    budget = 2 * 656.0 + 100.0  # only the cheapest widths fit
    assert allocate(e, MEASURED, budget, {}).tolist() == [0, 0]
    assert allocate(e, MEASURED, budget, {"log2_lambda": -100.0}).tolist() == [0, 0]


def test_codec_options_are_the_ones_modelled_here():
    """The constants above are the options of ``dynamiq(widths=(2,4,8),eps=(0.25,0.19,0.09))`` and
    of ``dynamiq(widths=(2,4,8),allocator=paper)`` in groups of 16 (the paper's configuration):
    the counterexamples apply to the codec."""
    paper = {"midrise": False, "super_scale": "bf16", "scale_rounding": "stochastic"}
    for codec, want in ((DynamiQ(widths=(2, 4, 8), eps=(0.25, 0.19, 0.09), group_size=16,
                                 dither=False, **paper), MEASURED),
                        (DynamiQ(widths=(2, 4, 8), allocator="paper", group_size=16, **paper),
                         PAPER)):
        got = codec.width_options
        assert [(o.width, o.cost) for o in got] == [(o.width, o.cost) for o in want]
        # the constants come from a parallel float64 sum, the codec's errors from exact sums
        assert [o.error for o in got] == pytest.approx([o.error for o in want], rel=1e-12)


@pytest.mark.parametrize("start", [None, -30.0, -10.0, 10.0])
def test_default_codec_gives_equal_energies_equal_widths(start):
    """The default codec's widths (2-8, in groups of 32) through its public ``prepare``: two
    super-groups of equal energy, budget 2 × the 5-bit cost (2720 bits, i.e. bits = 5.40625
    on 512 coordinates with 48 bits of fp8 metadata). The optimum is [5, 5] from every warm
    start (an earlier settle step returned [6, 4], [4, 4] or [8, 2] depending on the start)."""
    codec = DynamiQ(bits=5.40625, group_size=32)
    state = {} if start is None else {"log2_lambda": start}
    stats = {"sum8": torch.zeros(2, dtype=torch.float64),
             "csumsq8": torch.ones(2, dtype=torch.float64)}
    plan = codec.prepare(stats, 2 * 256, 4, state)
    assert plan.budget_bits == 2720.0
    assert [codec.width_list[i] for i in plan.choice] == [5, 5]


# ---- the allocation is the threshold-ordered walk of every hull upgrade ----------------------
def _walk(energy, options, budget, costs):
    """Reference: list every super-group's hull upgrades with their thresholds, sort them all by
    (threshold descending, super-group, hull position) and take them while they fit."""
    err = np.array([o.error for o in options])
    e = np.maximum(np.nan_to_num(np.asarray(energy, float), nan=0.0, posinf=np.inf), 0.0)
    fin = e[np.isfinite(e)]
    top = float(fin.max()) if fin.size and fin.max() > 0 else 1.0
    e = np.where(np.isfinite(e), e / top, 2.0**100)
    e = np.where(e < RELATIVE_FLOOR, 0.0, e)
    # per row the cheapest option, the most accurate among equally cheap ones
    choice = np.array([min((o for o in range(len(row)) if np.isfinite(row[o])),
                           key=lambda o, row=row: (row[o], err[o], o)) for row in costs])
    ups = []
    for j, row in enumerate(costs):
        ok = [o for o in range(len(row)) if np.isfinite(row[o])]
        best = min(ok, key=lambda o: (err[o], row[o], o))
        cur, k = int(choice[j]), 0
        while cur != best:
            cands = [o for o in ok if row[cur] < row[o] <= row[best]]
            slope = {o: (err[cur] - err[o]) / (row[o] - row[cur]) for o in cands}
            nxt = max(cands, key=lambda o: (slope[o], row[o]))
            ups.append((-(e[j] * (err[cur] - err[nxt]) / (row[nxt] - row[cur])), j, k,
                        row[nxt] - row[cur], nxt))
            cur, k = nxt, k + 1
    left = budget - float(np.take_along_axis(costs, choice[:, None], 1).sum())
    for neg_t, j, _, extra, nxt in sorted(ups):
        if -neg_t <= 0 or extra > left:
            break
        choice[j] = nxt
        left -= extra
    return choice


def test_equally_cheap_options_start_from_the_more_accurate():
    # a partial last super-group can have its options cut to equal costs: its allocation starts
    # from the more accurate of them (no upgrade leads from one to the other)
    options = [WidthOption(2, 1.0, 10.0), WidthOption(4, 0.5, 20.0)]
    costs = np.array([[10.0, 20.0], [1.0, 1.0]])
    assert allocate(np.array([1.0, 1.0]), options, 15.0, {}, costs).tolist() == [0, 1]
    assert allocate(np.array([1.0, 1.0]), options, 11.0, {}, costs).tolist() == [0, 1]


@given(st.lists(_energy, min_size=1, max_size=300), _option_sets, st.floats(0.02, 0.98),
       st.sampled_from(["same", "partial", "excluded"]))
def test_allocation_is_the_threshold_ordered_walk_of_all_upgrades(energies, options, frac, rows):
    """The bisection over sorted columns takes exactly the upgrades that sorting all of them
    and walking the list takes (long vectors exercise the search, equal energies its ties, a
    partial last super-group and excluded options the listed rows)."""
    e = np.array(energies * (1 + 2000 // len(energies)))[:2000] if len(energies) > 200 else \
        np.array(energies)
    m = e.size
    base = np.array([o.cost for o in options])
    costs = np.tile(base, (m, 1))
    if rows == "partial":
        costs[-1] = np.ceil(base * 0.3)
    elif rows == "excluded":
        costs[:, 0] = np.inf
        costs[-1, 1:] = np.ceil(base[1:] * 0.5)
    fin = costs[np.isfinite(costs)].reshape(m, -1)
    budget = float(fin.min(1).sum() + frac * (fin.max(1).sum() - fin.min(1).sum()))
    got = allocate(e, options, budget, {}, costs)
    if np.take_along_axis(costs, np.argmin(costs, 1)[:, None], 1).sum() >= budget:
        return
    assert got.tolist() == _walk(e, options, budget, costs).tolist()


def test_a_row_without_upgrades_keeps_its_only_option():
    """Repro: widths (2, 4, 8, 16) on 1025 coordinates; the partial last super-group's one
    coordinate is cheapest in BF16 (16 bits against a whole group's scale), which is also its
    most accurate option, so its hull has no upgrade. Its option was left unwritten (any
    value, e.g. 9 of 7 options)."""
    c = DynamiQ(bits=7.0, widths=(2, 4, 8, 16), scales="flat", rounding="stochastic")
    costs = c._costs(5, 1025)
    bf16 = c.option_keys.index((16, 0))
    assert int(np.argmin(costs[-1])) == bf16
    e = np.random.default_rng(0).random(5)
    for rows in (1, 2):  # one plan, and two hop positions of a per-hop allocation
        got = allocate(np.tile(e, rows), c.width_options, rows * (7 * 1025 - 100), {},
                       np.tile(costs, (rows, 1)))
        assert got.min() >= 0 and got.max() < len(c.options)
        assert (got[4::5] == bf16).all()


def test_a_cost_key_remembers_the_row_classes_without_changing_the_choice():
    """Calls that name their cost matrix (``cost_key``) reuse its row classes: each call's
    widths equal an unkeyed call's, for new energies and budgets every time."""
    rs = np.random.default_rng(11)
    opts = [WidthOption(2, 1.0, 0.3), WidthOption(4, 0.2, 0.5), WidthOption(8, 0.01, 1.0)]
    costs = np.tile([0.3, 0.5, 1.0], (300, 1))
    costs[-1] = [0.1, 0.2, 0.4]  # a partial last super-group: a class of its own
    costs[100:200] *= 3  # a hop sent three times
    key = ("test", costs.shape)
    for _ in range(4):
        e = rs.lognormal(0, 2, 300)
        budget = float(rs.uniform(costs[:, 0].sum(), costs[:, 2].sum()))
        want = allocate(e, opts, budget, {}, costs)
        assert np.array_equal(allocate(e, opts, budget, {}, costs, cost_key=key), want)


def test_energies_below_the_relative_floor_count_as_nothing():
    """A super-group whose energy is below RELATIVE_FLOOR times the largest keeps the cheapest
    option even when bits are left, like an empty one (its thresholds would be subnormal)."""
    e = np.array([1.0, 0.5 * RELATIVE_FLOOR, 0.0, 0.25])
    lo, mid, hi = (o.cost for o in MEASURED)
    # the two real super-groups at the top, and bits for one more first upgrade left over
    got = allocate(e, MEASURED, 2 * hi + 2 * lo + (mid - lo), {})
    assert got.tolist() == [2, 0, 0, 2]
