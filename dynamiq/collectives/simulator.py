"""In-process simulator: n virtual ranks run a pipeline's schedule in one process.

It runs exactly the per-rank logic of :mod:`dynamiq.collectives.engine` (so its results equal
a distributed run's bit for bit, given the same seeds and call counter) and additionally reports
the exact error after every step and the bytes each rank sent. One shortcut: the all-gather's
bytes are the owner's, and every rank decodes them to the same values, so each chunk's are
decoded by its first receiver and copied to the others (every message is still sent and
counted). On the P2P executor every rank decodes them; its tests check that all ranks agree.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from dynamiq.collectives.engine import (
    Plan,
    RankState,
    apply_transforms,
    center_and_prepare,
    local_metadata,
    undo_transforms,
)
from dynamiq.kernels.backend import resolve_backend
from dynamiq.metadata import combine
from dynamiq.pipeline import Pipeline, get_pipeline

__all__ = ["SimulationResult", "normalized_bits", "simulate"]


@dataclass
class SimulationResult:
    """What :func:`simulate` measured.

    Attributes:
        results: float32[n, d], every rank's all-reduced vector.
        exact: float64[d], the exact sum (or mean).
        vnmse: ``‖results[0] − exact‖² / ‖exact‖²``.
        hop_vnmse: Per reduce step: ``Σ‖decoded message − exact partial sum‖² / Σ‖exact‖²``
            over the messages sent in that step (empty unless ``track_hops``).
        bytes_sent: Bytes each rank put on the wire.
        bits_per_coord: ``8 * bytes_sent / d`` per rank.
        seconds: Wall time of the simulation.
        stats: Global per-block statistics of the metadata phase as the codecs saw them
            (``None`` unless the pipeline's components declare some).
        metadata_bits: Bits each rank contributes to the metadata phase.
        bits: The average budget ``b̄`` in bits per coordinate, metadata included, as the
            method page counts it (docs/method.rst): a throughput-optimal all-reduce moves
            ``2(n−1)/n · b̄`` bits per coordinate per rank, so
            ``b̄ = (8·mean(bytes_sent) / (2(n−1)/n) + metadata_bits) / d``.
    """

    results: torch.Tensor
    exact: torch.Tensor
    vnmse: float
    hop_vnmse: list[float] = field(default_factory=list)
    bytes_sent: list[int] = field(default_factory=list)
    bits_per_coord: list[float] = field(default_factory=list)
    seconds: float = 0.0
    stats: dict[str, torch.Tensor] | None = None
    metadata_bits: int = 0
    bits: float = 0.0


def normalized_bits(bytes_sent: list[int], metadata_bits: int, d: int) -> float:
    """``b̄`` from the bytes each of ``n`` ranks sent and the metadata bits per rank."""
    n = len(bytes_sent)
    if n < 2:
        return 0.0
    mean = sum(bytes_sent) / n
    return (8.0 * mean / (2.0 * (n - 1) / n) + metadata_bits) / d


def check_inputs(inputs: torch.Tensor | list[torch.Tensor]) -> torch.Tensor:
    """``inputs`` as one ``[world_size, d]`` floating-point tensor (a list of equal-shaped
    tensors is stacked); a clear error for anything else."""
    if isinstance(inputs, (list, tuple)):
        if not inputs:
            raise ValueError("need at least one rank's input")
        shapes = {tuple(t.shape) for t in inputs}
        if len(shapes) != 1:
            raise ValueError(f"all ranks must pass tensors of one shape, got {sorted(shapes)}")
        inputs = torch.stack([t.reshape(-1) for t in inputs])
    if not isinstance(inputs, torch.Tensor) or inputs.dim() != 2:
        raise ValueError("inputs must be a list of tensors or a [world_size, d] tensor")
    if inputs.shape[1] == 0:
        raise ValueError("cannot all-reduce empty tensors")
    if not inputs.dtype.is_floating_point:
        raise TypeError(f"expected floating-point inputs, got {inputs.dtype}")
    return inputs


def simulate(
    pipeline: str | Pipeline,
    inputs: torch.Tensor | list[torch.Tensor],
    *,
    op: str = "sum",
    call: int = 0,
    track_hops: bool | None = None,
    state: dict | None = None,
    backend: str = "auto",
) -> SimulationResult:
    """Run ``pipeline`` over ``world_size`` virtual ranks in this process.

    Args:
        pipeline: Pipeline, registered name or spec string.
        inputs: ``[world_size, d]`` tensor (or a list of ``world_size`` tensors of equal shape),
            rank ``r``'s contribution in row ``r``; converted to float32 as the P2P executor
            does.
        op: ``"sum"`` or ``"avg"``.
        call: Call counter (the distributed ``all_reduce`` counts its calls per pipeline and
            tensor size from 0; pass the same value to reproduce its bits).
        track_hops: Measure the error of every reduce message against the exact partial sum
            (costs an extra decode per message and float64 shadow sums). Default: when
            ``world_size * d <= 2**26``.
        state: Per-tensor codec state (warm starts, auto-scale factors) carried between
            calls: pass the same dict to successive calls on the same tensor, as the P2P
            executor keeps one per (group, pipeline, size). Default: a fresh one.
        backend: Kernel backend of the transforms, the metadata statistics and every hop:
            ``"auto"`` (Triton for CUDA inputs, Numba for CPU inputs), ``"numba"`` or
            ``"triton"`` (on CPU inputs only under ``TRITON_INTERPRET=1``); all give the same
            bits.

    Returns:
        A :class:`SimulationResult`. Equivalent to ``dynamiq.all_reduce`` on every rank.
    """
    t0 = time.perf_counter()
    p = get_pipeline(pipeline)
    if op not in ("sum", "avg"):
        raise ValueError(f"op must be 'sum' or 'avg', got {op!r}")
    x = check_inputs(inputs)
    resolve_backend(backend, x.device)  # a bad or unavailable backend fails here, clearly
    n, d = x.shape
    x32 = x.float()
    exact = x32.double().sum(0)
    if op == "avg":
        exact = exact / n
    if track_hops is None:
        track_hops = n * d <= 2**26
    p.topology.check_world_size(n)  # also at n == 1, as the P2P executor does
    if n == 1:
        res = x32.clone()
        return SimulationResult(res, exact, 0.0, [], [0], [0.0], time.perf_counter() - t0)
    states = {} if state is None else state
    ys, lengths = [], [d]
    for r in range(n):
        # accumulators: never the caller's memory
        y, lengths = apply_transforms(p, x32[r].clone(), call, backend)
        ys.append(y)
    length = ys[0].numel()
    plan = Plan(p, n, length, call, backend)
    metas = [local_metadata(p, y, states, backend) for y in ys]
    plan.set_metadata(combine([m for m, _ in metas], metas[0][1]), states)
    ys = [center_and_prepare(plan, y) for y in ys]
    # the shadow sums start from the ranks' own values before any codec rounds them
    shadow = [y.double() for y in ys] if track_hops else []
    ranks = [RankState(plan, r, ys[r]) for r in range(n)]
    hop = []
    gathered: dict[int, int] = {}  # chunk -> the first rank that decoded its all-gather bytes
    sched = plan.schedule
    for step in range(sched.steps()):
        ts = [t for t in sched.transfers_at(step) if plan.active(t)]
        msgs = [(t, ranks[t.src].message(t)) for t in ts]
        if track_hops:
            err = ref = 0.0
            for t, data in msgs:
                if t.phase != "reduce":
                    continue
                a, b = plan.bounds[t.chunk]
                dec = torch.empty(b - a, device=x32.device)
                plan.codec(t).decompress(data, dec, plan.context(t.src, t.chunk))
                true = shadow[t.src][a:b]
                err += float(((dec.double() - true) ** 2).sum())
                ref += float((true**2).sum())
                shadow[t.dst][a:b] += true
            if ref > 0:
                hop.append(err / ref)
        for t, data in msgs:
            first = gathered.get(t.chunk) if t.phase == "gather" else None
            if first is None:
                ranks[t.dst].receive(t, data)
                if t.phase == "gather":
                    gathered[t.chunk] = t.dst
            else:
                # the owner's bytes decode alike on every rank (the executors' invariant,
                # checked on the P2P executor): decoded once per chunk, copied to the others
                ranks[t.dst].receive_decoded(t, data, ranks[first].values(t.chunk))
    outs = []
    for r, rs in enumerate(ranks):
        # every rank's result is identical, so the codecs observe it once
        y = undo_transforms(plan, rs.acc, lengths, states if r == 0 else None)[:d]
        outs.append(y / n if op == "avg" else y)
    res = torch.stack(outs)
    vn = float(((res[0].double() - exact) ** 2).sum() / (exact**2).sum().clamp_min(1e-300))
    sent = [rs.bytes_sent for rs in ranks]
    mbits = p.metadata_bits(length)
    return SimulationResult(res, exact, vn, hop, sent, [8 * b / d for b in sent],
                            time.perf_counter() - t0, plan.stats if p.statistics else None,
                            mbits, normalized_bits(sent, mbits, d))
