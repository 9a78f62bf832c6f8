"""The paper's baselines as registered pipelines (docs/method.rst, baselines).

Importing this module registers, in :data:`dynamiq.pipeline.PIPELINES` (nominal budget ``b̄``
in bits per coordinate, metadata included):

* ``bf16``: an alias of ``passthrough-bf16``, ``passthrough(wire=bf16)@ring`` (16);
* ``mxfp8``: ``shared_scale@ring``, E4M3 elements in blocks of 32 under E8M0 scales (8 + 0.5);
* ``mxfp6``: ``shared_scale(element=e3m2)@ring`` (6 + 0.5);
* ``mxfp4``: ``shared_scale(element=e2m1)@ring`` (4 + 0.5);
* ``nvfp4``: ``shared_scale(element=e2m1,block=16,scale=e4m3)@ring`` (4 + 1);
* ``thc``: ``rht(block_size=65536)+intsum(levels=16,clamp=auto,first=True)@ring``, THC as its
  authors run it: every Hadamard block clamped at ``±T σ`` (``T = 2.31`` from the table,
  ``σ`` from the block's largest norm over the ranks) and rounded to 16 uniform levels
  (granularity 15), integer sums exact, the blocks' first coordinates summed exactly
  (``ceil(log2(15 n + 1))`` + 48/65536, plus the padding to a multiple of 65536);
* ``thc-maxscale``: ``rht(block_size=65536)+intsum@ring``, 15 levels under the global maximum
  (no clamp, unbiased; ``ceil(log2(14 n + 1))`` + 1/16, plus the padding);
* ``omnireduce``: ``sparse@ring``, BF16 blocks of 256 under 8 bits per coordinate (at most 8);
* ``omnireduce-paper``: ``sparse(wire=fp16,keep=0.25)@ring``, OmniReduce's configuration:
  FP16 blocks of 256, every rank keeping its top quarter of blocks (the union travels:
  ``16 × density`` + 1/256);

and the butterfly twin ``<name>-butterfly`` of each. The metadata costs are the statistics'
16 bits per block (``absmax32``/``absmax16`` per 32/16 coordinates, ``absmax`` and ``sumsq``
per 256), OmniReduce's 1-bit-per-block bitmap and THC's 16-bit norm and 32-bit first coordinate
per Hadamard block; ``thc`` and ``thc-maxscale`` also pay the ``rht`` padding.
"""

from __future__ import annotations

from dynamiq.codecs import IntSum, Passthrough, SharedScale, Sparse
from dynamiq.codecs.shared_scale import mx_codec
from dynamiq.pipeline import PIPELINES, Pipeline
from dynamiq.transforms import RandomizedHadamard

__all__ = ["BASELINES", "OMNIREDUCE_KEEP", "THC_BLOCK"]

#: Hadamard block of the ``thc`` pipelines: THC rotates the whole vector; the largest Hadamard
#: block (2^16) comes closest, and a σ per block (from the block norms of the metadata phase)
#: keeps the clamp matched to every block's energy. A whole-vector rotation would pad to the
#: next power of two (up to twice the length: gpt-stdlib's 3,257,856 coordinates would become
#: 4,194,304, +29 %), the blocks pad at most 65,535 coordinates (+0.6 % there).
THC_BLOCK = 1 << 16

#: OmniReduce's keep fraction in ``omnireduce-paper``: every rank keeps the quarter of its
#: 256-blocks with the largest norms. On 8 ranks of real gradients the union of the ranks'
#: choices covers about half of the blocks (measured: 48 % on gpt-stdlib, 38 % on minilm-mlm,
#: docs/method.rst), the density of the DynamiQ paper's adaptation at an 8-bit-equivalent
#: budget.
OMNIREDUCE_KEEP = 0.25

#: name → (codec, transforms) of every baseline; each is registered on a ring and a butterfly.
BASELINES: dict[str, tuple] = {
    "mxfp8": (mx_codec("mxfp8"), ()),
    "mxfp6": (mx_codec("mxfp6"), ()),
    "mxfp4": (mx_codec("mxfp4"), ()),
    "nvfp4": (SharedScale("e2m1", 16, "e4m3"), ()),
    # THC's 16 levels on the granularity-15 grid, clamped at the table's T; every Hadamard
    # block gets its own sigma
    "thc": (IntSum(levels=16, clamp="auto", first=True, block=THC_BLOCK),
            (RandomizedHadamard(block_size=THC_BLOCK),)),
    "thc-maxscale": (IntSum(), (RandomizedHadamard(block_size=THC_BLOCK),)),
    "omnireduce": (Sparse(bits=8.0), ()),
    "omnireduce-paper": (Sparse(wire="fp16", keep=OMNIREDUCE_KEEP), ()),
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
