"""Pipelines: transforms + partial-sum codec(s) + topology, as one frozen, hashable value.

A pipeline prints as a canonical spec string and parses back (``parse(str(p)) == p``)::

    rht(block_size=128)+requant(quantizer=dq4_hier)@ring
    passthrough(wire=bf16)@butterfly
    requant(quantizer=dq4_hier)|intra=passthrough@hierarchical(ranks_per_node=2)

(parameters at their default values are left out of the canonical form).

Grammar: ``[transform "+"]* codec ["|" level "=" codec]* "@" topology``. The ``level=codec``
entries override the codec on the links of one level of a hierarchical schedule (e.g. keep fast
intra-node links lossless and compress only between nodes). The string is the label in logs and
benchmarks and the key of compiled kernels; named pipelines live in :data:`PIPELINES`.
"""

from __future__ import annotations

from dataclasses import dataclass

from dynamiq.codecs import DynamiQ, PartialSumCodec, Passthrough, Requant, get_codec
from dynamiq.metadata import metadata_bits
from dynamiq.registry import Registry
from dynamiq.spec import build, format_call, split_top_level
from dynamiq.topologies import Topology, get_topology
from dynamiq.transforms import TRANSFORMS, Center, Transform

__all__ = ["PIPELINES", "Pipeline", "get_pipeline", "get_transform", "transform_spec"]


def transform_spec(t: Transform) -> str:
    """Canonical spec of a registered transform, e.g. ``rht(block_size=128,seed=3)``."""
    for name, cls in TRANSFORMS.items():
        if type(t) is cls:
            return format_call(name, t)
    raise ValueError(f"transform {t!r} is not registered in TRANSFORMS")


def get_transform(spec: str | Transform) -> Transform:
    """Return ``spec`` itself, or build a transform from ``rht(block_size=256)``-style specs."""
    if isinstance(spec, Transform):
        return spec
    return build(TRANSFORMS, spec, "transform")  # type: ignore[return-value]


@dataclass(frozen=True)
class Pipeline:
    """A compressed all-reduce: what to transform, how to code partial sums, along which schedule.

    Args:
        codec: The partial-sum codec (object or spec string), used on every link unless a level
            override applies; the owner's final bytes of each chunk are always in this codec.
        topology: Topology (object or spec string), e.g. ``"ring"``.
        transforms: Transforms applied in order before the reduction and undone after it; they
            must commute with summation across ranks (all ranks use the same seed).
        level_codecs: ``((level, codec), ...)`` overrides for the links of a level (``"intra"``,
            ``"inter"``) of hierarchical schedules.
    """

    codec: PartialSumCodec | str
    topology: Topology | str = "ring"
    transforms: tuple[Transform | str, ...] = ()
    level_codecs: tuple[tuple[str, PartialSumCodec | str], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "codec", get_codec(self.codec))
        object.__setattr__(self, "topology", get_topology(self.topology))
        object.__setattr__(self, "transforms", tuple(get_transform(t) for t in self.transforms))
        lc = tuple((str(lvl), get_codec(c)) for lvl, c in self.level_codecs)
        levels = [lvl for lvl, _ in lc]
        if len(set(levels)) != len(levels):
            raise ValueError(f"a level is given two codecs: {levels}")
        known = self.topology.levels()  # type: ignore[union-attr]
        for lvl in levels:
            if lvl not in known:
                raise ValueError(
                    f"level {lvl!r} does not exist in topology {self.topology}; "
                    f"its link levels are: {', '.join(known) or 'none'}"
                )
        object.__setattr__(self, "level_codecs", tuple(sorted(lc)))
        seen_stat = None
        for t in self.transforms:
            if getattr(t, "statistics", ()):
                seen_stat = t
            elif seen_stat is not None:
                raise ValueError(
                    f"transform {transform_spec(seen_stat)} uses the metadata statistics, so it "
                    f"must come after every data-independent transform (here {transform_spec(t)})"
                )

    def codec_for(self, level: str | None) -> PartialSumCodec:
        """Codec used on links of ``level`` (the main codec when there is no override)."""
        for lvl, c in self.level_codecs:  # type: ignore[misc]
            if lvl == level:
                return c
        return self.codec  # type: ignore[return-value]

    @property
    def codecs(self) -> tuple[PartialSumCodec, ...]:
        """The distinct codecs: the main one, then the level overrides."""
        out: list[PartialSumCodec] = [self.codec]  # type: ignore[list-item]
        for _, c in self.level_codecs:
            if c not in out:
                out.append(c)  # type: ignore[arg-type]
        return tuple(out)

    @property
    def statistics(self) -> tuple[str, ...]:
        """Sorted names of the per-block statistics its components declare."""
        parts = [*self.codecs, *self.transforms]
        return tuple(sorted({s for c in parts for s in getattr(c, "statistics", ())}))

    def metadata_bits(self, length: int) -> int:
        """Bits per rank of the metadata phase for a (transformed) vector of ``length``."""
        return metadata_bits(self.statistics, length) + sum(
            c.metadata_bits(length) for c in self.codecs
        )

    @property
    def unbiased(self) -> bool:
        """Whether every codec is unbiased (transforms are linear and exact in expectation)."""
        return all(c.unbiased for c in self.codecs)

    @property
    def block_size(self) -> int:
        """Alignment of chunk boundaries: the largest block size among the codecs."""
        return max([self.codec.block_size] + [c.block_size for _, c in self.level_codecs])

    def __str__(self) -> str:
        head = "+".join([transform_spec(t) for t in self.transforms] + [self.codec.spec()])
        levels = "".join(f"|{lvl}={c.spec()}" for lvl, c in self.level_codecs)
        return f"{head}{levels}@{self.topology.spec()}"

    @staticmethod
    def parse(spec: str) -> Pipeline:
        """Build a pipeline from its canonical string (whitespace ignored).

        Raises:
            ValueError: malformed string (the message says which part), or an unknown name
                (:class:`~dynamiq.registry.UnknownNameError` is also a ``ValueError``).
        """
        text = "".join(spec.split())
        parts = split_top_level(text, spec, sep="@", what="pipeline")
        if len(parts) != 2 or not parts[0] or not parts[1]:
            raise ValueError(
                f"pipeline spec {spec!r} must have the form "
                "'[transform+]*codec[|level=codec]*@topology', e.g. 'requant(quantizer=mxfp8)@ring'"
            )
        left, topo = parts
        chain, *levels = split_top_level(left, spec, sep="|", what="pipeline")
        steps = split_top_level(chain, spec, sep="+", what="pipeline")
        overrides = []
        for item in levels:
            lvl, eq, codec = item.partition("=")
            if not (eq and lvl and codec):
                raise ValueError(f"pipeline spec {spec!r}: level override {item!r} is not "
                                 "of the form level=codec")
            overrides.append((lvl, codec))
        return Pipeline(codec=steps[-1], topology=topo, transforms=tuple(steps[:-1]),
                        level_codecs=tuple(overrides))


PIPELINES: Registry[Pipeline] = Registry("pipeline")

PIPELINES.register("passthrough-fp32", Pipeline(Passthrough("fp32"), "ring"))
PIPELINES.register("passthrough-bf16", Pipeline(Passthrough("bf16"), "ring"))
PIPELINES.register("requant-dq4", Pipeline(Requant("dq4_hier"), "ring"))
PIPELINES.register("requant-dq8", Pipeline(Requant("dq8_hier"), "ring"))
PIPELINES.register("requant-dq4-butterfly", Pipeline(Requant("dq4_hier"), "butterfly"))
PIPELINES.register("requant-mxfp8", Pipeline(Requant("mxfp8"), "ring"))
PIPELINES.register(
    "requant-dq4-hier2",
    Pipeline(Requant("dq4_hier"), "hierarchical(ranks_per_node=2)",
             level_codecs=(("intra", Passthrough("fp32")),)),
)

# DynamiQ: the default takes the choices measured best at equal bits (widths 2-8, error model
# measured per width, tuned mid-rise ε-levels, groups of 32 or 64, power-of-two super-group
# scales, dithered decoding, 8-bit metadata, widths per hop); "dynamiq-paper"
# keeps the paper's exact choices (widths {2, 4, 8}, 4^-w error model, ε from the authors'
# range, levels with a zero, groups of 16, BF16 super-group scales, stochastically rounded
# group scales, BF16 metadata, no dithering, one width plan for every hop).
# Both centre through the metadata phase and spend 5 bits/coordinate.
_PAPER = DynamiQ(widths=(2, 4, 8), allocator="paper", eps=(0.25, 0.19, 0.09), group_size=16,
                 dither=False, metadata="bf16", per_hop=False, midrise=False,
                 super_scale="bf16", scale_rounding="stochastic")
_CENTER_BF16 = Center(statistic="sum")
PIPELINES.register("dynamiq", Pipeline(DynamiQ(), "ring", transforms=(Center(),)))
PIPELINES.register("dynamiq-butterfly", Pipeline(DynamiQ(), "butterfly", transforms=(Center(),)))
PIPELINES.register("dynamiq-paper", Pipeline(_PAPER, "ring", transforms=(_CENTER_BF16,)))
PIPELINES.register("dynamiq-paper-butterfly",
                   Pipeline(_PAPER, "butterfly", transforms=(_CENTER_BF16,)))


def get_pipeline(p: str | Pipeline) -> Pipeline:
    """A pipeline object, a registered pipeline name, or a pipeline spec string."""
    if isinstance(p, Pipeline):
        return p
    if not isinstance(p, str):
        raise TypeError(f"expected a Pipeline, a registered name or a spec, got {type(p)}")
    if p in PIPELINES:
        return PIPELINES[p]
    if "@" not in p:
        PIPELINES.get(p)  # raises with the list of known names
    return Pipeline.parse(p)
