"""The BERT encoder and a masked-LM head, in plain torch (no ``transformers``).

:class:`BertEncoder` has module names equal to Hugging Face checkpoints' keys, so a checkpoint
loads with ``strict=True`` (every tensor is used). :class:`MLMHead` is a freshly initialised
transform (dense, GELU, LayerNorm) whose decoder is tied to the word embeddings, plus an output
bias.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from dynamiq.bench.workloads.ddp import mix_seed

__all__ = ["BertConfig", "BertEncoder", "MLMHead"]


@dataclass(frozen=True)
class BertConfig:
    """The architecture fields of a BERT ``config.json``."""

    vocab_size: int = 30522
    hidden_size: int = 384
    num_hidden_layers: int = 6
    num_attention_heads: int = 12
    intermediate_size: int = 1536
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1

    @classmethod
    def from_file(cls, path: str | Path) -> BertConfig:
        """Read the fields this encoder needs from ``config.json``; checks its activation."""
        cfg = json.loads(Path(path).read_text(encoding="utf-8"))
        if cfg.get("hidden_act", "gelu") != "gelu":
            raise ValueError(f"unsupported hidden_act {cfg['hidden_act']!r} (only 'gelu')")
        if cfg.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError("only absolute position embeddings are supported")
        names = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in cfg.items() if k in names})


class _Embeddings(nn.Module):
    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(c.vocab_size, c.hidden_size)
        self.position_embeddings = nn.Embedding(c.max_position_embeddings, c.hidden_size)
        self.token_type_embeddings = nn.Embedding(c.type_vocab_size, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.dropout = nn.Dropout(c.hidden_dropout_prob)
        # Persistent so the checkpoint's copy is consumed (and checked) by a strict load.
        self.register_buffer("position_ids", torch.arange(c.max_position_embeddings)[None])

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        t = ids.shape[1]
        h = (
            self.word_embeddings(ids)
            + self.position_embeddings(self.position_ids[:, :t])
            + self.token_type_embeddings.weight[0]  # single-segment input: type id 0 only
        )
        return self.dropout(self.LayerNorm(h))


class _SelfAttention(nn.Module):
    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.heads = c.num_attention_heads
        self.p = c.attention_probs_dropout_prob
        self.query = nn.Linear(c.hidden_size, c.hidden_size)
        self.key = nn.Linear(c.hidden_size, c.hidden_size)
        self.value = nn.Linear(c.hidden_size, c.hidden_size)

    def forward(self, h: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        b, t, c = h.shape

        def split(x: torch.Tensor) -> torch.Tensor:
            return x.view(b, t, self.heads, c // self.heads).transpose(1, 2)

        a = F.scaled_dot_product_attention(
            split(self.query(h)),
            split(self.key(h)),
            split(self.value(h)),
            attn_mask=mask,
            dropout_p=self.p if self.training else 0.0,
        )
        return a.transpose(1, 2).reshape(b, t, c)


class _DenseResidualNorm(nn.Module):
    """``LayerNorm(residual + dropout(dense(x)))``: BERT's "output" sub-modules."""

    def __init__(self, n_in: int, c: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(n_in, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.dropout = nn.Dropout(c.hidden_dropout_prob)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(residual + self.dropout(self.dense(x)))


class _Attention(nn.Module):
    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.self = _SelfAttention(c)
        self.output = _DenseResidualNorm(c.hidden_size, c)

    def forward(self, h: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        return self.output(self.self(h, mask), h)


class _Intermediate(nn.Module):
    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(c.hidden_size, c.intermediate_size)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.dense(h))  # BERT's "gelu" is the exact (erf) form


class _Layer(nn.Module):
    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.attention = _Attention(c)
        self.intermediate = _Intermediate(c)
        self.output = _DenseResidualNorm(c.intermediate_size, c)

    def forward(self, h: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        h = self.attention(h, mask)
        return self.output(self.intermediate(h), h)


class _Encoder(nn.Module):
    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.layer = nn.ModuleList(_Layer(c) for _ in range(c.num_hidden_layers))


class _Pooler(nn.Module):
    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(c.hidden_size, c.hidden_size)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(h[:, 0]))


class BertEncoder(nn.Module):
    """The BERT encoder, its parameter names matching Hugging Face checkpoints' keys.

    Args:
        config: Architecture.
    """

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = _Embeddings(config)
        self.encoder = _Encoder(config)
        self.pooler = _Pooler(config)

    def forward(
        self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Final hidden states.

        Args:
            ids: int64 ``[batch, t]`` token ids.
            attention_mask: Optional ``[batch, t]``, 1/True for real tokens, 0 for padding.

        Returns:
            float32 ``[batch, t, hidden_size]``.
        """
        mask = None
        if attention_mask is not None:
            mask = attention_mask.bool()[:, None, None, :]
        h = self.embeddings(ids)
        for layer in self.encoder.layer:
            h = layer(h, mask)
        return h

    def pooled(self, hidden: torch.Tensor) -> torch.Tensor:
        """The pooler output (``tanh(dense(h[:, 0]))``), float32 ``[batch, hidden_size]``."""
        return self.pooler(hidden)


class MLMHead(nn.Module):
    """Masked-LM head: dense, GELU, LayerNorm, then the tied word-embedding decoder and a bias.

    The checkpoint has no MLM head, so the transform starts fresh (``N(0, 0.02)`` weights, zero
    biases); the decoder is the encoder's word embedding matrix itself.

    Args:
        config: Architecture.
        word_embeddings: The encoder's ``[vocab, hidden]`` embedding (tied decoder).
        seed: Seed of the transform's initialisation.
        bias: Initial output bias, float32 ``[vocab]`` (zeros when ``None``).
    """

    def __init__(
        self,
        config: BertConfig,
        word_embeddings: nn.Embedding,
        seed: int = 0,
        bias: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        init = torch.zeros(config.vocab_size) if bias is None else bias.float().clone()
        self.bias = nn.Parameter(init)
        self.decoder = word_embeddings  # registered here too; parameters() dedups it
        g = torch.Generator().manual_seed(mix_seed(seed, 0x6D6C6D))
        with torch.no_grad():
            self.dense.weight.copy_(torch.randn(self.dense.weight.shape, generator=g) * 0.02)
            self.dense.bias.zero_()

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """Vocabulary logits, float32 ``[..., vocab]``, of hidden states ``[..., hidden]``."""
        h = self.LayerNorm(F.gelu(self.dense(h)))
        return h @ self.decoder.weight.T + self.bias
