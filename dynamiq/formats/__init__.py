"""Number formats: parameter-defined element and scale formats, and their named catalog."""

from dynamiq.formats.catalog import DEFAULT_EPSILON, FORMATS, TUNED_EPSILON, resolve_format
from dynamiq.formats.types import (
    EpsilonFormat,
    Float32Format,
    FloatFormat,
    IntFormat,
    LevelFormat,
    NumberFormat,
)

__all__ = [
    "DEFAULT_EPSILON",
    "FORMATS",
    "TUNED_EPSILON",
    "EpsilonFormat",
    "Float32Format",
    "FloatFormat",
    "IntFormat",
    "LevelFormat",
    "NumberFormat",
    "resolve_format",
]
