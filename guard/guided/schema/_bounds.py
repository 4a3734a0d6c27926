"""Nested size bounds of a JSON schema, multiplied along each path.

``{"type": "array", "minItems": 1000, "items": {"type": "array", "minItems": 1000, "items":
{"type": "string", "minLength": 10000}}}`` keeps every bound within its cap, yet asks for 10^10
characters, and grammar compilers unroll the counts inside one another. The walk multiplies,
along every path from the root (local ``$ref`` followed, a ``$ref`` already on the path not
again), the ``minItems``/``maxItems`` of each array level and the ``minLength``/``maxLength`` of
the string inside, and refuses a product over ``max_schema_bound_product``. Iterative; it visits
each node of the expanded schema once per path, which the schema check has already bounded
(``max_schema_nodes`` after ``$ref`` expansion).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from guard.guided.schema._refs import resolve_ref

__all__ = ["BOUND_CAP", "BOUND_SKIP", "bound_here", "largest_bound_product"]

BOUND_CAP = 10**30
"""Bound products are capped here (a count of 10**30 is as refused as a larger one)."""
BOUND_SKIP = frozenset({"enum", "const", "examples", "default", "$defs", "definitions"})
"""Keys whose values the nested-bound walk does not enter (data, or reached through $ref)."""
_ARRAY_KEYS = ("minItems", "maxItems")
_STRING_KEYS = ("minLength", "maxLength")


def _bound(node: Mapping[str, Any], keys: tuple[str, str]) -> int:
    best = 1
    for key in keys:
        value = node.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and value > best:
            best = int(min(value, BOUND_CAP))
    return best


def bound_here(node: Mapping[str, Any], product: int) -> int:
    """The nested-bound product at ``node`` given the product above it."""
    if "minItems" in node or "maxItems" in node:
        product = min(BOUND_CAP, product * _bound(node, _ARRAY_KEYS))
    if "minLength" in node or "maxLength" in node:
        product = min(BOUND_CAP, product * _bound(node, _STRING_KEYS))
    return product


def largest_bound_product(schema: Any, max_visits: int) -> int:
    """The largest product of nested bounds along one path (1 when there are none).
    Stops (returning what it has) after ``max_visits`` nodes."""
    best = 1
    stack: list[tuple[Any, int, frozenset[str]]] = [(schema, 1, frozenset())]
    visits = 0
    while stack and visits < max_visits:
        node, product, refs = stack.pop()
        visits += 1
        if isinstance(node, list | tuple):
            stack.extend((x, product, refs) for x in node)
            continue
        if not isinstance(node, Mapping):
            continue
        ref = node.get("$ref")
        if isinstance(ref, str) and ref not in refs:
            stack.append((resolve_ref(schema, ref), product, refs | {ref}))
        here = bound_here(node, product)
        best = max(best, here)
        for key, value in node.items():
            if key in BOUND_SKIP:
                continue
            if isinstance(value, Mapping | list | tuple):
                stack.append((value, here, refs))
    return best
