"""The prompt count against a real chat template: the tiny test model's (scripts/upstreams), its
byte-level BPE trained here as the upstream set-up trains it.

- exact mode (the template named) agrees with a plain Jinja render of the same conversation,
  and is never above the fallback bound or the byte bound (a property over generated
  conversations: every part type, tool calls with any arguments, extra keys, tools);
- the classes of issue 13 (refusal/thinking parts, tool-call ids and arguments re-printed,
  developer tools, ...) are each counted.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jinja2.sandbox import ImmutableSandboxedEnvironment

from guard.checks import check_tokens
from guard.policy import Policy, policy_from_yaml
from guard.prompt._template_source import load_chat_template
from guard.prompt._vllm_chat import detect_content_format
from guard.request import RequestView
from tests._support import REPO_ROOT

UPSTREAMS = REPO_ROOT / "scripts" / "upstreams"
CHAT = "/v1/chat/completions"
BOS = "<|begin_of_text|>"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    sys.path.insert(0, str(UPSTREAMS))
    try:
        import tiny_tokenizer
    finally:
        sys.path.remove(str(UPSTREAMS))
    directory = tmp_path_factory.mktemp("tiny-model")
    tiny_tokenizer.train().save(str(directory / "tokenizer.json"))
    (directory / "chat_template.jinja").write_text(tiny_tokenizer.CHAT_TEMPLATE)
    config = {"bos_token": BOS, "eos_token": "<|im_end|>", "pad_token": "<|end_of_text|>"}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    yield directory


def _policy(model: Path, extra: str) -> Policy:
    return policy_from_yaml(
        f"limits: {{tokens: {{tokenizer: '{model / 'tokenizer.json'}', "
        f"max_prompt_tokens: 200000, context_length: null, {extra}}}, "
        "json: {max_depth: 64}}"
    )


@pytest.fixture(scope="module")
def policies(model_dir: Path) -> dict[str, Policy]:
    return {
        "exact": _policy(model_dir, "exact_costs: true"),
        "vllm": _policy(model_dir, "exact_costs: true, render_like: [vllm]"),
        "fallback": _policy(model_dir, "exact_costs: true, chat_template: null"),
        "bytes": _policy(model_dir, "exact_costs: false, chat_template: null"),
    }


def prompt_tokens(body: dict[str, Any], policy: Policy) -> int:
    result = check_tokens(RequestView.build(body, path=CHAT), policy)
    assert result.rejection is None, result.rejection
    return int(result.costs["prompt_tokens"])


def reference_count(model: Path, messages: list[dict[str, Any]], **kw: Any) -> int:
    """The template rendered as transformers renders it, counted by the tokenizer itself."""
    from tokenizers import Tokenizer

    def tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, **_: Any) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    source = (model / "chat_template.jinja").read_text()
    text = env.from_string(source).render(
        messages=messages, bos_token=BOS, add_generation_prompt=True, **kw
    )
    tokenizer = Tokenizer.from_file(str(model / "tokenizer.json"))
    return len(tokenizer.encode(text, add_special_tokens=False).ids)


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


def test_the_template_is_found_next_to_the_tokenizer(model_dir: Path) -> None:
    source = load_chat_template("auto", str(model_dir / "tokenizer.json"))
    assert source is not None and ("bos_token", BOS) in source.special_tokens
    # The template loops over content: vLLM hands it parts as dicts.
    assert detect_content_format(source.default) == "openai"


def test_exact_mode_is_the_rendered_count(model_dir: Path, policies: dict[str, Policy]) -> None:
    messages = [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": [{"type": "text", "text": "What is the capital?"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    body = {"messages": messages, "tools": TOOLS}
    # vLLM parses the arguments into a mapping before rendering.
    parsed = json.loads(json.dumps(messages))
    parsed[2]["tool_calls"][0]["function"]["arguments"] = {"city": "Paris"}
    expected = reference_count(model_dir, parsed, tools=TOOLS)
    assert prompt_tokens(body, policies["vllm"]) == expected
    # llama-cpp-python prints the arguments string as sent: the larger count wins.
    raw = reference_count(model_dir, messages, tools=TOOLS)
    assert prompt_tokens(body, policies["exact"]) == max(expected, raw)


ISSUE_SHAPES: dict[str, dict[str, Any]] = {
    "refusal part": {
        "messages": [{"role": "user", "content": [{"type": "refusal", "refusal": "x"}]}]
    },
    "thinking part": {
        "messages": [{"role": "user", "content": [{"type": "thinking", "thinking": "x"}]}]
    },
    "tool call id": {
        "messages": [
            {"role": "user", "content": "q"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"id": "x", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ],
            },
        ]
    },
    "tool_call_id": {"messages": [{"role": "tool", "tool_call_id": "x", "content": "ok"}]},
    "reasoning": {"messages": [{"role": "assistant", "content": "a", "reasoning_content": "x"}]},
    "developer tools": {
        "messages": [{"role": "developer", "content": "d", "tools": [{"description": "x"}]}]
    },
    "extra part key": {
        "messages": [{"role": "user", "content": [{"type": "text", "text": "a", "note": "x"}]}]
    },
    "name on the call": {
        "messages": [
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"id": "i", "type": "function", "function": {}, "name": "x"}],
            }
        ]
    },
}


@pytest.mark.parametrize("name", ISSUE_SHAPES)
def test_each_renderable_field_is_counted(name: str, policies: dict[str, Policy]) -> None:
    """Growing the marked field ("x") grows the fallback bound by about its tokens."""
    small = ISSUE_SHAPES[name]
    big = json.loads(json.dumps(small).replace('"x"', '"' + "tokens " * 500 + '"'))
    for mode in ("fallback", "bytes"):
        grown = prompt_tokens(big, policies[mode]) - prompt_tokens(small, policies[mode])
        assert grown >= 500, (name, mode, grown)


# -- the property ----------------------------------------------------------------------------

_ALPHABETS = st.sampled_from(
    [
        "abcdefghij klmnop",
        " \n\t",
        '{}[]",:0123456789',
        "<|im_start|><|im_end|>",
        "é漢字🙂",
        "x",
    ]
)
_TEXT = _ALPHABETS.flatmap(lambda a: st.text(alphabet=a, max_size=60))
_JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers(-999, 999) | _TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXT, inner, max_size=4),
    max_leaves=12,
)
_ARGUMENTS = st.one_of(
    _JSONISH.map(lambda v: json.dumps({"v": v})),
    _JSONISH.map(lambda v: json.dumps({"v": v}, indent=2)),
    _JSONISH.map(lambda v: json.dumps(v)),
    _TEXT,
)
_PART = st.one_of(
    st.builds(lambda t: {"type": "text", "text": t}, _TEXT),
    st.builds(lambda t: {"type": "refusal", "refusal": t}, _TEXT),
    st.builds(lambda t: {"type": "thinking", "thinking": t}, _TEXT),
    st.builds(lambda t: {"type": "tool_reference", "name": t}, _TEXT),
    st.builds(lambda t, n: {"type": "text", "text": t, "note": n}, _TEXT, _JSONISH),
    _TEXT,
)
_CALL = st.builds(
    lambda i, n, a, extra: {
        "id": i,
        "type": "function",
        "function": {"name": n, "arguments": a},
        **extra,
    },
    _TEXT,
    _TEXT,
    _ARGUMENTS,
    st.dictionaries(st.sampled_from(["name", "arguments", "extra"]), _TEXT, max_size=2),
)
_CONTENT = st.one_of(st.none(), _TEXT, st.lists(_PART, max_size=4))


@st.composite
def _message(draw: st.DrawFn) -> dict[str, Any]:
    role = draw(st.sampled_from(["system", "user", "assistant", "tool", "developer"]))
    message: dict[str, Any] = {"role": role, "content": draw(_CONTENT)}
    if role == "assistant" and draw(st.booleans()):
        message["tool_calls"] = draw(st.lists(_CALL, min_size=1, max_size=3))
    if role == "assistant" and draw(st.booleans()):
        message["reasoning_content"] = draw(_TEXT)
    if role == "tool":
        message["tool_call_id"] = draw(_TEXT)
    if role == "developer" and draw(st.booleans()):
        message["tools"] = TOOLS
    for key in draw(st.lists(st.sampled_from(["name", "task", "extra"]), max_size=2)):
        message[key] = draw(_TEXT)
    return message


_BODY = st.builds(
    lambda messages, tools: {"messages": messages, **({"tools": tools} if tools else {})},
    st.lists(_message(), min_size=1, max_size=6),
    st.one_of(st.none(), st.just(TOOLS), st.lists(st.just(TOOLS[0]), min_size=2, max_size=3)),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=_BODY)
def test_the_fallback_bound_is_never_below_the_exact_count(
    body: dict[str, Any], policies: dict[str, Policy]
) -> None:
    exact = prompt_tokens(body, policies["exact"])
    assert prompt_tokens(body, policies["vllm"]) <= exact
    assert prompt_tokens(body, policies["fallback"]) >= exact
    assert prompt_tokens(body, policies["bytes"]) >= exact
