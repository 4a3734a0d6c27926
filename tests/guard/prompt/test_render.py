"""guard.prompt._render: finding the upstream's template, and the conversation vLLM builds."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest

from guard.checks import check_tokens
from guard.errors import LimitExceeded
from guard.jinja import CODE_RAISED, ChatTemplateLimits
from guard.policy import Policy, policy_from_yaml
from guard.prompt._render import render_count
from guard.prompt._template_source import load_chat_template
from guard.prompt._units import ChatInput
from guard.prompt._vllm_chat import detect_content_format, llama_cpp_call, vllm_call
from guard.request import RequestView
from guard.tokens import get_counter

LOOPS_OVER_CONTENT = (
    "{% for m in messages %}{% for part in m.content %}{{ part.text }}{% endfor %}{% endfor %}"
)
PRINTS_CONTENT = "{% for message in messages %}{{ message['content'] }}{% endfor %}"
MACRO = (
    "{% macro render(content) %}{% for c in content %}{{ c.text }}{% endfor %}{% endmacro %}"
    "{% for message in messages %}{{ render(message.content) }}{% endfor %}"
)


def test_content_format_is_detected_as_vllm_detects_it() -> None:
    assert detect_content_format(LOOPS_OVER_CONTENT) == "openai"
    assert detect_content_format(MACRO) == "openai"
    assert detect_content_format(PRINTS_CONTENT) == "string"
    assert detect_content_format("{% if %}") == "string"  # does not parse: vLLM's default


def _gguf(template: str, tokens: list[str], bos: int, eos: int) -> bytes:
    def string(text: str) -> bytes:
        raw = text.encode()
        return struct.pack("<Q", len(raw)) + raw

    kvs = [
        (string("general.name") + struct.pack("<I", 8) + string("tiny")),
        (string("tokenizer.chat_template") + struct.pack("<I", 8) + string(template)),
        (
            string("tokenizer.ggml.tokens")
            + struct.pack("<IIQ", 9, 8, len(tokens))
            + b"".join(string(t) for t in tokens)
        ),
        (string("tokenizer.ggml.scores") + struct.pack("<IIQ", 9, 6, 2) + b"\x00" * 8),
        (string("tokenizer.ggml.bos_token_id") + struct.pack("<II", 4, bos)),
        (string("tokenizer.ggml.eos_token_id") + struct.pack("<II", 4, eos)),
    ]
    return b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs)) + b"".join(kvs) + b"\x00" * 64


def test_templates_are_found_next_to_the_tokenizer(tmp_path: Path) -> None:
    tokenizer = tmp_path / "tokenizer.json"
    tokenizer.write_text("{}")
    assert load_chat_template("auto", str(tokenizer)) is None
    assert load_chat_template("auto", "cl100k_base") is None
    assert load_chat_template(None, str(tokenizer)) is None
    # A GGUF model: its template and BOS/EOS.
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(_gguf("{{ bos_token }}hi", ["<s>", "</s>", "a"], 0, 1))
    load_chat_template.cache_clear()
    found = load_chat_template("auto", str(tokenizer))
    assert found is not None and found.default == "{{ bos_token }}hi"
    assert dict(found.special_tokens) == {"bos_token": "<s>", "eos_token": "</s>"}
    # tokenizer_config.json, named templates: tool_use for requests with tools.
    config = {
        "bos_token": {"content": "<|b|>"},
        "chat_template": [
            {"name": "default", "template": "plain"},
            {"name": "tool_use", "template": "{% generation %}tools{% endgeneration %}"},
        ],
    }
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    load_chat_template.cache_clear()
    found = load_chat_template("auto", str(tokenizer))
    assert found is not None
    assert found.source_for(False) == "plain"
    assert "generation" not in found.source_for(True)  # transformers' tag, a no-op here
    assert dict(found.special_tokens) == {"bos_token": "<|b|>"}
    # chat_template.jinja wins.
    (tmp_path / "chat_template.jinja").write_text("jinja")
    load_chat_template.cache_clear()
    found = load_chat_template("auto", str(tokenizer))
    assert found is not None and found.default == "jinja"
    with pytest.raises(FileNotFoundError):
        load_chat_template(str(tmp_path / "missing.jinja"), str(tokenizer))


def test_the_conversation_vllm_builds() -> None:
    body: dict[str, Any] = {
        "messages": [
            {"role": "developer", "content": "dev"},
            {"role": "system", "content": [{"type": "text", "text": "sys"}]},
            {
                "role": "user",
                "content": [
                    "bare",
                    {"type": "refusal", "refusal": "no"},
                    {"type": "thinking", "thinking": "hmm", "closed": True},
                    {"type": "input_text", "text": "in", "cache_control": {"x": 1}},
                    {"type": "image_url", "image_url": {"url": "https://x/y.png"}, "note": "n"},
                    {"type": "tool_reference", "name": "search"},
                ],
                "name": "ann",
                "extra": "dropped",
            },
            {
                "role": "assistant",
                "content": None,
                "reasoning_content": "because",
                "tool_calls": [
                    {"id": "1", "type": "function", "function": {"name": "f", "arguments": "[1]"}},
                    {"id": "2", "type": "function", "function": {"name": "g", "arguments": ""}},
                ],
            },
            {"role": "tool", "tool_call_id": "1", "content": [{"type": "text", "text": "a"}] * 2},
        ],
        "tools": [{"type": "function", "function": {"name": "f", "extra": 1}, "junk": 2}],
        "reasoning_effort": "low",
        "chat_template_kwargs": {"enable_thinking": False},
    }
    chat = ChatInput(body["messages"], body)
    variables = vllm_call(chat, LOOPS_OVER_CONTENT, (("bos_token", "<s>"),), 32).variables
    messages = variables["messages"]
    # No "developer" in the template: developer and system messages merged into one.
    assert messages[0] == {"role": "system", "content": "dev\n\nsys"}
    user = messages[1]
    assert user["content"][:4] == [
        {"type": "text", "text": "bare"},
        {"type": "text", "text": "no"},
        {"type": "text", "text": "hmm"},
        {"type": "text", "text": "in", "cache_control": {"x": 1}},
    ]
    assert user["content"][4] == {"type": "image", "note": "n"}
    assert user["content"][5] == {"type": "tool_reference", "name": "search"}
    assert user["name"] == "ann" and "extra" not in user
    assistant = messages[2]
    assert assistant["reasoning"] == assistant["reasoning_content"] == "because"
    assert [c["function"]["arguments"] for c in assistant["tool_calls"]] == [{}, {}]
    assert messages[3]["content"] == "a\na" and messages[3]["tool_call_id"] == "1"
    assert variables["tools"] == [
        {"type": "function", "function": {"name": "f", "description": None, "parameters": None}}
    ]
    assert variables["bos_token"] == "<s>" and variables["add_generation_prompt"] is True
    # Keyword arguments reach the template only when it reads them (vLLM's
    # resolve_chat_template_kwargs); the request's enable_thinking wins over reasoning_effort's.
    assert "reasoning_effort" not in variables and "enable_thinking" not in variables
    reads = LOOPS_OVER_CONTENT + "{{ reasoning_effort }}{{ enable_thinking }}"
    variables = vllm_call(chat, reads, (), 32).variables
    assert variables["reasoning_effort"] == "low" and variables["enable_thinking"] is False
    # The string content format joins the texts.
    flat = vllm_call(chat, PRINTS_CONTENT, (), 32).variables["messages"]
    assert flat[1]["content"] == "bare\nno\nhmm\nin\nsearch"
    # llama-cpp-python passes the messages as they are.
    assert llama_cpp_call(chat, ()).variables["messages"] is body["messages"]


def test_renders_are_independent_and_failures_say_why() -> None:
    counter = get_counter()
    chat = ChatInput([{"role": "user", "content": "hi"}], {})
    limits = ChatTemplateLimits()
    raising = "{{ raise_exception('roles must alternate') }}"
    outcome = render_count(chat, raising, (), ("vllm",), counter, 100, limits, 32)
    assert outcome.tokens is None
    assert outcome.raised is not None and outcome.raised.code == CODE_RAISED
    assert outcome.raised.message == "roles must alternate"
    escape = "{{ messages.__class__.__mro__ }}"
    assert render_count(chat, escape, (), ("vllm",), counter, 100, limits, 32).raised is None
    # Command R style: `content + ...` fails on list content as llama-cpp-python passes it,
    # while vLLM joins the texts (string content format): the successful render counts.
    listed = ChatInput([{"role": "user", "content": [{"type": "text", "text": "hello"}]}], {})
    concat = "{% for m in messages %}{{ '<|' + m.role + '|>' + m.content }}{% endfor %}"
    both = render_count(listed, concat, (), ("vllm", "llama_cpp"), counter, 100, limits, 32)
    assert both.tokens == counter.count("<|user|>hello")
    alone = render_count(listed, concat, (), ("llama_cpp",), counter, 100, limits, 32)
    assert alone.tokens is None and alone.raised is None
    loops = "{% for i in range(10000) %}{% for j in range(10000) %}{% endfor %}{% endfor %}"
    with pytest.raises(LimitExceeded):
        render_count(chat, loops, (), ("vllm",), counter, 100, limits, 32)
    big = "{% for m in messages %}{{ m.content * 5000 }}{% endfor %}"
    with pytest.raises(LimitExceeded) as info:
        render_count(chat, big, (), ("vllm",), counter, 100, limits, 32)
    assert info.value.code == "prompt_tokens_exceeded"


def _policy(tmp_path: Path, template: str) -> Policy:
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "chat_template.jinja").write_text(template)
    return policy_from_yaml(
        f"limits: {{tokens: {{chat_template: '{tmp_path / 'chat_template.jinja'}', "
        "exact_costs: true}}"
    )


def test_a_raising_template_is_the_upstreams_400(tmp_path: Path) -> None:
    policy = _policy(tmp_path, "{{ raise_exception('no system role') }}")
    body = {"messages": [{"role": "user", "content": "hello there"}]}
    result = check_tokens(RequestView.build(body, path="/v1/chat/completions"), policy)
    assert result.rejection is not None
    assert (result.rejection.code, result.rejection.status) == (CODE_RAISED, 400)
    assert result.rejection.message == "no system role"


def test_a_template_the_sandbox_refuses_falls_back_with_its_literal_text(tmp_path: Path) -> None:
    preamble = "You are a careful assistant. Answer in full sentences. " * 20
    # Refused by the sandbox only for a conversation that ends with the assistant (so not at
    # start-up, whose trial render is an ordinary chat).
    template = (
        preamble + "{% for m in messages %}<|START|>{{ m.role }}: {{ m.content }}<|END|>"
        "{% endfor %}{% if messages[-1].role == 'assistant' %}{{ messages.__class__.__mro__ }}"
        "{% endif %}"
    )
    policy = _policy(tmp_path, template)
    body = {
        "messages": [{"role": "user", "content": "hello there"}] * 2
        + [{"role": "assistant", "content": "hello there"}]
    }
    result = check_tokens(RequestView.build(body, path="/v1/chat/completions"), policy)
    assert result.rejection is None
    counter = get_counter()
    # What the template would print without the failing tail, and what the bound adds.
    printed = preamble + "<|START|>user: hello there<|END|>" * 3
    literal = counter.count(preamble) + 1 + 3 * (counter.count("<|START|>") + 1)
    literal += 3 * (counter.count(": ") + 1 + counter.count("<|END|>") + 1)
    tokens = policy.limits.tokens
    roles = 2 * len("user") + len("assistant")
    fields = tokens.per_request_tokens + 3 * (tokens.per_message_tokens + 2 + 1) + roles
    assert result.costs["prompt_tokens"] == fields + literal >= counter.count(printed)


def test_a_template_the_sandbox_cannot_render_is_a_start_up_error(tmp_path: Path) -> None:
    from guard.errors import PolicyError

    with pytest.raises(PolicyError, match=r"chat_template\.jinja: the chat template was refused"):
        _policy(tmp_path, "{{ messages.__class__.__mro__ }}")
    _policy(tmp_path / "rag", "{% for d in documents %}{{ d.text }}{% endfor %}")


def test_the_renders_modelled_follow_the_upstream_kind_unless_set() -> None:
    from guard.checks.tokens import render_flavours

    default = policy_from_yaml("")
    assert render_flavours(default) == ("vllm", "llama_cpp")  # the kind is not known yet
    assert render_flavours(default.with_upstream_kind("vllm")) == ("vllm",)
    assert render_flavours(default.with_upstream_kind("llama_cpp")) == ("llama_cpp",)
    both = policy_from_yaml("limits: {tokens: {render_like: [vllm, llama_cpp]}}")
    assert render_flavours(both.with_upstream_kind("vllm")) == ("vllm", "llama_cpp")


def test_the_responses_api_counts_the_templates_own_text(tmp_path: Path) -> None:
    preamble = "You are a careful assistant. Answer in full sentences. " * 20
    policy = _policy(tmp_path, preamble + "{% for m in messages %}{{ m.content }}{% endfor %}")
    view = RequestView.build({"input": "hi", "max_output_tokens": 8}, path="/v1/responses")
    result = check_tokens(view, policy)
    assert result.rejection is None
    assert result.costs["prompt_tokens"] > get_counter().count(preamble)
