"""A schema xgrammar's converter refuses for its form: a keyword's value of the wrong kind.

vLLM's ``auto`` sends a schema xgrammar refuses to guidance, or, when it has
``patternProperties`` anywhere, to outlines (:mod:`guard.guided.backends._routing`), whose
converter builds a regex that doubles with each array level (docs/findings/
vllm-outlines-schema-regex-abort.yaml: an unknown ``type`` under 18 arrays, 691 bytes, and vLLM's
API server aborts allocating 3.6 GB). What xgrammar refuses for a feature is
:func:`guard.guided.schema._facts.xgrammar_unsupported_node`; this is what it refuses for the
form, as xgrammar 0.2.8's ``Grammar.from_json_schema`` was measured to (tests/guard/guided/
test_malformed_schema.py holds the measured table and re-runs it where xgrammar is installed):

- ``type`` other than one of the seven JSON types or a list of them;
- a subschema that is neither an object nor ``true`` (``false`` too, as a property) where
  xgrammar reads one: ``properties`` and ``patternProperties`` values, ``items``,
  ``prefixItems``, ``anyOf`` / ``oneOf`` / ``allOf`` entries, ``additionalProperties``,
  ``unevaluatedProperties``, ``unevaluatedItems``, ``propertyNames``;
- ``required`` not a list of strings, ``enum`` not a non-empty list, ``pattern`` or ``format``
  not a string;
- a length or count bound not an integer, a numeric bound not a number (nor a fraction on an
  ``integer``), a lower bound above its upper one;
- a local ``$ref`` that leads nowhere.

Keywords xgrammar does not read (``$defs`` until referenced, ``not``, ``contains``, ``title``,
``default``, ...) are not judged. The walk follows the schema's own tree and each reference's
target once, iteratively: linear in the schema, which the schema check has already bounded.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from guard.guided.schema._refs import resolve_ref

__all__ = ["xgrammar_refuses_form"]

_TYPES = frozenset({"string", "integer", "number", "boolean", "null", "array", "object"})
# Keywords whose value is a map of name -> subschema, one subschema, a list of subschemas.
_SCHEMA_MAPS = ("properties", "patternProperties")
_SCHEMA_ONE = (
    "items",
    "additionalProperties",
    "unevaluatedProperties",
    "unevaluatedItems",
    "propertyNames",
)
_SCHEMA_LISTS = ("prefixItems", "anyOf", "oneOf", "allOf")
_COUNTS = (("minLength", "maxLength"), ("minItems", "maxItems"), ("minProperties", "maxProperties"))
_NUMBERS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _bad_type(node: Mapping[str, Any]) -> bool:
    if "type" not in node:
        return False
    t = node["type"]
    if isinstance(t, str):
        return t not in _TYPES
    return not isinstance(t, list) or any(not isinstance(x, str) or x not in _TYPES for x in t)


def _bad_bounds(node: Mapping[str, Any]) -> bool:
    for low_key, high_key in _COUNTS:
        low, high = node.get(low_key), node.get(high_key)
        if (low_key in node and not _is_int(low)) or (high_key in node and not _is_int(high)):
            return True
        if low is not None and high is not None and low > high:
            return True
    numbers = {k: node[k] for k in _NUMBERS if k in node}
    if not all(_is_number(v) for v in numbers.values()):
        return True
    if node.get("type") == "integer" and any(
        isinstance(v, float) and not v.is_integer() for v in numbers.values()
    ):
        return True
    lows = [numbers[k] for k in ("minimum", "exclusiveMinimum") if k in numbers]
    highs = [numbers[k] for k in ("maximum", "exclusiveMaximum") if k in numbers]
    return bool(lows and highs) and max(lows) > min(highs)


def _bad_values(node: Mapping[str, Any]) -> bool:
    if "required" in node:
        required = node["required"]
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            return True
    if "enum" in node and not (isinstance(node["enum"], list) and node["enum"]):
        return True
    return any(k in node and not isinstance(node[k], str) for k in ("pattern", "format"))


def _subschemas(node: Mapping[str, Any]) -> Iterator[Any]:
    """The node's subschemas xgrammar reads; a value of the wrong container kind is yielded
    as is (and judged not a schema)."""
    for key in _SCHEMA_MAPS:
        if key in node:
            value = node[key]
            if not isinstance(value, Mapping):
                yield None
                continue
            for sub in value.values():
                yield None if sub is False else sub  # xgrammar: "Schema 'false' cannot ..."
    for key in _SCHEMA_ONE:
        if key in node:
            yield node[key]
    for key in _SCHEMA_LISTS:
        if key in node:
            value = node[key]
            if isinstance(value, list):
                yield from value
            else:
                yield None


def xgrammar_refuses_form(schema: Any) -> bool:
    """Whether xgrammar's converter refuses ``schema`` for a keyword's value (see the module
    docstring); a schema it refuses for a feature is not this function's."""
    if isinstance(schema, bool):
        return False
    stack: list[Any] = [schema]
    followed: set[int] = set()  # the targets of references, walked once (they may recurse)
    while stack:
        node = stack.pop()
        if isinstance(node, bool):
            continue
        if not isinstance(node, Mapping):
            return True
        if _bad_type(node) or _bad_bounds(node) or _bad_values(node):
            return True
        ref = node.get("$ref")
        if ref is not None:
            if not isinstance(ref, str):
                return True
            if ref.startswith("#"):
                target = resolve_ref(schema, ref)
                if target is None or not isinstance(target, Mapping | bool):
                    return True
                if id(target) not in followed:
                    followed.add(id(target))
                    stack.append(target)
        stack.extend(_subschemas(node))
    return False
