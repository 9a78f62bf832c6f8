"""A binary-tree all-reduce: sum up a binary tree rooted at rank 0, then broadcast back down.

Importing this module registers the topology as ``binary_tree``, so that spec strings such as
``passthrough(wire=fp32)@binary_tree`` can name it.
"""

from __future__ import annotations

from dataclasses import dataclass

from dynamiq.topologies import TOPOLOGIES, Schedule, Topology, Transfer


def _depth(rank: int) -> int:
    """Depth of ``rank`` in the tree; ranks are numbered as in a binary heap."""
    return (rank + 1).bit_length() - 1


@TOPOLOGIES.register("binary_tree")
@dataclass(frozen=True)
class BinaryTree(Topology):
    """Reduce the whole vector up a binary tree rooted at rank 0, then broadcast it down.

    Rank ``r``'s parent is ``(r - 1) // 2``, so the tree has depth ``floor(log2 n)``: every
    partial sum is re-encoded at most that many times. The vector is one chunk owned by rank 0.
    Under the single-port model two siblings cannot both send to their parent in one step, so
    the left child (odd rank) goes first and the right one follows a step later; on the way
    down a parent serves its left child, then its right child. Any ``n >= 1`` ranks; at most
    ``4 floor(log2 n)`` steps, and an inner rank sends the whole vector up to three times.
    """

    def _build(self, world_size: int) -> Schedule:
        n = world_size
        bottom = _depth(n - 1)
        right = [r > 0 and r % 2 == 0 for r in range(n)]
        # Reduce: the deepest ranks send first, two steps per level of the tree.
        up = [2 * (bottom - _depth(r)) + right[r] for r in range(n)]
        start = max(up[1:], default=-1) + 1  # the broadcast begins once rank 0 has the sum
        # Broadcast: two steps per level again, from the top down.
        down = [start + 2 * (_depth(r) - 1) + right[r] for r in range(n)]
        transfers = [Transfer(up[r], r, (r - 1) // 2, 0, "reduce") for r in range(1, n)]
        transfers += [Transfer(down[r], (r - 1) // 2, r, 0, "gather") for r in range(1, n)]
        parents = tuple(-1 if r == 0 else (r - 1) // 2 for r in range(n))
        empty = Schedule(
            world_size=n,
            num_chunks=1,
            owners=(0,),
            parents=(parents,),
            chunk_weights=(1.0,),
            transfers=(),
            name=self.spec(),
        )
        return empty.with_transfers(transfers)  # sorts them into the canonical order
