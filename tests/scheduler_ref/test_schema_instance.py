"""The smallest instance of a JSON Schema (a forced tool call's arguments): each instance is
checked by a JSON Schema validator (jsonschema-rs, Draft 2020-12), and every schema, recursive
or huge, is answered within the budgets."""

from __future__ import annotations

import time
from typing import Any

import jsonschema_rs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_ref.schema_instance import (
    MAX_DEPTH,
    InstanceTooLarge,
    minimal_instance,
)

# A pydantic-style schema: $defs and $ref, enums, nested objects, Optional as anyOf with null,
# formats, bounds.
ORDER = {
    "$defs": {
        "Unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "Address": {
            "type": "object",
            "properties": {
                "street": {"type": "string", "minLength": 3},
                "zip": {"type": "integer", "minimum": 1000, "maximum": 99999},
                "country": {"const": "FR"},
            },
            "required": ["street", "zip", "country"],
            "additionalProperties": False,
        },
        "Item": {
            "type": "object",
            "properties": {
                "sku": {"type": "string", "pattern": "^[A-Z]"},
                "qty": {"type": "integer", "exclusiveMinimum": 0},
                "price": {"type": "number", "minimum": 0.5, "multipleOf": 0.25},
            },
            "required": ["qty", "price"],
        },
    },
    "type": "object",
    "properties": {
        "unit": {"$ref": "#/$defs/Unit"},
        "ship_to": {"$ref": "#/$defs/Address"},
        "items": {"type": "array", "items": {"$ref": "#/$defs/Item"}, "minItems": 2},
        "note": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        "when": {"type": "string", "format": "date-time"},
        "gift": {"type": "boolean"},
        "tags": {"type": ["array", "null"], "items": {"type": "string"}},
        "optional": {"type": "string"},
    },
    "required": ["unit", "ship_to", "items", "note", "when", "gift", "tags"],
}

SCHEMAS: dict[str, Any] = {
    "order ($ref, enum, nested objects)": ORDER,
    "empty object": {"type": "object"},
    "allOf merged": {
        "allOf": [
            {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
            {"properties": {"b": {"type": "string", "minLength": 2}}, "required": ["b"]},
        ]
    },
    "oneOf first branch": {
        "type": "object",
        "properties": {"v": {"oneOf": [{"type": "integer", "minimum": 7}, {"type": "string"}]}},
        "required": ["v"],
    },
    "minProperties past required": {
        "type": "object",
        "properties": {"x": {"type": "null"}},
        "minProperties": 3,
    },
    "tuple (prefixItems)": {
        "type": "array",
        "prefixItems": [{"type": "string"}, {"type": "integer", "minimum": 3}],
        "minItems": 2,
    },
    "draft 4 exclusiveMinimum": {
        "$schema": "http://json-schema.org/draft-04/schema#",
        "type": "number",
        "minimum": 2,
        "exclusiveMinimum": True,
    },
    "negative maximum": {"type": "integer", "maximum": -3},
    "definitions (draft 7)": {
        "definitions": {"A": {"type": "object", "required": ["k"]}},
        "$ref": "#/definitions/A",
    },
    "linked list (recursive, null ends it)": {
        "$defs": {
            "Node": {
                "type": "object",
                "properties": {
                    "value": {"type": "integer"},
                    "next": {"anyOf": [{"$ref": "#/$defs/Node"}, {"type": "null"}]},
                },
                "required": ["value", "next"],
            }
        },
        "$ref": "#/$defs/Node",
    },
}


def _validator(schema: Any) -> Any:
    if isinstance(schema, dict) and "draft-04" in str(schema.get("$schema", "")):
        return jsonschema_rs.Draft4Validator(schema)
    return jsonschema_rs.Draft202012Validator(schema, validate_formats=True)


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_the_instance_satisfies_the_schema(name: str) -> None:
    schema = SCHEMAS[name]
    instance = minimal_instance(schema)
    errors = [e.message for e in _validator(schema).iter_errors(instance)]
    assert errors == [], (instance, errors)


def test_the_instance_is_minimal_and_deterministic() -> None:
    instance = minimal_instance(ORDER)
    assert instance == minimal_instance(ORDER)
    assert instance == {
        "unit": "celsius",
        "ship_to": {"street": "aaa", "zip": 1000, "country": "FR"},
        "items": [{"qty": 1, "price": 0.5}, {"qty": 1, "price": 0.5}],
        "note": "",
        "when": "1970-01-01T00:00:00Z",
        "gift": False,
        "tags": [],
    }


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "array", "minItems": 10**9},
        {"type": "string", "minLength": 10**9},
        {"type": "object", "minProperties": 10**9},
        # Fan-out through $ref: 50 ** depth values.
        {
            "$defs": {"A": {"type": "array", "minItems": 50, "items": {"$ref": "#/$defs/A"}}},
            "$ref": "#/$defs/A",
        },
        # A small instance behind huge keywords: a million required names, all the same.
        {"type": "object", "required": ["a"] * 1_100_000},
    ],
    ids=["minItems", "minLength", "minProperties", "ref fan-out", "huge required"],
)
def test_a_huge_instance_is_refused_quickly(schema: Any) -> None:
    start = time.process_time()
    with pytest.raises(InstanceTooLarge):
        minimal_instance(schema)
    assert time.process_time() - start < 2.0


@pytest.mark.parametrize(
    "schema",
    [
        # Infinite: every instance is infinite (no finite instance exists); the answer is cut.
        {"type": "object", "properties": {"me": {"$ref": "#"}}, "required": ["me"]},
        {"$defs": {"A": {"anyOf": [{"$ref": "#/$defs/A"}]}}, "$ref": "#/$defs/A"},
        {"$ref": "#"},
        {"$defs": {"A": {"$ref": "#/$defs/B"}, "B": {"$ref": "#/$defs/A"}}, "$ref": "#/$defs/A"},
    ],
    ids=["required self", "anyOf self", "ref to root", "ref cycle"],
)
def test_a_recursive_schema_is_cut_at_the_depth_bound(schema: Any) -> None:
    instance = minimal_instance(schema)
    depth, node = 0, instance
    while isinstance(node, dict) and node:
        node, depth = next(iter(node.values())), depth + 1
    assert depth <= MAX_DEPTH


_SCALAR = st.one_of(
    st.fixed_dictionaries(
        {"type": st.just("string")},
        optional={"minLength": st.integers(0, 40), "format": st.sampled_from(["email", "uri"])},
    ),
    # A fixed-length format: satisfiable up to its length only.
    st.fixed_dictionaries(
        {"type": st.just("string"), "format": st.sampled_from(["date", "uuid", "ipv4"])},
        optional={"minLength": st.integers(0, 9)},
    ),
    st.fixed_dictionaries(
        {"type": st.sampled_from(["integer", "number"])},
        optional={
            "minimum": st.integers(-(10**6), 10**6),
            "exclusiveMinimum": st.integers(-(10**6), 10**6),
            "multipleOf": st.integers(1, 50),
        },
    ),
    st.fixed_dictionaries({"type": st.sampled_from(["boolean", "null"])}),
    st.lists(st.integers() | st.text(max_size=5), min_size=1, max_size=4).map(
        lambda values: {"enum": values}
    ),
)


def _schemas() -> st.SearchStrategy[dict[str, Any]]:
    def extend(children: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
        objects = st.dictionaries(st.text(min_size=1, max_size=6), children, max_size=4).flatmap(
            lambda props: st.builds(
                lambda required: {"type": "object", "properties": props, "required": required},
                st.lists(st.sampled_from(sorted(props)), unique=True) if props else st.just([]),
            )
        )
        arrays = st.builds(
            lambda items, n: {"type": "array", "items": items, "minItems": n},
            children,
            st.integers(0, 3),
        )
        unions = st.lists(children, min_size=1, max_size=3).map(lambda bs: {"anyOf": bs})
        return objects | arrays | unions

    return st.recursive(_SCALAR, extend, max_leaves=12)


@settings(max_examples=200, deadline=None)
@given(_schemas())
def test_generated_schemas_are_satisfied(schema: dict[str, Any]) -> None:
    instance = minimal_instance(schema)
    errors = [e.message for e in _validator(schema).iter_errors(instance)]
    assert errors == [], (instance, errors)
