"""guard.checks.schema: body shape, field types, required fields, unknown and denied fields."""

from __future__ import annotations

from typing import Any

import pytest

from guard.checks import check_schema
from guard.errors import GuardError
from guard.policy import Policy, default_policy, policy_from_yaml
from guard.request import RequestView

P = default_policy()
REJECT = policy_from_yaml("limits: {schema: {unknown_fields: reject, extra_known_fields: [x_ok]}}")
CHAT = "/v1/chat/completions"
MSG = [{"role": "user", "content": "hi"}]


def rejection(body: Any, path: str = CHAT, policy: Policy = P, method: str = "POST") -> GuardError:
    result = check_schema(RequestView.build(body, path=path, method=method), policy)
    assert result.rejection is not None, "expected a rejection"
    return result.rejection


def passes(body: Any, path: str = CHAT, policy: Policy = P, method: str = "POST") -> bool:
    result = check_schema(RequestView.build(body, path=path, method=method), policy)
    return result.rejection is None


def test_body_must_be_an_object() -> None:
    bodies: list[Any] = [[], "x", 1, None, True]
    for body in bodies:
        assert rejection(body).code == "body_not_object"
    assert passes(None, "/v1/models", method="GET")


def test_required_fields() -> None:
    assert rejection({"model": "m"}).code == "missing_field"
    assert rejection({"model": "m", "messages": None}).param == "messages"
    assert rejection({"model": "m"}, "/v1/completions").code == "missing_field"
    assert passes({"model": "m", "prompt_template": "hi {{x}}"}, "/v1/completions")
    assert rejection({"model": "m"}, "/v1/embeddings").param == "input"
    assert passes({"model": "m", "input": "x"}, "/v1/embeddings")
    # Model is optional, as vLLM makes it (the served model).
    assert passes({"messages": MSG})


def test_prompt_and_prompt_template_are_exclusive() -> None:
    err = rejection({"prompt": "a", "prompt_template": "b"}, "/v1/completions")
    assert err.code == "invalid_value"


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("n", "2", "invalid_type"),
        ("n", 2.0, "invalid_type"),
        ("n", True, "invalid_type"),
        ("n", 0, "invalid_value"),
        ("max_tokens", 0, "invalid_value"),
        ("max_tokens", "100", "invalid_type"),
        ("max_completion_tokens", -1, "invalid_value"),
        ("temperature", "hot", "invalid_type"),
        ("temperature", True, "invalid_type"),
        ("stream", "sometimes", "invalid_type"),
        ("stop", 5, "invalid_type"),
        ("stop", ["a", 1], "invalid_type"),
        ("logit_bias", {"abc": 1}, "invalid_value"),
        ("logit_bias", {"1": "x"}, "invalid_type"),
        ("logit_bias", {"1": 101}, "invalid_value"),
        ("logprobs", 3, "invalid_type"),
        ("top_logprobs", -1, "invalid_value"),
        ("model", 5, "invalid_type"),
        ("template_vars", {"a": 1}, "invalid_type"),
        ("chat_template_kwargs", [], "invalid_type"),
        ("tools", [{"type": "function", "function": {}}], "invalid_type"),
        ("response_format", {"schema": {}}, "invalid_type"),
        ("messages", [], "invalid_value"),
        ("messages", "hi", "invalid_type"),
        ("messages", [{"content": "x"}], "invalid_type"),
        ("messages", [{"role": "wizard", "content": "x"}], "invalid_value"),
        ("messages", [{"role": "user", "content": 5}], "invalid_type"),
        ("messages", [{"role": "user", "content": [{"text": "x"}]}], "invalid_type"),
        ("messages", [{"role": "user", "content": [{"type": "text"}]}], "invalid_type"),
        ("messages", [{"role": "user", "content": "x", "name": 1}], "invalid_type"),
    ],
)
def test_chat_field_types(field: str, value: Any, expected: str) -> None:
    err = rejection({"model": "m", "messages": MSG, field: value})
    assert err.code == expected
    assert err.param is not None and err.param.startswith(field)
    assert err.status == 400


def test_error_names_the_nested_field() -> None:
    body = {"messages": [*MSG, {"role": "user", "content": [{"type": "text", "text": 3}]}]}
    assert rejection(body).param == "messages[1].content[0].text"


@pytest.mark.parametrize(
    ("prompt", "ok"),
    [
        ("text", True),
        (["a", "b"], True),
        ([1, 2, 3], True),
        ([[1, 2], [3]], True),
        ([], False),
        ([[]], False),
        (["a", 1], False),
        ([1, "a"], False),
        ([-1], False),
        ([2**31], False),
        ([1.5], False),
        ([[1], "a"], False),
        ({"a": 1}, False),
    ],
)
def test_prompt_forms(prompt: Any, ok: bool) -> None:
    assert passes({"model": "m", "prompt": prompt}, "/v1/completions") is ok
    assert passes({"model": "m", "input": prompt}, "/v1/embeddings") is ok


def test_best_of_must_cover_n() -> None:
    assert passes({"prompt": "a", "n": 2, "best_of": 2}, "/v1/completions")
    assert rejection({"prompt": "a", "n": 3, "best_of": 2}, "/v1/completions").param == "best_of"


def test_nulls_are_accepted_for_optional_fields() -> None:
    assert passes({"messages": MSG, "n": None, "stop": None, "max_tokens": None, "tools": None})


def test_unknown_fields_allowed_by_default() -> None:
    assert passes({"messages": MSG, "some_new_openai_param": {"x": 1}})


def test_unknown_fields_rejected_by_policy() -> None:
    err = rejection({"messages": MSG, "vendor_knob": {"a": 1}}, policy=REJECT)
    assert err.code == "unknown_field"
    assert err.param == "vendor_knob"
    assert passes({"messages": MSG, "x_ok": 1, "top_k": 5, "guided_json": {}}, policy=REJECT)
    # A long unknown key is cut in the message.
    err = rejection({"messages": MSG, "k" * 1000: 1}, policy=REJECT)
    assert err.param is not None and len(err.param) < 80
    assert len(err.message) < 200


def test_denied_fields_in_every_mode() -> None:
    for policy in (P, REJECT):
        err = rejection({"messages": MSG, "logits_processors": ["evil.module.Cls"]}, policy=policy)
        assert err.code == "field_not_allowed"
        err = rejection({"messages": MSG, "mm_processor_kwargs": {"num_frames": 10**6}})
        assert err.code == "field_not_allowed"
    lenient = policy_from_yaml("limits: {schema: {denied_fields: []}}")
    assert passes({"messages": MSG, "mm_processor_kwargs": {}}, policy=lenient)


def test_other_endpoints() -> None:
    assert passes({"model": "m", "input": "x", "instructions": "be nice"}, "/v1/responses")
    assert rejection({"input": 5}, "/v1/responses").code == "invalid_type"
    assert passes({"prompt": "x"}, "/tokenize")
    assert rejection({"prompt": "x", "messages": MSG}, "/tokenize").code == "invalid_value"
    assert rejection({}, "/tokenize").code == "missing_field"
    # Routes of unknown shape: generation fields typed, nothing required or unknown.
    assert passes({"text_1": "a", "text_2": "b"}, "/score", policy=REJECT)
    assert rejection({"n": "5"}, "/score").code == "invalid_type"


def test_benign_openai_sdk_request_passes() -> None:
    body = {
        "model": "gpt-x",
        "messages": [
            {"role": "system", "content": "You write code."},
            {"role": "user", "content": [{"type": "text", "text": "def f(): return {'a': 1}"}]},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f"}}],
            },
            {"role": "tool", "content": "{}", "tool_call_id": "c1"},
        ],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
        "temperature": 0.7,
        "top_p": 1,
        "n": 1,
        "stream": True,
        "stream_options": {"include_usage": True},
        "stop": ["\n\n"],
        "max_completion_tokens": 100,
        "logit_bias": {"50256": -100},
        "response_format": {"type": "json_object"},
        "seed": 42,
    }
    assert passes(body)
    assert passes(body, policy=REJECT)


def test_a_part_without_a_type_is_read_by_its_media_key_as_vllm_does() -> None:
    # vLLM's CustomChatCompletionContentSimpleImageParam: {"image_url": "..."}, no type.
    for part in (
        {"image_url": "https://example.com/a.png"},
        {"image_url": {"url": "https://example.com/a.png"}},
        {"audio_url": "https://example.com/a.wav"},
        {"video_url": "https://example.com/a.mp4"},
    ):
        body = {"model": "m", "messages": [{"role": "user", "content": [part]}]}
        assert passes(body), part
    # Without a media key there is nothing to read it by: vLLM refuses it, so does the guard.
    body = {"model": "m", "messages": [{"role": "user", "content": [{"text": "hi"}]}]}
    assert rejection(body).param == "messages[0].content[0].type"


def test_booleans_are_read_as_vllms_pydantic_reads_them() -> None:
    for value in (True, False, 0, 1, "false", "True", "no", "on", " yes "):
        assert passes({"model": "m", "messages": MSG, "add_generation_prompt": value}), value
        assert passes({"model": "m", "messages": MSG, "stream": value}), value
    for value in (2, "maybe", 0.5, [], {}):
        err = rejection({"model": "m", "messages": MSG, "stream": value})
        assert (err.code, err.param) == ("invalid_type", "stream")


def test_a_named_tool_choice_must_name_a_tool() -> None:
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}
    named = {"type": "function", "function": {"name": "get_weather"}}
    assert passes({"model": "m", "messages": MSG, "tools": [tool], "tool_choice": named})
    # A name no tool has (llama-cpp-python: a 500), or no tools at all.
    other = {"type": "function", "function": {"name": "get_time"}}
    err = rejection({"model": "m", "messages": MSG, "tools": [tool], "tool_choice": other})
    assert (err.code, err.param) == ("invalid_value", "tool_choice.function.name")
    err = rejection({"model": "m", "messages": MSG, "tool_choice": named})
    assert err.param == "tool_choice.function.name"
    # The legacy pair the same way.
    fn = {"name": "get_weather", "parameters": {}}
    body = {"model": "m", "messages": MSG, "functions": [fn]}
    assert passes({**body, "function_call": {"name": "get_weather"}})
    assert passes({**body, "function_call": "auto"})
    err = rejection({**body, "function_call": {"name": "nope"}})
    assert err.param == "function_call.name"
