"""Partial-sum codecs: what the wire carries for a partial sum, and how a hop combines it.

* :class:`Passthrough` — FP32 / BF16 partial sums (uncompressed baselines);
* :class:`Requant` — one fixed quantizer, re-applied with fresh scales at every hop;
* :class:`DynamiQ` — the DynamiQ codec: per-super-group bit widths chosen from the metadata,
  ε-level quantization with hierarchical scales and correlated stochastic rounding;

plus the paper's baselines in their own modules. All are registered in :data:`CODECS`.
"""

from dynamiq.codecs.base import CODECS, HopContext, PartialSumCodec, get_codec
from dynamiq.codecs.dynamiq import DynamiQ, WidthPlan
from dynamiq.codecs.intsum import IntSum, IntSumPlan
from dynamiq.codecs.passthrough import Passthrough
from dynamiq.codecs.requant import Requant
from dynamiq.codecs.shared_scale import SharedScale, SharedScalePlan
from dynamiq.codecs.sparse import Sparse, SparsePlan

__all__ = [
    "CODECS",
    "DynamiQ",
    "HopContext",
    "IntSum",
    "IntSumPlan",
    "PartialSumCodec",
    "Passthrough",
    "Requant",
    "SharedScale",
    "SharedScalePlan",
    "Sparse",
    "SparsePlan",
    "WidthPlan",
    "get_codec",
]
