"""Every number format class in one import: ``from dynamiq.formats.types import FloatFormat``.

The classes live by family: the base class in :mod:`dynamiq.formats.base`, floats in
:mod:`dynamiq.formats.floats`, integers in :mod:`dynamiq.formats.ints`, level tables in
:mod:`dynamiq.formats.levels`.
"""

from __future__ import annotations

from dynamiq.formats.base import NumberFormat
from dynamiq.formats.floats import Float32Format, FloatFormat
from dynamiq.formats.ints import IntFormat
from dynamiq.formats.levels import EpsilonFormat, LevelFormat

__all__ = [
    "EpsilonFormat",
    "Float32Format",
    "FloatFormat",
    "IntFormat",
    "LevelFormat",
    "NumberFormat",
]
