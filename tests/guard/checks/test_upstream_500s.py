"""Requests that real upstreams answer with a 500, a crash or an unbounded generation, refused
as classes (issue 13: what the live campaigns found getting through the guard)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from guard.pipeline import evaluate_body
from guard.policy import Policy, default_policy, policy_from_yaml

P = default_policy()
CHAT = "/v1/chat/completions"
COMP = "/v1/completions"
NAMED = {"type": "function", "function": {"name": "f"}}
F = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


def _verdict(body: dict[str, Any], path: str = CHAT, policy: Policy = P) -> tuple[int, str | None]:
    v = evaluate_body(json.dumps(body).encode(), path, {}, policy)
    return (200, None) if v.allowed else (v.rejection.status, v.rejection.code)


def _chat(**kw: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **kw}


@pytest.mark.parametrize(
    "tools",
    [[{}], [{"type": "function", "function": None}], [{"type": "custom", "custom": {}}, F]],
)
def test_named_tool_choice_with_a_tool_vllm_cannot_read(tools: list[Any]) -> None:
    assert _verdict(_chat(tools=tools, tool_choice=NAMED)) == (400, "invalid_value")


def test_named_tool_choice_reads_tools_up_to_the_named_one() -> None:
    tools = [F, {"type": "custom", "custom": {"name": "c"}}]
    assert _verdict(_chat(tools=tools, tool_choice=NAMED)) == (200, None)
    assert _verdict(_chat(tools=[F], tool_choice="auto")) == (200, None)


@pytest.mark.parametrize("mask", [{"allowed_token_ids": [1]}, {"bad_words": ["a"]}])
@pytest.mark.parametrize(
    "constraint",
    [
        {"structured_outputs": {"regex": "a+"}},
        {"guided_choice": ["a"]},
        {"response_format": {"type": "json_object"}},
        {"tools": [F], "tool_choice": "required"},
    ],
)
def test_token_masks_with_structured_output(
    mask: dict[str, Any], constraint: dict[str, Any]
) -> None:
    assert _verdict(_chat(**mask, **constraint)) == (400, "invalid_value")
    assert _verdict(_chat(**mask)) == (200, None)
    assert _verdict(_chat(**mask, response_format={"type": "text"})) == (200, None)


def test_json_nested_inside_tool_call_arguments() -> None:
    deep = "[" * 1100 + "]" * 1100
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": deep}}
    body = {
        "model": "m",
        "messages": [
            {"role": "user", "content": "x"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
        ],
    }
    assert _verdict(body) == (400, "json_depth_exceeded")


@pytest.mark.parametrize(
    ("body", "path"),
    [
        ({"model": "m", "prompt": "hi", "max_tokens": 0}, COMP),
        ({"model": "m", "prompt": "hi", "n_predict": 0}, COMP),
        ({"model": "m", "prompt": "hi", "n_predict": -1}, COMP),
    ],
)
def test_an_output_cap_of_zero_or_less_is_unlimited(body: dict[str, Any], path: str) -> None:
    assert _verdict(body, path) == (400, "max_tokens_exceeded")
    (field,) = body.keys() - {"model", "prompt"}
    # Clamped to max_output_tokens (the seed preset's 2048) ...
    clamp = policy_from_yaml("{preset: seed, limits: {tokens: {over_max_output: clamp}}}")
    v = evaluate_body(json.dumps(body).encode(), path, {}, clamp)
    assert v.allowed
    assert {m.path: m.value for m in v.mutations}[(field,)] == 2048
    # ... or, without one, to what the context window leaves beside the prompt.
    clamp = policy_from_yaml("limits: {tokens: {over_max_output: clamp}}")
    v = evaluate_body(json.dumps(body).encode(), path, {}, clamp)
    assert v.allowed, v.rejection
    window = clamp.limits.tokens.context_length
    assert window is not None
    assert {m.path: m.value for m in v.mutations}[(field,)] == window - v.costs["prompt_tokens"]


def test_max_tokens_is_set_when_another_field_caps_the_output() -> None:
    # llama-cpp-python reads max_tokens only: the cap another field sets is copied there.
    llama_cpp = policy_from_yaml("upstream: {kind: llama_cpp}")
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    raw = json.dumps({**body, "max_completion_tokens": 10}).encode()
    v = evaluate_body(raw, CHAT, {}, llama_cpp)
    assert v.allowed and {m.path: m.value for m in v.mutations}[("max_tokens",)] == 10
    raw = json.dumps({"model": "m", "prompt": "x", "n_predict": 9}).encode()
    v = evaluate_body(raw, COMP, {}, llama_cpp)
    assert v.allowed and {m.path: m.value for m in v.mutations}[("max_tokens",)] == 9
    # vLLM reads max_completion_tokens itself: the request goes unchanged.
    v = evaluate_body(json.dumps({**body, "max_completion_tokens": 10}).encode(), CHAT, {}, P)
    assert v.allowed and v.mutations == ()


def test_prompt_lists_for_llama_cpp_python() -> None:
    body = {"model": "m", "prompt": ["a", "b"], "max_tokens": 4}
    assert _verdict(body, COMP) == (200, None)  # vLLM serves them: the default allows 64
    one = policy_from_yaml("limits:\n  fanout:\n    max_prompts: 1\n")
    assert _verdict(body, COMP, one) == (400, "prompts_exceeded")
    assert _verdict({**body, "prompt": ["a"]}, COMP, one) == (200, None)
