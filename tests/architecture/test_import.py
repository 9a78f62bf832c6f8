"""``import dynamiq`` and ``dynamiq --help`` compute nothing: no kernel is compiled or loaded, no
table measured, on a cold kernel cache."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

_PROBE = textwrap.dedent("""
    import sys, time
    t = time.perf_counter()
    import dynamiq
    elapsed = time.perf_counter() - t
    if sys.argv[1] == "help":
        from dynamiq.cli import main
        try:
            main(["--help"])
        except SystemExit:
            pass
    compiled = []
    if "numba" in sys.modules:
        from numba.core.dispatcher import Dispatcher
        for name, mod in list(sys.modules.items()):
            if not name.startswith("dynamiq") or mod is None:
                continue
            for attr in vars(mod).values():
                if isinstance(attr, Dispatcher) and attr.signatures:
                    compiled.append(f"{name}.{attr.py_func.__name__}")
    assert not compiled, f"compiled at import: {compiled}"
    assert "triton" not in sys.modules, "triton was imported"
    print(f"import took {elapsed:.2f} s")
""")


def _run(tmp_path, what: str) -> str:
    kernels, numba_cache = tmp_path / "kernels", tmp_path / "numba"
    env = {**os.environ, "DYNAMIQ_KERNEL_CACHE": str(kernels),
           "NUMBA_CACHE_DIR": str(numba_cache)}
    env.pop("TRITON_INTERPRET", None)
    out = subprocess.run([sys.executable, "-c", _PROBE, what], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    for d in (kernels, numba_cache):
        files = [p for p in d.rglob("*") if p.is_file()] if d.exists() else []
        assert not files, f"{what}: {d.name} cache written: {files[:5]}"
    return out.stdout


def test_import_compiles_nothing(tmp_path):
    _run(tmp_path, "import")


def test_help_compiles_nothing(tmp_path):
    _run(tmp_path, "help")
