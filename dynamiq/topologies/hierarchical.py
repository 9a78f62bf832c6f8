"""The two-level (intra-node, then inter-node) all-reduce built from two other topologies."""

from __future__ import annotations

from dataclasses import dataclass

from dynamiq.topologies.base import TOPOLOGIES, Topology, get_topology
from dynamiq.topologies.ring import Ring
from dynamiq.topologies.schedule import Schedule, Transfer

__all__ = ["Hierarchical"]

# One shared default instance: topologies are frozen values, and spec() leaves out a level
# equal to it.
_RING = Ring()


def _phase_steps(sched: Schedule, phase: str) -> tuple[list[Transfer], int, int]:
    """A schedule's transfers of one phase, their first step and how many steps they span."""
    ts = [t for t in sched.transfers if t.phase == phase]
    if not ts:
        return ts, 0, 0
    first = min(t.step for t in ts)
    return ts, first, max(t.step for t in ts) - first + 1


@TOPOLOGIES.register("hierarchical")
@dataclass(frozen=True)
class Hierarchical(Topology):
    """Two-level all-reduce: inside nodes, then across nodes, then back.

    Ranks ``node * ranks_per_node + local`` form nodes of ``ranks_per_node`` consecutive ranks.
    Stages, run one after the other: (1) the ``inner`` topology's reduce inside every node, (2)
    the ``outer`` topology's reduce across nodes among the ranks that own the same inner chunk,
    (3) the outer gather, (4) the inner gather. Transfers of stages 1 and 4 have level ``"intra"``,
    those of 2 and 3 ``"inter"``.

    Chunk ``ci * C_out + co`` is sub-chunk ``co`` of inner chunk ``ci`` (``C_in``/``C_out``: the
    chunk counts of the inner and outer schedules), weight ``w_in[ci] * w_out[co]``. Its
    aggregation tree joins, in every node, inner chunk ``ci``'s tree to the outer tree of chunk
    ``co`` over the ranks with local index ``owner_in[ci]``; its owner is rank ``owner_out[co] *
    ranks_per_node + owner_in[ci]``. With rings or butterflies at both levels each rank sends
    ``2(n - 1)/n`` of the vector, as a flat ring does.

    Args:
        ranks_per_node: Ranks per node; must divide the world size.
        inner: The topology used inside a node; a spec string is converted with
            :func:`~dynamiq.topologies.base.get_topology`. In a spec it is a nested spec, e.g.
            ``hierarchical(ranks_per_node=4,inner=butterfly)``.
        outer: The topology used across nodes, likewise.

    Raises:
        ValueError: ``ranks_per_node`` is not a positive int.
        UnknownNameError: ``inner`` or ``outer`` names no registered topology.
        TypeError: ``inner`` or ``outer`` is neither a topology nor a string.
    """

    ranks_per_node: int
    inner: Topology = _RING
    outer: Topology = _RING

    def __post_init__(self) -> None:
        p = self.ranks_per_node
        if isinstance(p, bool) or not isinstance(p, int) or p < 1:
            raise ValueError(f"hierarchical: ranks_per_node must be a positive int, got {p!r}")
        object.__setattr__(self, "inner", get_topology(self.inner))
        object.__setattr__(self, "outer", get_topology(self.outer))

    def levels(self) -> tuple[str, ...]:
        """``("intra", "inter")``: links inside a node, and between nodes."""
        return ("intra", "inter")

    @property
    def inner_topology(self) -> Topology:
        """Alias of :attr:`inner`."""
        return self.inner

    @property
    def outer_topology(self) -> Topology:
        """Alias of :attr:`outer`."""
        return self.outer

    def check_world_size(self, world_size: int) -> None:
        """See :meth:`Topology.check_world_size`; additionally ``ranks_per_node`` must divide
        ``world_size`` and both levels must accept their sizes."""
        super().check_world_size(world_size)
        p = self.ranks_per_node
        if world_size % p:
            raise ValueError(
                f"{self.spec()} needs a world size divisible by ranks_per_node={p}, got "
                f"{world_size}"
            )
        for level, topo, size in (
            ("inner", self.inner, p),
            ("outer", self.outer, world_size // p),
        ):
            try:
                topo.check_world_size(size)
            except ValueError as exc:
                raise ValueError(f"{self.spec()}: {level} level over {size} ranks: {exc}") from exc

    def _build(self, world_size: int) -> Schedule:
        p = self.ranks_per_node
        nodes = world_size // p
        inner = self.inner.schedule(p)
        outer = self.outer.schedule(nodes)
        c_out = outer.num_chunks

        owners, parents, weights = [], [], []
        for ci in range(inner.num_chunks):
            lead = inner.owners[ci]
            for co in range(c_out):
                owners.append(outer.owners[co] * p + lead)
                weights.append(inner.chunk_weights[ci] * outer.chunk_weights[co])
                par = []
                for node in range(nodes):
                    for local in range(p):
                        if local != lead:
                            par.append(node * p + inner.parents[ci][local])
                        else:
                            up = outer.parents[co][node]
                            par.append(-1 if up < 0 else up * p + local)
                parents.append(tuple(par))

        pairs: list[tuple[Transfer, str]] = []
        offset = 0

        def intra(ts: list[Transfer], shift: int) -> None:
            pairs.extend(
                (
                    Transfer(
                        t.step + shift,
                        node * p + t.src,
                        node * p + t.dst,
                        t.chunk * c_out + co,
                        t.phase,
                    ),
                    "intra",
                )
                for t in ts
                for node in range(nodes)
                for co in range(c_out)
            )

        def inter(ts: list[Transfer], shift: int) -> None:
            pairs.extend(
                (
                    Transfer(
                        t.step + shift,
                        t.src * p + inner.owners[ci],
                        t.dst * p + inner.owners[ci],
                        ci * c_out + t.chunk,
                        t.phase,
                    ),
                    "inter",
                )
                for t in ts
                for ci in range(inner.num_chunks)
            )

        # Each stage keeps its source schedule's relative step order, rebased to start right
        # after the previous stage; that preserves every ordering the validator relies on.
        for level, sched, phase in (
            (intra, inner, "reduce"),
            (inter, outer, "reduce"),
            (inter, outer, "gather"),
            (intra, inner, "gather"),
        ):
            ts, first, span = _phase_steps(sched, phase)
            level(ts, offset - first)
            offset += span

        pairs.sort(key=lambda tl: tl[0].sort_key())
        return Schedule(
            world_size=world_size,
            num_chunks=len(owners),
            owners=tuple(owners),
            parents=tuple(parents),
            chunk_weights=tuple(weights),
            transfers=tuple(t for t, _ in pairs),
            name=self.spec(),
            levels=tuple(lv for _, lv in pairs),
        )
