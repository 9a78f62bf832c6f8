"""dynamiq: compressed multi-hop all-reduce of gradients.

The public API is re-exported here; everything else is an implementation detail.
"""

from dynamiq.formats import (
    FORMATS,
    EpsilonFormat,
    Float32Format,
    FloatFormat,
    IntFormat,
    LevelFormat,
    NumberFormat,
    resolve_format,
)
from dynamiq.quantizers import QUANTIZERS, BlockQuantizer, Payload, get_quantizer
from dynamiq.registry import DuplicateNameError, Registry, UnknownNameError
from dynamiq.transforms import TRANSFORMS, Identity, RandomizedHadamard, Transform

__version__ = "0.1.0"

__all__ = [
    "FORMATS",
    "QUANTIZERS",
    "TRANSFORMS",
    "BlockQuantizer",
    "DuplicateNameError",
    "EpsilonFormat",
    "Float32Format",
    "FloatFormat",
    "Identity",
    "IntFormat",
    "LevelFormat",
    "NumberFormat",
    "Payload",
    "RandomizedHadamard",
    "Registry",
    "Transform",
    "UnknownNameError",
    "__version__",
    "get_quantizer",
    "resolve_format",
]
