"""The schema walk's two orders agree (guard/guided/schema/_walk.py).

A plain schema (dicts, lists, JSON scalars) is walked in the fast order; the same schema behind
a read-only mapping proxy is not a dict, so the fast order stops at once and the exact order
walks it. Whatever the schema, valid or not, the request's verdict is then the same: the same
code, message and ``param`` (the exact order's refusal is the first problem in document order,
which the fast order hands over to it), and, for a schema that passes, the same counters: a
second schema after it in the same request meets the same limits. The facts the backend checks
read (``guided_backend_cost_exceeded``) are gathered by the fast order only: with them or
without (the backends compute them again), the verdict is the same.
"""

from __future__ import annotations

import random
import types
from typing import Any

import pytest

from guard.errors import GuardError
from guard.guided import GuidedLimits, check_guided_decoding, check_structured_outputs

NAMES = ["a", "b", "x", "odd key", "k" * 20, "^x", "[a-z]+", "(a+)+"]
# A value that is wrong wherever it stands (where a schema, a list or a bound must be).
WRONG: list[Any] = [5, "x", None, [], {}, -1, 2.5, True, 10**9, [5]]
BOUNDS: list[Any] = [0, 3, 40, 900, 3000, 2.0, 2.5, -1, True, "3"]
NUMBERS: list[Any] = [-50, 0, 7, 5000, 0.5, 1e300, True, "1"]
REFS = ["#", "#/$defs/a", "#/definitions/b", "#/properties/a", "#x", "http:/"]
PATTERNS = ["^[a-z]+$", "\\d{4}", "(a|b)*", "(a+)+", "("]


class _Schemas:
    """Random schemas, mostly well-formed: a schema with one problem tells the two orders
    apart, one with many mostly does not (both give the first). Seeded: the same cases on
    every run."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def wrong(self) -> bool:
        return self.rng.random() < 0.04

    def data(self, depth: int = 0) -> Any:
        r = self.rng
        if depth > 2 or r.random() < 0.6:
            return r.choice([None, True, 3, "text", "k" * 30])
        if r.random() < 0.5:
            return [self.data(depth + 1) for _ in range(r.randint(0, 3))]
        return {r.choice(NAMES): self.data(depth + 1) for _ in range(r.randint(0, 3))}

    def schema(self, depth: int = 0) -> Any:
        r = self.rng
        if self.wrong():
            return r.choice(WRONG)
        if depth > 4 or r.random() < 0.15:
            return r.choice([True, False, {}, {"type": "string"}])
        node: dict[str, Any] = {}
        for key in r.sample(KEYWORDS, r.randint(0, 4)):
            node[key] = r.choice(WRONG) if self.wrong() else self.value(key, depth)
        return node

    def value(self, key: str, depth: int) -> Any:
        r = self.rng
        if key in ("properties", "patternProperties", "$defs", "definitions"):
            names = ["a", "b"] if key in ("$defs", "definitions") else NAMES
            return {r.choice(names): self.schema(depth + 1) for _ in range(r.randint(0, 3))}
        if key in ("anyOf", "allOf", "prefixItems"):
            return [self.schema(depth + 1) for _ in range(r.randint(0, 3))]
        if key == "items":
            if r.random() < 0.3:
                return [self.schema(depth + 1) for _ in range(r.randint(0, 2))]
            return self.schema(depth + 1)
        if key in ("additionalProperties", "not", "if"):
            return self.schema(depth + 1)
        if key == "dependencies":
            return {r.choice(NAMES): r.choice([self.schema(depth + 1), ["a", "b"]])}
        if key in ("enum", "required"):
            return [self.data() for _ in range(r.randint(0, 5))]
        if key in ("const", "default"):
            return self.data()
        if key in ("minLength", "maxLength", "minItems", "maxItems"):
            return r.choice(BOUNDS)
        if key in ("minimum", "multipleOf", "exclusiveMinimum"):
            return r.choice(NUMBERS)
        if key == "$ref":
            return r.choice(REFS)
        if key == "pattern":
            return r.choice(PATTERNS)
        if key == "format":
            return r.choice(["email", "date", "regex"])
        return r.choice(["string", "object", "array", ["string", "null"]])  # type

    def root(self) -> dict[str, Any]:
        s = self.schema()
        return s if isinstance(s, dict) else {"not": s}


KEYWORDS = [
    "type", "properties", "patternProperties", "$defs", "definitions", "dependencies", "items",
    "anyOf", "allOf", "prefixItems", "additionalProperties", "not", "if", "$ref", "enum",
    "const", "default", "pattern", "format", "minLength", "maxLength", "minItems", "maxItems",
    "minimum", "multipleOf", "exclusiveMinimum", "required",
]  # fmt: skip


# The default limits, and small ones that the generated schemas cross in every way.
LIMITS = [
    GuidedLimits(),
    GuidedLimits(
        max_schema_nodes=30,
        max_schema_chars=120,
        max_schema_depth=5,
        max_schema_enum=3,
        max_schema_refs=2,
        max_schema_length_bound=50,
        max_schema_items_bound=50,
        max_schema_number=1000.0,
        max_regexes=2,
    ),
    GuidedLimits(allow_recursive_refs=True, max_schema_nodes=60),
]


def _verdict(check: Any, body: dict[str, Any], limits: GuidedLimits) -> Any:
    try:
        check(body, limits)
    except GuardError as e:
        return (type(e).__name__, e.code, e.message, e.param)
    return None


def _body(schema: Any, second: Any) -> dict[str, Any]:
    return {
        "response_format": {"type": "json_schema", "json_schema": {"schema": schema}},
        "guided_json": second,
    }


@pytest.mark.parametrize("seed", range(4))
def test_the_fast_and_the_exact_order_agree(seed: int) -> None:
    gen = _Schemas(seed)
    for _ in range(500):
        schema, second = gen.root(), gen.root()
        proxied = types.MappingProxyType(schema)
        for limits in LIMITS:
            fast = _verdict(check_structured_outputs, _body(schema, second), limits)
            exact = _verdict(check_structured_outputs, _body(proxied, second), limits)
            assert fast == exact, (schema, second, limits)


def test_the_exact_order_refuses_the_first_problem_in_document_order() -> None:
    """Two problems in one schema: the refusal names the first in document order, however the
    fast order (children last-first) met them."""
    schema = {
        "properties": {"a": {"maxLength": -1}, "b": {"enum": "not a list"}},
        "items": {"minimum": "x"},
    }
    code = _verdict(check_guided_decoding, {"guided_json": schema}, GuidedLimits())
    assert code == (
        "GuardError",
        "guided_schema_invalid",
        "maxLength must not be negative",
        "guided_json.properties.a.maxLength",
    )
