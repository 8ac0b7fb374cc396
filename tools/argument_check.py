"""Check a tool call's arguments against the tool's JSON-schema ``parameters`` object.

Covers what function-calling schemas use: a flat ``object`` with typed ``properties``, ``required`` and
``enum``; keys the schema does not declare are refused. JSON types follow JSON Schema: ``number`` takes ints
and floats, ``integer`` only ints, and a boolean is never a number.
"""

from __future__ import annotations

from collections.abc import Mapping

_JSON_TYPES = {
    "string": (str,),
    "number": (int, float),
    "integer": (int,),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
    "null": (type(None),),
}


def _has_type(value, type_name: str) -> bool:
    if type_name not in _JSON_TYPES:
        raise ValueError(f"schema uses unsupported type {type_name!r}")
    if isinstance(value, bool) and type_name in ("number", "integer"):
        return False
    return isinstance(value, _JSON_TYPES[type_name])


def argument_errors(parameters: Mapping, arguments: Mapping) -> list[str]:
    """Every way ``arguments`` breaks the ``parameters`` schema, as readable messages (empty when valid)."""
    properties = parameters.get("properties", {})
    errors = [f"missing required argument '{name}'" for name in parameters.get("required", [])
              if name not in arguments]
    for name, value in arguments.items():
        spec = properties.get(name)
        if spec is None:
            errors.append(f"unexpected argument '{name}' (accepted: {', '.join(properties) or 'none'})")
            continue
        types = spec.get("type")
        if types is not None:
            types = [types] if isinstance(types, str) else list(types)
            if not any(_has_type(value, t) for t in types):
                errors.append(f"argument '{name}' must be {' or '.join(types)}, got {type(value).__name__}")
                continue
        if "enum" in spec and value not in spec["enum"]:
            errors.append(f"argument '{name}' must be one of {spec['enum']}, got {value!r}")
    return errors
