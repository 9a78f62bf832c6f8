"""In-process simulator: n virtual ranks run a pipeline's schedule in one process.

It runs exactly the per-rank logic of :mod:`dynamiq.collectives.engine` (so its results equal
a distributed run's bit for bit, given the same seeds and call counter) and additionally reports
the exact error after every step and the bytes each rank sent.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from dynamiq.collectives.engine import Plan, RankState
from dynamiq.collectives.metadata import combine, local_statistics
from dynamiq.pipeline import Pipeline, get_pipeline

__all__ = ["SimulationResult", "simulate"]


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
        stats: Global per-super-group statistics of the metadata phase (``None`` unless the
            pipeline's components declare some).
    """

    results: torch.Tensor
    exact: torch.Tensor
    vnmse: float
    hop_vnmse: list[float] = field(default_factory=list)
    bytes_sent: list[int] = field(default_factory=list)
    bits_per_coord: list[float] = field(default_factory=list)
    seconds: float = 0.0
    stats: dict[str, torch.Tensor] | None = None


def _check_inputs(inputs: torch.Tensor | list[torch.Tensor]) -> torch.Tensor:
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

    Returns:
        A :class:`SimulationResult`. Equivalent to ``dynamiq.all_reduce`` on every rank.
    """
    t0 = time.perf_counter()
    p = get_pipeline(pipeline)
    if op not in ("sum", "avg"):
        raise ValueError(f"op must be 'sum' or 'avg', got {op!r}")
    x = _check_inputs(inputs)
    n, d = x.shape
    x32 = x.float()
    exact = x32.double().sum(0)
    if op == "avg":
        exact = exact / n
    if track_hops is None:
        track_hops = n * d <= 2**26
    if n == 1:
        res = x32.clone()
        return SimulationResult(res, exact, 0.0, [], [0], [0.0], time.perf_counter() - t0)
    ys = [x32[r].clone() for r in range(n)]  # accumulators: never the caller's memory
    lengths = [d]
    for t in p.transforms:
        ys = [t.forward(y, step=call) for y in ys]
        lengths.append(ys[0].numel())
    length = ys[0].numel()
    plan = Plan(p, n, length, call)
    if p.statistics:
        plan.stats = combine(p.statistics, [local_statistics(p.statistics, y) for y in ys])
    states = [RankState(plan, r, ys[r]) for r in range(n)]
    shadow = [y.double() for y in ys] if track_hops else []
    hop = []
    sched = plan.schedule
    for step in range(sched.steps()):
        ts = [t for t in sched.transfers_at(step) if plan.active(t)]
        msgs = [(t, states[t.src].message(t)) for t in ts]
        if track_hops:
            err = ref = 0.0
            for t, data in msgs:
                if t.phase != "reduce":
                    continue
                a, b = plan.bounds[t.chunk]
                dec = torch.empty(b - a)
                plan.codec(t).decompress(data, dec)
                true = shadow[t.src][a:b]
                err += float(((dec.double() - true) ** 2).sum())
                ref += float((true**2).sum())
                shadow[t.dst][a:b] += true
            if ref > 0:
                hop.append(err / ref)
        for t, data in msgs:
            states[t.dst].receive(t, data)
    outs = []
    for s in states:
        y = s.acc
        for k in reversed(range(len(p.transforms))):
            y = p.transforms[k].inverse(y, lengths[k], step=call)
        y = y[:d]
        outs.append(y / n if op == "avg" else y)
    res = torch.stack(outs)
    vn = float(((res[0].double() - exact) ** 2).sum() / (exact**2).sum().clamp_min(1e-300))
    sent = [s.bytes_sent for s in states]
    return SimulationResult(res, exact, vn, hop, sent, [8 * b / d for b in sent],
                            time.perf_counter() - t0, plan.stats)
