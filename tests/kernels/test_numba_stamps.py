"""Numba's cache of the kernels follows every kernel source (:mod:`dynamiq.kernels.numba.stamps`):
a change to a module that another one inlines recompiles the other one's cached code."""

from __future__ import annotations

import importlib
import os
import pkgutil
import shutil
import subprocess
import sys
from pathlib import Path

import numba
import pytest

import dynamiq
import dynamiq.kernels.numba as numba_backend
from dynamiq.kernels.numba import stamps


def _cached_dispatchers():
    for info in pkgutil.iter_modules(numba_backend.__path__):
        mod = importlib.import_module(f"{numba_backend.__name__}.{info.name}")
        for name, obj in vars(mod).items():
            impl = getattr(getattr(obj, "_cache", None), "_impl", None)
            if isinstance(obj, numba.core.dispatcher.Dispatcher) and impl is not None:
                # a function imported from a sibling module is checked there
                if obj.py_func.__module__ == mod.__name__:
                    yield f"{mod.__name__}.{name}", impl._locator


def test_every_cached_kernel_function_is_stamped_with_the_digest():
    found = dict(_cached_dispatchers())
    # the modules that inline others' functions are among them
    assert {"dynamiq.kernels.numba.hadamard.rht_forward", "dynamiq.kernels.numba.rng.uniform",
            "dynamiq.kernels.numba.intsum.encode_kernel"} & set(found)
    assert len(found) > 40
    for name, locator in found.items():
        assert stamps.stamped(type(locator)), name
        assert locator.get_source_stamp()[1] == stamps.source_digest(), name


def test_functions_elsewhere_keep_numbas_own_locators(tmp_path, monkeypatch):
    (tmp_path / "elsewhere_mod.py").write_text(
        "import numba\n@numba.njit(cache=True)\ndef f(x):\n    return x + 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = importlib.import_module("elsewhere_mod")
    assert mod.f(1) == 2
    assert not stamps.stamped(type(mod.f._cache._impl._locator))


def test_digest_covers_every_kernel_source(tmp_path, monkeypatch):
    copy = tmp_path / "kernels"
    shutil.copytree(stamps.KERNELS_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(stamps, "KERNELS_DIR", copy)
    stamps.source_digest.cache_clear()
    try:
        base = stamps.source_digest()
        seen = {base}
        for rel in ("numba/rng.py", "abi.py", "numba/levels.py"):
            f = copy / rel
            text = f.read_text()
            f.write_text(text + "\n# changed\n")
            stamps.source_digest.cache_clear()
            seen.add(stamps.source_digest())
            f.write_text(text)
        stamps.source_digest.cache_clear()
        assert stamps.source_digest() == base
        assert len(seen) == 4
    finally:
        monkeypatch.undo()
        stamps.source_digest.cache_clear()


_RHT = """
import numpy as np
from dynamiq.kernels.numba.hadamard import rht_forward
from dynamiq.kernels.numba.rng import hash_u32
x = np.arange(64, dtype=np.float32)
out = np.empty_like(x)
rht_forward(x, out, 64, 3, 5, np.float32(0.125))
print(hash_u32(np.uint32(1), np.uint32(2), np.uint64(3)), out.tobytes().hex())
"""


@pytest.mark.slow
def test_a_change_to_an_inlined_module_recompiles_its_users(tmp_path):
    # a copy of the package, its Numba cache in its own __pycache__ folders
    src = tmp_path / "dynamiq"
    shutil.copytree(Path(dynamiq.__file__).parent, src,
                    ignore=shutil.ignore_patterns("__pycache__", "*.nbi", "*.nbc"))
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    env.pop("NUMBA_CACHE_DIR", None)

    def run() -> str:
        done = subprocess.run([sys.executable, "-c", _RHT], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=600, check=True)
        return done.stdout

    before = run()
    assert list((src / "kernels" / "numba" / "__pycache__").glob("hadamard.rht_forward*.nbi"))
    rng = src / "kernels" / "numba" / "rng.py"
    text = rng.read_text()
    assert "_M1 = np.uint32(0x85EBCA6B)" in text
    # another mixing constant: a different hash, so other signs in the transform
    rng.write_text(text.replace("_M1 = np.uint32(0x85EBCA6B)", "_M1 = np.uint32(0x85EBCA6D)"))
    changed = run()
    assert changed.split()[0] != before.split()[0]  # rng's own functions recompiled
    # hadamard.py itself did not change: its cached code must not be the old one
    assert changed.split()[1] != before.split()[1]
    rng.write_text(text)
    assert run() == before
