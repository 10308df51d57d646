"""A predicate for the simple JSON Schemas most tools declare, checked in a microsecond.

jsonschema stays the definition and words every error: ``compile_simple`` returns a
function that answers True only when jsonschema would accept the value, or None when
the schema uses anything beyond this subset (then jsonschema alone decides). A False
answer sends the value to jsonschema for its errors. tests/test_fastschema.py holds
both to the same answers.

The subset: ``type`` (a name or a list of names), ``properties`` whose values are
themselves in the subset, ``required``, ``additionalProperties`` as a boolean, and the
annotations ``description``, ``title``, ``$schema``. An empty schema accepts everything.
"""

from __future__ import annotations

from typing import Any, Callable

Check = Callable[[Any], bool]

_ANNOTATIONS = frozenset({"description", "title", "$schema", "$comment", "examples"})
_KEYWORDS = frozenset({"type", "properties", "required", "additionalProperties"}) | _ANNOTATIONS


def _is_integer(v: Any) -> bool:
    # JSON Schema: an integer is any number with no fractional part (1.0 included)
    if type(v) is int:
        return True
    return type(v) is float and v.is_integer()


_TYPES: dict[str, Check] = {
    "string": lambda v: type(v) is str,
    "number": lambda v: type(v) is int or type(v) is float,
    "integer": _is_integer,
    "boolean": lambda v: type(v) is bool,
    "null": lambda v: v is None,
    "object": lambda v: type(v) is dict,
    "array": lambda v: type(v) is list,
}


#: the type names whose check is the value's Python type alone (not "integer": 1.0 is one)
_PY_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "number": (int, float), "boolean": (bool,), "null": (type(None),),
    "object": (dict,), "array": (list,),
}


def _types_only(schema: Any) -> tuple[type, ...] | None:
    """The Python types a property's schema takes when it is a ``type`` and annotations
    only (``{"type": "string"}``): checked inline by ``object_check``, without a call per
    property (a tool call's params and result each, docs/PERFORMANCE.md "The tool row
    within 5%"); None for any other schema."""
    if not isinstance(schema, dict) or "type" not in schema or \
            not set(schema) <= _ANNOTATIONS | {"type"}:
        return None
    names = schema["type"]
    names = [names] if isinstance(names, str) else names
    if not isinstance(names, list) or not names or \
            not all(isinstance(n, str) and n in _PY_TYPES for n in names):
        return None
    return tuple(t for n in names for t in _PY_TYPES[n])


def compile_simple(schema: Any) -> Check | None:
    """A fast acceptance check for ``schema``, or None if it is outside the subset."""
    if schema is True or schema == {}:
        return lambda v: True
    if not isinstance(schema, dict) or not set(schema) <= _KEYWORDS:
        return None
    type_check: Check | None = None
    only_objects = False
    if "type" in schema:
        names = schema["type"]
        names = [names] if isinstance(names, str) else names
        if not isinstance(names, list) or not names or \
                not all(isinstance(n, str) and n in _TYPES for n in names):
            return None
        type_checks = [_TYPES[n] for n in names]
        only_objects = set(names) == {"object"}
        type_check = type_checks[0] if len(type_checks) == 1 else _any_of(tuple(type_checks))
    props = schema.get("properties", {})
    required = schema.get("required", [])
    extra = schema.get("additionalProperties", True)
    if not isinstance(props, dict) or not isinstance(required, list) or \
            not all(isinstance(r, str) for r in required) or not isinstance(extra, bool):
        return None
    prop_checks: dict[str, Check | tuple[type, ...]] = {}
    for name, sub in props.items():
        types = _types_only(sub)
        if types is not None:
            prop_checks[name] = types
            continue
        check = compile_simple(sub)
        if check is None:
            return None
        prop_checks[name] = check
    if not (prop_checks or required or not extra):
        return type_check if type_check is not None else (lambda v: True)
    object_check = _object_check(prop_checks, tuple(required), extra, only_objects)
    if type_check is None or only_objects:  # only_objects: object_check refuses the rest
        return object_check
    return _all_of(type_check, object_check)


def _object_check(prop_checks: dict[str, Check | tuple[type, ...]], needed: tuple[str, ...],
                  extra: bool, only_objects: bool) -> Check:
    """``properties``, ``required`` and ``additionalProperties`` in one loop; a value
    that is not an object passes (these keywords only constrain objects) unless
    ``only_objects`` (the schema's ``type`` is "object", checked here too). A property's
    check is a predicate, or the tuple of Python types its schema takes (``_types_only``)."""
    get = prop_checks.get

    def object_check(v: Any) -> bool:
        if type(v) is not dict:
            return not only_objects
        for key in needed:
            if key not in v:
                return False
        for key, value in v.items():
            check = get(key)
            if check is not None:
                if type(check) is tuple:
                    if type(value) not in check:
                        return False
                elif not check(value):  # type: ignore[operator]
                    return False
            elif not extra:  # a key with no check is not among the properties
                return False
        return True

    return object_check


def _all_of(first: Check, second: Check) -> Check:
    return lambda value: first(value) and second(value)


def _any_of(checks: tuple[Callable[[Any], bool], ...]) -> Callable[[Any], bool]:
    """A check passing when any of ``checks`` passes (a schema ``type`` list)."""
    return lambda value: any(check(value) for check in checks)
