"""Shared configuration of the DynamiQ codec's tests."""

from __future__ import annotations

import numba
import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Kernels and torch's index ops on one thread: on a loaded 2-core machine their parallel
    regions wait for descheduled workers far longer than the work takes (no bit changes)."""
    nb, th = numba.get_num_threads(), torch.get_num_threads()
    numba.set_num_threads(1)
    torch.set_num_threads(1)
    yield
    numba.set_num_threads(nb)
    torch.set_num_threads(th)
