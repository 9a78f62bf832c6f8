"""Compute backends. ``numba`` is the CPU reference and CPU execution path."""
