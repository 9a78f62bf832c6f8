"""``lstm-stdlib``: a byte-level 2-layer LSTM language model trained on the standard library.

The corpus, its per-worker shards and the random windows every worker reads are exactly those
of ``gpt-stdlib`` (:func:`~dynamiq.bench.workloads.gpt_stdlib.byte_shards`,
:func:`~dynamiq.bench.workloads.gpt_stdlib.byte_windows`); only the model differs. It is a
classic recurrent LM: a byte embedding, a stacked ``nn.LSTM`` and an output layer **untied**
from the embedding, so the embedding's gradient has non-zero rows only for the bytes a
micro-batch contains (about a hundred of 256 in Python source), while the recurrent matrices'
gradients, summed over every time step, are dense.

Training emulates DDP with AdamW on the workers' mean gradient, whose global norm is clipped
before each step, as LSTM training usually does (after the all-reduce, so the recorded
per-worker gradients are the raw ones). Each window starts from a zero state (no truncated-BPTT
state is carried between steps: the windows are random).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from dynamiq.bench.workloads.base import WORKLOADS, Progress, Workload, mix_seed
from dynamiq.bench.workloads.gpt_stdlib import (
    _read_stdlib,
    byte_shards,
    byte_windows,
    stdlib_corpus,
)
from dynamiq.bench.workloads.loop import train_ddp, warmup_lr

__all__ = ["ByteLSTM", "LstmStdlib"]


class ByteLSTM(nn.Module):
    """Byte embedding, stacked LSTM, untied linear output layer.

    The forget gates' input bias starts at 1 (Jozefowicz et al., 2015), so the cells remember
    from the first step instead of learning to; everything else keeps torch's initialisation.

    Args:
        embed: Embedding width.
        hidden: LSTM state width.
        n_layers: Stacked LSTM layers.
        vocab: Vocabulary size (256 bytes).
    """

    def __init__(self, embed: int, hidden: int, n_layers: int, vocab: int = 256) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, embed)
        self.lstm = nn.LSTM(embed, hidden, n_layers, batch_first=True)
        self.head = nn.Linear(hidden, vocab)
        with torch.no_grad():
            for layer in range(n_layers):
                # Gate order of nn.LSTM's biases: input, forget, cell, output.
                getattr(self.lstm, f"bias_ih_l{layer}")[hidden : 2 * hidden].fill_(1.0)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Next-byte logits.

        Args:
            idx: int64 ``[batch, t]`` byte values.

        Returns:
            float32 ``[batch, t, vocab]``.
        """
        h, _ = self.lstm(self.embed(idx))
        return self.head(h)


@dataclass(frozen=True)
class LstmStdlib(Workload):
    """Byte-level LSTM LM trained from scratch on the standard library, DDP-emulated.

    The defaults have 1,988,864 parameters: the two LSTM layers hold 1,873,920 (94 %), the
    output layer 98,560 and the embedding 16,384. Steps 10, 80 and 200 are recorded; at
    ``world_size=8`` training takes about a minute on two idle CPU cores (80 s of one core;
    linear in ``world_size`` and, the recurrence being sequential, in ``context``). The
    recurrent matrices' gradients are dense but small: the output layer (5 % of the
    coordinates) holds 80–98 % of the summed gradient's energy, so super-group energies spread
    over 3–4 decades (interquartile), and the embedding's rows of bytes absent from every
    micro-batch are exactly zero.

    Attributes:
        embed: Byte-embedding width.
        hidden: LSTM state width.
        n_layers: Stacked LSTM layers.
        context: Bytes per training window.
        micro_batch: Windows per worker per step.
        lr: Peak AdamW learning rate (linear warm-up, then constant).
        warmup: Warm-up steps.
        weight_decay: AdamW weight decay.
        clip: Largest global L2 norm of the averaged gradient before a step (0 disables).
        max_bytes: Cap on the corpus size in bytes.
        points: Steps at which per-worker gradients are recorded.
    """

    embed: int = 64
    hidden: int = 384
    n_layers: int = 2
    context: int = 64
    micro_batch: int = 4
    lr: float = 2e-3
    warmup: int = 10
    weight_decay: float = 0.01
    clip: float = 1.0
    max_bytes: int = 8 << 20
    points: tuple[int, ...] = (10, 80, 200)

    name = "lstm-stdlib"

    def _key_extra(self) -> dict[str, str]:
        # The corpus depends on the Python build, so its hash is part of the cache key.
        return {"corpus": hashlib.sha256(_read_stdlib(int(self.max_bytes))).hexdigest()[:16]}

    def build_model(self, seed: int = 0) -> ByteLSTM:
        """The freshly initialised model of a run with ``seed``."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(mix_seed(seed, 0x6C73746D))
            return ByteLSTM(self.embed, self.hidden, self.n_layers)

    def shards(self, world_size: int) -> list[torch.Tensor]:
        """The corpus cut into ``world_size`` contiguous, equally long shards (uint8)."""
        return byte_shards(stdlib_corpus(self.max_bytes), world_size, self.context, self.name)

    def batch(self, shard: torch.Tensor, *, seed: int, rank: int, step: int) -> torch.Tensor:
        """Worker ``rank``'s micro-batch at ``step``: int64 ``[micro_batch, context + 1]``."""
        return byte_windows(shard, self.context, self.micro_batch, seed=seed, rank=rank, step=step)

    @staticmethod
    def loss(model: ByteLSTM, batch: torch.Tensor) -> torch.Tensor:
        """Mean next-byte cross-entropy (nats) of ``batch`` (int64 ``[b, context + 1]``)."""
        logits = model(batch[:, :-1])
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))

    def train(
        self,
        world_size: int,
        points: tuple[int, ...] | None = None,
        *,
        seed: int = 0,
        progress: Progress | None = None,
        on_point: Callable[[int, ByteLSTM, list[torch.Tensor], torch.Tensor], None] | None = None,
    ) -> dict[int, torch.Tensor]:
        """Run the DDP-emulated training, without the cache.

        Args:
            world_size: Number of workers.
            points: Steps to record (the configured ones when ``None``).
            seed: Seed of initialisation and data order.
            progress: Receives progress lines.
            on_point: Optional ``(step, model, batches, grads)`` callback at each recorded step,
                before the update (``batches`` is the list of the workers' micro-batches).

        Returns:
            ``{step: float32 [world_size, d]}``, ``d`` = number of parameters.
        """
        pts = self.default_points() if points is None else tuple(sorted(set(points)))
        say = progress or (lambda _msg: None)
        shards = self.shards(world_size)
        model = self.build_model(seed)
        params = list(model.parameters())
        say(
            f"lstm-stdlib: {sum(p.numel() for p in params):,} parameters, {world_size} workers x "
            f"{self.micro_batch} x {self.context} bytes, training to step {pts[-1]}"
        )
        opt = torch.optim.AdamW(params, lr=self.lr, weight_decay=self.weight_decay)
        batches: dict[int, torch.Tensor] = {}

        def worker_loss(step: int, rank: int) -> torch.Tensor:
            batches[rank] = self.batch(shards[rank], seed=seed, rank=rank, step=step)
            return self.loss(model, batches[rank])

        def clip(_step: int) -> None:
            if self.clip > 0:
                torch.nn.utils.clip_grad_norm_(params, self.clip)

        def point_cb(step: int, grads: torch.Tensor) -> None:
            if on_point is not None:
                on_point(step, model, [batches[r] for r in range(world_size)], grads)

        return train_ddp(self.name, params, worker_loss, opt, world_size, pts, progress=progress,
                         lr_at=warmup_lr(self.lr, self.warmup), before_update=clip,
                         on_point=point_cb)


WORKLOADS.register("lstm-stdlib", LstmStdlib())
