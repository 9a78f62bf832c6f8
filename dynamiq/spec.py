"""Canonical spec strings of components: ``name`` or ``name(key=value,...)``.

Every registered component (topology, codec, transform, workload) prints as such a call and is
rebuilt from it by :func:`build`, so ``build(REG, spec_of(x)) == x``; whitespace is ignored.

Values are typed: a component holds Python values (numbers, booleans, tuples, nested
components), and its spec writes them as Python literals: ``dynamiq(widths=(2,4,8),bits=5.0)``,
``hierarchical(ranks_per_node=2,inner=butterfly)``. How a raw value is read follows the
dataclass field's type hint (:func:`coerce`):

* ``bool``: ``True``/``False`` (also ``true``, ``false``, ``1``, ``0``);
* ``int`` / ``float``: a number literal;
* ``tuple[X, ...]``: a tuple literal ``(a,b,c)``, or one value ``a`` for ``(a,)``; the legacy
  form ``a/b/c`` is accepted on input;
* a component base class enrolled with :func:`register_spec_type` (e.g. ``Topology``): a nested
  spec, built by that kind's builder;
* ``str``: the raw text.

A one-element tuple prints as its element (``group_size=32``), which reads back as ``(32,)``.
"""

from __future__ import annotations

import ast
import math
import re
import types
import typing
from collections.abc import Callable
from dataclasses import MISSING, fields
from typing import Any

from dynamiq.registry import Registry

__all__ = [
    "build",
    "coerce",
    "format_call",
    "format_value",
    "parse_call",
    "register_spec_type",
    "split_top_level",
]

#: Component base class → builder of a nested spec (see :func:`register_spec_type`).
_SPEC_TYPES: dict[type, Callable[[str], object]] = {}


def register_spec_type(base: type, builder: Callable[[str], object]) -> None:
    """Let fields typed ``base`` take nested specs: ``builder(text)`` makes the value.

    Raises:
        ValueError: ``base`` is already enrolled.
    """
    if base in _SPEC_TYPES:
        raise ValueError(f"{base.__name__} is already a spec type")
    _SPEC_TYPES[base] = builder


def split_top_level(body: str, spec: str, sep: str = ",", what: str = "spec") -> list[str]:
    """Split ``body`` at ``sep`` characters outside parentheses, so nested calls stay whole."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(body):
        if ch in "([":
            depth += 1
        elif ch in ")]":
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
    """``"name(a=1,b=x)"`` → ``("name", {"a": "1", "b": "x"})`` (values stay raw text)."""
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


def _literal(raw: str) -> object:
    try:
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return raw


def _scalar(hint: Any, raw: object, fail: Callable[[str], Exception]) -> object:
    """One value of type ``hint`` from raw text (or an already parsed literal)."""
    if hint is Any or hint is object:
        return _literal(raw) if isinstance(raw, str) else raw
    for base, builder in _SPEC_TYPES.items():
        if isinstance(hint, type) and issubclass(hint, base):
            if isinstance(raw, base):
                return raw
            return builder(str(raw))
    if hint is bool:
        low = str(raw).lower()
        if low not in ("true", "false", "1", "0"):
            raise fail("true or false")
        return low in ("true", "1")
    if hint is int:
        if isinstance(raw, bool) or not re.fullmatch(r"[+-]?\d+", str(raw)):
            raise fail("an integer")
        return int(str(raw))
    if hint is float:
        try:
            return float(str(raw))
        except ValueError:
            raise fail("a number") from None
    if hint is str:
        return str(raw)
    if typing.get_origin(hint) is tuple:
        return _tuple(hint, raw, fail)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        if type(None) in typing.get_args(hint) and str(raw) == "None":
            return None
        errors = []
        for opt in sorted(options, key=lambda t: t is str):  # text is the last resort
            try:
                return _scalar(opt, raw, fail)
            except (ValueError, TypeError) as e:
                errors.append(e)
        raise errors[-1]
    return raw


def _tuple(hint: Any, raw: object, fail: Callable[[str], Exception]) -> tuple:
    args = typing.get_args(hint)
    item = args[0] if args else Any
    if isinstance(raw, str):
        text = raw
        if "/" in text and not text.startswith("("):  # the legacy a/b/c form
            parts: list[object] = [p for p in text.split("/") if p]
        elif text.startswith("(") and text.endswith(")"):
            inner = text[1:-1]
            parts = [p for p in split_top_level(inner, text) if p] if inner else []
        else:
            parts = [text]
    elif isinstance(raw, (tuple, list)):
        parts = list(raw)
    else:
        parts = [raw]
    try:
        return tuple(_scalar(item, p, fail) for p in parts)
    except (ValueError, TypeError):
        name = getattr(item, "__name__", str(item))
        raise fail(f"a tuple of {name} values such as (1,2)") from None


def coerce(hint: Any, key: str, raw: str, spec: str, what: str = "spec") -> object:
    """The typed value of field ``key`` (type hint ``hint``) from its raw spec text.

    Raises:
        ValueError: ``raw`` cannot be read as ``hint`` (the message names the field).
    """
    def fail(kind: str) -> ValueError:
        return ValueError(f"{what} spec {spec!r}: {key} must be {kind}, got {raw!r}")

    return _scalar(hint, raw, fail)


def format_value(v: object) -> str:
    """The spec text of a typed value (inverse of :func:`coerce`)."""
    if isinstance(v, tuple):
        if len(v) == 1:
            return format_value(v[0])
        return "(" + ",".join(format_value(x) for x in v) + ")"
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else f"float('{v}')"
    return str(v)


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
    hints = typing.get_type_hints(cls)
    return cls(**{k: coerce(hints.get(k, str), k, v, spec, what) for k, v in raw.items()})


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
        text = values[f.name] if values and f.name in values else format_value(v)
        items.append(f"{f.name}={text}")
    return f"{name}({','.join(items)})" if items else name
