"""``bag-pydoc``: a fastText-style classifier over hashed n-grams, with a large embedding table.

The text is ``pydoc_data.topics`` (the help topics shipped with CPython; nothing is
downloaded). Every paragraph of a topic is one example and the topic (``"assert"``,
``"for"``, ``"slicings"``, ...) its label. A paragraph becomes the bag of its lower-cased word
unigrams and bigrams, each hashed (BLAKE2b) into one of ``buckets`` rows of an
``nn.EmbeddingBag``; a small MLP classifies the bag's sum.

The bag is summed, as recommenders' multi-hot bags are (TorchRec's default), not averaged as in
fastText: averaging divides every row's gradient by the bag's length (about 60 n-grams here),
which leaves the embedding table under 3 % of the gradient's energy and the vNMSE to the MLP's
few thousand coordinates; summed, the table's share is about a quarter at the start of training
and a few percent late (``pooling="mean"`` gives fastText's).

This is the shape of recommender and fastText gradients: nearly every parameter is an
embedding row, and a micro-batch touches only the rows of its own n-grams, so a worker's
gradient is mostly zero rows and the workers' rows overlap little. DDP all-reduces the
embedding's gradient as the dense tensor it is (``sparse=False``), zero rows included, which is
what this workload records.

Training emulates DDP: each worker holds a disjoint shard of a seeded permutation of the
paragraphs and draws distinct paragraphs of it per step; Adam steps on the workers' mean
gradient.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import nn

from dynamiq.bench.workloads.base import WORKLOADS, Progress, Workload, mix_seed
from dynamiq.bench.workloads.loop import train_ddp, warmup_lr

__all__ = ["BagPydoc", "HashedBagClassifier", "PydocParagraphs", "pydoc_paragraphs"]

_WORD = re.compile(r"[a-z0-9_]+")


def _topics() -> list[tuple[str, str]]:
    from pydoc_data.topics import topics

    return [(k, topics[k]) for k in sorted(topics)]


def _bucket(gram: str, buckets: int) -> int:
    # Python's hash() of a str changes between processes; BLAKE2b is the same everywhere.
    digest = hashlib.blake2b(gram.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % buckets


@dataclass(frozen=True)
class PydocParagraphs:
    """The paragraphs of ``pydoc_data.topics`` as hashed n-gram bags.

    Attributes:
        ids: int64 ``[total]``: every paragraph's bucket ids, concatenated.
        offsets: int64 ``[n + 1]``: paragraph ``i`` is ``ids[offsets[i]:offsets[i + 1]]``.
        labels: int64 ``[n]``: topic index of each paragraph.
        topics: Topic names, indexed by label.
    """

    ids: torch.Tensor
    offsets: torch.Tensor
    labels: torch.Tensor
    topics: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.labels)

    def bags(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``EmbeddingBag`` inputs of paragraphs ``idx`` (int64 ``[b]``): ``(ids, offsets)``."""
        parts = [self.ids[self.offsets[i] : self.offsets[i + 1]] for i in idx.tolist()]
        starts = torch.tensor([0] + [len(p) for p in parts[:-1]]).cumsum(0)
        return torch.cat(parts), starts


@lru_cache(maxsize=4)
def pydoc_paragraphs(buckets: int, min_words: int = 5) -> PydocParagraphs:
    """Paragraphs (blank-line separated) of every topic with at least ``min_words`` words.

    Words are the runs of ``[a-z0-9_]`` of the lower-cased text; a paragraph's bag holds each
    word and each pair of adjacent words, hashed into ``range(buckets)``. Topics without such
    a paragraph get no label.

    Returns:
        The paragraphs in topic order (1,996 of 79 topics on CPython 3.11).
    """
    ids: list[int] = []
    offsets = [0]
    labels: list[int] = []
    names: list[str] = []
    for name, text in _topics():
        kept = False
        for para in text.split("\n\n"):
            words = _WORD.findall(para.lower())
            if len(words) < min_words:
                continue
            if not kept:
                names.append(name)
                kept = True
            grams = words + [f"{a} {b}" for a, b in itertools.pairwise(words)]
            ids.extend(_bucket(g, buckets) for g in grams)
            offsets.append(len(ids))
            labels.append(len(names) - 1)
    return PydocParagraphs(torch.tensor(ids), torch.tensor(offsets), torch.tensor(labels),
                           tuple(names))


class HashedBagClassifier(nn.Module):
    """Sum (or mean) of hashed n-gram embeddings, then a one-hidden-layer MLP.

    The table starts uniform in ``±1/dim`` as fastText's does: small (a summed bag of 60 rows
    has coordinates of about 0.3), so the rows grow where the data pull them.

    Args:
        buckets: Rows of the embedding table.
        dim: Embedding width.
        hidden: MLP hidden width.
        classes: Output classes.
        pooling: ``"sum"`` or ``"mean"`` over a bag's rows.
    """

    def __init__(
        self, buckets: int, dim: int, hidden: int, classes: int, pooling: str = "sum"
    ) -> None:
        super().__init__()
        if pooling not in ("sum", "mean"):
            raise ValueError(f"pooling must be 'sum' or 'mean', got {pooling!r}")
        self.bag = nn.EmbeddingBag(buckets, dim, mode=pooling)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, classes))
        nn.init.uniform_(self.bag.weight, -1.0 / dim, 1.0 / dim)

    def forward(self, ids: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        """Class logits, float32 ``[b, classes]``, of ``b = len(offsets)`` bags (int64 inputs)."""
        return self.mlp(self.bag(ids, offsets))


@dataclass(frozen=True)
class BagPydoc(Workload):
    """fastText-style topic classifier of ``pydoc_data`` paragraphs, DDP-emulated.

    The defaults have 4,200,527 parameters, 4,194,304 (99.85 %) of them the 2^18 × 16 embedding
    table; the MLP (16 → 64 → 79 topics) has 6,223. Steps 0, 60 and 300 are recorded; at
    ``world_size=8`` training takes about 30 s on two idle CPU cores (linear in
    ``world_size``). A worker's 32 paragraphs hash to about 2,000 rows (under 1 % of the
    table), so its gradient is more than 99 % exact zeros; the sum over 8 workers has a few
    percent non-zero rows. The MLP's 25 super-groups of 256 coordinates still hold most of the
    energy (the table about a quarter at step 0, a few percent by step 300).

    Attributes:
        buckets: Rows of the hashed embedding table.
        dim: Embedding width.
        hidden: MLP hidden width.
        pooling: ``"sum"`` or ``"mean"`` of a bag's rows (see the module's docstring).
        min_words: Shortest paragraph (in words) used as an example.
        micro_batch: Paragraphs per worker per step.
        lr: Peak Adam learning rate (linear warm-up, then constant).
        warmup: Warm-up steps.
        points: Steps at which per-worker gradients are recorded.
    """

    buckets: int = 1 << 18
    dim: int = 16
    hidden: int = 64
    pooling: str = "sum"
    min_words: int = 5
    micro_batch: int = 32
    lr: float = 3e-3
    warmup: int = 10
    points: tuple[int, ...] = (0, 60, 300)

    name = "bag-pydoc"

    def _key_extra(self) -> dict[str, str]:
        # The topics differ between Python versions; their text keys the cache.
        h = hashlib.sha256()
        for name, text in _topics():
            h.update(f"{name}\0{text}\0".encode())
        return {"topics": h.hexdigest()[:16]}

    def data(self) -> PydocParagraphs:
        """The hashed paragraphs of this configuration."""
        return pydoc_paragraphs(self.buckets, self.min_words)

    def build_model(self, seed: int = 0) -> HashedBagClassifier:
        """The freshly initialised model of a run with ``seed``."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(mix_seed(seed, 0x626167))
            classes = len(self.data().topics)
            return HashedBagClassifier(self.buckets, self.dim, self.hidden, classes,
                                       self.pooling)

    def shards(self, world_size: int, seed: int = 0) -> list[torch.Tensor]:
        """Each worker's paragraph indices: a seeded permutation dealt out round-robin."""
        n = len(self.data())
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(mix_seed(seed, 7)))
        shards = [perm[r::world_size] for r in range(world_size)]
        if len(shards[-1]) < self.micro_batch:
            raise ValueError(
                f"bag-pydoc: {n} paragraphs give shards of {len(shards[-1])}, fewer than "
                f"micro_batch {self.micro_batch}; lower world_size or micro_batch"
            )
        return shards

    def batch(
        self, shard: torch.Tensor, *, seed: int, rank: int, step: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Worker ``rank``'s micro-batch at ``step``: distinct paragraphs of its shard.

        Returns:
            ``(ids, offsets, labels)``: int64 ``[total]``, ``[micro_batch]``, ``[micro_batch]``.
        """
        g = torch.Generator().manual_seed(mix_seed(seed, rank, step))
        idx = shard[torch.randperm(len(shard), generator=g)[: self.micro_batch]]
        data = self.data()
        ids, offsets = data.bags(idx)
        return ids, offsets, data.labels[idx]

    def train(
        self,
        world_size: int,
        points: tuple[int, ...] | None = None,
        *,
        seed: int = 0,
        progress: Progress | None = None,
        on_point: Callable[[int, HashedBagClassifier, list, torch.Tensor], None] | None = None,
    ) -> dict[int, torch.Tensor]:
        """Run the DDP-emulated training, without the cache.

        Args:
            world_size: Number of workers.
            points: Steps to record (the configured ones when ``None``).
            seed: Seed of initialisation and data order.
            progress: Receives progress lines.
            on_point: Optional ``(step, model, batches, grads)`` callback at each recorded step,
                before the update (``batches`` holds each worker's ``(ids, offsets, labels)``).

        Returns:
            ``{step: float32 [world_size, d]}``, ``d`` = number of parameters.
        """
        pts = self.default_points() if points is None else tuple(sorted(set(points)))
        say = progress or (lambda _msg: None)
        shards = self.shards(world_size, seed)
        model = self.build_model(seed)
        params = list(model.parameters())
        say(
            f"bag-pydoc: {sum(p.numel() for p in params):,} parameters "
            f"({self.buckets:,} x {self.dim} embedding), {len(self.data()):,} paragraphs of "
            f"{len(self.data().topics)} topics, {world_size} workers x {self.micro_batch}, "
            f"training to step {pts[-1]}"
        )
        opt = torch.optim.Adam(params, lr=self.lr)
        batches: dict[int, tuple[torch.Tensor, ...]] = {}

        def worker_loss(step: int, rank: int) -> torch.Tensor:
            batches[rank] = self.batch(shards[rank], seed=seed, rank=rank, step=step)
            ids, offsets, labels = batches[rank]
            return F.cross_entropy(model(ids, offsets), labels)

        def point_cb(step: int, grads: torch.Tensor) -> None:
            if on_point is not None:
                on_point(step, model, [batches[r] for r in range(world_size)], grads)

        return train_ddp(self.name, params, worker_loss, opt, world_size, pts, progress=progress,
                         lr_at=warmup_lr(self.lr, self.warmup), on_point=point_cb)


WORKLOADS.register("bag-pydoc", BagPydoc())
