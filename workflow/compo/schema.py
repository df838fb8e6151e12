"""JSON-schema validation with one line per problem: the key, then what was expected.

The config schema (`compo.config`) and each loss's recipe schema (`compo.losses`) are checked here. Two
keywords of our own say more than the validator's default message:

* `x-expected`: what a value of several forms (`oneOf`) or a name (`pattern`) must be;
* `x-message`: the whole message when the schema it sits in fails (e.g. a `then` that requires a key);
* `x-not-above: <sibling key>`: a number no larger than its sibling's (e.g. a margin's m_min and m_max).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import jsonschema


def _not_above(validator: Any, sibling: str, value: Any, schema: dict[str, Any]) -> Iterator[Any]:
    """`x-not-above` is checked by the parent object (it needs the sibling); see `_properties`."""
    return iter(())


def _properties(validator: Any, properties: dict[str, Any], instance: Any, schema: dict[str, Any]) -> Iterator[Any]:
    yield from jsonschema.Draft202012Validator.VALIDATORS["properties"](validator, properties, instance, schema)
    if not isinstance(instance, dict):
        return
    for name, subschema in properties.items():
        sibling = subschema.get("x-not-above") if isinstance(subschema, dict) else None
        if sibling is None or not isinstance(instance.get(name), int | float) or not isinstance(
                instance.get(sibling), int | float):
            continue
        if instance[name] > instance[sibling]:
            yield jsonschema.ValidationError(f"{name} {instance[name]} is above {sibling} {instance[sibling]}",
                                             path=[name], validator="x-not-above")


Validator = jsonschema.validators.extend(jsonschema.Draft202012Validator,
                                         {"properties": _properties, "x-not-above": _not_above})


def key_of(error: jsonschema.ValidationError) -> str:
    """The dotted key an error is about, "" for the top level."""
    return ".".join(str(p) for p in error.absolute_path)


def message_of(error: jsonschema.ValidationError) -> str:
    """One line for a schema violation: what was expected."""
    schema = error.schema if isinstance(error.schema, dict) else {}
    if schema.get("x-message"):
        return schema["x-message"]
    # a name pattern (its schema says what it expects) or a property name that breaks one
    expected = schema.get("x-expected")
    if error.validator == "propertyNames" or (error.validator == "pattern" and expected):
        bad = error.instance if error.validator == "pattern" else next(
            (c.instance for c in error.context if c.validator == "pattern"), None)
        expected = expected or next((c.schema.get("x-expected") for c in error.context
                                     if isinstance(c.schema, dict) and c.schema.get("x-expected")), None)
        if expected is not None:
            return f"{bad!r} is not {expected}"
    if error.validator == "oneOf" and expected:  # a value of one of several forms: say which
        return f"{error.instance!r} is not {expected}"
    return error.message


def problems(schema: dict[str, Any], instance: Any, name_keys: bool = False) -> list[tuple[str, str]]:
    """Every violation of `schema` by `instance` as (dotted key, message), in key order. `name_keys`: a
    missing required key, or a key the mapping does not allow, is the key of its problem (else the mapping
    that lacks or holds it is)."""
    errors = sorted(Validator(schema).iter_errors(instance), key=lambda e: [str(p) for p in e.absolute_path])
    found = []
    for error in errors:
        key, message = key_of(error), message_of(error)
        worded = message != error.message  # by the schema's x-message
        if name_keys and isinstance(error.instance, dict):
            if error.validator == "required":
                missing = next(k for k in error.validator_value if k not in error.instance)
                key, message = f"{key}.{missing}".lstrip("."), message if worded else "required"
            elif error.validator == "additionalProperties" and error.validator_value is False:
                known = list(error.schema.get("properties", {}))
                extra = next(k for k in error.instance if k not in known)
                key = f"{key}.{extra}".lstrip(".")
                message = message if worded else f"not a key here (known: {', '.join(known)})"
        found.append((key, message))
    return found
