"""Block-scaled quantizers: element format + groups + scales + rounding, and their payloads.

A :class:`BlockQuantizer` cuts a flat vector into groups of ``group_size`` elements, gives each
group a scale, and codes every element in the element format relative to its group scale. With
``super_group_size`` set, scales are *hierarchical*: each super-group has a scale in
``super_scale`` format and each group scale is stored relative to it (DynamiQ: UINT8 group scales
under a power-of-two super-group scale; the paper's: under a BF16 one).

The quantizer is a frozen, hashable value; :data:`QUANTIZERS` holds the named ones (MX, NVFP4,
plain integer and DynamiQ-level quantizers). ``encode`` returns a :class:`Payload` whose single
``uint8`` buffer is exactly what goes on the wire, so :meth:`BlockQuantizer.bits_per_coord` is the
wire cost, metadata included.

Modules: :mod:`~dynamiq.quantizers.block` (the quantizer), :mod:`~dynamiq.quantizers.payload`,
:mod:`~dynamiq.quantizers.layout` (the wire layout of a partial last block),
:mod:`~dynamiq.quantizers.checks` (argument checks), :mod:`~dynamiq.quantizers.catalog` (the
registered quantizers).
"""
from dynamiq.quantizers.block import BlockQuantizer
from dynamiq.quantizers.catalog import QUANTIZERS, get_quantizer
from dynamiq.quantizers.checks import ROUNDINGS, SCALE_ROUNDINGS
from dynamiq.quantizers.payload import Payload

__all__ = [
    "QUANTIZERS",
    "ROUNDINGS",
    "SCALE_ROUNDINGS",
    "BlockQuantizer",
    "Payload",
    "get_quantizer",
]
