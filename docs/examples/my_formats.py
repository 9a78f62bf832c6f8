"""Register a number format, a quantizer built on it and a pipeline that uses it.

Every process that names them must import this module first: the ranks of an all-reduce
included (``all_reduce_my_format.py`` does, at its top).
"""

from dynamiq import FORMATS, PIPELINES, QUANTIZERS, BlockQuantizer, FloatFormat, Pipeline, Requant

# An 8-bit float with 3 exponent and 4 mantissa bits, every code finite.
E3M4 = FORMATS.register("e3m4", FloatFormat(ebits=3, mbits=4, special="none"))

# DynamiQ's recipe on top of it: groups of 16 with 8-bit scales relative to a BF16 scale per
# super-group of 256, stochastic rounding of elements and scales (hence unbiased).
E3M4_HIER = QUANTIZERS.register("e3m4_hier", BlockQuantizer(
    "e3m4", group_size=16, scale="u8rel", rounding="stochastic", scale_rounding="stochastic",
    super_group_size=256, super_scale="bf16"))

# Re-quantize every partial sum with fresh scales, around a ring.
REQUANT_E3M4 = PIPELINES.register("requant-e3m4", Pipeline(Requant("e3m4_hier"), "ring"))
