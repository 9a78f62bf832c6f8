"""Human-readable views of a schedule: a one-line summary and a step-by-step table."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # only for annotations: schedule.py imports this module
    from dynamiq.topologies.schedule import Schedule

__all__ = ["schedule_summary", "schedule_text"]


def schedule_summary(s: Schedule) -> str:
    """One line: the schedule's name, ranks, chunks, steps, transfers and deepest tree.

    Equivalent to ``str(s)``, e.g. ``Schedule 'butterfly': 8 ranks, 8 chunks, 6 steps, 48
    transfers, max tree depth 3``. Assumes the parents form trees (see ``Schedule.validate``).
    """
    max_depth = max(s.depth(c) for c in range(s.num_chunks))
    return (
        f"Schedule {s.name!r}: {s.world_size} ranks, {s.num_chunks} chunks, "
        f"{s.steps()} steps, {len(s.transfers)} transfers, max tree depth {max_depth}"
    )


def schedule_text(s: Schedule) -> str:
    """A readable table: each step's messages, then each chunk's aggregation tree.

    The first line is :func:`schedule_summary`. A message line reads ``src->dst phase [level]:
    chunks`` (a step without transfers reads ``(idle)``); a tree line lists its edges
    ``child->parent`` ordered by the step in which they are used. Equivalent to ``s.to_text()``.
    """
    # step -> message (src, dst, phase, level) -> its chunks, in transfer order
    by_step: dict[int, dict[tuple[int, int, str, str], list[int]]] = {}
    for i, t in enumerate(s.transfers):
        level = s.levels[i] if s.levels else ""
        by_step.setdefault(t.step, {}).setdefault((t.src, t.dst, t.phase, level), []).append(
            t.chunk
        )
    lines = [schedule_summary(s), "steps:"]
    for step in range(s.steps()):
        messages = by_step.get(step)
        if not messages:
            lines.append(f"  step {step}: (idle)")
            continue
        lines.append(f"  step {step}:")
        for (src, dst, phase, level), chunks in messages.items():
            tag = f" [{level}]" if level else ""
            lines.append(f"    {src}->{dst} {phase}{tag}: {', '.join(map(str, chunks))}")
    sends = {(t.chunk, t.src): t.step for t in s.transfers if t.phase == "reduce"}
    lines.append("trees (child->parent, in reduce order):")
    for c in range(s.num_chunks):
        edges = sorted((sends.get((c, r), -1), r, p) for r, p in enumerate(s.parents[c]) if p >= 0)
        body = " ".join(f"{r}->{p}" for _, r, p in edges) or "(single rank)"
        lines.append(
            f"  chunk {c} (owner {s.owners[c]}, weight {s.chunk_weights[c]:.6g}, "
            f"depth {s.depth(c)}): {body}"
        )
    return "\n".join(lines)
