"""Partial-sum codecs: the four hop operations agree with each other bit for bit, on every codec.

Every class registered in :data:`dynamiq.CODECS` is enrolled at collection time with
representative parameters (Passthrough on both wires, Requant over every registered quantizer), so
a newly registered quantizer is checked as a codec with no extra test code. A newly registered
codec *class* is enrolled with its default parameters; if it has none, ``test_codec_is_enrolled``
fails and asks for representative parameters in :func:`dynamiq.testing.representative_codecs`.

Floating-point results are compared through their bit patterns (``view(int32)``), so ``-0.0`` and
NaN payloads count, and "equal" always means bit-identical.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pytest
import torch

from dynamiq import (
    CODECS,
    QUANTIZERS,
    BlockQuantizer,
    HopContext,
    PartialSumCodec,
    Passthrough,
    Requant,
    UnknownNameError,
    get_codec,
)
from dynamiq.collectives.statistics import local_statistics
from dynamiq.testing import representative_codecs

SIZES = (1, 255, 256, 1000)
WRITEBACKS = ("none", "sum", "decoded")


CODEC_CLASSES = CODECS.items()
SAMPLES: list[PartialSumCodec] = [c for _, cls in CODEC_CLASSES
                                  for c in representative_codecs(cls)]


def _id(c: PartialSumCodec) -> str:
    try:
        return c.spec()
    except ValueError:
        return repr(c)


def _bits(t: torch.Tensor) -> torch.Tensor:
    """Bit pattern of a float32 tensor, for bit-for-bit comparisons (NaN == NaN, -0 != 0)."""
    assert t.dtype == torch.float32
    return t.contiguous().view(torch.int32)


def assert_same_bits(a: torch.Tensor, b: torch.Tensor, what: str = "") -> None:
    assert a.shape == b.shape, (what, a.shape, b.shape)
    if a.dtype == torch.float32:
        a, b = _bits(a), _bits(b)
    assert a.dtype == b.dtype, (what, a.dtype, b.dtype)
    diff = torch.nonzero(a != b).flatten()
    assert diff.numel() == 0, f"{what}: {diff.numel()} entries differ, first at {int(diff[0])}"


def _data(n: int, seed: int) -> torch.Tensor:
    """Heavy-tailed float32 test vector with some exact zeros."""
    rs = np.random.default_rng(seed)
    x = rs.standard_normal(n) * np.exp(1.5 * rs.standard_normal(n))
    x[rs.integers(0, n, size=n // 9)] = 0.0
    return torch.from_numpy(x.astype(np.float32))


# a compression in the middle of a collective: not rank 0, a stream, an offset into the vector
CTX = HopContext(seed=0, stream=(3, 1), rank=1, world_size=3, index_offset=512)
CTX_LEAF = HopContext(seed=0, stream=(3, 1), rank=2, world_size=3, index_offset=512)


@functools.cache
def _ctx(codec: PartialSumCodec, n: int, base: HopContext = CTX) -> HopContext:
    """``base`` with the metadata a collective would give: the statistics the codec declares
    and its per-call decision (``prepare``) for a vector that ends with this chunk."""
    length = base.index_offset + n
    full = _data(length, 99)
    stats = local_statistics(codec.statistics, full)
    state: dict = {}
    stats.update({k: v for k, (v, _) in codec.local_metadata(full, state).items()})
    plan = codec.prepare(stats, length, base.world_size, state)
    return dataclasses.replace(base, stats=stats, prepared={codec: plan})


def _message(codec: PartialSumCodec, n: int, seed: int = 1) -> torch.Tensor:
    """What an upstream rank would send: the compressed partial sum of a random chunk."""
    return codec.compress(_data(n, seed), _ctx(codec, n, CTX_LEAF))


def _decompressed(codec: PartialSumCodec, data: torch.Tensor, n: int) -> torch.Tensor:
    out = torch.empty(n, dtype=torch.float32)
    codec.decompress(data, out, _ctx(codec, n))
    return out


# ---------------------------------------------------------------- enrolment
@pytest.mark.parametrize("name", CODECS.names())
def test_codec_is_enrolled(name):
    cls = CODECS[name]
    reps = representative_codecs(cls)
    assert reps, (
        f"codec {name!r} ({cls.__name__}) has no default parameters: add representative "
        "instances to dynamiq.testing.representative_codecs()"
    )
    assert all(isinstance(c, PartialSumCodec) and type(c) is cls for c in reps)


def test_every_registered_quantizer_is_enrolled_as_requant():
    enrolled = {QUANTIZERS.name_of(c.quantizer) for c in SAMPLES if isinstance(c, Requant)}
    assert enrolled == set(QUANTIZERS.names())


# ---------------------------------------------------------------- the four hop operations
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("codec", SAMPLES, ids=_id)
def test_wire_bytes_is_the_compressed_length(codec, n):
    data = codec.compress(_data(n, 0), _ctx(codec, n))
    assert data.dtype == torch.uint8 and data.dim() == 1
    assert data.numel() == codec.wire_bytes(n, _ctx(codec, n))
    # a preallocated buffer of exactly that size is filled in place, with the same bytes
    buf = torch.empty(codec.wire_bytes(n, _ctx(codec, n)), dtype=torch.uint8)
    out = codec.compress(_data(n, 0), _ctx(codec, n), out=buf)
    assert out.data_ptr() == buf.data_ptr()
    assert_same_bits(buf, data, "compress(out=...)")


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("codec", SAMPLES, ids=_id)
def test_compress_is_a_function_of_input_and_context(codec, n):
    x = _data(n, 0)
    x0 = x.clone()
    ctx = _ctx(codec, n)
    assert_same_bits(codec.compress(x, ctx), codec.compress(x, ctx), "compress twice")
    assert_same_bits(x, x0, "compress modified its input")


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("codec", SAMPLES, ids=_id)
def test_decompress_accumulate_is_acc_plus_decompress(codec, n):
    data = _message(codec, n)
    acc = _data(n, 2)
    want = acc + _decompressed(codec, data, n)
    data0 = data.clone()
    codec.decompress_accumulate(data, acc, _ctx(codec, n))
    assert_same_bits(acc, want, "decompress_accumulate")
    assert_same_bits(data, data0, "decompress_accumulate modified the message")


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("codec", SAMPLES, ids=_id)
def test_fused_recompress_equals_compress_of_the_sum(codec, n):
    data = _message(codec, n)
    acc = _data(n, 2)
    acc0 = acc.clone()
    want = codec.compress(acc0 + _decompressed(codec, data, n), _ctx(codec, n))
    got = codec.decompress_accumulate_recompress(data, acc, _ctx(codec, n))
    assert_same_bits(got, want, "decompress_accumulate_recompress vs compress(acc + decompress)")
    assert_same_bits(acc, acc0, "writeback='none' changed acc")


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("codec", SAMPLES, ids=_id)
def test_fused_recompress_writeback_sum(codec, n):
    data = _message(codec, n)
    acc = _data(n, 2)
    total = acc + _decompressed(codec, data, n)  # the float32 partial sum
    want = codec.compress(total.clone(), _ctx(codec, n))
    got = codec.decompress_accumulate_recompress(data, acc, _ctx(codec, n), writeback="sum")
    assert_same_bits(got, want, "bytes with writeback='sum'")
    assert_same_bits(acc, total, "writeback='sum' must leave acc + decompress(data) in acc")


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("codec", SAMPLES, ids=_id)
def test_fused_recompress_writeback_decoded(codec, n):
    data = _message(codec, n)
    acc = _data(n, 2)
    want = codec.compress(acc + _decompressed(codec, data, n), _ctx(codec, n))
    got = codec.decompress_accumulate_recompress(data, acc, _ctx(codec, n), writeback="decoded")
    assert_same_bits(got, want, "bytes with writeback='decoded'")
    # what the sink keeps is exactly what every receiver of these bytes decodes
    assert_same_bits(acc, _decompressed(codec, got, n), "writeback='decoded'")


@pytest.mark.parametrize("codec", SAMPLES, ids=_id)
def test_fused_recompress_fills_out_buffer(codec):
    n = 300
    data = _message(codec, n)
    acc = _data(n, 2)
    want = codec.decompress_accumulate_recompress(data, acc.clone(), _ctx(codec, n))
    buf = torch.empty(codec.wire_bytes(n, _ctx(codec, n)), dtype=torch.uint8)
    got = codec.decompress_accumulate_recompress(data, acc, _ctx(codec, n), out=buf)
    assert got.data_ptr() == buf.data_ptr()
    assert_same_bits(buf, want, "out buffer")


@pytest.mark.parametrize("codec", SAMPLES, ids=_id)
def test_unknown_writeback_is_rejected(codec):
    data = _message(codec, 64)
    with pytest.raises(ValueError, match="writeback"):
        codec.decompress_accumulate_recompress(data, _data(64, 2), _ctx(codec, 64),
                                               writeback="both")


@pytest.mark.parametrize("codec", SAMPLES, ids=_id)
def test_lossless_flag_is_honest(codec):
    x = _data(1000, 5)
    y = _decompressed(codec, codec.compress(x, _ctx(codec, 1000)), 1000)
    if codec.lossless:
        assert_same_bits(y, x, f"{_id(codec)} claims to be lossless")
    else:
        assert not torch.equal(y, x), f"{_id(codec)} is exact here: should it be lossless?"


# ---------------------------------------------------------------- passthrough specifics
def _special_values() -> torch.Tensor:
    f = np.finfo(np.float32)
    vals = [0.0, -0.0, np.inf, -np.inf, np.nan, f.max, -f.max, f.tiny, f.smallest_subnormal,
            -f.smallest_subnormal, 1.0, -1.0, 1 / 3]
    return torch.tensor(vals, dtype=torch.float32)


def test_passthrough_fp32_is_lossless():
    codec = Passthrough("fp32")
    assert codec.lossless and codec.wire_bytes(10) == 40
    x = torch.cat([_special_values(), _data(1000, 6)])
    y = _decompressed(codec, codec.compress(x, CTX), x.numel())
    assert_same_bits(y, x, "passthrough fp32 round trip")
    # the wire is the float32 bit pattern itself
    assert_same_bits(codec.compress(x, CTX).view(torch.float32), x, "fp32 wire bytes")


def _bf16_probe() -> torch.Tensor:
    """float32 values around every kind of bf16 rounding decision."""
    rs = np.random.default_rng(7)
    rand = rs.integers(0, 2**32, size=20000, dtype=np.uint64).astype(np.uint32)
    hi = rs.integers(0, 2**16, size=4000, dtype=np.uint64).astype(np.uint32) << np.uint32(16)
    # exact ties (low half 0x8000) with even and odd high halves, and their neighbours
    lows = np.array([0x7FFF, 0x8000, 0x8001, 0x0000, 0xFFFF, 0x0001], dtype=np.uint32)
    near = (hi[:, None] | lows[None, :]).reshape(-1)
    extra = np.array([0x7F7FFFFF, 0x7F7F8000, 0x7F7F7FFF, 0x00008000, 0x00018000, 0x80018000],
                     dtype=np.uint32)  # overflow to inf, a tie below max, subnormal ties
    bits = np.concatenate([rand, near, extra])
    x = bits.view(np.float32)
    return torch.from_numpy(x[~np.isnan(x)].copy())


def test_passthrough_bf16_rounds_to_nearest_even():
    codec = Passthrough("bf16")
    assert not codec.lossless
    x = _bf16_probe()
    n = x.numel()
    assert codec.wire_bytes(n) == 2 * n
    ref = x.to(torch.bfloat16)
    data = codec.compress(x, CTX)
    assert_same_bits(data.view(torch.int16), ref.view(torch.int16), "bf16 wire vs Tensor.to")
    assert_same_bits(_decompressed(codec, data, n), ref.float(), "bf16 decompress")
    # ties really are in the probe, and they went to the even neighbour
    b = x.view(torch.int32)
    tie = (b & 0xFFFF) == 0x8000
    assert int(tie.sum()) > 1000
    assert ((ref.view(torch.int16)[tie] & 1) == 0).all()


def test_passthrough_bf16_keeps_nan_and_inf():
    codec = Passthrough("bf16")
    x = _special_values()
    y = _decompressed(codec, codec.compress(x, CTX), x.numel())
    assert torch.equal(torch.isnan(y), torch.isnan(x))
    assert torch.equal(torch.isposinf(y), torch.isposinf(x) | (x == np.finfo(np.float32).max))


def test_passthrough_rejects_an_unknown_wire():
    with pytest.raises(ValueError, match="'fp32' or 'bf16'"):
        Passthrough("fp16")


@pytest.mark.parametrize("codec", SAMPLES, ids=_id)
def test_compress_rejects_non_float32_chunks(codec):
    with pytest.raises(TypeError, match="float32"):
        codec.compress(torch.zeros(8, dtype=torch.float64), CTX)
    with pytest.raises(TypeError, match="1-D"):
        codec.compress(torch.zeros(2, 4), CTX)


# ---------------------------------------------------------------- spec strings
@pytest.mark.parametrize("codec", SAMPLES, ids=_id)
def test_spec_round_trip(codec):
    spec = codec.spec()
    assert str(codec) == spec and " " not in spec
    back = get_codec(spec)
    assert back == codec and hash(back) == hash(codec) and type(back) is type(codec)
    assert back.spec() == spec
    assert get_codec(codec) is codec


@pytest.mark.parametrize(
    ("spec", "codec"),
    [
        ("passthrough", Passthrough("fp32")),
        ("passthrough(wire=bf16)", Passthrough("bf16")),
        (" passthrough( wire = bf16 ) ", Passthrough("bf16")),
        ("requant(quantizer=mxfp8)", Requant("mxfp8")),
        ("requant(quantizer=mxfp8_e4m3)", Requant("mxfp8")),  # an alias of the quantizer
        ("requant(quantizer=dq4_hier,seed=3)", Requant(QUANTIZERS["dq4_hier"], seed=3)),
        ("requant(quantizer=dq4_hier,seed=0)", Requant("dq4_hier")),
    ],
)
def test_specs_parse_to_codecs(spec, codec):
    assert get_codec(spec) == codec


def test_requant_spec_names_seed_only_when_set():
    assert Requant("dq4_hier").spec() == "requant(quantizer=dq4_hier)"
    assert Requant("dq4_hier", seed=5).spec() == "requant(quantizer=dq4_hier,seed=5)"


def test_unknown_codec_lists_the_known_ones():
    with pytest.raises(UnknownNameError) as info:
        get_codec("lz4(level=3)")
    msg = str(info.value)
    assert "lz4" in msg
    for name in CODECS.names():
        assert name in msg


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("passthrough(wire=fp16)", "'fp32' or 'bf16'"),
        ("passthrough(bits=16)", "no parameter 'bits'.*accepted: wire"),
        ("passthrough(wire=bf16,wire=fp32)", "given twice"),
        ("passthrough(wire)", "expected key=value"),
        ("passthrough(wire=bf16", "malformed"),
        ("requant", "needs parameter 'quantizer'"),
        ("requant(seed=1)", "needs parameter 'quantizer'"),
        ("requant(quantizer=mxfp8,seed=one)", "seed must be an integer"),
        ("requant(quantizer=mxfp8,seed=-1)", "non-negative"),
        ("", "empty codec spec"),
    ],
)
def test_bad_codec_parameters(spec, match):
    with pytest.raises(ValueError, match=match):
        get_codec(spec)


def test_unknown_quantizer_in_requant_spec():
    with pytest.raises(UnknownNameError, match="Did you mean 'mxfp8'"):
        get_codec("requant(quantizer=mxfp9)")


def test_requant_rejects_a_bad_seed_object():
    with pytest.raises(ValueError, match="non-negative"):
        Requant("mxfp8", seed=-3)


def _unregistered_quantizer() -> BlockQuantizer:
    q = BlockQuantizer("e4m3", group_size=64, scale="e8m0", scale_rounding="ocp")
    assert QUANTIZERS.name_of(q) is None
    return q


def test_requant_with_unregistered_quantizer_has_no_spec():
    codec = Requant(_unregistered_quantizer())
    x = _data(300, 3)
    # it still codes (on the reference backend: no kernel to compile for this quantizer)
    ctx = dataclasses.replace(CTX, backend="reference")
    assert codec.compress(x, ctx).numel() == codec.wire_bytes(300)
    with pytest.raises(ValueError, match=r"not registered.*QUANTIZERS\.register"):
        codec.spec()
    with pytest.raises(ValueError, match="not registered"):
        str(codec)


def test_requant_spec_after_registering_its_quantizer():
    q = _unregistered_quantizer()
    QUANTIZERS.register("test_e4m3_g64", q)
    try:
        codec = Requant(q, seed=2)
        assert codec.spec() == "requant(quantizer=test_e4m3_g64,seed=2)"
        assert get_codec(codec.spec()) == codec
    finally:
        QUANTIZERS.unregister("test_e4m3_g64")


def test_requant_spec_finds_an_equal_registered_quantizer():
    same = BlockQuantizer("e4m3", group_size=32, scale="e8m0", scale_rounding="ocp")
    assert same is not QUANTIZERS["mxfp8"]
    assert Requant(same).spec() == "requant(quantizer=mxfp8)"
