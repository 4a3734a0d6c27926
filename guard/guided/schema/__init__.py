"""JSON schemas in guided-decoding constraints.

- :func:`check_schema`: one schema constraint against the request's budget, by the schema walk
  (:mod:`._walk`); given as JSON text, parsed first (:func:`parse_json_text`, :mod:`._text`);
- :class:`SchemaFacts`, :func:`facts_of`: what the backend routing and cost models read from a
  schema, gathered in that walk or on their own (:mod:`._facts`);
- :func:`xgrammar_refuses_form`: a schema xgrammar refuses for a keyword's value (:mod:`._malformed`);
- :func:`largest_bound_product`: the nested size bounds multiplied along each path
  (:mod:`._bounds`); :func:`resolve_ref`: a local ``$ref`` (:mod:`._refs`).
"""

from __future__ import annotations

from guard.guided.schema._bounds import largest_bound_product
from guard.guided.schema._facts import Memo, SchemaFacts, count_of, facts_of
from guard.guided.schema._malformed import xgrammar_refuses_form
from guard.guided.schema._refs import resolve_ref
from guard.guided.schema._text import parse_json_text
from guard.guided.schema._walk import check_schema

__all__ = [
    "Memo",
    "SchemaFacts",
    "check_schema",
    "count_of",
    "facts_of",
    "largest_bound_product",
    "parse_json_text",
    "resolve_ref",
    "xgrammar_refuses_form",
]
