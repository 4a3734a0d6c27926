"""JSON schemas in guided-decoding constraints: what the backend routing and cost models read
from a schema, gathered in one walk (:mod:`._facts`), and the nested size bounds multiplied
along each path (:mod:`._bounds`), a local ``$ref`` resolved (:mod:`._refs`).
"""

from __future__ import annotations

from guard.guided.schema._bounds import BOUND_SKIP, bound_here, largest_bound_product
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
    "count_of",
    "facts_of",
    "largest_bound_product",
    "resolve_ref",
]
