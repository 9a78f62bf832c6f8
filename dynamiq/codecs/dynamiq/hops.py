"""Per-hop width plans: one allocation over every (super-group, hop) pair (docs/method.rst).

Along a reduce tree every rank compresses a chunk once: a leaf its own values, an internal rank
a partial sum of ``s`` contributions, the owner the whole sum, whose bytes every all-gather
transfer then carries. Each compression adds its own error to the result, and that error grows
with what it codes: a partial sum of ``s`` contributions carries about ``s`` times one rank's
energy (independent gradients). So the same width is worth more late in the tree than early,
and the owner's compression, sent ``n − 1`` times in a ring, costs as much as all the reduce
messages together.

:func:`hop_plans` gives every hop position ``s`` its own option per super-group: super-group
``j`` at position ``s`` is an item of energy ``E_j · coded_s · s`` and cost
``sent_s · c(w)`` (the schedule's :meth:`~dynamiq.topologies.Schedule.hop_profile`), all
allocated at once by :func:`~dynamiq.codecs.allocation.allocate` under the budget of every
transfer together. On a ring of 8 the reduce messages then grow from narrow to wide along the
chain and the owner's message stays narrow; the modelled error falls by about a quarter at the
same bits.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

import numpy as np

from dynamiq.codecs.allocation import WidthOption, allocate, remembered
from dynamiq.codecs.dynamiq.plan import WidthPlan

__all__ = ["hop_plans", "ring_profile"]

#: Stacked per-hop costs of recent keys (a few: one per tensor size and schedule).
_COSTS: OrderedDict[Hashable, np.ndarray] = OrderedDict()
_COSTS_KEPT = 8


def ring_profile(world_size: int) -> tuple[tuple[int, float, float], ...]:
    """:meth:`~dynamiq.topologies.Schedule.hop_profile` of a ring of ``world_size`` ranks, what a
    codec assumes when it is prepared outside an executor that passes its schedule's."""
    n = max(1, int(world_size))
    if n == 1:
        return ()
    return (*tuple((s, 1.0, 1.0) for s in range(1, n)), (n, 1.0, float(n - 1)))


def hop_plans(energy: np.ndarray, options: list[WidthOption], budget: float,
              costs: np.ndarray, profile: tuple[tuple[int, float, float], ...],
              widths: tuple[int, ...], state: dict, cost_key: Hashable | None = None
              ) -> WidthPlan:
    """The per-hop allocation of ``budget`` bits per transfer.

    Args:
        energy: float64 ``[m]``, every super-group's global energy.
        options: The allocator's options (model error and cost).
        budget: Bits one transfer of the whole vector may carry (metadata excluded).
        costs: float64 ``[m, options]``, the options' wire bits per super-group.
        profile: The schedule's ``(s, coded, sent)`` triples (at least one).
        widths: The width of every option (the plans' labels).
        state: Per-tensor state, passed to the allocation.
        cost_key: A hashable naming ``costs`` (see :func:`~dynamiq.codecs.allocation.allocate`),
            extended here by the profile.

    Returns:
        A :class:`WidthPlan` whose :attr:`~WidthPlan.hops` hold the plan of every ``s``; its
        own ``choice`` is the largest ``s``'s (the owner's), its ``used_bits`` the bits per
        transfer averaged over all of them (``≤ budget``).
    """
    m = energy.size
    sent_total = sum(k for _, _, k in profile)
    e = np.concatenate([energy * (coded * s) for s, coded, _ in profile])
    key = None if cost_key is None else ("hops", cost_key, profile)

    def stacked() -> np.ndarray:
        # every hop's costs: as large as the vector's float32 bytes times the options, and the
        # same on every call of one key, so built once per key (read-only: calls share it)
        out = np.concatenate([costs * sent for _, _, sent in profile])
        out.flags.writeable = False
        return out

    c = stacked() if key is None else remembered(_COSTS, key, stacked, _COSTS_KEPT)
    choice = allocate(e, options, budget * sent_total, state, c, key)
    hops: dict[int, WidthPlan] = {}
    spent = 0.0
    for i, (s, _, sent) in enumerate(profile):
        ch = choice[i * m:(i + 1) * m]
        used = float(np.take_along_axis(costs, ch[:, None], 1).sum())
        hops[s] = WidthPlan(ch, widths, budget, used)
        spent += sent * used
    top = hops[profile[-1][0]]
    return WidthPlan(top.choice, widths, budget, spent / sent_total, hops=hops)
