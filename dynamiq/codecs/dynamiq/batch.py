"""The DynamiQ round trip of a whole batch of compressions: one kernel pair per option.

A chunk's message codes each of its super-groups under the option its hop's plan gives it
(:mod:`~dynamiq.codecs.dynamiq.plan`), with random numbers keyed by the compressing rank,
the chunk's stream and the super-group's place in the plan's stable order. Every one of those
is a per-block key (:class:`~dynamiq.kernels.BlockKeys`), so the super-groups of one option
from every row of a :class:`~dynamiq.codecs.batch.HopBatch` are coded by one
:meth:`~dynamiq.quantizers.BlockQuantizer.roundtrip_blocks` call, whatever chunk and rank
they come from; BF16 super-groups are cast in one pass. Rows whose chunk ends in a partial
super-group (at most the vector's last chunk) take the per-message path.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from dynamiq.codecs.base import PartialSumCodec
from dynamiq.codecs.batch import HopBatch, ragged_arange, split_unaligned
from dynamiq.codecs.dynamiq.segments import _BF16, _on
from dynamiq.kernels import Backend, backend_for
from dynamiq.metadata import SUPER_GROUP
from dynamiq.quantizers import BlockQuantizer

if TYPE_CHECKING:
    from dynamiq.codecs.dynamiq.codec import DynamiQ

__all__ = ["roundtrip_batch"]


def roundtrip_batch(codec: DynamiQ, values: torch.Tensor, batch: HopBatch) -> np.ndarray:
    """:meth:`DynamiQ.roundtrip_batch <dynamiq.codecs.DynamiQ.roundtrip_batch>`."""
    batch.check(values)
    split = split_unaligned(values, batch, SUPER_GROUP,
                            lambda v, b: roundtrip_batch(codec, v, b),
                            lambda v, b: PartialSumCodec.roundtrip_batch(codec, v, b))
    if split is not None:
        return split
    nbytes = np.zeros(len(batch), dtype=np.int64)
    rows = np.flatnonzero(batch.sizes > 0)
    if rows.size == 0:
        return nbytes
    if batch.prepared is None or codec not in batch.prepared:
        raise ValueError("the dynamiq codec needs the call's width plan in the batch")
    full = batch.prepared[codec]
    be = backend_for(batch.backend, values)
    cols = batch.stream_columns()
    if codec.rounding == "path" and cols:
        cols[-1] = 0  # the whole tree shares one stream (see DynamiQ._stream)
    row_keys = None  # every row's keys, folded once (the same for every option)
    option_bytes = np.array([o.nbytes(SUPER_GROUP) for o in codec.options], dtype=np.int64)
    for s in np.unique(batch.summands[rows]).tolist():
        sel = rows[batch.summands[rows] == s]
        plan = full.for_summands(int(s))
        per_row = batch.sizes[sel] // SUPER_GROUP
        row_of = np.repeat(sel, per_row)
        first = ragged_arange(batch.offsets[sel] // SUPER_GROUP, per_row)
        flat = ragged_arange(batch.starts[sel] // SUPER_GROUP, per_row)
        choice = plan.choice[first]
        nbytes += np.bincount(row_of, weights=option_bytes[choice],
                              minlength=len(batch)).astype(np.int64)
        for o in np.unique(choice).tolist():
            m = choice == o
            q = codec.quantizer_for(o, plan)
            if q is None:
                _bf16_blocks(values, torch.from_numpy(flat[m]).to(values.device), be)
                continue
            per = SUPER_GROUP // q.block_size
            sub = np.arange(per, dtype=np.int64)
            blocks = (flat[m][:, None] * per + sub).reshape(-1)
            offsets = (plan.position[first[m]][:, None] * SUPER_GROUP
                       + sub * q.block_size).reshape(-1)
            if row_keys is None:
                row_keys = BlockQuantizer.block_keys(codec.seed, tuple(cols), batch.ranks,
                                                     batch.world_size,
                                                     np.zeros(len(batch), np.int64))
            keys = row_keys.take(np.repeat(row_of[m], per), offsets)
            q.roundtrip_blocks(values, torch.from_numpy(blocks).to(values.device), keys,
                               backend=batch.backend)
    return nbytes


def _bf16_blocks(values: torch.Tensor, sgs: torch.Tensor, be: Backend) -> None:
    """BF16 round trip of the super-groups ``sgs`` of ``values``, in place."""
    dense = be.gather_rows(values, sgs, SUPER_GROUP)
    data = _BF16.compress(dense, _on(be.name))
    _BF16.decompress(data, dense, _on(be.name))
    be.scatter_rows(dense, sgs, values, False, SUPER_GROUP)
