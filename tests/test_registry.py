"""Registry behaviour: registration, duplicates, aliases, readable misses."""

from __future__ import annotations

import pytest

from dynamiq.registry import DuplicateNameError, Registry, UnknownNameError


def test_register_call_and_decorator():
    r: Registry[object] = Registry("widget")
    assert r.register("a", 1) == 1

    @r.register("b")
    class B:
        pass

    assert r["a"] == 1 and r.get("b") is B
    assert r.names() == ["a", "b"] and len(r) == 2 and "a" in r and "c" not in r


def test_duplicates_raise():
    r: Registry[int] = Registry("widget")
    r.register("a", 1)
    with pytest.raises(DuplicateNameError, match="already registered"):
        r.register("a", 2)
    r.alias("x", "a")
    with pytest.raises(DuplicateNameError):
        r.register("x", 3)
    with pytest.raises(DuplicateNameError):
        r.alias("a", "a")
    assert r["a"] == 1


def test_alias_and_unregister():
    r: Registry[int] = Registry("widget")
    r.register("alpha", 1)
    r.alias("al", "alpha")
    assert r["al"] == 1 and r.canonical("al") == "alpha" and r.aliases() == {"al": "alpha"}
    assert r.unregister("al") == 1
    assert "al" not in r and "alpha" not in r
    with pytest.raises(UnknownNameError):
        r.alias("z", "missing")


def test_unknown_name_lists_known_and_suggests():
    r: Registry[int] = Registry("number format")
    r.register("e4m3", 1)
    r.register("e5m2", 2)
    with pytest.raises(UnknownNameError) as ei:
        r["e4m4"]
    msg = str(ei.value)
    assert "unknown number format 'e4m4'" in msg and "e4m3" in msg and "e5m2" in msg
    assert "Did you mean" in msg


@pytest.mark.parametrize("bad", ["", "a b", "x+y", "f(1)", "p@q", "k=v", " a"])
def test_bad_names(bad):
    r: Registry[int] = Registry("widget")
    with pytest.raises((ValueError, TypeError)):
        r.register(bad, 1)


def test_name_of():
    r: Registry[tuple] = Registry("widget")
    t = (1, 2)
    r.register("t", t)
    assert r.name_of(t) == "t" and r.name_of((1, 2)) == "t" and r.name_of((3,)) is None
