"""Pipelines: canonical spec strings round-trip, malformed ones fail with a useful message.

``Pipeline.parse(str(p)) == p`` (with equal hashes) is checked on hypothesis-generated pipelines
over every registered quantizer, on every registered pipeline, and on strings with whitespace.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

import dynamiq.pipeline
from dynamiq import (
    PIPELINES,
    QUANTIZERS,
    Butterfly,
    Hierarchical,
    Identity,
    Passthrough,
    Pipeline,
    RandomizedHadamard,
    Requant,
    Ring,
    UnknownNameError,
    get_pipeline,
)
from dynamiq.pipeline import transform_spec

# ---------------------------------------------------------------- strategies
rhts = st.builds(
    RandomizedHadamard,
    block_size=st.sampled_from([2**k for k in range(4, 11)]),  # 16 .. 1024
    seed=st.integers(0, 2**64 - 1),
)
transform_chains = st.lists(st.one_of(rhts, st.just(Identity())), max_size=2).map(tuple)
passthroughs = st.sampled_from(["fp32", "bf16"]).map(Passthrough)
requants = st.builds(Requant, st.sampled_from(QUANTIZERS.names()), seed=st.integers(0, 2**63))
codecs = st.one_of(passthroughs, requants)
basic = st.sampled_from(["ring", "butterfly"])
topologies = st.one_of(
    st.just(Ring()),
    st.just(Butterfly()),
    st.builds(Hierarchical, st.sampled_from([1, 2, 4]), basic, basic),
)
overrides = st.tuples(
    st.one_of(st.none(), passthroughs),  # intra=passthrough(...)
    st.one_of(st.none(), codecs),  # inter=...
).map(lambda io: tuple((lvl, c) for lvl, c in zip(("intra", "inter"), io) if c is not None))


@st.composite
def pipelines(draw) -> Pipeline:
    topology = draw(topologies)
    # only hierarchical schedules have link levels to override
    levels = draw(overrides) if isinstance(topology, Hierarchical) else ()
    return Pipeline(
        codec=draw(codecs),
        topology=topology,
        transforms=draw(transform_chains),
        level_codecs=levels,
    )


def _spaced(spec: str) -> str:
    """The same spec with whitespace around every separator (parse ignores it)."""
    return re.sub(r"([@+|=(),])", r" \1\n ", spec)


# ---------------------------------------------------------------- round trips
@given(pipelines())
def test_generated_pipelines_round_trip(p):
    s = str(p)
    back = Pipeline.parse(s)
    assert back == p and hash(back) == hash(p)
    assert str(back) == s and " " not in s
    assert Pipeline.parse(_spaced(s)) == p
    assert get_pipeline(s) == p


@given(pipelines())
def test_components_given_as_specs_equal_objects(p):
    q = Pipeline(
        codec=p.codec.spec(),
        topology=p.topology.spec(),
        transforms=tuple(transform_spec(t) for t in p.transforms),
        level_codecs=tuple((lvl, c.spec()) for lvl, c in reversed(p.level_codecs)),
    )
    assert q == p and hash(q) == hash(p) and str(q) == str(p)


@given(pipelines())
def test_level_codecs_and_block_size(p):
    levels = dict(p.level_codecs)
    for lvl in ("intra", "inter", None):
        assert p.codec_for(lvl) == levels.get(lvl, p.codec)
    assert p.block_size == max(c.block_size for c in [p.codec, *levels.values()])
    assert list(levels) == sorted(levels)  # canonical order, whatever order they were given in


@pytest.mark.parametrize("name", PIPELINES.names())
def test_registered_pipelines_round_trip(name):
    p = PIPELINES[name]
    s = str(p)
    back = Pipeline.parse(s)
    assert back == p and hash(back) == hash(p) and str(back) == s
    assert get_pipeline(name) is p
    assert get_pipeline(s) == p
    assert PIPELINES.name_of(back) == name


@pytest.mark.parametrize(
    ("name", "spec"),
    [
        ("requant-dq4", "requant(quantizer=dq4_hier)@ring"),
        ("requant-dq4-butterfly", "requant(quantizer=dq4_hier)@butterfly"),
        ("passthrough-bf16", "passthrough(wire=bf16)@ring"),
        ("requant-mxfp8", "requant(quantizer=mxfp8)@ring"),
    ],
)
def test_registered_pipeline_strings(name, spec):
    assert str(PIPELINES[name]) == spec


def test_level_override_spec():
    p = PIPELINES["requant-dq4-hier2"]
    assert p.codec == Requant("dq4_hier") and p.topology == Hierarchical(2)
    assert p.codec_for("intra") == Passthrough("fp32") and p.codec_for("inter") == p.codec
    assert Pipeline.parse(
        "requant(quantizer=dq4_hier)|intra=passthrough@hierarchical(ranks_per_node=2)"
    ) == p


def test_transform_spec_prints_non_default_fields():
    assert transform_spec(RandomizedHadamard()) == "rht"
    assert transform_spec(RandomizedHadamard(block_size=64, seed=3)) == "rht(block_size=64,seed=3)"
    assert transform_spec(Identity()) == "identity"


def _docstring_examples() -> list[str]:
    """The indented example specs after the first ``::`` of dynamiq.pipeline's docstring."""
    doc = dynamiq.pipeline.__doc__ or ""
    _, _, rest = doc.partition("::\n")
    lines = rest.splitlines()
    while lines and not lines[0].strip():
        lines.pop(0)
    examples = []
    for line in lines:
        if not line.startswith("    "):
            break
        examples.append(line.strip())
    return examples


def test_docstring_examples_parse():
    examples = _docstring_examples()
    assert len(examples) == 3, examples
    for s in examples:
        p = Pipeline.parse(s)
        assert Pipeline.parse(str(p)) == p


def test_docstring_examples_are_canonical():
    for s in _docstring_examples():
        assert str(Pipeline.parse(s)) == s


# ---------------------------------------------------------------- malformed strings
@pytest.mark.parametrize(
    ("spec", "match"),
    [
        # no (or more than one) '@', or an empty side
        ("requant(quantizer=mxfp8)", r"must have the form .*@topology"),
        ("requant(quantizer=mxfp8)@", r"must have the form"),
        ("@ring", r"must have the form"),
        ("passthrough@ring@ring", r"must have the form"),
        # level overrides that are not level=codec, or a level given twice
        ("passthrough|intra@ring", r"level override 'intra' is not of the form level=codec"),
        ("passthrough|=passthrough@ring", r"level override '=passthrough'"),
        ("passthrough|intra=@ring", r"level override 'intra='"),
        ("passthrough|intra=passthrough|intra=passthrough(wire=bf16)@ring", r"two codecs"),
        ("passthrough|intra=passthrough@ring", r"level 'intra' does not exist in topology ring"),
        ("passthrough|itnra=passthrough@hierarchical(ranks_per_node=2)", r"intra, inter"),
        # unbalanced parentheses anywhere
        ("passthrough(wire=bf16@ring", r"unbalanced parentheses in pipeline spec"),
        ("passthrough)(@ring", r"unbalanced parentheses"),
        ("(passthrough@ring", r"unbalanced parentheses"),
        ("passthrough@hierarchical(ranks_per_node=2", r"unbalanced parentheses"),
        # bad components and parameters
        ("rht++passthrough@ring", r"empty transform spec"),
        ("rht(block_size=1000)+passthrough@ring", r"power of two"),
        ("passthrough(wire=fp16)@ring", r"'fp32' or 'bf16'"),
        ("passthrough@ring(x=1)", r"topology 'ring' has no parameter 'x'"),
        ("passthrough@hierarchical", r"needs parameter 'ranks_per_node'"),
        ("passthrough@hierarchical(ranks_per_node=two)", r"ranks_per_node must be an integer"),
    ],
)
def test_malformed_specs(spec, match):
    with pytest.raises(ValueError, match=match):
        Pipeline.parse(spec)


@pytest.mark.parametrize(
    ("spec", "kind", "name"),
    [
        ("lz4@ring", "partial-sum codec", "lz4"),
        ("passthrough|intra=lz4@ring", "partial-sum codec", "lz4"),
        ("passthrough@torus", "topology", "torus"),
        ("passthrough@hierarchical(ranks_per_node=2,inner=torus)", "topology", "torus"),
        ("fft+passthrough@ring", "transform", "fft"),
        ("requant(quantizer=mxfp9)@ring", "quantizer", "mxfp9"),
    ],
)
def test_unknown_names_are_reported_with_the_known_ones(spec, kind, name):
    # UnknownNameError is a KeyError (see dynamiq.registry), not a ValueError
    with pytest.raises(UnknownNameError) as info:
        Pipeline.parse(spec)
    msg = str(info.value)
    assert f"unknown {kind} {name!r}" in msg and "Known: " in msg


# ---------------------------------------------------------------- get_pipeline
def test_get_pipeline_by_name_spec_and_object():
    p = PIPELINES["requant-dq4"]
    assert get_pipeline("requant-dq4") is p
    assert get_pipeline("requant(quantizer=dq4_hier)@ring") == p
    assert get_pipeline(" requant( quantizer = dq4_hier ) @ ring ") == p
    assert get_pipeline(p) is p
    q = Pipeline(Passthrough("bf16"), "butterfly", transforms=("rht",))
    assert get_pipeline(str(q)) == q


def test_get_pipeline_unknown_name_lists_registered_ones():
    with pytest.raises(UnknownNameError) as info:
        get_pipeline("requant-dq5")
    msg = str(info.value)
    assert re.search(r"Did you mean [^?]*'requant-dq4'", msg)
    for name in PIPELINES.names():
        assert name in msg


def test_get_pipeline_rejects_other_types():
    with pytest.raises(TypeError, match="registered name or a spec"):
        get_pipeline(42)  # type: ignore[arg-type]


def test_get_pipeline_malformed_spec():
    with pytest.raises(ValueError, match="unbalanced"):
        get_pipeline("requant(quantizer=dq4_hier@ring")
