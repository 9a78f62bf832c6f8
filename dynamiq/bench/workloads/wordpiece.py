"""BERT's uncased WordPiece tokenizer in the standard library (no ``tokenizers``).

:class:`WordPieceTokenizer` is BERT's basic tokenizer followed by greedy longest-match-first
WordPiece over a ``vocab.txt``.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable
from pathlib import Path

__all__ = ["WordPieceTokenizer"]


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
