"""Orthogonal transforms applied to a gradient before quantization and undone after reduction.

A transform maps a 1-D float32 vector of length ``n`` to a (possibly zero-padded) vector of
length ``padded_length(n)``. Every transform here is *linear* and, for a fixed configuration and
``step``, identical on every rank, so it commutes with the all-reduce sum::

    inverse(sum_r forward(x_r, step=s), n, step=s) == sum_r x_r     (up to float32 rounding)

The randomized Hadamard transform spreads each block's energy evenly over its coordinates, which
flattens outliers and makes low-bit quantization of the rotated vector far more accurate.

Modules: :mod:`~dynamiq.transforms.base` (the interface and registry),
:mod:`~dynamiq.transforms.identity`, :mod:`~dynamiq.transforms.rht`,
:mod:`~dynamiq.transforms.center` (mean-centering through the metadata phase).

Transforms are looked up by name in :data:`TRANSFORMS`::

    TRANSFORMS["rht"](block_size=1024, seed=7)
"""

from dynamiq.transforms.base import TRANSFORMS, Transform
from dynamiq.transforms.center import Center
from dynamiq.transforms.identity import Identity
from dynamiq.transforms.rht import RHT_STREAM, RandomizedHadamard

__all__ = ["RHT_STREAM", "TRANSFORMS", "Center", "Identity", "RandomizedHadamard", "Transform"]
