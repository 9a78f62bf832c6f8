"""Triton device code (``@triton.jit``) of every kernel family; importing a module here imports
:mod:`triton` and decorates its kernels (compiled, or interpreted under
``TRITON_INTERPRET=1``)."""
