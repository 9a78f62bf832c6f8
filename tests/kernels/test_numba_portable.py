"""The portable paths of the Numba block kernels, taken on a host that has the faster ones.

Where the host has AVX2 and BMI2, the kernels decode codes of at most four magnitude bits by a
vector permute and pack odd widths by bit extraction; other hosts (ARM, older x86) take a
select tree, minifloat and integer arithmetic with a fix-up pass, and shifts.
``DYNAMIQ_PORTABLE_KERNELS=1`` makes a process take those paths on any host: a child process
does so here and checks them against the reference backend, bit for bit, for the widths and
families whose code the choice changes (each kernel is compiled for the child, about a minute
of a cold run in all).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow

_CHILD = textwrap.dedent("""
    import numpy as np, torch
    from dynamiq import QUANTIZERS, Payload
    from dynamiq.codecs import get_codec
    from dynamiq.codecs.dynamiq.options import build_options
    from dynamiq.kernels.numba import packing, permute
    from dynamiq.kernels.numba.host import PORTABLE

    assert PORTABLE and not packing.HAS_BMI2 and not permute.HAS_AVX2
    keys = {"seed": 5, "rank": 1, "world_size": 4, "stream": (2, 7), "index_offset": 256}
    five = [o.quantizer for o in build_options(get_codec("dynamiq"))
            if o.quantizer is not None and o.key == (5, 64)][0]
    cases = [("dq4_hier", QUANTIZERS["dq4_hier"]), ("mxfp4", QUANTIZERS["mxfp4"]),
             ("dynamiq 5-bit", five)]
    rs = np.random.default_rng(0)

    def same(a, b, what):
        # float32 through their bit patterns (NaNs included)
        if a.dtype == torch.float32:
            a, b = a.view(torch.int32), b.view(torch.int32)
        assert torch.equal(a, b), what

    for name, q in cases:
        n = 4096 + 77
        x = torch.from_numpy((rs.standard_normal(n) * 3).astype(np.float32))
        x[100], x[2000] = float("nan"), float("inf")
        want = q.encode(x, backend="reference", **keys)
        got = q.encode(x, backend="numba", **keys)
        same(got.data, want.data, f"{name} encode")
        same(q.decode(got, backend="numba", **keys), q.decode(want, backend="reference", **keys),
             f"{name} decode")
        acc = torch.randn(n)
        a1, a2 = acc.clone(), acc.clone()
        hop = dict(keys, rank=2, in_rank=1)
        r1 = q.recompress(want, a1, writeback="sum", backend="reference", **hop)
        r2 = q.recompress(Payload(q, n, want.data.clone()), a2, writeback="sum",
                          backend="numba", **hop)
        same(r2.data, r1.data, f"{name} recompress")
        same(a2, a1, f"{name} recompress sum")
        # every code byte, the codes no encoder writes included, decoded and accumulated
        codes = want.sections()[0]
        codes[:] = rs.integers(0, 256, codes.size, dtype=np.uint8)
        for accumulate in (False, True):
            base = torch.randn(n)
            w = q.decode(want, base.clone(), accumulate=accumulate, backend="reference", **keys)
            g = q.decode(want, base.clone(), accumulate=accumulate, backend="numba", **keys)
            same(g, w, f"{name} every code, accumulate={accumulate}")
    print("portable paths match")
""")


def test_portable_paths_match_the_reference():
    env = dict(os.environ, DYNAMIQ_PORTABLE_KERNELS="1")
    done = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "portable paths match" in done.stdout
