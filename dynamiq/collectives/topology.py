"""Temporary alias of :mod:`dynamiq.topologies` for importers not yet moved to it."""

from dynamiq.topologies import *  # noqa: F403
from dynamiq.topologies import __all__ as __all__
