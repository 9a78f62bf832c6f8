"""The batched simulator gives the per-message simulator's bits: results, bytes, bits and
vNMSE, for every registered pipeline it runs, on ring, butterfly and hierarchical schedules,
with partial blocks and empty chunks; and it refuses what it cannot run, clearly."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dynamiq import get_pipeline, simulate
from dynamiq.collectives.batched import Trees, simulate_batched
from dynamiq.pipeline import PIPELINES
from dynamiq.topologies import get_topology

pytestmark = pytest.mark.usefixtures("one_numba_thread")


def _runnable() -> list[str]:
    out = []
    for name in PIPELINES.names():
        p = get_pipeline(name)
        if len(p.codecs) == 1 and not p.codec.rounds_own:
            out.append(name)
    return out


def _inputs(n: int, d: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    # uneven magnitudes across coordinates, as gradients have
    return torch.randn(n, d, generator=g) * torch.rand(d, generator=g) ** 4


def _same(a, b) -> None:
    assert torch.equal(a.results[0].view(torch.int32), b.results[0].view(torch.int32))
    assert all(torch.equal(r.view(torch.int32), a.results[0].view(torch.int32))
               for r in b.results)
    assert a.bytes_sent == b.bytes_sent
    assert a.bits == b.bits
    assert a.vnmse == b.vnmse
    assert torch.equal(a.exact, b.exact)


@pytest.mark.parametrize("name", _runnable())
@pytest.mark.parametrize(("n", "d"), [(5, 1000), (8, 4096)])
def test_registered_pipelines_match_the_simulator(name, n, d) -> None:
    p = get_pipeline(name)
    if not p.topology.supports(n):
        pytest.skip(f"{p.topology} does not serve {n} ranks")
    x = _inputs(n, d)
    _same(simulate(name, x, call=2, track_hops=False), simulate_batched(name, x, call=2))


@pytest.mark.parametrize("spec", [
    "center+dynamiq@hierarchical(ranks_per_node=2)",
    "center+dynamiq@hierarchical(ranks_per_node=4,outer=butterfly)",
    "center+dynamiq(target=1e-3)@ring",
    "center+dynamiq(rounding=path)@butterfly",
    "rht+dynamiq@ring",
    "center+dynamiq(bits=5.0,widths=(2,3,4,5,6,7,8,16))@ring",
    # long-chain dithering rule, forced at 16 ranks: width 4 without its dither
    "center+dynamiq(widths=4,group_size=32,dither_max_growth=1.0)@ring",
])
def test_variants_match_the_simulator(spec) -> None:
    # Both on the reference backend: what is checked is how the batched simulator schedules
    # the virtual ranks' hops, with codings that the parity tests hold equal on every backend
    # (the registered pipelines above, and the keyed kernels below, run on Numba).
    x = _inputs(16, 3000, seed=1)
    state_a: dict = {}
    state_b: dict = {}
    for call in range(2):  # the per-tensor state carries between calls alike
        _same(simulate(spec, x, call=call, state=state_a, track_hops=False,
                       backend="reference"),
              simulate_batched(spec, x, call=call, state=state_b, backend="reference"))


def test_numbas_keyed_kernels_give_the_same_bits(monkeypatch) -> None:
    """The batches above code few runs of shared keys, which Numba codes run by run; a large
    simulation takes the keyed kernels, forced here (on three widths, to keep a cold run's
    compilation short)."""
    import dynamiq.kernels.numba as nbk

    spec = "center+dynamiq(widths=(2,4,8),group_size=32)@ring"
    x = _inputs(16, 4096, seed=2)
    want = simulate(spec, x, call=1, track_hops=False)
    monkeypatch.setattr(nbk, "KEYED_MIN_RUNS", 0)
    _same(want, simulate_batched(spec, x, call=1))


def test_inplace_uses_the_inputs_and_avg_divides() -> None:
    x = _inputs(4, 2048)
    want = simulate("dynamiq", x, op="avg", track_hops=False)
    y = x.clone()
    got = simulate_batched("dynamiq", y, op="avg", inplace=True)
    _same(want, got)
    assert not torch.equal(y, x)  # the accumulators were the caller's tensor


def test_large_steps_run_in_pieces_with_the_same_bits(monkeypatch) -> None:
    from dynamiq.collectives import batched

    x = _inputs(8, 4096)
    want = simulate_batched("dynamiq-butterfly", x)
    monkeypatch.setattr(batched, "PIECE", 700)  # not a multiple of any chunk
    assert batched._pieces(np.array([512] * 4)) == [slice(0, 2), slice(2, 3), slice(3, 4)]
    assert batched._pieces(np.array([100] * 15)) == [slice(0, 7), slice(7, 14), slice(14, 15)]
    assert batched._pieces(np.array([], dtype=np.int64)) == []
    _same(want, simulate_batched("dynamiq-butterfly", x))


def test_progress_reports_every_step() -> None:
    seen = []
    simulate_batched("dynamiq", _inputs(4, 1024), progress=lambda k, t: seen.append((k, t)))
    assert seen == [(k, 6) for k in range(1, 7)]


@pytest.mark.parametrize(("spec", "n"), [("ring", 7), ("butterfly", 16),
                                         ("hierarchical(ranks_per_node=2)", 6)])
def test_trees_equal_the_schedules(spec, n) -> None:
    topo = get_topology(spec)
    sched = topo.schedule(n)
    ch = topo.chunking(n)
    t = Trees.of(topo.step_arrays(n), len(ch.weights), n)
    for c in range(sched.num_chunks):
        assert tuple(t.sizes[c]) == sched.subtree_sizes(c)
        assert tuple(t.heights[c]) == sched.heights(c)
        assert tuple(t.children[c]) == sched.child_counts[c]
    assert t.hop_profile(ch.owners, ch.weights) == sched.hop_profile()
    assert t.compression_factors(ch.weights) == sched.compression_factors()


def test_refusals_are_clear() -> None:
    x = _inputs(4, 512)
    with pytest.raises(ValueError, match="rounds every rank's own values"):
        simulate_batched("thc", x)
    with pytest.raises(ValueError, match="op must be"):
        simulate_batched("dynamiq", x, op="max")
    with pytest.raises(ValueError, match="inplace"):
        simulate_batched("dynamiq", x.double(), inplace=True)
    with pytest.raises(ValueError, match="power-of-two"):
        simulate_batched("dynamiq-butterfly", _inputs(6, 512))


def test_one_rank_returns_its_input() -> None:
    x = _inputs(1, 300)
    r = simulate_batched("dynamiq", x)
    assert torch.equal(r.results, x) and r.vnmse == 0.0
    assert np.all(np.asarray(r.bytes_sent) == 0)
