"""The registered quantizers (MX, NVFP4, integer and DynamiQ-level ones) and their lookup."""

from __future__ import annotations

from dynamiq.formats import DEFAULT_EPSILON, EpsilonFormat
from dynamiq.quantizers.block import BlockQuantizer
from dynamiq.registry import Registry

__all__ = ["QUANTIZERS", "get_quantizer"]


QUANTIZERS: Registry[BlockQuantizer] = Registry("quantizer")


def _mx(element: str) -> BlockQuantizer:
    return BlockQuantizer(element, group_size=32, scale="e8m0", scale_rounding="ocp")


QUANTIZERS.register("mxfp8", _mx("e4m3"))
QUANTIZERS.register("mxfp8_e5m2", _mx("e5m2"))
QUANTIZERS.register("mxfp6", _mx("e3m2"))
QUANTIZERS.register("mxfp6_e2m3", _mx("e2m3"))
QUANTIZERS.register("mxfp4", _mx("e2m1"))
# NVFP4: E2M1 elements, an E4M3 scale per 16 under an FP32 scale (NVFP4's per-tensor scale,
# here one per 256 so that blocks stay independent); an E4M3 scale on its own cannot span a
# gradient's range (it clipped above 2688 and zeroed groups below about 1e-3)
QUANTIZERS.register("nvfp4", BlockQuantizer("e2m1", group_size=16, scale="e4m3rel",
                                            super_group_size=256, super_scale="fp32"))
QUANTIZERS.alias("mxfp8_e4m3", "mxfp8")
QUANTIZERS.alias("mxfp6_e3m2", "mxfp6")
for _b in (4, 8):
    QUANTIZERS.register(f"int{_b}_sr", BlockQuantizer(f"int{_b}", group_size=32, scale="bf16",
                                                      rounding="stochastic"))
for _b in (2, 4, 8):
    QUANTIZERS.register(
        f"dq{_b}_hier",
        BlockQuantizer(f"dq{_b}", group_size=16, scale="u8rel", rounding="stochastic",
                       scale_rounding="stochastic", super_group_size=256, super_scale="bf16"),
    )
# the DynamiQ codec's default coding of one width: mid-rise ε-levels, groups of 32 under
# group scales rounded up and power-of-two super-group scales, correlated rounding decoded with
# subtractive dithering
QUANTIZERS.register(
    "dq4_dither",
    BlockQuantizer(EpsilonFormat(4, DEFAULT_EPSILON[4], midrise=True), group_size=32,
                   scale="u8rel", rounding="correlated", scale_rounding="up",
                   super_group_size=256, super_scale="e8m0", dither=True),
)


def get_quantizer(q: str | BlockQuantizer) -> BlockQuantizer:
    """Return ``q`` itself or the registered quantizer of that name."""
    if isinstance(q, BlockQuantizer):
        return q
    return QUANTIZERS.get(q)
