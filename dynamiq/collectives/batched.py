"""Batched in-process simulator: every transfer of a schedule step processed at once.

:func:`~dynamiq.collectives.simulator.simulate` runs the per-rank logic of
:mod:`dynamiq.collectives.engine` message by message, which costs Python work per message: a
ring of ``n`` ranks sends ``2n(n − 1)`` of them, and its schedule alone holds as many records.
:func:`simulate_batched` gives the same bits at thousands of ranks by processing a step's
transfers together:

* the schedule comes as integer arrays per step (:meth:`Topology.step_arrays
  <dynamiq.topologies.Topology.step_arrays>`), never as records;
* every compression of a step is one :class:`~dynamiq.codecs.batch.HopBatch` and one call of
  the codec's :meth:`~dynamiq.codecs.PartialSumCodec.roundtrip_batch`, which replaces each
  compressed chunk by what its receivers decode (so the bytes themselves are never kept);
* a receiver adds the decoded values in float32, the one addition per coordinate that
  ``decompress_accumulate`` and the fused recompress make, so the sums are bit-identical;
* the all-gather carries the owner's decoded values to every rank: the result is computed
  once and returned as a view repeated for every rank.

The aggregation trees (children, subtree sizes, heights) come from one pass over the reduce
steps, as ``[chunks, ranks]`` arrays; with the accumulators (``[ranks, length]`` float32) they
are the memory the simulation needs.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from dynamiq.codecs.batch import HopBatch, ragged_arange
from dynamiq.collectives.engine import (
    apply_transforms,
    center_and_prepare,
    chunk_bounds,
    local_metadata,
    undo_transforms,
)
from dynamiq.collectives.prepare import prepare_codecs
from dynamiq.collectives.simulator import SimulationResult, check_inputs, normalized_bits
from dynamiq.kernels.backend import resolve_backend
from dynamiq.metadata import combine
from dynamiq.pipeline import Pipeline, get_pipeline

__all__ = ["Trees", "simulate_batched"]


@dataclass
class Trees:
    """Every chunk's aggregation tree as ``[chunks, ranks]`` arrays, from the reduce steps.

    Attributes:
        children: int32, incoming reduce messages of each rank per chunk.
        sizes: int32, contributions in what each rank sends (or, as the owner, holds): its
            subtree size (:meth:`Schedule.subtree_sizes
            <dynamiq.topologies.Schedule.subtree_sizes>`).
        heights: int32, 0 for a leaf, else one more than its highest child
            (:meth:`Schedule.heights <dynamiq.topologies.Schedule.heights>`).
        sends: bool, whether each rank sends a reduce message of each chunk.
        gathers: int64 ``[chunks]``, all-gather transfers of each chunk.
        steps: Number of step arrays (phases of steps) the schedule has.
    """

    children: np.ndarray
    sizes: np.ndarray
    heights: np.ndarray
    sends: np.ndarray
    gathers: np.ndarray
    steps: int = 0

    @classmethod
    def of(cls, steps: Any, chunks: int, world_size: int) -> Trees:
        """The trees of the step arrays ``steps`` (an iterable of
        :class:`~dynamiq.topologies.arrays.StepArrays`).

        Raises:
            ValueError: a rank receives two messages of one chunk in one step (their order of
                addition would be undefined here), or sends a chunk twice.
        """
        shape = (chunks, world_size)
        t = cls(np.zeros(shape, np.int32), np.ones(shape, np.int32), np.zeros(shape, np.int32),
                np.zeros(shape, bool), np.zeros(chunks, np.int64))
        for sa in steps:
            t.steps += 1
            c, src, dst = sa.chunk, sa.src, sa.dst
            if sa.phase == "gather":
                t.gathers += np.bincount(c, minlength=chunks)
                continue
            key = c * world_size + dst
            if np.unique(key).size != key.size:
                raise ValueError(f"step {sa.step}: a rank receives two messages of one chunk")
            if t.sends[c, src].any():
                raise ValueError(f"step {sa.step}: a rank sends a chunk a second time")
            t.sizes[c, dst] += t.sizes[c, src]
            t.heights[c, dst] = np.maximum(t.heights[c, dst], t.heights[c, src] + 1)
            t.children[c, dst] += 1
            t.sends[c, src] = True
        return t

    def hop_profile(self, owners: np.ndarray, weights: tuple[float, ...]
                    ) -> tuple[tuple[int, float, float], ...]:
        """:meth:`Schedule.hop_profile <dynamiq.topologies.Schedule.hop_profile>` of these
        trees (the same numbers)."""
        n = self.sizes.shape[1]
        live = [c for c, w in enumerate(weights) if w > 0]
        if not live:
            return ()
        coded = np.zeros((len(live), n + 1), np.int64)
        sent = np.zeros((len(live), n + 1), np.int64)
        for i, c in enumerate(live):
            s = self.sizes[c][self.sends[c]]
            coded[i] = np.bincount(s, minlength=n + 1)
            sent[i] = coded[i]
            own = int(self.sizes[c, owners[c]])
            coded[i, own] += 1
            sent[i, own] += int(self.gathers[c])
        if (coded == coded[0]).all() and (sent == sent[0]).all():
            keys = np.flatnonzero(coded[0])
            return tuple((int(s), float(coded[0, s]), float(sent[0, s])) for s in keys)
        w = [weights[c] for c in live]
        total = sum(w)
        keys = np.flatnonzero(coded.any(0))
        out = []
        for s in keys.tolist():
            a = sum(wi * float(coded[i, s]) for i, wi in enumerate(w)) / total
            b = sum(wi * float(sent[i, s]) for i, wi in enumerate(w)) / total
            out.append((s, a, b))
        return tuple(out)

    def compression_factors(self, weights: tuple[float, ...]) -> tuple[float, float]:
        """:meth:`Schedule.compression_factors
        <dynamiq.topologies.Schedule.compression_factors>` of these trees (the same numbers,
        summed in the same order)."""
        n = self.sizes.shape[1]
        ind = eq = total = 0.0
        for c, w in enumerate(weights):
            if w <= 0:
                continue
            s = self.sizes[c].astype(np.int64)
            ind += w * int(s.sum()) / n
            eq += w * int((s * s).sum()) / (n * n)
            total += w
        return (ind / total, eq / total) if total > 0 else (1.0, 1.0)


@dataclass
class _Call:
    """What the transforms' helpers of :mod:`~dynamiq.collectives.engine` read of a plan."""

    pipeline: Pipeline
    world_size: int
    call: int
    backend: str
    raw_stats: dict | None = None
    stats: dict | None = None
    prepared: dict | None = None


def _flat_index(ranks: np.ndarray, chunks: np.ndarray, lo: np.ndarray, size: np.ndarray,
                length: int) -> torch.Tensor:
    """int64 indices into the flattened ``[ranks, length]`` accumulators of the coordinates of
    ``chunks[i]`` on ``ranks[i]``, row after row."""
    return torch.from_numpy(ragged_arange(ranks * length + lo[chunks], size[chunks]))


#: Coordinates a step moves at once, about: a step with more (a butterfly's first steps move half
#: the vector of every rank) runs in pieces, which bounds the memory of its indices and values.
PIECE = 1 << 22


def _pieces(sizes: np.ndarray) -> list[slice]:
    """Consecutive runs of transfers, each starting within one :data:`PIECE` of the step's
    coordinates (so at most ``PIECE`` plus one transfer's coordinates)."""
    if sizes.size == 0:
        return []
    start = np.cumsum(sizes) - sizes
    group = start // PIECE
    edges = [0, *(np.flatnonzero(group[1:] != group[:-1]) + 1).tolist(), sizes.size]
    return [slice(a, b) for a, b in itertools.pairwise(edges)]


def simulate_batched(
    pipeline: str | Pipeline,
    inputs: torch.Tensor | list[torch.Tensor],
    *,
    op: str = "sum",
    call: int = 0,
    state: dict | None = None,
    backend: str = "auto",
    inplace: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> SimulationResult:
    """:func:`~dynamiq.collectives.simulator.simulate`, one schedule step at a time.

    Args:
        pipeline: Pipeline, registered name or spec string: one codec on every link (no
            per-level codecs), none that rounds a rank's own values before the hops (THC's
            levels).
        inputs: ``[world_size, d]`` (or a list of ``world_size`` equal-shaped tensors).
        op, call, state, backend: As for :func:`~dynamiq.collectives.simulator.simulate`.
        inplace: Use ``inputs`` (a contiguous float32 ``[world_size, d]`` tensor) as the
            accumulators instead of a copy: it is overwritten, which halves the memory of a
            large simulation.
        progress: Called as ``progress(done, steps)`` after every step.

    Returns:
        A :class:`~dynamiq.collectives.simulator.SimulationResult` equal to ``simulate``'s bit
        for bit, except that ``results`` is one row viewed ``world_size`` times (every rank's
        result is identical) and ``hop_vnmse`` is empty (no per-message tracking).

    Raises:
        ValueError: The pipeline has per-level codecs or rounds own values, an argument is
            out of range, or the topology's schedule is not one a batch can run (a rank
            receiving two messages of one chunk in one step).
    """
    t0 = time.perf_counter()
    p = get_pipeline(pipeline)
    if op not in ("sum", "avg"):
        raise ValueError(f"op must be 'sum' or 'avg', got {op!r}")
    codec = p.codec
    if len(p.codecs) != 1:
        raise ValueError("simulate_batched runs pipelines with one codec on every link; use "
                         "simulate for per-level codecs")
    if codec.rounds_own:
        raise ValueError(f"{codec.spec()} rounds every rank's own values before the hops; "
                         "use simulate")
    x = check_inputs(inputs)
    resolve_backend(backend, x.device)
    n, d = x.shape
    p.topology.check_world_size(n)
    if inplace:
        if x.dtype != torch.float32 or not x.is_contiguous() or x is not inputs:
            raise ValueError("inplace needs a contiguous float32 [world_size, d] tensor")
        acc = x
    else:
        acc = x.float().clone()
    exact = torch.zeros(d, dtype=torch.float64, device=x.device)
    for r0 in range(0, n, 64):
        exact += acc[r0:r0 + 64].double().sum(0)
    if op == "avg":
        exact = exact / n
    if n == 1:
        res = acc.clone()
        return SimulationResult(res, exact, 0.0, [], [0], [0.0], time.perf_counter() - t0)
    states = {} if state is None else state
    lengths = [d]
    if any(not getattr(t, "statistics", ()) for t in p.transforms):
        rows = []
        for r in range(n):
            y, lengths = apply_transforms(p, acc[r].clone(), call, backend)
            rows.append(y)
        acc = torch.stack(rows)
        del rows
    length = acc.shape[1]
    info = _Call(p, n, call, backend)
    metas = [local_metadata(p, acc[r], states, backend) for r in range(n)]
    info.raw_stats = combine([m for m, _ in metas], metas[0][1])
    del metas
    chunking = p.topology.chunking(n)
    owners, weights = chunking.owners, chunking.weights
    nchunks = len(weights)
    trees = Trees.of(p.topology.step_arrays(n), nchunks, n)
    info.stats, info.prepared = prepare_codecs(
        p, info.raw_stats, length, n, states,
        lambda: trees.compression_factors(weights), lambda: trees.hop_profile(owners, weights))
    for r in range(n):
        y = center_and_prepare(info, acc[r])  # type: ignore[arg-type]
        if y is not acc[r]:
            acc[r].copy_(y)
    bounds = np.array(chunk_bounds(weights, length, p.block_size), dtype=np.int64)
    lo, size = bounds[:, 0], bounds[:, 1] - bounds[:, 0]
    flat = acc.view(-1)
    sent = np.zeros(n, np.int64)
    final = np.zeros(nchunks, np.int64)
    remaining = trees.children.copy()

    def roundtrip(ranks: np.ndarray, chunks: np.ndarray) -> np.ndarray:
        idx = _flat_index(ranks, chunks, lo, size, length).to(flat.device)
        vals = flat[idx]
        batch = HopBatch((call, chunks, trees.heights[chunks, ranks].astype(np.int64)),
                         ranks, lo[chunks], size[chunks],
                         trees.sizes[chunks, ranks].astype(np.int64), n, info.stats,
                         info.prepared, backend)
        nbytes = codec.roundtrip_batch(vals, batch)
        flat[idx] = vals
        return nbytes

    def reduce(src: np.ndarray, dst: np.ndarray, c: np.ndarray) -> None:
        """One piece of a reduce step: leaves compress as they send, receivers add, and a
        receiver whose last message this was compresses its partial sum."""
        leaf = trees.children[c, src] == 0
        if leaf.any():
            # a leaf compresses its own values as it sends them
            np.add.at(sent, src[leaf], roundtrip(src[leaf], c[leaf]))
        into = _flat_index(dst, c, lo, size, length).to(flat.device)
        flat[into] += flat[_flat_index(src, c, lo, size, length).to(flat.device)]
        remaining[c, dst] -= 1
        done = remaining[c, dst] == 0
        if done.any():
            # the last incoming message: the rank compresses its partial sum (the owner
            # keeps what every receiver will decode)
            r, ch = dst[done], c[done]
            nb = roundtrip(r, ch)
            own = owners[ch] == r
            final[ch[own]] = nb[own]
            np.add.at(sent, r[~own], nb[~own])

    for k, sa in enumerate(p.topology.step_arrays(n)):
        live = size[sa.chunk] > 0
        src, dst, c = sa.src[live], sa.dst[live], sa.chunk[live]
        if sa.phase == "gather":
            np.add.at(sent, src, final[c])
        else:
            for part in _pieces(size[c]):
                reduce(src[part], dst[part], c[part])
        if progress:
            progress(k + 1, trees.steps)
    keep = size > 0
    idx = _flat_index(owners[keep], np.flatnonzero(keep), lo, size, length).to(flat.device)
    res = flat[idx]
    y = undo_transforms(info, res, lengths, states)[:d]  # type: ignore[arg-type]
    if op == "avg":
        y = y / n
    vn = float(((y.double() - exact) ** 2).sum() / (exact**2).sum().clamp_min(1e-300))
    bytes_sent = sent.tolist()
    mbits = p.metadata_bits(length)
    return SimulationResult(y.expand(n, d), exact, vn, [], bytes_sent,
                            [8 * b / d for b in bytes_sent], time.perf_counter() - t0,
                            info.stats if p.statistics else None, mbits,
                            normalized_bits(bytes_sent, mbits, d))
