"""dynamiq: compressed multi-hop all-reduce of gradients.

The public API is re-exported here; everything else is an implementation detail.
"""

import logging as _logging

from dynamiq import baselines as _baselines  # noqa: F401  (registers the baselines)
from dynamiq.codecs import (
    CODECS,
    DynamiQ,
    HopContext,
    IntSum,
    PartialSumCodec,
    Passthrough,
    Requant,
    SharedScale,
    Sparse,
    WidthPlan,
    get_codec,
)
from dynamiq.collectives.api import CallMismatchError, all_reduce, reset_call_counters
from dynamiq.collectives.batched import simulate_batched
from dynamiq.collectives.p2p import P2PStats
from dynamiq.collectives.simulator import SimulationResult, simulate
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
from dynamiq.pipeline import PIPELINES, Pipeline, get_pipeline
from dynamiq.quantizers import QUANTIZERS, BlockQuantizer, Payload, get_quantizer
from dynamiq.registry import DuplicateNameError, Registry, UnknownNameError
from dynamiq.topologies import (
    TOPOLOGIES,
    Butterfly,
    Hierarchical,
    Ring,
    Schedule,
    Topology,
    Transfer,
    get_topology,
)
from dynamiq.transforms import TRANSFORMS, Center, Identity, RandomizedHadamard, Transform

__version__ = "0.1.0"

# The library reports through ``logging`` under the "dynamiq" logger and prints nothing itself;
# applications choose where the records go (``dynamiq --log-level`` on the command line).
_logging.getLogger("dynamiq").addHandler(_logging.NullHandler())

__all__ = [
    "CODECS",
    "FORMATS",
    "PIPELINES",
    "QUANTIZERS",
    "TOPOLOGIES",
    "TRANSFORMS",
    "BlockQuantizer",
    "Butterfly",
    "CallMismatchError",
    "Center",
    "DuplicateNameError",
    "DynamiQ",
    "EpsilonFormat",
    "Float32Format",
    "FloatFormat",
    "Hierarchical",
    "HopContext",
    "Identity",
    "IntFormat",
    "IntSum",
    "LevelFormat",
    "NumberFormat",
    "P2PStats",
    "PartialSumCodec",
    "Passthrough",
    "Payload",
    "Pipeline",
    "RandomizedHadamard",
    "Registry",
    "Requant",
    "Ring",
    "Schedule",
    "SharedScale",
    "SimulationResult",
    "Sparse",
    "Topology",
    "Transfer",
    "Transform",
    "UnknownNameError",
    "WidthPlan",
    "__version__",
    "all_reduce",
    "get_codec",
    "get_pipeline",
    "get_quantizer",
    "get_topology",
    "reset_call_counters",
    "resolve_format",
    "simulate",
    "simulate_batched",
]
