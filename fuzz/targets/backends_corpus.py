"""The structured-output corpus the backend targets, tests and bench share.

``BENIGN``: what clients really send as constraints (emails, dates, UUIDs, IPv4, enums, the JSON
schemas of common tool definitions), each must be admitted wherever its reachable backends'
measured cost is within budget. ``EXPENSIVE``: the inputs of issue 16's table (automaton
blow-ups for outlines, the 324-byte schema ``auto`` routes to outlines, xgrammar's per-token
mask cliff). Each case is ``(id, kind, spec)`` with ``kind`` in ``regex``, ``json``,
``choice``, ``grammar``.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["BENIGN", "EXPENSIVE", "ROUTED_324", "Case", "request_body"]

Case = tuple[str, str, Any]

WEATHER: dict[str, Any] = {
    "type": "object",
    "properties": {
        "location": {"type": "string", "description": "The city and state, e.g. San Francisco"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["location"],
}
SEARCH: dict[str, Any] = {
    "type": "object",
    "properties": {
        "query": {"type": "string"},
        "max_results": {"type": "integer", "minimum": 1, "maximum": 50},
        "filters": {
            "type": "object",
            "properties": {
                "date_from": {"type": "string", "format": "date"},
                "site": {"type": "string"},
            },
        },
    },
    "required": ["query"],
    "additionalProperties": False,
}
EVENT: dict[str, Any] = {
    "type": "object",
    "properties": {
        "title": {"type": "string"},
        "start": {"type": "string", "format": "date-time"},
        "end": {"type": "string", "format": "date-time"},
        "attendees": {"type": "array", "items": {"type": "string", "format": "email"}},
        "location": {"type": "string"},
        "all_day": {"type": "boolean"},
    },
    "required": ["title", "start"],
    "additionalProperties": False,
}
ORDER: dict[str, Any] = {
    "type": "object",
    "properties": {
        "order_id": {"type": "string", "format": "uuid"},
        "customer": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "email": {"type": "string", "format": "email"},
                "phone": {"type": "string", "pattern": "^\\+[1-9][0-9]{1,14}$"},
            },
            "required": ["name", "email"],
        },
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "sku": {"type": "string"},
                    "quantity": {"type": "integer", "minimum": 1},
                    "price": {"type": "number"},
                },
                "required": ["sku", "quantity"],
            },
        },
        "status": {"type": "string", "enum": ["pending", "paid", "shipped", "cancelled"]},
    },
    "required": ["order_id", "items"],
}
PERSON: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string", "format": "email"},
    },
    "required": ["name", "age"],
}
OPT12: dict[str, Any] = {
    "type": "object",
    "properties": {f"p{i}": {"type": ("string", "integer", "boolean")[i % 3]} for i in range(12)},
}
TOOLCALL: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "enum": ["get_current_weather", "search_web", "create_event"]},
        "arguments": {"anyOf": [WEATHER, SEARCH, EVENT]},
    },
    "required": ["name", "arguments"],
}

BENIGN: list[Case] = [
    ("re-email", "regex", r"[a-zA-Z0-9._%+-]+@[a-zA-Z0-9.-]+\.[a-zA-Z]{2,}"),
    ("re-date", "regex", r"\d{4}-\d{2}-\d{2}"),
    ("re-ipv4", "regex", r"((25[0-5]|2[0-4]\d|[01]?\d\d?)\.){3}(25[0-5]|2[0-4]\d|[01]?\d\d?)"),
    (
        "re-uuid",
        "regex",
        r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
    ),
    ("re-colour", "regex", r"(red|green|blue|yellow|orange|purple|black|white|gray|brown)"),
    ("re-us-phone", "regex", r"\+?1?[ -]?\(?\d{3}\)?[ -]?\d{3}[ -]?\d{4}"),
    ("re-e164", "regex", r"\+[1-9]\d{1,14}"),
    ("re-iso-ts", "regex", r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,6})?(Z|[+-]\d{2}:\d{2})"),
    ("re-percent", "regex", r"(100|[1-9]?[0-9])"),
    ("re-int", "regex", r"-?(0|[1-9]\d{0,8})"),
    ("re-zip", "regex", r"\d{5}(-\d{4})?"),
    ("re-hex-colour", "regex", r"#[0-9a-fA-F]{6}"),
    ("re-semver", "regex", r"\d+\.\d+\.\d+"),
    ("re-name", "regex", r"[A-Z][a-z]{1,20}( [A-Z][a-z]{1,20})?"),
    ("re-yes-no", "regex", r"(yes|no|maybe)"),
    ("re-words-50", "regex", r"[A-Za-z ]{1,50}"),
    ("re-card", "regex", r"\d{4}( \d{4}){3}"),
    ("re-url", "regex", r"https?://[a-z0-9.-]+(/[a-zA-Z0-9._~-]*)*"),
    ("re-sentiment", "regex", r"(Positive|Negative|Neutral): [^\n]{0,8}"),
    ("js-weather-tool", "json", WEATHER),
    ("js-search-tool", "json", SEARCH),
    ("js-event-tool", "json", EVENT),
    ("js-order", "json", ORDER),
    ("js-person", "json", PERSON),
    ("js-opt12", "json", OPT12),
    ("js-enum20", "json", {"type": "string", "enum": [f"option_{i}" for i in range(20)]}),
    ("js-toolcall-anyof", "json", TOOLCALL),
    ("js-email", "json", {"type": "string", "format": "email"}),
    ("js-date", "json", {"type": "string", "format": "date"}),
    ("js-datetime", "json", {"type": "string", "format": "date-time"}),
    ("js-uuid", "json", {"type": "string", "format": "uuid"}),
    ("js-ipv4", "json", {"type": "string", "format": "ipv4"}),
    ("js-int-range", "json", {"type": "integer", "minimum": 1, "maximum": 100}),
    ("js-int-array-5", "json", {"type": "array", "items": {"type": "integer"}, "maxItems": 5}),
    ("js-json-object", "json", {"type": "object"}),
    ("choice-10", "choice", [f"label {i}" for i in range(10)]),
    ("gbnf-yes-no", "grammar", 'root ::= "yes" | "no"'),
]

ROUTED_324: dict[str, Any] = {
    "anyOf": [
        {"type": "string", "maxLength": 64},
        {"type": "integer", "multipleOf": 3},
        {"type": "object", "patternProperties": {"^x": {"type": "string"}}},
    ]
}

EXPENSIVE: list[Case] = [
    ("re-ab-a-ab12", "regex", "(a|b)*a(a|b){12}"),
    ("re-ab-a-ab16", "regex", "(a|b)*a(a|b){16}"),
    ("re-ab-a-ab20", "regex", "(a|b)*a(a|b){20}"),
    ("re-class-a-class18", "regex", "[ab]*a[ab]{18}"),
    ("re-dot-x-dot16", "regex", ".*x.{16}"),
    ("js-str-max16", "json", {"type": "string", "maxLength": 16}),
    ("js-str-max20", "json", {"type": "string", "maxLength": 20}),
    ("js-str-max64", "json", {"type": "string", "maxLength": 64}),
    ("js-routed-324", "json", ROUTED_324),
    ("re-nested-1-3-x5", "regex", "(.{1,3}){5}"),
]


def request_body(kind: str, spec: Any, model: str = "tiny-llama") -> dict[str, Any]:
    """A chat request carrying one constraint in vLLM 0.32's ``structured_outputs`` (a schema
    as ``response_format``, as OpenAI clients send it)."""
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": "Answer."}],
        "max_tokens": 8,
    }
    if kind == "json":
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "out", "schema": spec},
        }
    else:
        body["structured_outputs"] = {kind: spec}
    return body


def spec_text(kind: str, spec: Any) -> str:
    return spec if isinstance(spec, str) else json.dumps(spec, separators=(",", ":"))
