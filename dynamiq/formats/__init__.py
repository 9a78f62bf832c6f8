"""Number formats: parameter-defined element and scale formats, and their named catalog."""

from dynamiq.formats.base import NumberFormat
from dynamiq.formats.catalog import DEFAULT_EPSILON, FORMATS, TUNED_EPSILON, resolve_format
from dynamiq.formats.floats import Float32Format, FloatFormat
from dynamiq.formats.ints import IntFormat
from dynamiq.formats.levels import EpsilonFormat, LevelFormat

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
