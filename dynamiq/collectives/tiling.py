"""Tiles: a schedule whose chunks are cut into messages of at most ``tile_elems`` coordinates.

A chunk larger than ``tile_elems`` coordinates is cut into tiles on block boundaries and every
tile travels as its own message, so that a leaf compresses tile ``k + 1`` while tile ``k`` is on
the wire, and a receiver decodes tile ``k`` while tile ``k + 1`` arrives. The schedule seen by
:class:`~dynamiq.collectives.engine.RankState` is the original one with each chunk replaced by
its tiles (same tree, same steps). Blocks are coded independently and the random numbers of a
tile are drawn from its parent chunk's stream at the tile's global element indices, so the
decoded values, the summation order and the byte count are those of the untiled schedule.
"""

from __future__ import annotations

from dataclasses import dataclass

from dynamiq.codecs import Passthrough
from dynamiq.collectives.engine import Plan, chunk_bounds
from dynamiq.pipeline import Pipeline
from dynamiq.topologies import Schedule, Transfer

__all__ = ["MIN_TILE_ELEMS", "TILE_ELEMS", "Layout", "TiledPlan", "build_layout", "default_tile",
           "is_identity"]

#: Largest default tile: 8 MB of float32 input per message (the paper's pipelining
#: granularity), the FP32 passthrough's.
TILE_ELEMS = 1 << 21
#: Smallest default tile of a compressed pipeline.
MIN_TILE_ELEMS = 1 << 18


def is_identity(p: Pipeline) -> bool:
    """Whether every codec of ``p`` sends its float32 input bytes as they are (FP32
    passthrough; subclasses may code differently, so only the class itself counts)."""
    return all(type(c) is Passthrough and c.wire == "fp32" for c in p.codecs)


def default_tile(p: Pipeline, numel: int, world: int) -> int:
    """Coordinates per message when the caller names none.

    The FP32 passthrough sends :data:`TILE_ELEMS`. A compressed pipeline cuts every chunk of
    a ring-sized share (``numel / world``) into at least two tiles, so that a rank decodes and
    recodes one while the next arrives, within ``[MIN_TILE_ELEMS, TILE_ELEMS]`` (a power of
    two): on a slow link a chunk sent whole leaves each hop's codec time exposed on every step
    (measured in docs/benchmarks.rst). Every rank computes the same from the same call.
    """
    if is_identity(p):
        return TILE_ELEMS
    half = -(-max(1, numel) // (2 * max(1, world)))
    return max(MIN_TILE_ELEMS, min(TILE_ELEMS, 1 << (half - 1).bit_length()))


@dataclass
class Layout:
    """The tiled schedule of one (pipeline, world size, length, tile size), shared by all calls.

    Attributes:
        pipeline: The pipeline.
        world_size: Number of ranks.
        length: Length of the (transformed) vector being summed.
        schedule: The pipeline's schedule with every chunk replaced by its tiles.
        bounds: ``[start, end)`` of every tile in the vector.
        parent: The chunk of the untiled schedule that each tile belongs to.
        level: The hierarchy level of every transfer (``None`` for single-level topologies).
        send: The reduce transfer of each ``(tile, sender)``.
    """

    pipeline: Pipeline
    world_size: int
    length: int
    schedule: Schedule
    bounds: list[tuple[int, int]]
    parent: tuple[int, ...]
    level: dict[Transfer, str | None]
    send: dict[tuple[int, int], Transfer]


def _tiles(a: int, b: int, tile: int) -> list[tuple[int, int]]:
    if b - a <= tile:
        return [(a, b)]  # an empty chunk stays one (inactive) tile so the schedule keeps its shape
    return [(s, min(b, s + tile)) for s in range(a, b, tile)]


def build_layout(p: Pipeline, world: int, length: int, tile_elems: int) -> Layout:
    """Cut every chunk of ``p``'s schedule on ``world`` ranks into tiles.

    Args:
        p: The pipeline.
        world: Number of ranks.
        length: Length of the (transformed) vector being summed.
        tile_elems: Coordinates per tile at most, rounded down to a multiple of the pipeline's
            block size (at least one block).

    Returns:
        The tiled layout.
    """
    base = p.topology.schedule(world)
    bounds = chunk_bounds(base.chunk_weights, length, p.block_size)
    align = p.block_size
    # tiles start on block boundaries, so every tile but a chunk's last is whole blocks and the
    # tiles' payloads add up to the chunk's payload, padding included
    tile = max(align, tile_elems // align * align)
    tiles = [_tiles(a, b, tile) for a, b in bounds]
    first = [0]
    for ts in tiles:
        first.append(first[-1] + len(ts))
    parent = tuple(c for c, ts in enumerate(tiles) for _ in ts)
    new_bounds = [ab for ts in tiles for ab in ts]
    weights = []
    for c, ts in enumerate(tiles):
        size = bounds[c][1] - bounds[c][0]
        w = base.chunk_weights[c]
        weights += [w * (b - a) / size for a, b in ts] if size else [w]
    base_levels = base.levels or (None,) * len(base.transfers)
    transfers, levels = [], []
    for t, lv in zip(base.transfers, base_levels):
        for k in range(len(tiles[t.chunk])):
            transfers.append(Transfer(t.step, t.src, t.dst, first[t.chunk] + k, t.phase))
            levels.append(lv)
    sched = Schedule(
        world_size=world,
        num_chunks=len(new_bounds),
        owners=tuple(base.owners[c] for c in parent),
        parents=tuple(base.parents[c] for c in parent),
        chunk_weights=tuple(weights),
        transfers=(),
        name=f"{base.name} tiled by {tile}",
    )
    sched = sched.with_transfers(transfers, levels if base.levels else ())
    lv_all = sched.levels or (None,) * len(sched.transfers)
    return Layout(
        pipeline=p,
        world_size=world,
        length=length,
        schedule=sched,
        bounds=new_bounds,
        parent=parent,
        level=dict(zip(sched.transfers, lv_all)),
        send={(t.chunk, t.src): t for t in sched.transfers if t.phase == "reduce"},
    )


class TiledPlan(Plan):
    """A :class:`~dynamiq.collectives.engine.Plan` over the tiled schedule of a layout.

    Every tile draws from its parent chunk's random stream, so
    :class:`~dynamiq.collectives.engine.RankState` runs unchanged and gives the untiled bits.

    Args:
        layout: The cached layout (it is not copied).
        call: Call counter, part of every random-number stream.
        backend: Kernel backend of the hops (see :class:`~dynamiq.collectives.engine.Plan`).
    """

    def __init__(self, layout: Layout, call: int, backend: str = "auto") -> None:
        self.layout = layout
        super().__init__(layout.pipeline, layout.world_size, layout.length, call, backend)

    def __post_init__(self) -> None:
        # The layout holds the tiled schedule and the lookups Plan derives from a schedule:
        # Plan's own __post_init__ would rebuild the untiled schedule on every call.
        self.schedule = self.layout.schedule
        self.bounds = self.layout.bounds
        self._level = self.layout.level
        self._send = self.layout.send

    def stream_chunk(self, chunk: int) -> int:
        """The parent chunk of tile ``chunk``, whose random stream the tile draws from."""
        return self.layout.parent[chunk]
