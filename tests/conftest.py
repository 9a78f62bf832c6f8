"""Shared test configuration: hypothesis profiles (derandomized in CI), shared fixtures."""

from __future__ import annotations

import os

import numba
import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    max_examples=40,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "dev", deadline=None, max_examples=40, suppress_health_check=[HealthCheck.too_slow]
)
# HYPOTHESIS_PROFILE=deep: a long random search, for hunting edge cases before a release
settings.register_profile(
    "deep", deadline=None, max_examples=2000, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


@pytest.fixture(scope="module")
def one_numba_thread():
    """Run a module's Numba kernels on one thread. Parallel kernels (the RHT) wait for
    descheduled workers in every parallel region on a busy 2-core machine (the simulator runs
    many ranks' kernels back to back); results do not depend on the thread count."""
    before = numba.get_num_threads()
    numba.set_num_threads(1)
    yield
    numba.set_num_threads(before)
