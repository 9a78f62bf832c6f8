"""The binary-tree topology of the guide "Add a topology" (docs/examples/binary_tree.py): valid
schedules, exact and compressed sums in the simulator, and the same bits over gloo processes.

The example registers ``binary_tree`` when it is imported. It is imported here once, by module
name, at collection time: Python runs a module once per process, so the registration happens
once, before any test runs (the guide's own test finds it registered and leaves it alone), and
the spawned ranks, which import this module to find their plan, register it in theirs.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from _world import world_results

import dynamiq
from dynamiq.topologies import TOPOLOGIES, get_topology, validate_schedule

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"
if str(EXAMPLES) not in sys.path:
    sys.path.insert(0, str(EXAMPLES))
binary_tree = importlib.import_module("binary_tree")

EXACT = "passthrough(wire=fp32)@binary_tree"
COMPRESSED = "requant(quantizer=dq4_hier)@binary_tree"
D = 1000  # not a multiple of the 256-element block: a partial last block
WORLD = 5  # rank 1 has two children, rank 2 none: both sibling cases and a lopsided tree

pytestmark = pytest.mark.usefixtures("one_numba_thread")


def _inputs(n: int, d: int = D, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * seed + n)
    return torch.randn(n, d, generator=g) * torch.logspace(-2, 2, d)


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.asarray(a, dtype=np.float32), np.asarray(b, dtype=np.float32)
    return a.shape == b.shape and np.array_equal(a.view(np.int32), b.view(np.int32))


def test_registered_under_its_name() -> None:
    topo = get_topology("binary_tree")
    assert TOPOLOGIES["binary_tree"] is binary_tree.BinaryTree
    assert topo == binary_tree.BinaryTree() and str(topo) == "binary_tree"
    assert get_topology(str(topo)) == topo
    assert dynamiq.get_pipeline(COMPRESSED).topology == topo


@pytest.mark.parametrize("n", range(1, 10))
def test_schedule_is_a_valid_binary_tree(n: int) -> None:
    s = binary_tree.BinaryTree().schedule(n)
    validate_schedule(s)
    assert (s.world_size, s.num_chunks, s.owners, s.chunk_weights) == (n, 1, (0,), (1.0,))
    assert s.parents == (tuple(-1 if r == 0 else (r - 1) // 2 for r in range(n)),)
    assert s.depth(0) == (n.bit_length() - 1)
    assert s.steps() <= 4 * (n.bit_length() - 1)
    # one send up per rank but the root, one send down per child
    kids = [len(s.children(0, r)) for r in range(n)]
    assert s.bytes_per_rank(1) == [(r > 0) + kids[r] for r in range(n)]


@pytest.mark.parametrize("n", range(1, 10))
def test_fp32_passthrough_sums_exactly(n: int) -> None:
    # Integer-valued floats: every order of summation is exact in float32.
    g = torch.Generator().manual_seed(n)
    x = torch.randint(-1000, 1000, (n, D), generator=g).float()
    res = dynamiq.simulate(EXACT, x)
    want = x.double().sum(0).float()
    for r in range(n):
        assert torch.equal(res.results[r], want), r
    sched = get_topology("binary_tree").schedule(n)
    assert res.bytes_sent == sched.bytes_per_rank(4 * D)


@pytest.mark.parametrize("n", range(2, 10))
def test_compressed_pipeline_agrees_across_ranks(n: int) -> None:
    res = dynamiq.simulate(COMPRESSED, _inputs(n))
    assert all(torch.equal(res.results[r], res.results[0]) for r in range(n))
    assert 0 < res.vnmse < 0.05
    sched = get_topology("binary_tree").schedule(n)
    codec = dynamiq.get_pipeline(COMPRESSED).codec
    assert res.bytes_sent == sched.bytes_per_rank(codec.wire_bytes(D))


# ---- over gloo --------------------------------------------------------------------------------
def _plan(rank: int, n: int, barriers: list) -> dict:
    x = _inputs(n)[rank]
    out = {}
    for call, spec in enumerate((EXACT, COMPRESSED, COMPRESSED)):
        t = x.clone()
        dynamiq.all_reduce(t, spec, timeout=60)
        out[f"{spec}/{call}"] = t.numpy().copy()
    return out


def test_all_reduce_over_gloo_equals_simulate() -> None:
    res = world_results(WORLD, _plan)
    x = _inputs(WORLD)
    # all_reduce counts calls per pipeline and size from 0: the second COMPRESSED call is call 1
    for key, spec, call in ((f"{EXACT}/0", EXACT, 0), (f"{COMPRESSED}/1", COMPRESSED, 0),
                            (f"{COMPRESSED}/2", COMPRESSED, 1)):
        sim = dynamiq.simulate(spec, x, call=call)
        for r in range(WORLD):
            assert _same_bits(res[r][key], sim.results[r].numpy()), f"{key}, rank {r}"
    assert not _same_bits(res[0][f"{COMPRESSED}/1"], res[0][f"{COMPRESSED}/2"])
