"""fuzz.live._shapes: the operators on OpenAI request shapes, each bounded by the body cap."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from fuzz.live import OPERATORS, nest_grammar
from fuzz.live._shapes import Context, duplicate, grow_string
from guard.isolation import run_limited
from tests.fuzz.live._fake import CHAT, HELLO


def test_nest_grammar() -> None:
    assert nest_grammar('root ::= "a"', 3) == 'root ::= ((("a")))'
    assert nest_grammar('root ::= x\nx ::= "b"', 2) == 'root ::= ((x))\nx ::= "b"'


def _grow_repeatedly(cap: int) -> int:
    """In a limited child: a body near the cap, then the repeating operators again and again
    on it (as stacked operators and a climbing campaign do); the body's final size."""
    body: dict[str, Any] = {"messages": [{"role": "user", "content": "x" * (cap // 2)}]}
    ctx = Context(random.Random(0), max_bytes=cap)
    for _ in range(12):
        grow_string(body, ctx)
        duplicate(body, ctx)
    return len(json.dumps(body))


def test_repeating_operators_are_bounded_by_the_body_cap() -> None:
    """Each operator's copies are bounded by the body cap, so operators stacked on one body
    grow it linearly, not multiplicatively: a 1 MiB string repeated 256 times, twice, took a
    campaign's process to 21 GB before the cap could discard the child."""
    cap = 256 << 10
    result = run_limited(_grow_repeatedly, cap, mem_limit_bytes=512 << 20, timeout_s=120)
    assert result.outcome == "ok", result
    assert result.value is not None and result.value <= 32 * cap, result.value


@pytest.mark.parametrize("name", sorted(OPERATORS))
def test_each_operator_applies_to_a_chat(name: str) -> None:
    op = OPERATORS[name][0]
    rng = random.Random(2)
    applied = 0
    for _ in range(20):
        body: dict[str, Any] = json.loads(json.dumps(HELLO))
        path = "/v1/completions" if name == "struct.prompt_form" else CHAT
        if op(body, Context(rng, ("donor text",), path)):
            applied += 1
            json.dumps(body)
    assert applied
