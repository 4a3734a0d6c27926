"""guard.checks.guided: delegates to guard.guided with the policy's limits."""

from __future__ import annotations

from typing import Any

import pytest

from guard.checks import check_guided
from guard.policy import Policy, default_policy, policy_from_yaml
from guard.request import RequestView

P = default_policy()
MSG = [{"role": "user", "content": "hi"}]


def code(body: Any, policy: Policy = P) -> str | None:
    result = check_guided(RequestView.build(body, path="/v1/chat/completions"), policy)
    return None if result.rejection is None else result.rejection.code


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({"guided_regex": "(a+)+b"}, "guided_regex_unsafe"),
        ({"structured_outputs": {"regex": "a{100}{100}{100}"}}, "guided_regex_unsafe"),
        ({"guided_regex": "(" * 60 + "a" + ")" * 60}, "guided_regex_unsafe"),
        ({"guided_regex": "a" * 5000}, "guided_regex_too_long"),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "(a*)*$"}},
                }
            },
            "guided_regex_unsafe",
        ),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {
                            "name": "f",
                            "parameters": {"properties": {"a": {"pattern": "(x+x+)+y"}}},
                        },
                    }
                ]
            },
            "guided_regex_unsafe",
        ),
        ({"grammar": "root ::= " + "(" * 100 + '"a"' + ")" * 100}, "guided_grammar_too_deep"),
    ],
)
def test_unsafe_constraints_are_refused(extra: dict[str, Any], expected: str) -> None:
    assert code({"messages": MSG, **extra}) == expected


def test_benign_constraints_pass() -> None:
    body = {
        "messages": MSG,
        "guided_regex": r"\d{3}-\d{4}",
        "response_format": {
            "type": "json_schema",
            "json_schema": {
                "name": "person",
                "schema": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string", "pattern": "^[A-Z][a-z]+$"},
                        "age": {"type": "integer", "minimum": 0, "maximum": 150},
                    },
                    "required": ["name"],
                },
            },
        },
        "guided_choice": ["yes", "no"],
    }
    assert code(body) is None


def test_policy_limits_are_used() -> None:
    short = policy_from_yaml("limits: {guided: {max_regex_length: 10}}")
    assert code({"guided_regex": "a" * 10}, short) is None
    assert code({"guided_regex": "a" * 11}, short) == "guided_regex_too_long"


def test_non_objects_pass() -> None:
    assert code(None) is None
    assert code(["guided_regex", "(a+)+"]) is None
