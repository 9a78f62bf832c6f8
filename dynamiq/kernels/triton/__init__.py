"""Triton backend of the kernels: bit-exact twins of :mod:`dynamiq.kernels.numba`.

* :mod:`~dynamiq.kernels.triton.rng` — the counter-based hash and uniforms,
* :mod:`~dynamiq.kernels.triton.codec` — device functions of the quantization maths,
* :mod:`~dynamiq.kernels.triton.blocks` — the encode / decode / recompress kernels,
* :mod:`~dynamiq.kernels.triton.launch` — their host-side launchers,
* :mod:`~dynamiq.kernels.triton.baselines` — the hop kernels of the other codecs (shared scale,
  integer sums, FP32/BF16 wire values of a block selection, DynamiQ's width reordering), with
  their launchers in :mod:`~dynamiq.kernels.triton.launch_baselines`,
* :mod:`~dynamiq.kernels.triton.hadamard` — the blocked randomized Hadamard transform,
* :mod:`~dynamiq.kernels.triton.stats` — per-super-group statistics.

Importing this package imports :mod:`triton`; :mod:`dynamiq` itself never does (see
:func:`dynamiq.kernels.backend.resolve_backend`). Kernels are decorated when their module is
imported, and that is when Triton decides between compiling them and interpreting them: to run
them on CPU tensors (tests), set ``TRITON_INTERPRET=1`` before the first import.
"""
