"""One registry type for every kind of named component.

Formats, quantizers, transforms, codecs and topologies are all looked up by name through a
:class:`Registry`. Registering a name twice raises instead of silently replacing the first entry;
aliases are explicit and point at a canonical name.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")

__all__ = ["DuplicateNameError", "Registry", "UnknownNameError"]


class UnknownNameError(KeyError, ValueError):
    """Raised when a name is not registered; the message lists the known names.

    It is a ``KeyError`` (a failed lookup) and a ``ValueError`` (a bad value in a spec string or
    config), so either ``except`` catches it.
    """

    def __str__(self) -> str:  # KeyError quotes its message; we want it readable.
        return str(self.args[0]) if self.args else ""


class DuplicateNameError(ValueError):
    """Raised when a name (or alias) is registered twice in the same registry."""


class Registry(Generic[T]):
    """A name → component mapping with explicit aliases.

    Args:
        kind: What the registry holds, used in error messages (e.g. ``"number format"``).

    Example:
        >>> r = Registry[int]("number")
        >>> r.register("one", 1)
        1
        >>> r.alias("uno", "one")
        >>> r["uno"]
        1
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}
        self._aliases: dict[str, str] = {}

    @staticmethod
    def _check_name(name: str) -> None:
        if not isinstance(name, str) or not name:
            raise TypeError(f"registry names must be non-empty strings, got {name!r}")
        if name != name.strip() or any(c in name for c in "+@(),= "):
            raise ValueError(
                f"registry name {name!r} may not contain spaces or any of '+@(),=' "
                "(they are reserved by the pipeline spec syntax)"
            )

    def register(self, name: str, item: T | None = None) -> T | Callable[[T], T]:
        """Register ``item`` under ``name``; usable as a call or as a decorator.

        Args:
            name: The canonical name. Must not already be a name or alias here.
            item: The component. When omitted, returns a decorator that registers its argument.

        Returns:
            ``item`` itself (or the decorator).

        Raises:
            DuplicateNameError: ``name`` is already registered (as a name or alias).
        """
        if item is None:

            def deco(obj: T) -> T:
                self.register(name, obj)
                return obj

            return deco
        self._check_name(name)
        if name in self._items or name in self._aliases:
            raise DuplicateNameError(
                f"{self.kind} {name!r} is already registered; pick another name or "
                f"unregister the existing one first"
            )
        self._items[name] = item
        return item

    def alias(self, alias: str, target: str) -> None:
        """Make ``alias`` resolve to the registered name ``target``.

        Raises:
            DuplicateNameError: ``alias`` is already a name or alias.
            UnknownNameError: ``target`` is not registered.
        """
        self._check_name(alias)
        if alias in self._items or alias in self._aliases:
            raise DuplicateNameError(f"{self.kind} name {alias!r} is already taken")
        self._aliases[alias] = self.canonical(target)

    def unregister(self, name: str) -> T:
        """Remove a canonical name and every alias pointing to it; returns the removed item."""
        canon = self.canonical(name)
        for a in [a for a, t in self._aliases.items() if t == canon]:
            del self._aliases[a]
        return self._items.pop(canon)

    def canonical(self, name: str) -> str:
        """Resolve an alias to its canonical name (a canonical name maps to itself)."""
        if name in self._items:
            return name
        if name in self._aliases:
            return self._aliases[name]
        known = sorted(self._items) + sorted(self._aliases)
        close = difflib.get_close_matches(str(name), known, n=3)
        hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
        raise UnknownNameError(
            f"unknown {self.kind} {name!r}.{hint} Known: {', '.join(sorted(self._items))}"
        )

    def get(self, name: str) -> T:
        """Return the component registered as ``name`` (or an alias of it)."""
        return self._items[self.canonical(name)]

    __getitem__ = get

    def name_of(self, item: T) -> str | None:
        """The canonical name under which ``item`` is registered (by equality), or ``None``."""
        for k, v in self._items.items():
            if v is item:
                return k
        for k, v in self._items.items():
            try:
                if v == item:
                    return k
            except Exception:  # components with array fields may not compare
                continue
        return None

    def names(self) -> list[str]:
        """Canonical names, in registration order."""
        return list(self._items)

    def aliases(self) -> dict[str, str]:
        """A copy of the alias → canonical-name map."""
        return dict(self._aliases)

    def items(self) -> list[tuple[str, T]]:
        """``(name, component)`` pairs in registration order."""
        return list(self._items.items())

    def __contains__(self, name: object) -> bool:
        return name in self._items or name in self._aliases

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._items))

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {len(self)} entries)"
