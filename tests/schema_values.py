"""Values of experiment-file sections drawn from the file's JSON Schema (`testbed schema`), for the
property tests of testbed.assembly.config (tests/test_config_toml.py, tests/test_config_sections.py)."""

from __future__ import annotations

from hypothesis import strategies as st

from testbed.assembly.config import json_schema

SCHEMA = json_schema()


def _resolved(schema: dict) -> dict:
    """``schema`` with its ``$ref`` (into the experiment schema's $defs) followed."""
    while "$ref" in schema:
        schema = SCHEMA["$defs"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


def section_schema(name: str) -> dict:
    """The JSON Schema of section ``name`` (its $ref followed)."""
    return _resolved(SCHEMA["properties"][name])


def from_schema(schema: dict) -> st.SearchStrategy:
    """Values valid under ``schema``, for the JSON Schema the sections' pydantic models write
    (types, enums, ranges, patterns, anyOf, arrays, nested tables); an optional key may be left out."""
    schema = _resolved(schema)
    if "anyOf" in schema:
        return st.one_of([from_schema(alternative) for alternative in schema["anyOf"]])
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    kind = schema.get("type")
    if kind == "null":
        return st.none()
    if kind == "boolean":
        return st.booleans()
    if kind in ("integer", "number"):
        low = schema.get("minimum", schema.get("exclusiveMinimum"))
        high = schema.get("maximum", schema.get("exclusiveMaximum"))
        if kind == "integer":
            return st.integers(None if low is None else low + ("exclusiveMinimum" in schema),
                               None if high is None else high - ("exclusiveMaximum" in schema))
        return st.floats(low, high, exclude_min="exclusiveMinimum" in schema, exclude_max="exclusiveMaximum" in schema,
                         allow_nan=False, allow_infinity=False)
    if kind == "string":
        return st.from_regex(schema["pattern"], fullmatch=True) if "pattern" in schema else st.text(max_size=12)
    if kind == "array":
        return st.lists(from_schema(schema["items"]), max_size=4)
    if kind == "object":
        required = set(schema.get("required", ()))
        properties = {key: from_schema(value) for key, value in schema["properties"].items()}
        return st.fixed_dictionaries({k: v for k, v in properties.items() if k in required},
                                     optional={k: v for k, v in properties.items() if k not in required})
    raise AssertionError(f"a schema this generator does not read: {schema}")
