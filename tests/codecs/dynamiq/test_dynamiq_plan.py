"""The width plan and the per-chunk message layout (``dynamiq.codecs.dynamiq.plan``).

What is checked:

* the plan: positions in the whole vector's stable order by option, the width histogram;
* the layout: the BF16 segment first (even byte offset), the others by option, a partial last
  super-group paying for its groups only; the rows each segment occupies in the chunk;
* wire accounting: a chunk's message is the sum of its width segments, and every rank's
  ``bytes_sent`` is the sum of its sends' ``wire_bytes``;
* tiles: a chunk coded as tiles decodes like the whole chunk (the ``block_size`` contract).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _dynamiq_data import SG, gradients, same, segment_bytes

from dynamiq import simulate
from dynamiq.codecs import HopContext
from dynamiq.codecs.dynamiq import DynamiQ, WidthPlan
from dynamiq.codecs.dynamiq.plan import chunk_layout
from dynamiq.collectives.engine import chunk_bounds
from dynamiq.pipeline import get_pipeline


# ---- the plan and the layout ----------------------------------------------------------------
def test_plan_positions_and_histogram():
    plan = WidthPlan(np.array([2, 0, 1, 0, 2], dtype=np.int64), (2, 4, 16), 0.0, 0.0)
    # stable order by option: sg 1, 3 (option 0), 2 (option 1), 0, 4 (option 2)
    assert plan.position.tolist() == [3, 0, 2, 1, 4]
    assert plan.histogram() == {2: 0.4, 4: 0.2, 16: 0.4}
    two_sizes = WidthPlan(np.array([0, 1, 1, 3], dtype=np.int64), (2, 2, 4, 4), 0.0, 0.0)
    assert two_sizes.histogram() == {2: 0.75, 4: 0.25}


def test_layout_puts_bf16_first_and_cuts_the_partial_super_group():
    codec = DynamiQ(widths=(3, 16), group_size=32, bits=8.0)  # 3 bits: odd segment sizes
    n = 3 * SG + 40
    choice = np.array([0, 1, 0, 1], dtype=np.int64)
    lay = chunk_layout(choice, np.array([0, 2, 1, 3]), n, codec.options)
    assert lay.order.tolist() == [0, 2, 1, 3]
    q = codec.quantizers[0]
    # (option, first reordered super-group, coordinates, bytes, random-number index)
    assert lay.segments == (
        (1, 2, SG + 40, 0, 2 * (SG + 40), 2 * SG),
        (0, 0, 2 * SG, 2 * (SG + 40), 2 * (SG + 40) + q.nbytes(2 * SG), 0),
    )
    assert lay.nbytes == segment_bytes(codec, choice, n)


@pytest.mark.parametrize("n", [4 * SG, 3 * SG + 7])
@pytest.mark.parametrize("block", [SG, 32])
def test_segment_rows_cover_the_chunk_once(n, block):
    """Each segment's rows are its super-groups in message order (expanded to the block size);
    together they cover every block of the chunk exactly once, a partial last block last."""
    codec = DynamiQ(widths=(2, 8), group_size=32)
    lay = chunk_layout(np.array([1, 0, 1, 0], dtype=np.int64), np.arange(4), n, codec.options)
    assert [r for r in (lay.rows(k, SG, torch.device("cpu")).tolist()
                        for k in range(len(lay.segments)))] == [[1, 3], [0, 2]]
    rows = [lay.rows(k, block, torch.device("cpu")) for k in range(len(lay.segments))]
    flat = torch.cat(rows)
    nblocks = -(-n // block)
    assert sorted(flat.tolist()) == list(range(nblocks))
    for k, r in enumerate(rows):
        coords = lay.segments[k][2]
        assert r.numel() == -(-coords // block)
        assert (r[:-1] < n // block).all()  # only a segment's last row may be partial
    assert lay.rows(0, block, torch.device("cpu")) is rows[0]  # cached


# ---- wire accounting -------------------------------------------------------------------------
@pytest.mark.parametrize(("n", "choice"), [
    (8 * SG, [0, 1, 2, 3, 0, 1, 2, 3]),
    (8 * SG, [3, 3, 0, 0, 2, 1, 1, 2]),
    (4 * SG + 77, [0, 1, 2, 1, 3]),  # the partial super-group is the widest
    (SG, [2]),
    (40, [0]),
])
def test_message_size_is_the_sum_of_its_segments(n, choice):
    codec = DynamiQ(widths=(2, 4, 8, 16), group_size=32)
    choice = np.array(choice, dtype=np.int64)
    offset = 3 * SG  # the chunk's place in a longer vector: the plan covers it
    full = np.concatenate([np.zeros(3, dtype=np.int64), choice])
    plan = WidthPlan(full, codec.width_list, 0.0, 0.0)
    ctx = HopContext(stream=(0, 1), rank=0, world_size=2, index_offset=offset,
                     prepared={codec: plan})
    want = segment_bytes(codec, choice, n)
    assert codec.wire_bytes(n, ctx) == want
    x = torch.randn(n)
    assert codec.compress(x, ctx).numel() == want
    assert codec.max_wire_bytes(n) >= want


def test_wire_bytes_needs_the_plan():
    codec = DynamiQ()
    with pytest.raises(ValueError, match="width plan"):
        codec.wire_bytes(SG, HopContext())
    # one width in one group size: no plan needed
    one = DynamiQ(widths=4, group_size=32)
    assert one.wire_bytes(SG) == one.quantizers[0].nbytes(SG)


def test_chunk_offset_must_fall_on_a_super_group():
    codec = DynamiQ()
    plan = WidthPlan(np.zeros(4, dtype=np.int64), codec.width_list, 0.0, 0.0)
    with pytest.raises(ValueError, match="not a multiple"):
        codec.wire_bytes(SG, HopContext(index_offset=SG // 2, prepared={codec: plan}))


@pytest.mark.parametrize(("topology", "n", "d"), [("ring", 4, 40 * SG), ("butterfly", 8, 9000),
                                                  ("ring", 3, 5000)])
def test_bytes_sent_is_the_sum_of_each_ranks_messages(topology, n, d):
    """Rebuild the call's widths from the reported statistics and add up ``wire_bytes`` of
    every chunk a rank sends (reduce and gather phases; empty chunks send nothing)."""
    p = get_pipeline(f"center+dynamiq(widths=(2,4,8,16),bits=6)@{topology}")
    res = simulate(p, gradients(n, d, seed=6))
    codec = p.codec
    sched = p.topology.schedule(n)
    plan = codec.prepare(res.stats, d, n, {}, hop_profile=sched.hop_profile())
    bounds = chunk_bounds(sched.chunk_weights, d, p.block_size)
    sent = [0] * n
    for t in sched.transfers:
        a, b = bounds[t.chunk]
        if b > a:
            # a message is coded under the plan of the partial sum it carries: the sender's
            # subtree in the reduce phase, the owner's whole sum in the gather phase
            coder = sched.owners[t.chunk] if t.phase == "gather" else t.src
            ctx = HopContext(index_offset=a, prepared={codec: plan},
                             summands=sched.subtree_sizes(t.chunk)[coder])
            sent[t.src] += codec.wire_bytes(b - a, ctx)
    assert res.bytes_sent == sent
    assert res.bits_per_coord == [8 * s / d for s in sent]


# ---- tiles -----------------------------------------------------------------------------------
def _whole_and_tiled(choice) -> tuple[torch.Tensor, torch.Tensor]:
    """A 4-super-group chunk decoded after coding it whole, and after coding it as two tiles of
    512 coordinates (what the P2P executor does with ``tile_elems=512``)."""
    codec = DynamiQ()
    x = torch.randn(4 * SG, generator=torch.Generator().manual_seed(0))
    plan = WidthPlan(np.array(choice, dtype=np.int64), codec.width_list, 0.0, 0.0)

    def decoded(offset: int, n: int) -> torch.Tensor:
        ctx = HopContext(stream=(7, 0), rank=0, world_size=4, index_offset=offset,
                         prepared={codec: plan})
        y = torch.empty(n)
        codec.decompress(codec.compress(x[offset:offset + n].contiguous(), ctx), y, ctx)
        return y

    return decoded(0, 4 * SG), torch.cat([decoded(0, 2 * SG), decoded(2 * SG, 2 * SG)])


@pytest.mark.parametrize("choice", [[0, 0, 2, 2], [1, 1, 1, 1]])
def test_tiles_code_like_the_whole_chunk_when_width_sorted(choice):
    """``block_size`` contract (codecs/base.py): chunk boundaries on multiples of it, "blocks
    are coded independently, so a chunk can be coded alone with the same result" — the P2P
    executor's tiles rely on it. Holds here because each tile's reorder keeps every
    super-group at its untiled position (same random-number indices)."""
    whole, tiled = _whole_and_tiled(choice)
    assert same(whole, tiled)


def test_tiles_code_like_the_whole_chunk():
    """Repro: widths [8, 2, 8, 2] over 4 super-groups; compress the whole chunk vs two tiles of
    512 (index_offset 0 and 512): super-groups 0 and 3 decode differently."""
    whole, tiled = _whole_and_tiled([2, 0, 2, 0])
    assert same(whole, tiled)
