"""The kernel ABI: what every backend agrees on, as named values instead of positional tuples.

Components above the kernels (quantizers, transforms, codecs) describe a kernel call with the
records below; a backend (:mod:`dynamiq.kernels.backend`) turns them into whatever its kernels
take. One definition per fact: the rounding and write-back enums, the stream purposes of the
random numbers, the tile size of tiled backends, the scale kinds, float32's largest value.

Records:

* :class:`KernelSpec` — the compile-time parameters of a block quantizer's kernels;
* :class:`BlockCode` — a block quantizer as the kernels see it (spec, format tables, scale
  divisor, dither amplitude) and its payload layout;
* :class:`RandKeys` — the random-number keys and position of one encode/decode;
* :class:`BlockKeys` — the same per block, for calls whose blocks belong to many chunks;
* :class:`SharedScaleCode` — a shared-scale minifloat element format as the kernels see it;
* :class:`Selection` — which blocks of a chunk travel (sparse wire values);
* :class:`LevelGrid` — THC's level table on a fine integer grid (integer-sum leaf rounding).
"""

from __future__ import annotations

import enum
import itertools
import math
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import torch

from dynamiq.kernels.tables import FormatTables

__all__ = [
    "FLT_MAX",
    "KIND_FP32",
    "KIND_TABLE",
    "MAX_HADAMARD_BLOCK",
    "MIN_HADAMARD_BLOCK",
    "ROUNDING",
    "SCALE_ROUNDING",
    "STAT_OPS",
    "TILE",
    "TILE_INTERPRETED",
    "WIRE_DTYPES",
    "BlockCode",
    "BlockKeys",
    "KernelSpec",
    "LevelGrid",
    "Purpose",
    "RandKeys",
    "Rounding",
    "Selection",
    "SharedScaleCode",
    "Writeback",
    "rht_norm",
]


class Rounding(enum.IntEnum):
    """Rounding modes as kernels number them (elements and scales)."""

    NEAREST = 0  #: to nearest, ties to the even index
    STOCHASTIC = 1  #: up with probability equal to the fractional position
    UP = 2  #: towards +inf (never below the value)
    DOWN = 3  #: towards 0
    CORRELATED = 4  #: stochastic with uniforms stratified across ranks


#: Element rounding names (``BlockQuantizer.rounding``) → kernel mode.
ROUNDING = {"nearest": Rounding.NEAREST, "stochastic": Rounding.STOCHASTIC,
            "correlated": Rounding.CORRELATED}
#: Scale rounding names (``BlockQuantizer.scale_rounding``) → kernel mode; ``"ocp"`` rounds
#: down onto a power-of-two grid (its divisor differs, see ``BlockQuantizer``).
SCALE_ROUNDING = {"nearest": Rounding.NEAREST, "stochastic": Rounding.STOCHASTIC,
                  "up": Rounding.UP, "down": Rounding.DOWN, "ocp": Rounding.DOWN}


class Writeback(enum.IntEnum):
    """What the accumulator holds after a fused decompress–accumulate–recompress."""

    NONE = 0  #: unchanged (scratch)
    SUM = 1  #: the float32 partial sum
    DECODED = 2  #: the decoded value of the outgoing message (a sink's compress-once rule)

    @classmethod
    def parse(cls, value: str | Writeback) -> Writeback:
        """The member named ``value`` (``"none"``, ``"sum"``, ``"decoded"``) or ``value``.

        Raises:
            ValueError: an unknown name.
        """
        if isinstance(value, Writeback):
            return value
        try:
            return cls[str(value).upper()]
        except KeyError:
            names = tuple(m.name.lower() for m in cls)
            raise ValueError(f"writeback must be one of {names}, got {value!r}") from None


class Purpose(enum.IntEnum):
    """Stream purposes of the counter-based random numbers, so that element, scale, permutation
    and integer-sum draws never share numbers."""

    ELEMENT = 0x454C454D
    SCALE = 0x5343414C
    PERMUTATION = 0x5045524D
    INTSUM = 0x494E5453
    LEVELS = 0x4C45564C


#: Scale kinds: a table format, or raw FP32 bits.
KIND_TABLE = 0
KIND_FP32 = 1

#: The largest finite float32 value: decoded values saturate there.
FLT_MAX = np.float32(np.finfo(np.float32).max)

#: Target coordinates per program of tiled (GPU) backends.
TILE = 1024
#: The same under an interpreter, where fewer, larger programs run faster.
TILE_INTERPRETED = 4096

#: Wire formats of uncompressed values → (torch dtype, bytes per value).
WIRE_DTYPES = {"fp32": (torch.float32, 4), "bf16": (torch.bfloat16, 2),
               "fp16": (torch.float16, 2)}

#: Block reductions of the metadata phase that backends provide (in float64): sums, sums of
#: squares, largest magnitudes and sums of squares about the block's mean (zero padding included).
STAT_OPS = ("sum", "sumsq", "absmax", "csumsq")

#: Block sizes of the randomized Hadamard transform.
MIN_HADAMARD_BLOCK = 2
MAX_HADAMARD_BLOCK = 1 << 16


def rht_norm(block: int) -> np.float32:
    """The float32 scale ``1/sqrt(block)`` of the Hadamard kernels, correctly rounded.

    Args:
        block: Block size, a power of two in ``[2, 2**16]``.

    Returns:
        ``np.float32``: ``2**(-L/2)`` exactly when ``L = log2(block)`` is even, otherwise the
        float32 nearest to ``sqrt(1/2)`` scaled by ``2**(-(L-1)/2)`` (an exact power-of-two
        scaling, so still the float32 nearest to ``1/sqrt(block)``).

    Raises:
        ValueError: ``block`` is not a power of two in range.
    """
    if (isinstance(block, bool) or not isinstance(block, (int, np.integer))
            or not MIN_HADAMARD_BLOCK <= block <= MAX_HADAMARD_BLOCK or block & (block - 1)):
        raise ValueError(f"block must be a power of two in [{MIN_HADAMARD_BLOCK}, "
                         f"{MAX_HADAMARD_BLOCK}], got {block!r}")
    log2 = int(block).bit_length() - 1
    if log2 % 2 == 0:
        return np.float32(math.ldexp(1.0, -(log2 // 2)))
    # scaling the rounded sqrt(1/2) by a power of two keeps it the correctly rounded value and
    # avoids the double rounding a float64 1/sqrt(block) -> float32 conversion could suffer
    return np.float32(math.ldexp(float(np.float32(math.sqrt(0.5))), -((log2 - 1) // 2)))


class KernelSpec(NamedTuple):
    """Compile-time parameters of the block kernels: one compiled variant each.

    Everything else about a format (its magnitude, decode and lookup tables, the scale
    divisor) is a runtime argument, so formats of the same width share a compiled kernel.
    """

    bits: int  # element code width, 1-16
    mbits: int  # element magnitude bits
    emode: int  # Rounding: NEAREST | STOCHASTIC | CORRELATED
    group: int  # G (power of two)
    block: int  # super-group size if hierarchical, else G (power of two)
    hier: bool
    skind: int  # group scale: KIND_TABLE | KIND_FP32
    sbytes: int  # bytes per group scale code
    smode: int  # Rounding: NEAREST | STOCHASTIC | UP | DOWN
    ukind: int  # super scale kind
    ubytes: int  # bytes per super scale code
    dither: bool = False  # decoding subtracts the encoder's dither
    ssearch: int = 0  # table group scale: 0 = bucket lookup, else binary-search depth
    efam: int = 0  # element search (dynamiq.kernels.tables.element_family)
    emant: int = 0  # FAMILY_FLOAT: mantissa bits
    ebias: int = 0  # FAMILY_FLOAT: exponent bias
    midrise: bool = False  # no zero level: rounds across zero, negatives use 1 - u
    sgrid: int = 0  # table group scale: k if its levels are i / k (tables.uniform_grid)

    def tag(self) -> str:
        """Readable, unique name of the variant."""
        return (f"b{self.bits}m{self.mbits}r{self.emode}_g{self.group}_B{self.block}"
                f"{'h' if self.hier else 'f'}_s{self.skind}x{self.sbytes}r{self.smode}"
                f"_u{self.ukind}x{self.ubytes}{'d' if self.dither else ''}_p{self.ssearch}"
                f"_e{self.efam}x{self.emant}x{self.ebias}{'z' if self.midrise else ''}"
                f"{f'_q{self.sgrid}' if self.sgrid else ''}")


class RandKeys(NamedTuple):
    """Random-number keys and position of one block encode or decode.

    ``(k0, k1)`` keys the rank's element uniforms, ``(p0, p1)`` the permutation of correlated
    rounding (shared by all ranks), ``(q0, q1)`` the stochastic scale rounding; ``offset`` is the
    global index of the first coordinate.
    """

    k0: int
    k1: int
    p0: int
    p1: int
    q0: int
    q1: int
    rank: int
    world: int
    offset: int


class BlockKeys(NamedTuple):
    """:class:`RandKeys` with a value per block: the keys and position of every block of a
    call whose blocks come from many chunks (a batch of compressions by many ranks).

    Block ``i`` is coded exactly as a call with ``RandKeys(k0[i], k1[i], p0[i], p1[i], q0[i],
    q1[i], rank[i], world, offset[i])`` codes its first block. Arrays are uint64 (keys) and
    int64 (ranks, offsets) of one length.
    """

    k0: np.ndarray
    k1: np.ndarray
    p0: np.ndarray
    p1: np.ndarray
    q0: np.ndarray
    q1: np.ndarray
    rank: np.ndarray
    world: int
    offset: np.ndarray

    def block(self, i: int) -> RandKeys:
        """Block ``i``'s keys as :class:`RandKeys`."""
        return RandKeys(int(self.k0[i]), int(self.k1[i]), int(self.p0[i]), int(self.p1[i]),
                        int(self.q0[i]), int(self.q1[i]), int(self.rank[i]), self.world,
                        int(self.offset[i]))

    def take(self, rows: np.ndarray, offsets: np.ndarray) -> BlockKeys:
        """The keys of blocks that belong to entries ``rows`` of these, with their own
        ``offsets``."""
        return BlockKeys(self.k0[rows], self.k1[rows], self.p0[rows], self.p1[rows],
                         self.q0[rows], self.q1[rows], self.rank[rows], self.world,
                         np.asarray(offsets, dtype=np.int64))

    def runs(self, block: int) -> np.ndarray:
        """int64 starts of the runs of blocks that one :class:`RandKeys` call codes alike
        (equal keys and rank, offsets one ``block`` apart), followed by the number of blocks."""
        m = len(self.offset)
        if m == 0:
            return np.zeros(1, np.int64)
        same = np.ones(m - 1, bool)
        for a in (self.k0, self.k1, self.p0, self.p1, self.q0, self.q1, self.rank):
            same &= a[1:] == a[:-1]
        same &= self.offset[1:] == self.offset[:-1] + block
        return np.concatenate([[0], np.flatnonzero(~same) + 1, [m]]).astype(np.int64)


@dataclass(frozen=True, eq=False)
class BlockCode:
    """A block quantizer as every backend's kernels see it (identity-hashed, so backends may
    cache device copies of its tables per object).

    Attributes:
        spec: The compile-time parameters.
        elem, scale, sup: Tables of the element, group-scale and super-group-scale formats
            (``sup``: inert placeholders when scales are flat).
        divisor: float32 element maximum the group maximum is divided by to get the scale.
        kappa: float32 dither amplitude (0 without dithering).
    """

    spec: KernelSpec
    elem: FormatTables
    scale: FormatTables
    sup: FormatTables
    divisor: np.float32
    kappa: np.float32

    def padded_length(self, n: int) -> int:
        """``n`` rounded up to whole blocks."""
        b = self.spec.block
        return -(-n // b) * b

    def layout(self, n: int) -> tuple[int, int, int]:
        """Bytes of the code, group-scale and super-scale sections of the kernels' payload of
        ``n`` coordinates (a partial last block padded to whole)."""
        s = self.spec
        npad = self.padded_length(n)
        codes = npad * s.bits // 8
        scales = (npad // s.group) * s.sbytes
        supers = (npad // s.block) * s.ubytes if s.hier else 0
        return codes, scales, supers

    def nbytes(self, n: int) -> int:
        """Size of the kernels' payload of ``n`` coordinates."""
        return sum(self.layout(n))


@dataclass(frozen=True, eq=False)
class SharedScaleCode:
    """A minifloat element format under a shared per-block scale, as the kernels see it.

    A value ``v`` in a block of scale ``s`` codes as the nearest decoded level ``dec[c] * s``
    (ties to the even magnitude code), saturating at the largest; non-finite values (or a
    non-finite scale) give ``nan_code``.

    Attributes:
        tables: The element format's :class:`FormatTables` (search table and bucket lookup).
        mbits: Magnitude bits; codes are ``mbits + 1`` bits (sign on top).
        nan_code: The code of NaN.
        dec: float32 value of every code (``dec[nan_code]`` is NaN).
    """

    tables: FormatTables
    mbits: int
    nan_code: int
    dec: np.ndarray

    @property
    def bits(self) -> int:
        """Bits per code."""
        return self.mbits + 1


@dataclass(eq=False)
class Selection:
    """The blocks of a chunk whose values travel (the others are dropped).

    Attributes:
        mask: bool ``[ceil(n / block)]`` on the CPU, the travelling blocks.
        n: Coordinates in the chunk.
        block: Coordinates per block.
        derived: Per-backend forms of the selection (e.g. an index on a device), cached by the
            backends under keys of their own.
    """

    mask: torch.Tensor
    n: int
    block: int
    derived: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        nb = -(-self.n // self.block)
        if self.mask.numel() != nb:
            raise ValueError(f"selection has {self.mask.numel()} blocks, a chunk of {self.n} "
                             f"needs {nb}")

    def index(self) -> torch.Tensor:
        """int64 chunk-local indices of the travelling coordinates (CPU, cached)."""
        idx = self.derived.get("index")
        if idx is None:
            per = self.mask.to(torch.bool).repeat_interleave(self.block)[: self.n]
            idx = self.derived["index"] = torch.nonzero(per).flatten()
        return idx

    @property
    def count(self) -> int:
        """Number of travelling coordinates."""
        return int(self.index().numel())


@dataclass(frozen=True, eq=False)
class LevelGrid:
    """Levels on a fine integer grid, as the integer-sum leaf rounding sees them.

    A rank's value ``v`` is clamped to ``[-g/2, g/2]`` steps and rounded stochastically to one
    of its two neighbouring levels; level ``c`` (an integer in ``[0, g]``) decodes to
    ``(c - g/2) * step``.

    Attributes:
        levels: The levels, ascending integers from 0 to ``granularity``.
        granularity: ``g``, the number of grid steps across the clamp range.
        lower: int32 ``[g]``: the largest level ``<= j`` for every grid cell ``[j, j + 1)``.
        upper: int32 ``[g]``: the smallest level ``>= j + 1``.
        derived: Per-backend forms of the tables (e.g. on a device), cached under keys of
            the backends' own.
    """

    levels: tuple[int, ...]
    granularity: int = field(init=False)
    lower: np.ndarray = field(init=False, repr=False)
    upper: np.ndarray = field(init=False, repr=False)
    derived: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        lv = tuple(int(c) for c in self.levels)
        g = lv[-1] if lv else 0
        if len(lv) < 2 or lv[0] != 0 or any(b <= a for a, b in itertools.pairwise(lv)):
            raise ValueError(f"levels must ascend strictly from 0, got {self.levels!r}")
        cells = np.arange(g)
        at = np.asarray(lv)
        lower = at[np.searchsorted(at, cells, side="right") - 1]
        upper = at[np.searchsorted(at, cells + 1, side="left")]
        object.__setattr__(self, "levels", lv)
        object.__setattr__(self, "granularity", g)
        object.__setattr__(self, "lower", lower.astype(np.int32))
        object.__setattr__(self, "upper", upper.astype(np.int32))
