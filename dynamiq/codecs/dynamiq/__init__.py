"""The DynamiQ codec (registered as ``dynamiq``): per-super-group bit widths under a budget,
coded in one message.

See docs/method.rst. From the metadata phase (global per-super-group sums and sums of
squares; 8 bits each on the wire by default, BF16 in the paper) every rank derives the same
coding option, a width and a group size, for every super-group of 256 coordinates
(:mod:`dynamiq.codecs.allocation`); no width map travels. A chunk's message is the
concatenation of one segment per option, in increasing cost order (BF16 first): the chunk's
super-groups are reordered (stably) so that equal options are contiguous, each segment is coded
by the quantizer of its option (mid-rise ε-levels, groups of 32 or 64 with UINT8 scales rounded
up relative to a power-of-two super-group scale, correlated element rounding decoded with
subtractive dithering), and the reorder is undone on decoding. Every hop recomputes the scales
from its partial sum; by default each hop position has its own options
(:mod:`~dynamiq.codecs.dynamiq.hops`).

Width 16 means "BF16, uncompressed" (round to nearest even, the ``passthrough(wire=bf16)``
codec's bytes). Width 1 (a sign bit only) is not offered: an unbiased 1-bit code needs signed
rounding outside the sign-magnitude element model.

Modules, one job each:

* :mod:`~dynamiq.codecs.dynamiq.options` — the coding options, their quantizers and wire costs,
  and the normalisation of the tuple-valued configuration;
* :mod:`~dynamiq.codecs.dynamiq.errors` — the per-option error the ``measured`` allocator uses,
  measured on first use;
* :mod:`~dynamiq.codecs.dynamiq.plan` — :class:`WidthPlan` and the per-chunk layout (the
  reorder by option);
* :mod:`~dynamiq.codecs.dynamiq.hops` — the per-hop plans, one allocation over every
  (super-group, hop position) pair;
* :mod:`~dynamiq.codecs.dynamiq.segments` — the hop operations on one option's segment;
* :mod:`~dynamiq.codecs.dynamiq.codec` — the :class:`DynamiQ` codec itself.
"""

from dynamiq.codecs.dynamiq.codec import SHORT_LENGTH, SHORT_MIN_WIDTH, DynamiQ
from dynamiq.codecs.dynamiq.errors import ALLOCATORS, measured_error, width_options
from dynamiq.codecs.dynamiq.options import ALLOWED_WIDTHS, BF16_WIDTH, CodingOption
from dynamiq.codecs.dynamiq.plan import ChunkLayout, WidthPlan
from dynamiq.formats import TUNED_EPSILON

__all__ = [
    "ALLOCATORS",
    "ALLOWED_WIDTHS",
    "BF16_WIDTH",
    "SHORT_LENGTH",
    "SHORT_MIN_WIDTH",
    "TUNED_EPSILON",
    "ChunkLayout",
    "CodingOption",
    "DynamiQ",
    "WidthPlan",
    "measured_error",
    "width_options",
]
