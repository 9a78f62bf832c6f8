"""The derived views of ``dynamiq bench nmse``: budget to match a reference, bias, targets.

* :func:`bits_to_match`: the budget at which DynamiQ's measured sweep reaches a reference
  method's vNMSE, interpolated linearly in ``log vNMSE`` between the two sweep points around it.
* :func:`bias_ratio`: the vNMSE of the mean of ``K`` independent calls relative to ``vNMSE / K``.
  An unbiased method's errors average out (ratio 1 up to sampling noise); a bias stays, so the
  ratio grows towards ``K · bias² / vNMSE``.
* :func:`target_pipeline`: a DynamiQ method in its accuracy-targeted mode.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence

from dynamiq.codecs import DynamiQ
from dynamiq.collectives.simulator import simulate
from dynamiq.pipeline import Pipeline

__all__ = ["bias_ratio", "bits_to_match", "target_pipeline", "vnmse_at"]


def _points(sweep: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    return sorted((b, v) for b, v in sweep if math.isfinite(b) and v > 0 and math.isfinite(v))


def bits_to_match(sweep: Sequence[tuple[float, float]], reference: float) -> float | None:
    """The budget at which the sweep's vNMSE falls to ``reference``.

    Args:
        sweep: ``(bits, vNMSE)`` of the measured budget sweep (any order).
        reference: The vNMSE to match (e.g. MXFP8's).

    Returns:
        The bits where the piecewise log-linear interpolation of the sweep first reaches
        ``reference`` (the smallest budget of the sweep if it already does there); ``None``
        when no budget of the sweep reaches it (the sweep ends above it) or the sweep is empty.
    """
    pts = _points(sweep)
    if not pts or not (reference > 0 and math.isfinite(reference)):
        return None
    if pts[0][1] <= reference:
        return pts[0][0]
    for (b0, v0), (b1, v1) in itertools.pairwise(pts):
        if v1 <= reference < v0:
            t = (math.log(v0) - math.log(reference)) / (math.log(v0) - math.log(v1))
            return b0 + t * (b1 - b0)
    return None


def vnmse_at(sweep: Sequence[tuple[float, float]], bits: float) -> float | None:
    """The sweep's vNMSE at ``bits`` (log-linear interpolation; ``None`` outside the sweep)."""
    pts = _points(sweep)
    for (b0, v0), (b1, v1) in itertools.pairwise(pts):
        if b0 <= bits <= b1:
            t = 0.0 if b1 == b0 else (bits - b0) / (b1 - b0)
            return math.exp(math.log(v0) + t * (math.log(v1) - math.log(v0)))
    if pts and abs(pts[-1][0] - bits) < 1e-9:
        return pts[-1][1]
    return None


def bias_ratio(pipeline: Pipeline, sets: Sequence, calls: int, *, first_call: int = 1000,
               backend: str = "auto") -> float:
    """``vNMSE(mean of calls) / (mean vNMSE / calls)``, averaged over the gradient sets.

    Each of the ``calls`` calls draws fresh random numbers (call counters ``first_call``,
    ``first_call + 1``, …) on the same gradients; codec state starts afresh on every set, and
    one unmeasured call settles adaptive codecs first.

    Args:
        pipeline: The method.
        sets: :class:`~dynamiq.bench.workloads.GradientSet` objects (``grads`` ``[n, d]``).
        calls: ``K >= 2``.
        first_call: Call counter of the first measured call.
        backend: Kernel backend of the simulation (``"reference"``: no kernel to compile,
            the same bits).

    Returns:
        About 1 for an unbiased method (its ``K`` errors are independent, so their mean has
        ``1/K`` of the error); larger by ``K · ‖bias‖² / error`` for a biased one.

    Raises:
        ValueError: ``calls < 2``.
    """
    if calls < 2:
        raise ValueError(f"bias needs at least 2 calls, got {calls}")
    ratios = []
    for gs in sets:
        state: dict = {}
        simulate(pipeline, gs.grads, call=first_call - 1, state=state, track_hops=False,
                 backend=backend)
        total = None
        single = 0.0
        exact = None
        for k in range(calls):
            r = simulate(pipeline, gs.grads, call=first_call + k, state=state, track_hops=False,
                         backend=backend)
            got = r.results[0].double()
            total = got if total is None else total + got
            single += r.vnmse
            exact = r.exact
        mean = total / calls
        norm = float((exact * exact).sum())
        if norm <= 0 or single <= 0:
            continue
        ratios.append(float(((mean - exact) ** 2).sum()) / norm / (single / calls / calls))
    return sum(ratios) / len(ratios) if ratios else float("nan")


def target_pipeline(pipeline: Pipeline, target: float | str) -> Pipeline:
    """``pipeline`` with its DynamiQ codec in the accuracy-targeted mode ``target``.

    Raises:
        ValueError: the pipeline's codec is not a DynamiQ codec with several options.
    """
    c = pipeline.codec
    if not (isinstance(c, DynamiQ) and c.variable):
        raise ValueError(f"a target needs a DynamiQ codec with variable widths, not {c.spec()}")
    return dataclasses.replace(pipeline, codec=dataclasses.replace(c, target=target))
