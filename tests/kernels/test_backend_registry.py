"""Plug-in backends: :func:`register_backend` / :func:`unregister_backend`."""

from __future__ import annotations

import pytest
import torch

from dynamiq import simulate
from dynamiq.kernels import (
    Backend,
    backend_names,
    get_backend,
    register_backend,
    resolve_backend,
    unregister_backend,
)
from dynamiq.kernels.numba import NumbaBackend


class _Counting(NumbaBackend):
    """Numba's kernels, counting the fused hops it runs."""

    name = "counting-test"
    auto_devices = ()

    def __init__(self) -> None:
        self.hops = 0

    def block_recompress(self, *args, **kwargs):
        self.hops += 1
        return super().block_recompress(*args, **kwargs)


def test_registered_backend_runs_and_matches_numba():
    be = register_backend(_Counting())
    try:
        assert "counting-test" in backend_names() and get_backend("counting-test") is be
        assert resolve_backend("counting-test", "cpu") == "counting-test"
        assert resolve_backend("auto", "cpu") == "numba"  # built-ins keep "auto"
        x = torch.randn(4, 4096, generator=torch.Generator().manual_seed(0))
        got = simulate("requant-dq4", x, backend="counting-test")
        ref = simulate("requant-dq4", x, backend="numba")
        assert torch.equal(got.results, ref.results)
        assert be.hops > 0
    finally:
        assert unregister_backend("counting-test") is be
    assert "counting-test" not in backend_names()
    with pytest.raises(ValueError, match="backend must be one of"):
        get_backend("counting-test")


def test_register_backend_refuses_bad_input():
    with pytest.raises(TypeError, match="Backend instance"):
        register_backend(object())  # type: ignore[arg-type]
    nameless = type("Nameless", (Backend,), {"name": ""})()
    with pytest.raises(ValueError, match="needs a name"):
        register_backend(nameless)
    clash = type("Clash", (NumbaBackend,), {"name": "numba"})()
    with pytest.raises(ValueError, match="exists already"):
        register_backend(clash)
    with pytest.raises(ValueError, match="not a registered plug-in"):
        unregister_backend("numba")
    with pytest.raises(ValueError, match="not a registered plug-in"):
        unregister_backend("no-such-backend")
