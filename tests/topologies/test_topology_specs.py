"""Spec strings of topologies, and the hierarchical topology's typed (nested) configuration."""

from __future__ import annotations

import re

import pytest
from _topology_samples import BASIC, SAMPLES, ids
from hypothesis import given, settings
from hypothesis import strategies as st

from dynamiq.registry import UnknownNameError
from dynamiq.spec import coerce
from dynamiq.topologies import Butterfly, Hierarchical, Ring, Topology, get_topology

SETTINGS = settings(max_examples=50, deadline=None)


@pytest.mark.parametrize("topo", SAMPLES, ids=ids)
def test_spec_round_trip(topo: Topology) -> None:
    assert get_topology(topo.spec()) == topo
    assert get_topology(str(topo)) == topo
    assert " " not in topo.spec()
    assert get_topology(topo) is topo


_specs = st.recursive(
    st.sampled_from(BASIC),
    lambda sub: st.builds(
        lambda p, i, o: Hierarchical(p, i, o).spec(), st.integers(1, 8), sub, sub
    ),
    max_leaves=4,
)


@SETTINGS
@given(spec=_specs)
def test_spec_round_trip_random(spec: str) -> None:
    topo = get_topology(spec)
    assert topo.spec() == spec
    assert get_topology(topo.spec()) == topo


def test_spec_examples() -> None:
    assert get_topology("ring") == Ring()
    assert get_topology("butterfly") == Butterfly()
    assert Hierarchical(2).spec() == "hierarchical(ranks_per_node=2)"
    assert get_topology("hierarchical(ranks_per_node=2)") == Hierarchical(2)
    full = get_topology("hierarchical(ranks_per_node=4,inner=ring,outer=butterfly)")
    assert full == Hierarchical(4, outer="butterfly")
    assert full.spec() == "hierarchical(ranks_per_node=4,outer=butterfly)"
    assert get_topology(" hierarchical( outer = butterfly , ranks_per_node = 4 ) ") == full
    assert Hierarchical(2, inner=" ring ") == Hierarchical(2)
    assert get_topology("hierarchical(ranks_per_node=2,inner=butterfly)") == Hierarchical(
        2, inner=Butterfly()
    )


def test_levels_are_topology_objects() -> None:
    h = Hierarchical(2)
    assert h.inner == Ring() and h.outer == Ring()
    g = Hierarchical(2, inner="butterfly", outer=Hierarchical(2))
    assert isinstance(g.inner, Butterfly) and g.outer == Hierarchical(2)
    nested = "hierarchical(ranks_per_node=2,inner=butterfly,outer=hierarchical(ranks_per_node=2))"
    assert g.spec() == nested
    assert get_topology(g.spec()) == g and hash(get_topology(g.spec())) == hash(g)
    assert g.inner_topology is g.inner and g.outer_topology is g.outer
    with pytest.raises(TypeError, match="expected a Topology or a spec string"):
        Hierarchical(2, inner=3)  # type: ignore[arg-type]


def test_topology_fields_read_nested_specs() -> None:
    spec = "hierarchical(ranks_per_node=2,outer=butterfly)"
    assert coerce(Topology, "inner", spec, "outer(...)") == Hierarchical(2, outer="butterfly")


@pytest.mark.parametrize(
    ("spec", "error", "fragment"),
    [
        ("tree", UnknownNameError, "unknown topology 'tree'"),
        ("hierarchical(ranks_per_node=2,inner=nope)", UnknownNameError, "Known:"),
        ("hierarchical", ValueError, "needs parameter 'ranks_per_node'"),
        ("hierarchical(ranks_per_node=two)", ValueError, "ranks_per_node must be an integer"),
        ("hierarchical(ranks_per_node=0)", ValueError, "positive int"),
        ("hierarchical(ranks_per_node=2,ranks_per_node=2)", ValueError, "given twice"),
        ("hierarchical(ranks_per_node)", ValueError, "expected key=value"),
        ("hierarchical(ranks_per_node=2", ValueError, "malformed topology spec"),
        ("hierarchical(ranks_per_node=(2)", ValueError, "unbalanced parentheses"),
        ("ring(size=4)", ValueError, "has no parameter 'size'; accepted: none"),
        ("", ValueError, "empty topology spec"),
    ],
)
def test_bad_specs(spec: str, error: type[Exception], fragment: str) -> None:
    with pytest.raises(error, match=re.escape(fragment)):
        get_topology(spec)


def test_unknown_names_list_the_known_ones() -> None:
    with pytest.raises(UnknownNameError) as info:
        get_topology("tree")
    # Tests and guides may register more topologies in this process: check the built-ins only.
    known = str(info.value).split("Known: ", 1)[1].split(", ")
    assert {"butterfly", "hierarchical", "ring"} <= set(known)
    assert known == sorted(known)


def test_get_topology_rejects_other_types() -> None:
    with pytest.raises(TypeError):
        get_topology(3)  # type: ignore[arg-type]
