"""guard.prompt._vllm_chat: the keyword arguments and the continue_final_message cut as vLLM 0.32
and transformers do them (resolve_chat_template_kwargs, build_chat_params, merge_kwargs,
render_jinja_template)."""

from __future__ import annotations

from typing import Any

from guard.jinja import ChatTemplateLimits, template_variables
from guard.prompt._render import render_count
from guard.prompt._units import ChatInput, ChatKind
from guard.prompt._vllm_chat import CONTINUE_MARKER, cut_at_marker, vllm_call
from guard.tokens import get_counter

READS = "{{ enable_thinking }}{{ max_length }}{{ custom }}{% for m in messages %}{{ m.content }}{% endfor %}"
TOOL = {"type": "function", "function": {"name": "f"}, "defer_loading": True}


def _call(body: dict[str, Any], source: str = READS, kind: ChatKind = "chat") -> dict[str, Any]:
    messages = body.get("messages", [{"role": "user", "content": "hi"}])
    return vllm_call(ChatInput(messages, body, kind), source, (("bos_token", "<s>"),), 32).variables


def test_only_the_kwargs_the_template_reads_reach_it() -> None:
    assert template_variables(READS) >= {"enable_thinking", "max_length", "custom", "messages"}
    variables = _call(
        {"chat_template_kwargs": {"custom": "x", "unread": "y", "max_length": 5, "bos_token": "B"}}
    )
    assert variables["custom"] == "x"
    assert "unread" not in variables  # resolve_chat_template_kwargs drops it
    assert "max_length" not in variables  # apply_chat_template's own parameter, consumed
    assert variables["bos_token"] == "<s>"  # not read by this template: the tokenizer's stays
    reads_bos = _call({"chat_template_kwargs": {"bos_token": "B"}}, READS + "{{ bos_token }}")
    assert reads_bos["bos_token"] == "B"  # kwargs overwrite special tokens (transformers)


def test_the_requests_own_fields_win_over_its_kwargs() -> None:
    variables = _call(
        {"chat_template_kwargs": {"add_generation_prompt": False}, "reasoning_effort": "none"}
    )
    assert variables["add_generation_prompt"] is True  # the body's default, not null: it wins
    assert variables["enable_thinking"] is False  # from reasoning_effort "none"
    kept = _call({"chat_template_kwargs": {"enable_thinking": True}, "reasoning_effort": "none"})
    assert kept["enable_thinking"] is True


def test_tools_as_vllm_dumps_them() -> None:
    assert _call({"tools": []})["tools"] == []  # kept: `tools is not none` templates differ
    assert _call({})["tools"] is None
    (tool,) = _call({"tools": [TOOL]})["tools"]
    assert tool["function"]["defer_loading"] is True and tool["defer_loading"] is True
    assert _call({"tools": [TOOL]}, kind="pooling")["tools"] is None
    override = _call({"tools": [TOOL], "chat_template_kwargs": {"tools": ["mine"]}})
    assert override["tools"] == ["mine"]  # merge_kwargs: the request's kwargs win


def test_pooling_and_score_defaults() -> None:
    assert _call({}, kind="pooling")["add_generation_prompt"] is False
    assert _call({}, kind="tokenize")["add_generation_prompt"] is True
    score = _call(
        {"instruction": "Judge", "messages": [{"role": "query", "content": "q"}]},
        READS + "{{ instruction }}",
        "score",
    )
    assert score["instruction"] == "Judge" and score["add_generation_prompt"] is False
    assert score["messages"] == [{"role": "query", "content": "q"}]


def test_vllm_refuses_before_rendering() -> None:
    chat = ChatInput([{"role": "user", "content": "hi"}], {"continue_final_message": True})
    assert vllm_call(chat, READS, (), 32).refused is not None  # with the default generation prompt
    for body in (
        {"add_generation_prompt": "maybe"},
        {"chat_template_kwargs": {"messages": []}, "messages": [{"role": "user", "content": "x"}]},
        {"documents": ["not a dict"]},
    ):
        assert vllm_call(
            ChatInput([{"role": "user", "content": "x"}], body), "{{ messages }}", (), 32
        ).refused


def test_continue_final_message_is_cut_as_transformers_cuts_it() -> None:
    counter = get_counter()
    template = (
        "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}<|end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    body = {"add_generation_prompt": False, "continue_final_message": True}
    for content, expected in (
        ("Once upon", "<|user|>hi<|end|>\n<|assistant|>Once upon"),
        ([{"type": "text", "text": "Once"}], "<|user|>hi<|end|>\n<|assistant|>Once"),
    ):
        messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": content}]
        chat = ChatInput(messages, body)
        outcome = render_count(
            chat, template, (), ("vllm",), counter, 100, ChatTemplateLimits(), 32
        )
        assert outcome.tokens == counter.count(expected)
    # Trailing spaces the template strips: cut before the marker, trailing space removed.
    assert cut_at_marker("a " + CONTINUE_MARKER + "b") == "a "
    assert cut_at_marker("a " + CONTINUE_MARKER.strip() + "b") == "a"
    assert cut_at_marker("no marker") is None
