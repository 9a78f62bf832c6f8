"""Every backend gives the reference backend's bits, for every registered component.

Backends are enrolled automatically: every name :func:`dynamiq.kernels.backend_names` knows
(the Triton one runs under the interpreter here, see ``conftest.py``) is compared with
``reference``, the readable NumPy/torch statement of the kernels. Components are taken from the
registries when the test runs: every quantizer (encode, decode, the fused hop in every
write-back, with correlated and dithered keys, on lengths with partial blocks), every codec's
:meth:`~dynamiq.codecs.PartialSumCodec.examples` (the four hop operations, inside a collective),
every transform, and the metadata statistics.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _parity import (
    SCALE_CASES,
    WRITEBACKS,
    assert_same,
    case_vector,
    check_hops,
    enrolled,
    metadata_context,
    vector,
)

from dynamiq import QUANTIZERS, TRANSFORMS, BlockQuantizer, Payload
from dynamiq.collectives.statistics import local_statistics
from dynamiq.formats import EpsilonFormat
from dynamiq.kernels import backend_names
from dynamiq.metadata import STATISTICS

BACKENDS = [b for b in backend_names() if b not in ("auto", "reference")]
KEYS = {"seed": 5, "rank": 1, "world_size": 3, "stream": (2, 7), "index_offset": 768}

# Each test compiles the kernels of every registered quantizer or codec on a cold cache, which
# takes longer than the suite's per-test limit (meant for hangs) on a loaded 2-core machine.
pytestmark = [pytest.mark.usefixtures("one_numba_thread"), pytest.mark.timeout(3600)]


def test_backends_are_discovered():
    assert {"numba", "triton"} <= set(BACKENDS)
    assert "reference" in backend_names()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n", [1000, 77])
def test_every_registered_quantizer_matches_the_reference(backend, n):
    for name in QUANTIZERS.names():
        q = QUANTIZERS[name]
        x = vector(n, 3)
        want = q.encode(x, backend="reference", **KEYS)
        got = q.encode(x, backend=backend, **KEYS)
        assert_same(got.data, want.data, f"{name} encode n={n}")
        assert_same(q.decode(got, backend=backend, **KEYS),
                    q.decode(want, backend="reference", **KEYS), f"{name} decode n={n}")
        _check_recompress(q, want, backend, f"{name} n={n}")


def _check_recompress(q, incoming, backend: str, what: str) -> None:
    # the fused hop on ``incoming`` (the reference's payload) in every write-back
    n = incoming.n
    acc = vector(n, 4)
    for wb in WRITEBACKS:
        a1, a2 = acc.clone(), acc.clone()
        r1 = q.recompress(incoming, a1, writeback=wb, backend="reference", in_rank=2, **KEYS)
        r2 = q.recompress(Payload(q, n, incoming.data.clone()), a2, writeback=wb,
                          backend=backend, in_rank=2, **KEYS)
        assert_same(r2.data, r1.data, f"{what} recompress({wb}) bytes")
        assert_same(a2, a1, f"{what} recompress({wb}) acc")


def _check_awkward_blocks(q, backend: str, what: str) -> None:
    # one block per awkward case (NaN, Inf, subnormal, float32-max, zero and lifted groups)
    x = case_vector(q, 1)
    want = q.encode(x, backend="reference", **KEYS)
    got = q.encode(x, backend=backend, **KEYS)
    assert_same(got.data, want.data, f"{what} encode (awkward blocks)")
    assert_same(q.decode(got, backend=backend, **KEYS),
                q.decode(want, backend="reference", **KEYS), f"{what} decode (awkward blocks)")


#: FP8 elements in groups of 16 under super-groups: groups decoded two at a time, NaN codes
#: among them
_E4M3_G16 = BlockQuantizer("e4m3", group_size=16, scale="e4m3rel", super_group_size=256,
                           super_scale="fp32")


@pytest.mark.parametrize("name", ["mxfp8", "mxfp8_e5m2", "mxfp4", "int8_sr", "int4_sr",
                                  "dq4_hier", "dq8_hier", "dq4_dither", "nvfp4", "e4m3_g16"])
def test_every_element_code_decodes_as_the_reference(name):
    # Numba decodes minifloat and integer grids by arithmetic, and the codes no encoder writes
    # (a minifloat's NaN and Inf codes) through the table; small tables (dq4) through a chain
    # of selects: every byte value, in a decode and in a decode that accumulates
    q = _E4M3_G16 if name == "e4m3_g16" else QUANTIZERS[name]
    n = 4096
    p = q.encode(vector(n, 3, specials=False), backend="reference", **KEYS)
    codes = p.sections()[0]
    codes[:] = np.random.default_rng(0).integers(0, 256, codes.size, dtype=np.uint8)
    assert np.unique(codes).size == 256
    for accumulate in (False, True):
        base = vector(n, 4, specials=False)
        want = q.decode(p, base.clone(), accumulate=accumulate, backend="reference", **KEYS)
        got = q.decode(p, base.clone(), accumulate=accumulate, backend="numba", **KEYS)
        assert_same(got, want, f"{name} accumulate={accumulate}")
        if name.startswith("mxfp8") or name == "e4m3_g16":  # grids with NaN (and Inf) codes
            assert not torch.isfinite(want).all()


@pytest.mark.parametrize("name,world", [("int4_sr", 1), ("dq4_hier", 1), ("dq8_hier", 1),
                                        ("dq4_dither", 4), ("dq4_dither", 17)])
def test_draws_across_a_high_word_change_match_the_reference(name, world):
    # Numba's loops carry each element's (and each group's, for stochastic scales) stream
    # state as an induction variable, restarted where the indices' high 32 bits change: a
    # vector that straddles 2**32, in its encode, dithered decode and the fused hop (both
    # ranks' draws in one loop for dq4_dither)
    q = QUANTIZERS[name]
    keys = dict(KEYS, world_size=world, rank=world - 1, index_offset=2**32 - 2 * 4096 - 77)
    x = vector(3 * 4096 + 500, 6)
    want = q.encode(x, backend="reference", **keys)
    got = q.encode(x, backend="numba", **keys)
    assert_same(got.data, want.data, f"{name} encode")
    assert_same(q.decode(got, backend="numba", **keys),
                q.decode(want, backend="reference", **keys), f"{name} decode")
    hop = dict(keys, rank=0, in_rank=world - 1)
    acc = vector(x.numel(), 7)
    a_want, a_got = acc.clone(), acc.clone()
    r_want = q.recompress(want, a_want, writeback="decoded", backend="reference", **hop)
    r_got = q.recompress(want, a_got, writeback="decoded", backend="numba", **hop)
    assert_same(r_got.data, r_want.data, f"{name} hop")
    assert_same(a_got, a_want, f"{name} hop's decoded sum")


@pytest.mark.parametrize("world", [17, 4])
def test_correlated_rounding_over_any_world_matches_the_reference(world):
    # Numba takes the stratum's cycle walk in vector lanes for a few steps and walks the rest
    # of the elements in full; over 17 ranks each step leaves the world's range with
    # probability 15/32, so about 1 % of these elements need the full walk, in most tasks
    q = QUANTIZERS["dq4_dither"]
    keys = dict(KEYS, world_size=world)
    x = vector(1 << 15, 4)
    want = q.encode(x, backend="reference", **keys)
    got = q.encode(x, backend="numba", **keys)
    assert_same(got.data, want.data, f"encode over {world} ranks")
    assert_same(q.decode(got, backend="numba", **keys),
                q.decode(want, backend="reference", **keys), f"decode over {world} ranks")
    # the next hop decodes rank 1's rounding and encodes its own under the same permutation:
    # Numba draws both from one hash of the shared key per element (and walks the long
    # cycles of either rank in full)
    hop = dict(keys, rank=2, in_rank=1)
    acc = vector(1 << 15, 5)
    a_want, a_got = acc.clone(), acc.clone()
    r_want = q.recompress(want, a_want, writeback="sum", backend="reference", **hop)
    r_got = q.recompress(want, a_got, writeback="sum", backend="numba", **hop)
    assert_same(r_got.data, r_want.data, f"hop over {world} ranks")
    assert_same(a_got, a_want, f"hop's partial sum over {world} ranks")


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_registered_quantizer_matches_the_reference_on_awkward_blocks(backend):
    for name in QUANTIZERS.names():
        _check_awkward_blocks(QUANTIZERS[name], backend, name)


@pytest.mark.slow
@pytest.mark.parametrize("case", SCALE_CASES, ids=lambda c: "-".join(map(str, c.values())))
def test_scale_formats_and_roundings_match_the_reference_on_awkward_blocks(case):
    # numba only: the Triton test module compares these cases with numba
    q = BlockQuantizer(group_size=16, **case)
    _check_awkward_blocks(q, "numba", q.describe())


# Mid-rise grids through every element search the kernels have (compares for small tables,
# the bucket lookup for large ones) and every element rounding; the registered ``dq4_dither``
# covers the dithered, correlated one on every backend.
MIDRISE_CASES = [
    {"element": EpsilonFormat(3, 0.35, midrise=True), "rounding": "stochastic",
     "scale": "u8rel", "scale_rounding": "up", "super_group_size": 256, "super_scale": "e8m0"},
    {"element": EpsilonFormat(8, 0.06, midrise=True), "rounding": "correlated", "dither": True,
     "scale": "u8rel", "scale_rounding": "stochastic", "super_group_size": 128,
     "super_scale": "bf16"},
    {"element": EpsilonFormat(6, 0.0, midrise=True), "rounding": "stochastic", "dither": True,
     "scale": "bf16"},
    {"element": EpsilonFormat(5, 0.15, midrise=True), "rounding": "nearest", "scale": "bf16"},
    {"element": EpsilonFormat(7, 0.08, midrise=True), "rounding": "nearest", "scale": "bf16"},
]


@pytest.mark.parametrize("case", MIDRISE_CASES, ids=lambda c: f"{c['element']}-{c['rounding']}")
def test_midrise_grids_match_the_reference(case):
    # numba only (the Triton parity of a mid-rise grid is the registered dq4_dither's)
    q = BlockQuantizer(group_size=16, **case)
    _check_awkward_blocks(q, "numba", q.describe())
    want = q.encode(vector(1000, 3), backend="reference", **KEYS)
    _check_recompress(q, want, "numba", q.describe())


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_registered_codec_matches_the_reference(backend):
    n = 1003  # no block size divides it: every codec has a partial last block
    for codec in enrolled():
        check_hops(codec, metadata_context(codec, n, 1), metadata_context(codec, n, 2), n,
                   repr(codec), backends=(backend, "reference"))


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_registered_transform_matches_the_reference(backend):
    for name, cls in TRANSFORMS.items():
        for t in ([cls(block_size=b) for b in (16, 256, 4096, 65536)] if name == "rht"
                  else [cls()]):
            if getattr(t, "statistics", ()):
                continue  # data-dependent transforms run inside pipelines (test_triton_codecs)
            x = vector(700, 9)
            y_ref = t.forward(x, step=3, backend="reference") if name == "rht" else None
            if y_ref is None:
                continue  # transforms without kernels (identity)
            y = t.forward(x, step=3, backend=backend)
            assert_same(y, y_ref, f"{t} forward")
            assert_same(t.inverse(y, 700, step=3, backend=backend),
                        t.inverse(y_ref, 700, step=3, backend="reference"), f"{t} inverse")


@pytest.mark.parametrize("backend", BACKENDS)
def test_metadata_statistics_match_the_reference(backend):
    rs = np.random.default_rng(2)
    y = torch.from_numpy((rs.standard_normal(3000) * 10.0 ** rs.uniform(-3, 3, 3000))
                         .astype(np.float32))
    y[[5, 2000]] = float("nan")
    y[1000] = float("inf")
    names = list(STATISTICS.names())
    want = local_statistics(names, y, backend="reference")
    got = local_statistics(names, y, backend=backend)
    for name in names:
        w, g = want[name], got[name]
        assert torch.equal(w.isnan(), g.isnan()), name
        assert torch.equal(w.nan_to_num(7.0), g.nan_to_num(7.0)), name


def test_every_registered_pipeline_simulates_to_the_reference_bits():
    """Whole all-reductions, every registered pipeline: the Numba backend's results and bytes
    equal the reference backend's (Triton's equal Numba's: test_triton_codecs.py)."""
    import dynamiq.baselines  # noqa: F401  (registers the baseline pipelines)
    from dynamiq import PIPELINES, simulate

    for k, name in enumerate(PIPELINES.names()):
        world = 4 if "hier" in name or "butterfly" in name else 3
        xs = [vector(1100, 20 + 7 * k + r, specials=False) for r in range(world)]
        want = simulate(name, xs, backend="reference", track_hops=False)
        got = simulate(name, xs, backend="numba", track_hops=False)
        assert_same(got.results, want.results, f"{name} results")
        assert got.bytes_sent == want.bytes_sent, name
