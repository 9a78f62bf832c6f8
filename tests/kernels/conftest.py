"""Run the Triton kernels under Triton's interpreter, on CPU tensors (no GPU needed).

Triton decides whether a function is compiled or interpreted when its ``@triton.jit`` decorator
runs (``triton.jit`` reads ``TRITON_INTERPRET`` then), i.e. when :mod:`dynamiq.kernels.triton`
is first imported; launches read nothing more. pytest imports this file before any test module of
this folder, and nothing outside this folder imports :mod:`dynamiq.kernels.triton`, so setting the
variable here, at import, is early enough. The guard below turns a too-late setting (e.g. the
package imported by a plugin first) into one clear error instead of failing launches.
"""

from __future__ import annotations

import os
import sys

import pytest

os.environ["TRITON_INTERPRET"] = "1"


@pytest.fixture(autouse=True)
def _triton_interpreted():
    mod = sys.modules.get("dynamiq.kernels.triton.jit.blocks")
    if mod is not None and type(mod.encode_kernel).__name__ != "InterpretedFunction":
        pytest.fail("dynamiq.kernels.triton was imported before TRITON_INTERPRET=1 was set")
    yield
