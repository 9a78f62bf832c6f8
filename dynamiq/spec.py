"""Canonical spec strings of components: ``name`` or ``name(key=value,...)``.

Every registered component (topology, codec, transform) prints as such a call and is rebuilt
from it by :func:`build`, so ``build(REG, spec_of(x)) == x``. Values may themselves be nested
calls (``hierarchical(ranks_per_node=2,inner=ring)``); whitespace is ignored.
"""

from __future__ import annotations

import re
import typing
from dataclasses import MISSING, fields

from dynamiq.registry import Registry

__all__ = ["build", "format_call", "parse_call", "split_top_level"]


def split_top_level(body: str, spec: str, sep: str = ",", what: str = "spec") -> list[str]:
    """Split ``body`` at ``sep`` characters outside parentheses, so nested calls stay whole."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(body):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced parentheses in {what} spec {spec!r}")
        elif ch == sep and depth == 0:
            parts.append(body[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"unbalanced parentheses in {what} spec {spec!r}")
    parts.append(body[start:])
    return parts


def parse_call(spec: str, what: str = "spec") -> tuple[str, dict[str, str]]:
    """``"name(a=1,b=x)"`` → ``("name", {"a": "1", "b": "x"})`` (values stay strings)."""
    if not isinstance(spec, str):
        raise TypeError(f"expected a {what} string, got {type(spec).__name__}")
    text = "".join(spec.split())
    if not text:
        raise ValueError(f"empty {what} spec")
    name, paren, rest = text.partition("(")
    if not paren:
        return name, {}
    if not rest.endswith(")"):
        raise ValueError(f"malformed {what} spec {spec!r}: expected name(key=value,...)")
    params: dict[str, str] = {}
    body = rest[:-1]
    for item in split_top_level(body, spec, what=what) if body else []:
        key, eq, value = item.partition("=")
        if not (eq and key and value):
            raise ValueError(
                f"malformed parameter {item!r} in {what} spec {spec!r}: expected key=value"
            )
        if key in params:
            raise ValueError(f"parameter {key!r} given twice in {what} spec {spec!r}")
        params[key] = value
    return name, params


def _coerce(cls: type, key: str, raw: str, spec: str, what: str) -> object:
    hint = typing.get_type_hints(cls).get(key, str)
    if hint is bool:
        low = raw.lower()
        if low not in ("true", "false", "1", "0"):
            raise ValueError(f"{what} spec {spec!r}: {key} must be true or false, got {raw!r}")
        return low in ("true", "1")
    if hint is int:
        if not re.fullmatch(r"[+-]?\d+", raw):
            raise ValueError(f"{what} spec {spec!r}: {key} must be an integer, got {raw!r}")
        return int(raw)
    if hint is float:
        try:
            return float(raw)
        except ValueError:
            raise ValueError(f"{what} spec {spec!r}: {key} must be a number, got {raw!r}") from None
    return raw


def build(registry: Registry, spec: str, what: str) -> object:
    """Instantiate the registered dataclass that ``spec`` names with its parameters.

    Raises:
        UnknownNameError: unknown name (the message lists the known ones).
        ValueError: malformed spec, unknown or missing parameter, or a value of the wrong type.
    """
    name, raw = parse_call(spec, what)
    cls = registry.get(name)
    params = {f.name: f for f in fields(cls) if f.init}
    unknown = sorted(set(raw) - set(params))
    if unknown:
        raise ValueError(
            f"{what} {name!r} has no parameter {', '.join(map(repr, unknown))}; accepted: "
            f"{', '.join(params) or 'none'}"
        )
    missing = [k for k, f in params.items()
               if f.default is MISSING and f.default_factory is MISSING and k not in raw]
    if missing:
        example = ",".join(f"{k}=..." for k in missing)
        raise ValueError(
            f"{what} {name!r} needs parameter {', '.join(map(repr, missing))}, "
            f"e.g. {name}({example})"
        )
    return cls(**{k: _coerce(cls, k, v, spec, what) for k, v in raw.items()})


def format_call(name: str, obj: object, values: dict[str, str] | None = None) -> str:
    """Canonical spec of dataclass ``obj`` registered as ``name``: non-default fields only.

    ``values`` overrides how individual fields print (e.g. a quantizer by its registered name).
    """
    items = []
    for f in fields(obj):
        if not f.init:
            continue
        v = getattr(obj, f.name)
        if f.default is not MISSING and v == f.default and not (values and f.name in values):
            continue
        items.append(f"{f.name}={values[f.name] if values and f.name in values else v}")
    return f"{name}({','.join(items)})" if items else name
