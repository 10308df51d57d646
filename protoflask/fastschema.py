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


def compile_simple(schema: Any) -> Check | None:
    """A fast acceptance check for ``schema``, or None if it is outside the subset."""
    if schema is True or schema == {}:
        return lambda v: True
    if not isinstance(schema, dict) or not set(schema) <= _KEYWORDS:
        return None
    checks: list[Check] = []
    if "type" in schema:
        names = schema["type"]
        names = [names] if isinstance(names, str) else names
        if not isinstance(names, list) or not names or \
                not all(isinstance(n, str) and n in _TYPES for n in names):
            return None
        type_checks = [_TYPES[n] for n in names]
        if len(type_checks) == 1:
            checks.append(type_checks[0])
        else:
            checks.append(_any_of(tuple(type_checks)))
    props = schema.get("properties", {})
    required = schema.get("required", [])
    extra = schema.get("additionalProperties", True)
    if not isinstance(props, dict) or not isinstance(required, list) or \
            not all(isinstance(r, str) for r in required) or not isinstance(extra, bool):
        return None
    prop_checks: dict[str, Check] = {}
    for name, sub in props.items():
        check = compile_simple(sub)
        if check is None:
            return None
        prop_checks[name] = check
    if prop_checks or required or not extra:
        allowed = frozenset(prop_checks)
        needed = tuple(required)

        def object_check(v: Any) -> bool:
            if type(v) is not dict:
                return True  # these keywords only constrain objects
            for key in needed:
                if key not in v:
                    return False
            for key, value in v.items():
                check = prop_checks.get(key)
                if check is not None:
                    if not check(value):
                        return False
                elif not extra and key not in allowed:
                    return False
            return True

        checks.append(object_check)
    if len(checks) == 1:
        return checks[0]
    return lambda v: all(c(v) for c in checks)


def _any_of(checks: tuple[Callable[[Any], bool], ...]) -> Callable[[Any], bool]:
    """A check passing when any of ``checks`` passes (a schema ``type`` list)."""
    return lambda value: any(check(value) for check in checks)
