"""``cnn-digits``: a small residual CNN with BatchNorm trained on scikit-learn's digits.

The data are the 1,797 8×8 handwritten digits that ship inside the scikit-learn wheel
(:func:`sklearn.datasets.load_digits`; nothing is downloaded), so the workload needs
``pip install 'dynamiq[digits]'``; scikit-learn is imported only when the workload runs.

The model is a ResNet in miniature: a conv–BN–ReLU stem, two residual blocks (conv–BN–ReLU–
conv–BN plus a 1×1 conv–BN shortcut; the second halves the resolution), global average pooling
and a linear head. BatchNorm is what sets it apart from the transformer workloads: every
worker normalises with its *own* micro-batch statistics, as DDP without ``SyncBatchNorm`` does,
so a worker's gradient is not the gradient of its samples under a shared normalisation and the
workers' mean is not the full batch's gradient.

Training emulates DDP: each worker holds a disjoint shard of a seeded permutation of the
images (as ``DistributedSampler`` gives it), draws its micro-batch from the shard, shifts each
image by up to one pixel (the usual augmentation) and backpropagates; SGD with Nesterov
momentum steps on the mean of the workers' gradients.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import nn

from dynamiq.bench.workloads.base import (
    WORKLOADS,
    Progress,
    Workload,
    WorkloadUnavailable,
    mix_seed,
)
from dynamiq.bench.workloads.loop import train_ddp, warmup_lr

__all__ = ["CnnDigits", "DigitsResNet", "digits_data"]

_UNAVAILABLE = (
    "cnn-digits needs scikit-learn (its bundled digits data set): pip install 'dynamiq[digits]' "
    '(in a checkout: pip install -e ".[digits]")'
)


@lru_cache(maxsize=1)
def _load_digits() -> tuple[bytes, bytes]:
    try:
        from sklearn.datasets import load_digits
    except ImportError as e:
        raise WorkloadUnavailable(_UNAVAILABLE) from e
    bunch = load_digits()
    # Raw bytes are what the cache key hashes; fixed dtypes make them the same on every platform.
    images = bunch.images.astype("float32").tobytes()
    labels = bunch.target.astype("int64").tobytes()
    return images, labels


def digits_data() -> tuple[torch.Tensor, torch.Tensor]:
    """scikit-learn's digits, standardised.

    Pixels (0–16) are shifted and scaled by the data set's mean and standard deviation, so the
    stem sees zero-mean, unit-variance inputs.

    Returns:
        ``(images, labels)``: float32 ``[1797, 1, 8, 8]`` and int64 ``[1797]`` (0–9).

    Raises:
        WorkloadUnavailable: scikit-learn is not installed.
    """
    raw_x, raw_y = _load_digits()
    x = torch.frombuffer(bytearray(raw_x), dtype=torch.float32).view(-1, 1, 8, 8)
    y = torch.frombuffer(bytearray(raw_y), dtype=torch.int64)
    return (x - x.mean()) / x.std(), y.clone()


def _conv_bn(cin: int, cout: int, k: int, stride: int = 1) -> nn.Sequential:
    # No conv bias: the BatchNorm after it would cancel it, and its gradient would be zero.
    return nn.Sequential(
        nn.Conv2d(cin, cout, k, stride=stride, padding=k // 2, bias=False), nn.BatchNorm2d(cout)
    )


class _ResBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.a = _conv_bn(cin, cout, 3, stride)
        self.b = _conv_bn(cout, cout, 3)
        self.skip = _conv_bn(cin, cout, 1, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.b(F.relu(self.a(x))) + self.skip(x))


class DigitsResNet(nn.Module):
    """Residual CNN for 8×8 single-channel images.

    Channels are ``width``, ``2 * width`` and ``4 * width``; the second block has stride 2
    (8×8 → 4×4). Convolutions use He initialisation (fan-out, as torchvision's ResNets do).

    Args:
        width: Channels of the stem.
        classes: Output classes.
    """

    def __init__(self, width: int = 32, classes: int = 10) -> None:
        super().__init__()
        self.stem = _conv_bn(1, width, 3)
        self.block1 = _ResBlock(width, 2 * width, 1)
        self.block2 = _ResBlock(2 * width, 4 * width, 2)
        self.head = nn.Linear(4 * width, classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Class logits.

        Args:
            x: float32 ``[batch, 1, 8, 8]``.

        Returns:
            float32 ``[batch, classes]``.
        """
        h = self.block2(self.block1(F.relu(self.stem(x))))
        return self.head(h.mean((2, 3)))


def shift_images(x: torch.Tensor, generator: torch.Generator, max_shift: int = 1) -> torch.Tensor:
    """Translate each image by a random whole number of pixels, zero-filling what comes in.

    Args:
        x: float32 ``[batch, 1, h, w]``.
        generator: Source of the shifts.
        max_shift: Largest shift along each axis.

    Returns:
        float32 ``[batch, 1, h, w]``.
    """
    if max_shift <= 0:
        return x
    b, _, h, w = x.shape
    s = max_shift
    # Pad with the blank-pixel value (the smallest after standardisation), not zero, so a shift
    # does not draw a frame around the digit.
    padded = F.pad(x, (s, s, s, s), value=float(x.amin()))
    dy, dx = torch.randint(0, 2 * s + 1, (2, b), generator=generator)
    rows = (dy[:, None] + torch.arange(h))[:, :, None]
    cols = (dx[:, None] + torch.arange(w))[:, None, :]
    return padded[torch.arange(b)[:, None, None], 0, rows, cols].unsqueeze(1)


@dataclass(frozen=True)
class CnnDigits(Workload):
    """Residual BatchNorm CNN trained on scikit-learn's digits, DDP-emulated.

    The defaults have 289,514 parameters (1,216 of them BatchNorm scales and shifts; 230,144 in
    the second block) and record steps 5, 60 and 200; ``world_size=8`` takes about 20 s on two
    idle CPU cores (linear in ``world_size``). The gradients are dense (no zero super-group) and
    their energy moves with training: the head's 1,290 coordinates hold half of it at step 5,
    the stem and the first block three quarters by step 200, when the loss is near zero and
    the gradient a third of its early norm; BatchNorm's parameters hold about 1 %.

    Attributes:
        width: Stem channels (blocks have 2× and 4×).
        micro_batch: Images per worker per step.
        lr: Peak SGD learning rate (linear warm-up, then constant).
        warmup: Warm-up steps.
        momentum: Nesterov momentum.
        weight_decay: L2 penalty (applied by SGD, not part of the recorded gradients).
        max_shift: Largest random translation, in pixels (0 disables the augmentation).
        points: Steps at which per-worker gradients are recorded.
    """

    width: int = 32
    micro_batch: int = 16
    lr: float = 0.05
    warmup: int = 10
    momentum: float = 0.9
    weight_decay: float = 5e-4
    max_shift: int = 1
    points: tuple[int, ...] = (5, 60, 200)

    name = "cnn-digits"

    def _key_extra(self) -> dict[str, str]:
        # Another scikit-learn could ship other bytes; the data's hash keys the cache.
        raw_x, raw_y = _load_digits()
        return {"digits": hashlib.sha256(raw_x + raw_y).hexdigest()[:16]}

    def build_model(self, seed: int = 0) -> DigitsResNet:
        """The freshly initialised model of a run with ``seed``, in train mode."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(mix_seed(seed, 0x636E6E))
            return DigitsResNet(self.width).train()

    def shards(self, world_size: int, seed: int = 0) -> list[torch.Tensor]:
        """Each worker's image indices: a seeded permutation dealt out round-robin (int64)."""
        _, y = digits_data()
        perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(mix_seed(seed, 7)))
        shards = [perm[r::world_size] for r in range(world_size)]
        if len(shards[-1]) < self.micro_batch:
            raise ValueError(
                f"cnn-digits: {len(y)} images give shards of {len(shards[-1])}, fewer than "
                f"micro_batch {self.micro_batch}; lower world_size or micro_batch"
            )
        return shards

    def batch(
        self, shard: torch.Tensor, *, seed: int, rank: int, step: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Worker ``rank``'s augmented micro-batch at ``step`` (distinct images of its shard).

        Returns:
            ``(images, labels)``: float32 ``[micro_batch, 1, 8, 8]``, int64 ``[micro_batch]``.
        """
        x, y = digits_data()
        g = torch.Generator().manual_seed(mix_seed(seed, rank, step))
        idx = shard[torch.randperm(len(shard), generator=g)[: self.micro_batch]]
        return shift_images(x[idx], g, self.max_shift), y[idx]

    def train(
        self,
        world_size: int,
        points: tuple[int, ...] | None = None,
        *,
        seed: int = 0,
        progress: Progress | None = None,
        on_point: Callable[[int, DigitsResNet, list, torch.Tensor], None] | None = None,
    ) -> dict[int, torch.Tensor]:
        """Run the DDP-emulated training, without the cache.

        Args:
            world_size: Number of workers.
            points: Steps to record (the configured ones when ``None``).
            seed: Seed of initialisation, data order and augmentation.
            progress: Receives progress lines.
            on_point: Optional ``(step, model, batches, grads)`` callback at each recorded step,
                before the update (``batches`` holds each worker's ``(images, labels)``).

        Returns:
            ``{step: float32 [world_size, d]}``, ``d`` = number of parameters.
        """
        pts = self.default_points() if points is None else tuple(sorted(set(points)))
        say = progress or (lambda _msg: None)
        shards = self.shards(world_size, seed)
        model = self.build_model(seed)
        params = list(model.parameters())
        say(
            f"cnn-digits: {sum(p.numel() for p in params):,} parameters, {world_size} workers x "
            f"{self.micro_batch} images, training to step {pts[-1]}"
        )
        opt = torch.optim.SGD(params, lr=self.lr, momentum=self.momentum, nesterov=True,
                              weight_decay=self.weight_decay)
        batches: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

        def worker_loss(step: int, rank: int) -> torch.Tensor:
            # In train mode each forward normalises with this worker's micro-batch statistics.
            # The running statistics it also updates never enter a training-mode gradient.
            batches[rank] = self.batch(shards[rank], seed=seed, rank=rank, step=step)
            images, labels = batches[rank]
            return F.cross_entropy(model(images), labels)

        def point_cb(step: int, grads: torch.Tensor) -> None:
            if on_point is not None:
                on_point(step, model, [batches[r] for r in range(world_size)], grads)

        return train_ddp(self.name, params, worker_loss, opt, world_size, pts, progress=progress,
                         lr_at=warmup_lr(self.lr, self.warmup), on_point=point_cb)


WORKLOADS.register("cnn-digits", CnnDigits())
