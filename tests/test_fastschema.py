"""The fast schema check says yes only where jsonschema says yes (and to every simple
valid value), on schemas and values drawn around the subset's edges."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st
from jsonschema import validators

from protoflask.fastschema import compile_simple

TYPES = ["string", "number", "integer", "boolean", "null", "object", "array"]

values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.floats(-3, 3, allow_nan=False)
    | st.sampled_from([1.0, 2.5, 0.0]) | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=2) | st.dictionaries(
        st.sampled_from(["a", "b", "c"]), inner, max_size=3),
    max_leaves=5)

type_spec = st.sampled_from(TYPES) | st.lists(st.sampled_from(TYPES), min_size=1, max_size=3)

leaf_schemas = st.fixed_dictionaries({}, optional={"type": type_spec,
                                                   "description": st.just("d")})


@st.composite
def schemas(draw):
    schema = draw(st.fixed_dictionaries({}, optional={
        "type": type_spec,
        "properties": st.dictionaries(st.sampled_from(["a", "b", "c"]), leaf_schemas,
                                      max_size=3),
        "required": st.lists(st.sampled_from(["a", "b", "c"]), max_size=2, unique=True),
        "additionalProperties": st.booleans(),
    }))
    if draw(st.integers(0, 9)) == 0:  # sometimes step outside the subset
        schema["minLength"] = 1
    return schema


@settings(max_examples=500, deadline=None)
@given(schemas(), values)
def test_fast_check_agrees_with_jsonschema(schema, value):
    check = compile_simple(schema)
    validator = validators.validator_for(schema)(schema)
    if check is None:
        assert "minLength" in schema  # only schemas outside the subset are refused
        return
    assert check(value) == validator.is_valid(value), (schema, value)


def test_builtin_schemas_are_in_the_subset():
    from protoflask.tools import builtin_tools

    for tool in builtin_tools():
        assert tool._input_ok is not None and tool.output_ok is not None


def test_integers_follow_json_schema():
    check = compile_simple({"type": "integer"})
    assert check(3) and check(3.0) and not check(3.5) and not check(True)


@settings(max_examples=300, deadline=None)
@given(schemas(), schemas(), st.sampled_from(["a", "b", "c"]), values, values)
def test_nested_object_schemas_agree_with_jsonschema(outer, inner, name, value, wrapped):
    """A property whose schema is itself an object schema (the subset is recursive)."""
    outer.setdefault("properties", {})[name] = inner
    if isinstance(value, dict):
        value = {**value, name: wrapped}
    check = compile_simple(outer)
    validator = validators.validator_for(outer)(outer)
    if check is None:
        assert "minLength" in outer or "minLength" in inner
        return
    assert check(value) == validator.is_valid(value), (outer, value)


def test_object_type_refuses_other_values_with_properties():
    check = compile_simple({"type": "object", "properties": {"a": {"type": "string"}},
                            "required": ["a"], "additionalProperties": False})
    assert check({"a": "x"}) and not check({"a": 1}) and not check({"a": "x", "b": 1})
    assert not check([]) and not check("a") and not check(None) and not check({})
    loose = compile_simple({"properties": {"a": {"type": "string"}}, "required": ["a"]})
    assert loose([]) and loose("a") and not loose({}) and loose({"a": "x", "b": 1})


SAMPLES = [None, True, False, 0, 1, -2, 1.0, 2.5, 0.0, "", "x", [], [1], {}, {"a": 1}]


def test_a_property_of_types_only_is_checked_as_jsonschema_checks_it():
    """Every type name and pair of names as a property's schema (checked inline by the
    value's Python type, ``_types_only``) over a value of every kind: jsonschema's answer."""
    specs = [name for name in TYPES] + [[a, b] for a in TYPES for b in TYPES if a < b]
    for spec in specs:
        for prop in ({"type": spec}, {"type": spec, "description": "d"}):
            schema = {"type": "object", "properties": {"a": prop}}
            check = compile_simple(schema)
            validator = validators.validator_for(schema)(schema)
            assert check is not None
            for value in SAMPLES:
                assert check({"a": value}) == validator.is_valid({"a": value}), (spec, value)
