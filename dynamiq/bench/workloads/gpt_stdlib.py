"""``gpt-stdlib``: a small byte-level GPT trained from scratch on CPython's standard library.

The text is this interpreter's own ``*.py`` standard-library sources, so nothing is downloaded
and the corpus exists wherever Python does. The model is a decoder-only transformer in plain
torch: token and learned position embeddings, pre-LayerNorm blocks (causal self-attention via
``scaled_dot_product_attention``, then a GELU MLP), a final LayerNorm and an LM head **tied** to
the token embedding (as in GPT-2, so the embedding's gradient is dense, as in real LMs).

Training emulates DDP: every worker holds the same parameters and reads its own contiguous
shard of the corpus; AdamW steps on the mean of the workers' micro-batch gradients.
"""

from __future__ import annotations

import hashlib
import math
import sysconfig
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from dynamiq.bench.progress import progress_bar, quiet
from dynamiq.bench.workloads.base import WORKLOADS, Progress, Workload, emulate_ddp, mix_seed

__all__ = ["GptStdlib", "TinyGPT", "byte_shards", "byte_windows", "stdlib_corpus"]


@lru_cache(maxsize=4)
def _read_stdlib(max_bytes: int) -> bytes:
    root = Path(sysconfig.get_paths()["stdlib"])
    # Third-party packages installed into the base interpreter are not the standard library
    # and differ between machines, so they are skipped.
    files = sorted(
        (p for p in root.rglob("*.py") if "site-packages" not in p.relative_to(root).parts),
        key=lambda p: p.relative_to(root).as_posix(),
    )
    chunks: list[bytes] = []
    total = 0
    for path in files:
        if total >= max_bytes:
            break
        try:
            data = path.read_bytes()
        except OSError:
            continue
        chunks.append(data[: max_bytes - total])
        total += len(chunks[-1])
    if not chunks:
        raise FileNotFoundError(f"no standard-library sources (*.py) found under {root}")
    return b"".join(chunks)


def stdlib_corpus(max_bytes: int = 8 << 20) -> torch.Tensor:
    """The first ``max_bytes`` bytes of the standard library's ``*.py`` files, concatenated.

    Files under ``sysconfig.get_paths()["stdlib"]`` are read in sorted relative-path order
    (``site-packages`` excluded), so the corpus is deterministic for a given Python build.

    Returns:
        uint8 ``[n]`` with ``n <= max_bytes``.
    """
    return torch.frombuffer(bytearray(_read_stdlib(int(max_bytes))), dtype=torch.uint8)


def byte_shards(data: torch.Tensor, world_size: int, context: int, name: str) -> list[torch.Tensor]:
    """``data`` cut into ``world_size`` contiguous, equally long shards, as DDP's sampler would.

    Args:
        data: uint8 ``[n]`` corpus.
        world_size: Number of workers.
        context: Sequence length the shards must hold (plus the target byte and one spare).
        name: Workload named in the error message.

    Returns:
        ``world_size`` uint8 views ``[n // world_size]``.

    Raises:
        ValueError: The shards are too short for ``context``.
    """
    n = len(data) // world_size
    if n < context + 2:
        raise ValueError(
            f"{name}: {len(data)} corpus bytes give shards of {n} bytes, too short for "
            f"context {context}; lower world_size or raise max_bytes"
        )
    return [data[r * n : (r + 1) * n] for r in range(world_size)]


def byte_windows(
    shard: torch.Tensor, context: int, micro_batch: int, *, seed: int, rank: int, step: int
) -> torch.Tensor:
    """Worker ``rank``'s micro-batch at ``step``: ``micro_batch`` random windows of ``shard``.

    Each (seed, rank, step) has its own generator, so a batch does not depend on what was drawn
    before it (nor on the model that reads it).

    Returns:
        int64 ``[micro_batch, context + 1]`` (inputs are ``[:, :-1]``, targets ``[:, 1:]``).
    """
    g = torch.Generator().manual_seed(mix_seed(seed, rank, step))
    starts = torch.randint(0, len(shard) - context - 1, (micro_batch,), generator=g)
    return shard[starts[:, None] + torch.arange(context + 1)].long()


class _Block(nn.Module):
    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.out = nn.Linear(4 * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.n_heads, c // self.n_heads).unbind(2)
        a = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, c))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class TinyGPT(nn.Module):
    """Byte-level decoder-only transformer with a tied LM head.

    Args:
        d_model: Width.
        n_layers: Number of pre-LN blocks.
        n_heads: Attention heads (must divide ``d_model``).
        context: Maximum sequence length (learned position embeddings).
        vocab: Vocabulary size (256 bytes).
    """

    def __init__(
        self, d_model: int, n_layers: int, n_heads: int, context: int, vocab: int = 256
    ) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"n_heads={n_heads} must divide d_model={d_model}")
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(context, d_model)
        self.blocks = nn.ModuleList(_Block(d_model, n_heads) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)
        # GPT-2 initialisation; residual output projections are scaled down with depth so the
        # residual stream's variance does not grow with the number of blocks.
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() >= 2:
                std = 0.02
                if name.endswith(("proj.weight", "out.weight")):
                    std /= math.sqrt(2 * n_layers)
                nn.init.normal_(p, std=std)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Next-byte logits.

        Args:
            idx: int64 ``[batch, t]`` byte values, ``t <= context``.

        Returns:
            float32 ``[batch, t, vocab]``.
        """
        h = self.tok(idx) + self.pos.weight[: idx.shape[1]]
        for block in self.blocks:
            h = block(h)
        return self.ln_f(h) @ self.tok.weight.T


@dataclass(frozen=True)
class GptStdlib(Workload):
    """Byte-level GPT trained from scratch on the standard library, DDP-emulated.

    The defaults (about 3.26M parameters) record steps 20, 100 and 250 and take about two
    minutes at ``world_size=8`` on two CPU cores; the cost grows linearly with ``world_size``.

    Attributes:
        d_model: Model width.
        n_layers: Transformer blocks.
        n_heads: Attention heads.
        context: Sequence length of every training sequence.
        micro_batch: Sequences per worker per step.
        lr: Peak AdamW learning rate (linear warm-up, then constant).
        warmup: Warm-up steps.
        weight_decay: AdamW weight decay.
        max_bytes: Cap on the corpus size in bytes.
        points: Steps at which per-worker gradients are recorded.
    """

    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 4
    context: int = 128
    micro_batch: int = 4
    lr: float = 1e-3
    warmup: int = 20
    weight_decay: float = 0.01
    max_bytes: int = 8 << 20
    points: tuple[int, ...] = (20, 100, 250)

    name = "gpt-stdlib"

    def _key_extra(self) -> dict[str, str]:
        # The corpus depends on the Python build, so its hash is part of the cache key.
        return {"corpus": hashlib.sha256(_read_stdlib(int(self.max_bytes))).hexdigest()[:16]}

    def build_model(self, seed: int = 0) -> TinyGPT:
        """The freshly initialised model of a run with ``seed``."""
        # fork_rng keeps the caller's global generator untouched by the initialisation.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(mix_seed(seed, 0x6770))
            return TinyGPT(self.d_model, self.n_layers, self.n_heads, self.context)

    def shards(self, world_size: int) -> list[torch.Tensor]:
        """The corpus cut into ``world_size`` contiguous, equally long shards (uint8)."""
        return byte_shards(stdlib_corpus(self.max_bytes), world_size, self.context, self.name)

    def batch(self, shard: torch.Tensor, *, seed: int, rank: int, step: int) -> torch.Tensor:
        """Worker ``rank``'s micro-batch at ``step``: random windows of its shard.

        Each (seed, rank, step) has its own generator, so a batch does not depend on what was
        drawn before it.

        Returns:
            int64 ``[micro_batch, context + 1]`` (inputs are ``[:, :-1]``, targets ``[:, 1:]``).
        """
        return byte_windows(shard, self.context, self.micro_batch, seed=seed, rank=rank, step=step)

    @staticmethod
    def loss(model: TinyGPT, batch: torch.Tensor) -> torch.Tensor:
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
        on_point: Callable[[int, TinyGPT, list[torch.Tensor], torch.Tensor], None] | None = None,
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
            f"gpt-stdlib: {sum(p.numel() for p in params):,} parameters, {world_size} workers x "
            f"{self.micro_batch} x {self.context} bytes, training to step {pts[-1]}"
        )
        opt = torch.optim.AdamW(
            params, lr=self.lr, betas=(0.9, 0.95), weight_decay=self.weight_decay
        )
        batches: dict[int, torch.Tensor] = {}

        def worker_loss(step: int, rank: int) -> torch.Tensor:
            b = self.batch(shards[rank], seed=seed, rank=rank, step=step)
            batches[rank] = b
            return self.loss(model, b)

        every = max(1, pts[-1] // 10)
        bar = progress_bar(pts[-1], "gpt-stdlib", enabled=None if progress else False)

        def on_step(step: int, loss: float) -> None:
            bar.update(step - bar.n)
            bar.set_postfix_str(f"loss {loss:.3f}", refresh=False)
            if quiet(bar) and (step % every == 0 or step in pts):
                say(f"gpt-stdlib: training step {step}/{pts[-1]} loss {loss:.3f}")

        def point_cb(step: int, grads: torch.Tensor) -> None:
            if on_point is not None:
                on_point(step, model, [batches[r] for r in range(world_size)], grads)

        with bar:
            return emulate_ddp(params, worker_loss, opt, world_size, pts,
                               lr_at=lambda s: self.lr * min(1.0, (s + 1) / max(1, self.warmup)),
                               on_step=on_step, on_point=point_cb)


WORKLOADS.register("gpt-stdlib", GptStdlib())
