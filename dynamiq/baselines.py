"""The paper's baselines as registered pipelines (docs/method.rst, baselines).

Importing this module registers, in :data:`dynamiq.pipeline.PIPELINES` (nominal budget ``b̄``
in bits per coordinate, metadata included):

* ``bf16``: an alias of ``passthrough-bf16``, ``passthrough(wire=bf16)@ring`` (16);
* ``mxfp8``: ``shared_scale@ring``, E4M3 elements in blocks of 32 under E8M0 scales (8 + 0.5);
* ``mxfp6``: ``shared_scale(element=e3m2)@ring`` (6 + 0.5);
* ``mxfp4``: ``shared_scale(element=e2m1)@ring`` (4 + 0.5);
* ``nvfp4``: ``shared_scale(element=e2m1,block=16,scale=e4m3)@ring`` (4 + 1);
* ``thc``: ``rht(block_size=65536)+intsum@ring``, 15 levels with exact integer sums
  (``ceil(log2(14 n + 1))`` + 1/16, plus the padding to a multiple of 65536);
* ``omnireduce``: ``sparse@ring``, BF16 blocks of 256 under 8 bits per coordinate (at most 8);

and the butterfly twin ``<name>-butterfly`` of each. The metadata costs are the statistics'
16 bits per block (``absmax32``/``absmax16`` per 32/16 coordinates, ``absmax`` and ``sumsq``
per 256) plus OmniReduce's 1-bit-per-block bitmap; ``thc`` also pays the ``rht`` padding.
"""

from __future__ import annotations

from dynamiq.codecs import IntSum, Passthrough, SharedScale, Sparse
from dynamiq.pipeline import PIPELINES, Pipeline
from dynamiq.transforms import RandomizedHadamard

__all__ = ["BASELINES", "THC_BLOCK"]

#: Hadamard block of the ``thc`` pipelines: THC's global scale only fits a rotation of the whole
#: vector (with blocks of 256 a few high-energy blocks set the scale for all and vNMSE was ~20x
#: worse on gpt-stdlib); the padding costs at most 2^16 coordinates.
THC_BLOCK = 1 << 16

#: name → (codec, transforms) of every baseline; each is registered on a ring and a butterfly.
BASELINES: dict[str, tuple] = {
    "mxfp8": (SharedScale("e4m3", 32, "e8m0"), ()),
    "mxfp6": (SharedScale("e3m2", 32, "e8m0"), ()),
    "mxfp4": (SharedScale("e2m1", 32, "e8m0"), ()),
    "nvfp4": (SharedScale("e2m1", 16, "e4m3"), ()),
    # THC rotates the whole vector; the largest Hadamard block (2^16) comes closest
    "thc": (IntSum(), (RandomizedHadamard(block_size=THC_BLOCK),)),
    "omnireduce": (Sparse(bits=8.0), ()),
}


def _register() -> None:
    # "bf16" is the existing BF16 pipeline under a second name (registering an equal pipeline
    # would give it two canonical names)
    if "bf16" not in PIPELINES:
        PIPELINES.alias("bf16", "passthrough-bf16")
    if "bf16-butterfly" not in PIPELINES:
        PIPELINES.register("bf16-butterfly", Pipeline(Passthrough("bf16"), "butterfly"))
    for name, (codec, transforms) in BASELINES.items():
        for suffix, topology in (("", "ring"), ("-butterfly", "butterfly")):
            if name + suffix not in PIPELINES:  # importing twice (reload) registers once
                PIPELINES.register(name + suffix, Pipeline(codec, topology, transforms))


_register()
