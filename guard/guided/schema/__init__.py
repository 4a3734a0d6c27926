"""JSON schemas in guided-decoding constraints.

- :func:`check_schema`: one schema constraint (an object or JSON text, :func:`parse_json_text`)
  against the request's budget (:mod:`._check`), by the schema walk (:mod:`._walk`);
- :class:`SchemaFacts`, :func:`facts_of`: what the backend routing and cost models read from a
  schema, gathered in that walk or on their own (:mod:`._facts`);
- :func:`largest_bound_product`: the nested size bounds multiplied along each path
  (:mod:`._bounds`); :func:`resolve_ref`: a local ``$ref`` (:mod:`._refs`).
"""

from __future__ import annotations

from guard.guided.schema._bounds import BOUND_SKIP, bound_here, largest_bound_product
from guard.guided.schema._check import check_schema, parse_json_text
from guard.guided.schema._facts import (
    FACT_KEYS,
    Memo,
    SchemaFacts,
    add_node,
    count_of,
    facts_of,
)
from guard.guided.schema._refs import resolve_ref

__all__ = [
    "BOUND_SKIP",
    "FACT_KEYS",
    "Memo",
    "SchemaFacts",
    "add_node",
    "bound_here",
    "check_schema",
    "count_of",
    "facts_of",
    "largest_bound_product",
    "parse_json_text",
    "resolve_ref",
]
