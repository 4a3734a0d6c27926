"""fuzz.live._fields: an under-count named by the fields beyond a plain chat, and a finding's class."""

from __future__ import annotations

from fuzz.live import LiveRequest, payload_class, shape_signature
from fuzz.live._fields import baseline_body, remove_paths, shape_paths
from tests.fuzz.live._fake import CHAT, HELLO


def test_shape_signature() -> None:
    refusal = {
        "model": "m",
        "messages": [{"role": "user", "content": [{"type": "refusal", "refusal": "x"}]}],
    }
    assert shape_signature(refusal) == "messages[].content[type=refusal].refusal"
    assert shape_signature(HELLO) == "template-overhead"
    args = {
        "messages": [{"role": "assistant", "tool_calls": [{"function": {"arguments": {"a": "b"}}}]}]
    }
    assert shape_signature(args) == "messages[].tool_calls[].function.arguments.a"
    tools = {"tools": [{"type": "function", "function": {"name": "f"}}]}
    assert shape_signature(tools) == "tools[].function.name"  # a tool's type is not a shape
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}]}
    assert shape_signature(parts) == "template-overhead"  # text parts are a plain chat


def test_remove_paths_and_the_plain_chat_core() -> None:
    doc = {
        "model": "m",
        "temperature": 0.1,
        "messages": [
            {"role": "system", "content": "be brief"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "hi "},
                    {"type": "refusal", "refusal": "no"},
                    {"type": "text", "text": "there"},
                ],
                "name": "bob",
            },
        ],
        "tools": [{"type": "function", "function": {"name": "f"}}],
    }
    refusal = "messages[].content[type=refusal]"
    stripped = remove_paths(doc, {refusal, "tools"})
    assert "tools" not in stripped and refusal not in shape_paths(stripped)
    assert stripped["messages"][1]["content"][1] == {"type": "text", "text": "there"}
    assert baseline_body(doc) == {
        "model": "m",
        "temperature": 0.1,
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "hi there"},  # text parts joined, the rest left out
        ],
    }
    assert baseline_body(["not", "an", "object"]) is None


def test_payload_class_files_a_live_finding_by_what_its_request_holds() -> None:
    def chat(**extra: object) -> LiveRequest:
        return LiveRequest(CHAT, {**HELLO, **extra})

    assert payload_class(chat(grammar="root ::= x"), "crash:ServerDied:server:died") == (
        "guided_decoding"
    )
    assert payload_class(chat(grammar="x"), "undercount:prompt_tokens:grammar") == "volume"
    image = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
    assert payload_class(chat(messages=[image]), "time") == "multimodal_fan_out"
    assert payload_class(chat(chat_template="{{ x }}"), "time") == "request_chat_template"
    assert payload_class(chat(chat_template_kwargs={"a": 1}), "time") == "template_kwargs"
    assert payload_class(chat(n=1000), "5xx:500:x") == "fan_out"
    nested: object = "x"
    for _ in range(40):
        nested = [nested]
    assert payload_class(chat(extra_body=nested), "memory") == "json_body_bomb"
    assert payload_class(LiveRequest(CHAT, None, raw=b"{{{"), "crash:x:y") == "json_body_bomb"
    assert payload_class(chat(), "time") == "volume"
