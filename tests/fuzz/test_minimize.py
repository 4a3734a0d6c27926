"""fuzz.minimize: ddmin over bytes and shrink_json over JSON documents, each keeping what the
predicate needs and stopping at its budget."""

from __future__ import annotations

import json
from typing import Any

from fuzz.minimize import MinimiseStats, ddmin, shrink_json


def test_shrink_json_keeps_what_the_predicate_needs() -> None:
    doc = {
        "model": "m",
        "messages": [{"role": "user", "content": "x" * 100}, {"role": "user", "content": "NEEDLE"}],
        "tools": [{"a": 1}, {"b": [1, 2, 3]}],
        "n": 1000,
        "grammar": "root ::= " + "(" * 64 + '"a"' + ")" * 64,
    }

    def still(d: Any) -> bool:
        text = json.dumps(d)
        return "NEEDLE" in text and "((((" in text

    small = shrink_json(doc, still, max_tests=300, keep=frozenset({"model"}))
    assert still(small) and small["model"] == "m"
    assert set(small) == {"model", "messages", "grammar"}
    assert len(small["messages"]) == 1
    grammar = small["grammar"]
    assert grammar.count("(") < 20 and grammar.count("(") == grammar.count(")")


def test_shrink_json_stops_at_its_budget() -> None:
    calls = []

    def still(d: Any) -> bool:
        calls.append(d)
        return isinstance(d, dict) and len(d.get("a", ())) > 3

    shrink_json({"a": list(range(100)), "b": "x" * 1000}, still, max_tests=5)
    assert len(calls) == 5


def test_ddmin_finds_a_one_minimal_input() -> None:
    data = b"xxxxaxxxxxxbxxxxxxxxxxcxxxx" * 3

    def fails(d: bytes) -> bool:
        return b"a" in d and b"b" in d and b"c" in d

    stats = MinimiseStats()
    small = ddmin(data, fails, stats=stats)
    assert sorted(small) == sorted(b"abc") and stats.complete
    # Bounded: it stops at max_tests and still returns an input that fails.
    cut = ddmin(data, fails, max_tests=3)
    assert fails(cut) and len(cut) <= len(data)
