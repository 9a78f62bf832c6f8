"""Processes that start at once compile each generated kernel once between them."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("numba")

_CHILD = """
import json, sys, torch
from dynamiq.kernels.numba import blocks
from dynamiq.quantizers import get_quantizer
print("ready", flush=True)
sys.stdin.readline()  # both children start coding together
get_quantizer("int8_sr").encode(torch.randn(1000), backend="numba")
(mod,) = blocks._loaded.values()
st = mod.encode.stats
print(json.dumps([sum(st.cache_misses.values()), sum(st.cache_hits.values())]))
"""


def test_concurrent_first_calls_compile_once(tmp_path):
    env = dict(os.environ, DYNAMIQ_KERNEL_CACHE=str(tmp_path / "kernels"),
               NUMBA_CACHE_DIR=str(tmp_path / "numba"))
    procs = [subprocess.Popen([sys.executable, "-c", _CHILD], env=env, text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
             for _ in range(2)]
    for p in procs:
        assert p.stdout.readline().strip() == "ready"
    for p in procs:  # released only once both have imported dynamiq and torch
        p.stdin.write("go\n")
        p.stdin.flush()
    counts = []
    for p in procs:
        out, _ = p.communicate(timeout=600)
        assert p.returncode == 0
        counts.append(json.loads(out.strip().splitlines()[-1]))
    # one process compiled the kernel (a cache miss); the other waited and loaded it
    assert sorted(counts) == [[0, 1], [1, 0]]
    assert sorted(p.name for p in (tmp_path / "kernels").glob("*.encode.lock"))
