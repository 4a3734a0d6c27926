"""A look-alike that forces a tool call fails unless its answer carries the call
(loadtests.tool_calls): judged on the reference scheduler's own answers to the corpus's forced
calls, and on answers that miss the call."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient

from loadtests.replay import load_lookalikes
from loadtests.tool_calls import forced_call_failure
from scheduler_ref.profiles import HARDENED
from scheduler_ref.server import create_app

FORCED = [
    r
    for r in load_lookalikes("hardened")
    if b'"tool_choice"' in r.body() and b'"stream":true' not in r.body()
]


def test_the_corpus_has_forced_calls() -> None:
    bodies = [json.loads(r.body()) for r in FORCED]
    choices = [b.get("tool_choice") for b in bodies]
    assert "required" in choices and any(isinstance(c, dict) for c in choices)


def test_the_reference_answers_every_forced_look_alike_with_its_call() -> None:
    with TestClient(create_app(HARDENED)) as client:
        for replay in FORCED:
            resp = client.post(replay.path, content=replay.body())
            assert resp.status_code == 200, (replay.id, resp.text)
            assert forced_call_failure(replay.body(), resp.content) is None, replay.id


def _answer(message: dict[str, Any]) -> bytes:
    return json.dumps({"choices": [{"index": 0, "message": message}]}).encode()


CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
REQUIRED = json.dumps({"tools": [{"type": "function", "function": {"name": "f"}}],
                       "tool_choice": "required"}).encode()  # fmt: skip
NAMED_G = json.dumps({"tools": [{"type": "function", "function": {"name": "g"}}],
                      "tool_choice": {"type": "function", "function": {"name": "g"}}}).encode()  # fmt: skip


@pytest.mark.parametrize(
    ("request_body", "message", "failure"),
    [
        (REQUIRED, {"role": "assistant", "content": None, "tool_calls": [CALL]}, None),
        (REQUIRED, {"role": "assistant", "content": "sunny"}, "has no tool_calls"),
        (REQUIRED, {"role": "assistant", "tool_calls": []}, "has no tool_calls"),
        (REQUIRED, {"tool_calls": [{**CALL, "function": {"name": "f"}}]}, "malformed"),
        (REQUIRED, {"tool_calls": [{**CALL, "type": "custom"}]}, "malformed"),
        (NAMED_G, {"tool_calls": [CALL]}, "not the named one"),
        # No forced call: text is the answer.
        (json.dumps({"tools": [], "tool_choice": "required"}).encode(), {"content": "x"}, None),
        (json.dumps({"tool_choice": "auto", "tools": [1]}).encode(), {"content": "x"}, None),
    ],
)
def test_answers_without_the_call_fail(
    request_body: bytes, message: dict[str, Any], failure: str | None
) -> None:
    got = forced_call_failure(request_body, _answer(message))
    if failure is None:
        assert got is None
    else:
        assert got is not None and failure in got
