"""Numba's on-disk cache of the kernels, kept fresh when any kernel source changes.

Numba caches a ``cache=True`` function's machine code next to its module and reuses it while
that one file keeps its stamp. The kernels inline functions of other modules (the hash of
:mod:`~dynamiq.kernels.numba.rng`, the level searches of
:mod:`~dynamiq.kernels.numba.levels`) and compile constants of :mod:`dynamiq.kernels.abi` into
their code, so a change there alone would leave the cached code of, say, the Hadamard
transform stale: old bits, silently. Importing this module (every kernel module does, before
its first cached function) makes the cache of every function defined under
``dynamiq/kernels`` also depend on :func:`source_digest`, a digest of every source file of
that package: a change to any of them recompiles them all on next use.

The generated block kernels (:mod:`~dynamiq.kernels.numba.blocks`) live outside the package;
their module names carry the same digest.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

from numba.core import caching

__all__ = ["KERNELS_DIR", "source_digest", "stamped"]

#: The folder whose sources every cached kernel depends on (``dynamiq/kernels``).
KERNELS_DIR = Path(__file__).resolve().parent.parent


@functools.cache
def source_digest() -> str:
    """SHA-1 (hex) of the path and contents of every ``.py`` file under :data:`KERNELS_DIR`,
    read once per process."""
    h = hashlib.sha1()
    for path in sorted(KERNELS_DIR.rglob("*.py")):
        h.update(path.relative_to(KERNELS_DIR).as_posix().encode())
        h.update(b"\0")
        h.update(path.read_bytes())
        h.update(b"\0")
    return h.hexdigest()


def _ours(py_file: str) -> bool:
    try:
        return Path(py_file).resolve().is_relative_to(KERNELS_DIR)
    except OSError:
        return False


def _stamped(base: type) -> type:
    """``base`` (a Numba cache locator) for the functions of :data:`KERNELS_DIR` only, with
    :func:`source_digest` added to its source stamp."""

    class Stamped(base):
        @classmethod
        def from_function(cls, py_func, py_file):
            if not _ours(py_file):
                return None  # anyone else's functions: Numba's own locators
            return super().from_function(py_func, py_file)

        def get_source_stamp(self):
            return (super().get_source_stamp(), source_digest())

    Stamped.__name__ = Stamped.__qualname__ = f"Stamped{base.__name__}"
    return Stamped


# Numba renamed its cache classes (``_CacheImpl`` before 0.61)
_IMPL = getattr(caching, "CacheImpl", None) or caching._CacheImpl


def stamped(locator: type) -> bool:
    """Whether ``locator`` (a cached dispatcher's locator class) is one of this module's."""
    return locator.__name__.startswith("Stamped") and locator.__module__ == __name__


if not any(stamped(c) for c in _IMPL._locator_classes):
    # ahead of Numba's own, each tried in the same order: only our files are taken
    _IMPL._locator_classes[:0] = [_stamped(c) for c in _IMPL._locator_classes]
