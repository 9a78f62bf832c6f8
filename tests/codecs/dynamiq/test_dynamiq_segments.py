"""The hop operations on one segment of a message (``dynamiq.codecs.dynamiq.segments``).

What is checked: width 16 is the ``passthrough(wire=bf16)`` codec's wire format (bytes, decoded
values, accumulators in every write-back mode, inside a message of several widths too); a
quantized segment is its option's block quantizer.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _dynamiq_data import SG, same

from dynamiq.codecs import HopContext, Passthrough
from dynamiq.codecs.dynamiq import DynamiQ, WidthPlan
from dynamiq.codecs.dynamiq.segments import Bf16Segment, QuantSegment, segment_of
from dynamiq.quantizers import Payload

BF16 = Passthrough(wire="bf16")


def _data(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * torch.logspace(-3, 3, n)
    acc = torch.randn(n, generator=g)
    acc[1] = -0.0
    return x, acc


def test_segment_kinds():
    codec = DynamiQ(widths=(4, 16), group_size=32)
    segs = [segment_of(o) for o in codec.options]
    assert isinstance(segs[0], QuantSegment) and segs[0].q is codec.quantizers[0]
    assert isinstance(segs[1], Bf16Segment)
    assert segs[1].nbytes(100) == BF16.wire_bytes(100) == 200
    assert not segs[1].unbiased and segs[0].unbiased


@pytest.mark.parametrize("n", [SG, 3 * SG + 5])
@pytest.mark.parametrize("writeback", ["none", "sum", "decoded"])
def test_width_16_is_the_bf16_passthrough(n, writeback):
    codec = DynamiQ(widths=16, bits=16)
    ctx = HopContext(stream=(1, 2), rank=1, world_size=4)
    x, acc0 = _data(n)
    data = codec.compress(x, ctx)
    assert torch.equal(data, BF16.compress(x, ctx))
    mine, theirs = torch.empty(n), torch.empty(n)
    assert same(codec.decompress(data, mine, ctx), BF16.decompress(data, theirs, ctx))
    a, b = acc0.clone(), acc0.clone()
    codec.decompress_accumulate(data, a, ctx)
    BF16.decompress_accumulate(data, b, ctx)
    assert same(a, b)
    a, b = acc0.clone(), acc0.clone()
    out = codec.decompress_accumulate_recompress(data, a, ctx, writeback=writeback)
    assert torch.equal(out, BF16.decompress_accumulate_recompress(data, b, ctx,
                                                                  writeback=writeback))
    assert same(a, b)


def test_bf16_segment_inside_a_mixed_message():
    """Super-groups 1 and 3 at width 16 travel first in the message, as the passthrough codec
    sends them; the 4-bit super-groups follow."""
    codec = DynamiQ(widths=(4, 16), group_size=32)
    plan = WidthPlan(np.array([0, 1, 0, 1], dtype=np.int64), codec.width_list, 0.0, 0.0)
    ctx = HopContext(stream=(0, 3), rank=2, world_size=4, prepared={codec: plan})
    x, acc0 = _data(4 * SG, seed=1)
    wide = torch.cat([x[SG:2 * SG], x[3 * SG:]])
    data = codec.compress(x, ctx)
    assert torch.equal(data[:4 * SG], BF16.compress(wide, ctx))
    for writeback in ("sum", "decoded"):
        a = acc0.clone()
        out = codec.decompress_accumulate_recompress(data, a, ctx, writeback=writeback)
        b = torch.cat([acc0[SG:2 * SG], acc0[3 * SG:]])
        want = BF16.decompress_accumulate_recompress(data[:4 * SG], b, ctx, writeback=writeback)
        assert torch.equal(out[:4 * SG], want), writeback
        assert same(torch.cat([a[SG:2 * SG], a[3 * SG:]]), b), writeback


@pytest.mark.parametrize("writeback", ["none", "sum", "decoded"])
def test_bf16_segment_works_on_its_rows_only(writeback):
    """The width-16 segment codes the chunk's super-groups ``rows`` (message order, here a
    partial last one) as the passthrough codes them gathered, and writes back into those rows
    only: the sum under "sum", the decoded message under "decoded", nothing under "none"."""
    n = 3 * SG + 40
    x, acc0 = _data(n, seed=2)
    rows = torch.tensor([1, 3])
    dense = torch.cat([x[SG:2 * SG], x[3 * SG:]])
    seg = Bf16Segment()
    out = torch.empty(seg.nbytes(SG + 40), dtype=torch.uint8)
    seg.encode(x, rows, SG + 40, out, "numba")
    assert torch.equal(out, BF16.compress(dense, None))
    y = torch.full((n,), 7.0)
    seg.decode(out, y, rows, SG + 40, False, "numba")
    assert same(y[SG:2 * SG], dense[:SG].bfloat16().float())
    assert same(y[3 * SG:], dense[SG:].bfloat16().float()) and (y[:SG] == 7).all()
    a = acc0.clone()
    sent = torch.empty_like(out)
    seg.recompress(out, a, rows, SG + 40, sent, writeback, "numba")
    b = torch.cat([acc0[SG:2 * SG], acc0[3 * SG:]])
    want = BF16.decompress_accumulate_recompress(out, b, None, writeback=writeback)
    assert torch.equal(sent, want)
    assert same(a[:SG], acc0[:SG]) and same(a[2 * SG:3 * SG], acc0[2 * SG:3 * SG])
    if writeback != "none":
        assert same(torch.cat([a[SG:2 * SG], a[3 * SG:]]), b)
    else:
        assert same(a, acc0)


def test_quantized_segment_is_its_quantizer():
    codec = DynamiQ(widths=5, group_size=32, bits=6.0)
    q = codec.quantizers[0]
    seg = segment_of(codec.options[0])
    x, acc = _data(2 * SG + 3, seed=3)
    rand = {"seed": 4, "rank": 1, "world_size": 4, "stream": (2,), "index_offset": 512}
    n = x.numel()
    rows = torch.arange(-(-n // seg.block))
    out = torch.empty(seg.nbytes(n), dtype=torch.uint8)
    seg.encode(x, rows, n, out, "numba", **rand)
    assert torch.equal(out, q.encode(x, **rand).data)
    y = torch.empty(n)
    seg.decode(out, y, rows, n, False, "numba", **rand)
    assert same(y, q.decode(q.encode(x, **rand), **rand))
    a, b = acc.clone(), acc.clone()
    sent = torch.empty_like(out)
    seg.recompress(out, a, rows, n, sent, "sum", "numba", **rand)
    want = q.recompress(Payload(q, x.numel(), out), b, writeback="sum", **rand)
    assert torch.equal(sent, want.data) and same(a, b)
