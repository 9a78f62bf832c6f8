"""The named catalog of number formats.

``FORMATS`` holds element and scale formats alike. Registering a user format is one line::

    dynamiq.FORMATS.register("e3m4", FloatFormat(ebits=3, mbits=4, special="none"))

and from then on quantizers, kernels and the conformance tests accept it by name.
"""

from __future__ import annotations

from dynamiq.formats.types import (
    EpsilonFormat,
    Float32Format,
    FloatFormat,
    IntFormat,
    LevelFormat,
    NumberFormat,
)
from dynamiq.registry import Registry

__all__ = ["DEFAULT_EPSILON", "FORMATS", "TUNED_EPSILON", "resolve_format"]

FORMATS: Registry[NumberFormat] = Registry("number format")

# OCP 8-bit floats
FORMATS.register("e4m3", FloatFormat(4, 3, special="fn"))
FORMATS.register("e5m2", FloatFormat(5, 2, special="ieee"))
# OCP 6- and 4-bit floats: no Inf/NaN codes
FORMATS.register("e3m2", FloatFormat(3, 2, special="none"))
FORMATS.register("e2m3", FloatFormat(2, 3, special="none"))
FORMATS.register("e2m1", FloatFormat(2, 1, special="none"))
# 16-bit floats
FORMATS.register("bf16", FloatFormat(8, 7, special="ieee"))
FORMATS.register("fp16", FloatFormat(5, 10, special="ieee"))
# symmetric sign-magnitude integers
for _b in range(2, 9):
    FORMATS.register(f"int{_b}", IntFormat(_b))
FORMATS.register("int16", IntFormat(16))
# scale formats
FORMATS.register("e8m0", FloatFormat(8, 0, special="fn", signed=False, subnormals=False))
FORMATS.register("fp32", Float32Format())
FORMATS.register("u8rel", IntFormat(8, signed=False, normalized=True))
# E4M3's magnitudes over its maximum (448): an NVFP4 group scale relative to an FP32 scale above
# it (the sign bit is never set)
_E4M3 = FloatFormat(4, 3, special="fn")
FORMATS.register("e4m3rel", LevelFormat(tuple(float(v) / _E4M3.max_value
                                              for v in _E4M3.magnitudes())))

# ---- DynamiQ's ε-level formats: the two ε tables live here, side by side -------------------
#: DynamiQ ε per width (tunable defaults in the range the method's authors used; their widths,
#: so no width 7): the registered ``dq<b>`` formats.
DEFAULT_EPSILON = {2: 0.25, 3: 0.22, 4: 0.19, 5: 0.15, 6: 0.12, 8: 0.09}
#: DynamiQ ε per width minimising the measured error of one quantization of Gaussian groups of
#: 16 under hierarchical scales: the :class:`~dynamiq.DynamiQ` codec's default for every width
#: it offers. Width 2 has the levels {0, 1} whatever ε is.
TUNED_EPSILON = {2: 0.25, 3: 0.35, 4: 0.22, 5: 0.15, 6: 0.12, 7: 0.08, 8: 0.06}
# no dq7: the authors' range gives no ε for width 7 (the codec's width 7 takes TUNED_EPSILON's)
for _b, _e in DEFAULT_EPSILON.items():
    FORMATS.register(f"dq{_b}", EpsilonFormat(_b, _e))
    FORMATS.register(f"uniform{_b}", EpsilonFormat(_b, 0.0))

FORMATS.alias("fp8_e4m3", "e4m3")
FORMATS.alias("fp8_e5m2", "e5m2")
FORMATS.alias("fp6_e3m2", "e3m2")
FORMATS.alias("fp6_e2m3", "e2m3")
FORMATS.alias("fp4_e2m1", "e2m1")
FORMATS.alias("bfloat16", "bf16")
FORMATS.alias("float16", "fp16")
FORMATS.alias("float32", "fp32")


def resolve_format(fmt: str | NumberFormat) -> NumberFormat:
    """Return ``fmt`` itself, or the registered format of that name."""
    if isinstance(fmt, NumberFormat):
        return fmt
    if isinstance(fmt, str):
        return FORMATS.get(fmt)
    raise TypeError(f"expected a NumberFormat or a registered name, got {type(fmt).__name__}")
