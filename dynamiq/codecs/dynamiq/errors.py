"""The error model of the ``measured`` allocator: each option's own relative squared error.

Measuring runs the option's quantizer on 2^16 Gaussian values, so it happens on the first
:meth:`~dynamiq.codecs.dynamiq.DynamiQ.prepare` that needs it, never when a codec is built, and
once per quantizer per process. :func:`codec_error` measures a whole partial-sum codec the same
way (the reference of a named accuracy target).

Both run on the reference backend. Every backend gives the same bits, so the tables are the
same wherever the hops run; the reference backend compiles nothing, which keeps a codec whose
hops run elsewhere (Triton on a GPU, or a simulation on the reference backend) from compiling
the CPU kernels of every option, and measures all of DynamiQ's options faster than loading
their compiled kernels does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache

import torch

from dynamiq.codecs.allocation import WidthOption
from dynamiq.codecs.base import HopContext, PartialSumCodec
from dynamiq.codecs.dynamiq.options import CHOICES, CodingOption
from dynamiq.metadata import STATISTICS
from dynamiq.quantizers import BlockQuantizer

__all__ = ["ALLOCATORS", "codec_error", "measured_error", "width_options"]

#: Error models of the allocation: the codec's measured errors, or the paper's ``4^−w``.
ALLOCATORS = CHOICES["allocator"]

#: Values and seed of the measurement (fixed, so every rank and process gets the same table).
_SAMPLES = 1 << 16
_SEED = 0x5EED
#: Where the measurements run (see the module's docstring).
_BACKEND = "reference"


@lru_cache(maxsize=64)
def measured_error(q: BlockQuantizer | None) -> float:
    """Relative squared error of one encode–decode of ``q`` on Gaussian data.

    Args:
        q: The quantizer, or ``None`` for BF16 (round to nearest even).

    Returns:
        ``Σ (x̂ − x)² / Σ x²`` over 2^16 standard normal float32 values (fixed seed;
        random-number seed 1 for the quantizer), the squares in float64 and their sums
        correctly rounded (:func:`math.fsum`).
    """
    x = _sample()
    if q is None:
        y = x.to(torch.bfloat16).float()
    else:
        y = q.decode(q.encode(x, seed=1, backend=_BACKEND), seed=1, backend=_BACKEND)
    return _relative(x, y)


@lru_cache(maxsize=16)
def codec_error(codec: PartialSumCodec) -> float:
    """Relative squared error of one compress–decompress of ``codec`` on Gaussian data.

    The codec is prepared as a one-rank collective would prepare it: on the sample's own
    metadata statistics (for an MX codec, block scales from each block's maximum).

    Args:
        codec: A partial-sum codec whose statistics all have blocks dividing 2^16.

    Returns:
        ``Σ (x̂ − x)² / Σ x²`` over the same 2^16 values as :func:`measured_error`.
    """
    x = _sample()
    stats = {name: STATISTICS[name].local(x.double().view(-1, STATISTICS[name].block))
             for name in codec.statistics}
    plan = codec.prepare(stats, x.numel(), 1, {})
    ctx = HopContext(prepared={codec: plan}, backend=_BACKEND)
    y = torch.empty_like(x)
    codec.decompress(codec.compress(x, ctx), y, ctx)
    return _relative(x, y)


def _sample() -> torch.Tensor:
    """The 2^16 standard normal float32 values of every measurement (fixed seed)."""
    return torch.randn(_SAMPLES, generator=torch.Generator().manual_seed(_SEED))


def _relative(x: torch.Tensor, y: torch.Tensor) -> float:
    """``Σ (y − x)² / Σ x²``, the squares in float64 and the sums correctly rounded."""
    # exact sums: a parallel reduction's last bit follows the thread count at the time of the
    # first prepare, and every rank must derive the same allocation whatever its thread count
    err = math.fsum(((y.double() - x.double()) ** 2).tolist())
    return err / math.fsum((x.double() ** 2).tolist())


def width_options(options: Sequence[CodingOption], allocator: str) -> list[WidthOption]:
    """The allocator's view of ``options``: width, model error ``v(w)`` and cost ``c(w)``.

    Args:
        options: The codec's options, by increasing cost.
        allocator: ``"measured"`` (:func:`measured_error` of each option's quantizer) or
            ``"paper"`` (``4^−w``).

    Returns:
        One :class:`~dynamiq.codecs.allocation.WidthOption` per option, same order; the cost is
        the option's wire bits per whole super-group.
    """
    if allocator not in ALLOCATORS:
        raise ValueError(f"allocator must be one of {ALLOCATORS}, got {allocator!r}")
    return [WidthOption(o.width,
                        4.0 ** (-o.width) if allocator == "paper" else measured_error(o.quantizer),
                        o.bits())
            for o in options]
