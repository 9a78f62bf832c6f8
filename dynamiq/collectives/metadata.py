"""The metadata phase: per-block statistics that components need before the main sum.

A component (codec or transform) lists the statistics it needs in its ``statistics``
attribute, e.g. ``("sum", "sumsq")`` for mean-centering and variance-driven bit allocation. The
executor computes them on every rank's (transformed) vector, per block of the statistic's
``block`` coordinates (a super-group of :data:`SUPER_GROUP` for the built-in ones), and combines
them across ranks in one small exchange before the main all-reduce (a sum for additive
statistics, a max for ``absmax``), so every rank sees the same global values; they reach the
codecs through :class:`~dynamiq.codecs.HopContext`.

**What travels.** Every rank's values are rounded to BF16 before the exchange (DYNAMIQ.md §2.2:
two BF16 values per super-group), additive ones to nearest, maxima upwards so that they stay
bounds. The exchange carries them in float64 containers, where the sum of ``n`` BF16 values is
exact unless their exponents span more than 45 binades; so every executor (and every order of
summation) obtains the same global values. The wire cost is accounted at 16 bits per value
(:func:`metadata_bits`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import torch

from dynamiq.kernels.backend import resolve_backend
from dynamiq.registry import Registry

__all__ = [
    "STATISTICS",
    "SUPER_GROUP",
    "Statistic",
    "combine",
    "local_statistics",
    "metadata_bits",
    "round_bf16",
]

#: Coordinates per super-group over which the built-in statistics are taken.
SUPER_GROUP = 256

_REDUCES = ("sum", "max")


@dataclass(frozen=True)
class Statistic:
    """A per-block statistic and how ranks' values combine.

    Attributes:
        reduce: ``"sum"`` or ``"max"`` across ranks.
        local: float64 ``[blocks, block]`` (zero-padded) → float64 ``[blocks]`` on one rank.
        block: Coordinates per block (a power of two).
    """

    reduce: str
    local: Callable[[torch.Tensor], torch.Tensor]
    block: int = SUPER_GROUP

    def __post_init__(self) -> None:
        if self.reduce not in _REDUCES:
            raise ValueError(f"reduce must be one of {_REDUCES}, got {self.reduce!r}")
        if self.block < 1 or self.block & (self.block - 1):
            raise ValueError(f"block must be a power of two, got {self.block!r}")

    def blocks(self, length: int) -> int:
        """Number of values for a vector of ``length`` coordinates."""
        return -(-length // self.block)


STATISTICS: Registry[Statistic] = Registry("statistic")
STATISTICS.register("sum", Statistic("sum", lambda g: g.sum(1)))
STATISTICS.register("sumsq", Statistic("sum", lambda g: (g * g).sum(1)))
STATISTICS.register("absmax", Statistic("max", lambda g: g.abs().amax(1)))
# sum of squares about the rank's own block mean: no cancellation when the mean dominates
STATISTICS.register(
    "csumsq", Statistic("sum", lambda g: ((g - g.mean(1, keepdim=True)) ** 2).sum(1))
)
STATISTICS.register("absmax32", Statistic("max", lambda g: g.abs().amax(1), block=32))
STATISTICS.register("absmax16", Statistic("max", lambda g: g.abs().amax(1), block=16))
# the built-in statistics (a name re-registered with other maths is not the Triton kernel's)
_BUILTIN = {name: STATISTICS[name] for name in STATISTICS.names()}


def round_bf16(t: torch.Tensor, up: bool = False) -> torch.Tensor:
    """float64 → the nearest BF16 value (ties to even), or the next one up in magnitude.

    Args:
        t: float64 tensor.
        up: Round magnitudes upwards instead (keeps a maximum a bound).

    Returns:
        float64 tensor of BF16-representable values (non-finite values pass through).
    """
    b = t.to(torch.bfloat16)
    if up:
        low = b.double().abs() < t.abs()
        if bool(low.any()):
            bits = b.view(torch.int16)
            b = torch.where(low, (bits + 1).view(torch.bfloat16), b)
    return b.double()


def local_statistics(names: Iterable[str], y: torch.Tensor, backend: str = "auto"
                     ) -> dict[str, torch.Tensor]:
    """This rank's statistics as they travel: name → float64 ``[blocks]`` of BF16 values.

    ``y`` (float32, 1-D) is zero-padded to whole blocks; sums are taken in float64 and then
    rounded to BF16 (maxima upwards).

    Args:
        names: Statistic names in :data:`STATISTICS`.
        y: float32 ``[n]``.
        backend: ``"auto"``, ``"numba"`` or ``"triton"``: with Triton (by default for CUDA
            tensors) the built-in statistics are taken by
            :func:`dynamiq.kernels.triton.stats.local_statistics` on ``y``'s device (maxima are
            identical; sums may differ from torch's only when their float64 value lies within
            about ``1e-13`` relative of a BF16 rounding boundary); the others, and every
            statistic of the Numba backend, by torch on the CPU.

    Returns:
        name → float64 ``[blocks]`` on the CPU.
    """
    names = list(names)
    done: dict[str, torch.Tensor] = {}
    if names and resolve_backend(backend, y.device) == "triton":
        from dynamiq.kernels.triton import stats as tstats

        fast = [n for n in names if n in tstats.OPS and STATISTICS[n] is _BUILTIN.get(n)]
        if fast:
            done = {k: v.cpu() for k, v in
                    tstats.local_statistics(fast, y.detach().contiguous()).items()}
    if not done:
        return _torch_statistics(names, y)
    rest = _torch_statistics([n for n in names if n not in done], y)
    return {n: done[n] if n in done else rest[n] for n in names}


def _torch_statistics(names: list[str], y: torch.Tensor) -> dict[str, torch.Tensor]:
    """The statistics ``names`` of ``y`` computed by torch on the CPU."""
    out = {}
    if not names:
        return out
    y64 = y.detach().to(device="cpu", dtype=torch.float64)
    for name in names:
        st = STATISTICS[name]
        nb = st.blocks(y64.numel())
        g = torch.zeros(nb * st.block, dtype=torch.float64)
        g[: y64.numel()] = y64
        out[name] = round_bf16(st.local(g.view(nb, st.block)), up=st.reduce == "max")
    return out


def combine(per_rank: list[Mapping[str, torch.Tensor]], reduces: Mapping[str, str] | None = None
            ) -> dict[str, torch.Tensor]:
    """Global values from every rank's metadata (ranks in order): sums or maxima by name.

    Args:
        per_rank: One mapping per rank, name → float64 tensor.
        reduces: ``name → "sum" | "max"`` for names not in :data:`STATISTICS`.
    """
    out = {}
    for name in per_rank[0]:
        kind = (reduces or {}).get(name) or STATISTICS[name].reduce
        rows = [m[name] for m in per_rank]
        if kind == "max":
            out[name] = torch.stack(rows).amax(0)
        else:
            acc = rows[0].clone()
            for r in rows[1:]:
                acc += r
            out[name] = acc
    return out


def metadata_bits(names: Iterable[str], length: int) -> int:
    """Bits per rank that the statistics ``names`` cost for a vector of ``length`` (16 each)."""
    return sum(16 * STATISTICS[n].blocks(length) for n in names)
