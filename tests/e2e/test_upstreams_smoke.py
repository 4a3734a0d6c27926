"""The real upstreams answer the OpenAI API the way the guard will see it: a chat, a stream,
tools, a JSON-schema response format and usage. The model is random, so the tests check the
protocol and the prompt accounting, not the words.

Each test that takes ``client`` runs twice per upstream: the openai client straight to the
upstream, and through the guard (``schedguard serve`` in front of it, the model's
``tokenizer.json`` in its policy), where the same answers and the same ``usage`` must come
back."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import jinja2
import jinja2.ext
import openai
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment
from openai.types.chat import ChatCompletion
from tokenizers import Tokenizer

from schedguard.servers import RunningServer
from tests._guard_process import guard_spec, start
from tests.e2e.conftest import ROOT, RunningUpstream

TEMPLATE = (ROOT / "scripts" / "upstreams" / "chat_template.jinja").read_text()
BOS = "<|begin_of_text|>"

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]


@pytest.fixture(scope="module", params=["vllm", "llamacpp"])
def upstream(request: pytest.FixtureRequest) -> RunningUpstream:
    running: RunningUpstream = request.getfixturevalue(f"{request.param}_upstream")
    return running


@pytest.fixture(scope="module")
def guard(upstream: RunningUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The guard in front of ``upstream`` (rate limits off: the tests send one at a time)."""
    policy = tmp_path_factory.mktemp(f"smoke-guard-{upstream.name}") / "policy.yaml"
    policy.write_text(
        f"limits:\n  tokens:\n    tokenizer: {upstream.tokenizer_json}\n"
        "rate:\n  requests_per_minute: null\n  tokens_per_minute: null\n"
    )
    server: RunningServer = start(guard_spec("guard", upstream.base_url, policy))
    try:
        server.wait_ready(120)
        yield server.url
    finally:
        server.stop()


@pytest.fixture(params=["direct", "guard"])
def client(upstream: RunningUpstream, request: pytest.FixtureRequest) -> Iterator[openai.OpenAI]:
    base_url = upstream.openai_base_url
    if request.param == "guard":
        base_url = request.getfixturevalue("guard") + "/v1"
    with openai.OpenAI(base_url=base_url, api_key="unused", timeout=120, max_retries=0) as c:
        yield c


def chat(client: openai.OpenAI, **request: Any) -> ChatCompletion:
    """One chat completion; requests here are plain dicts as a gateway would forward them."""
    reply: ChatCompletion = client.chat.completions.create(**request)
    return reply


def rendered_prompt_tokens(
    upstream: RunningUpstream, messages: list[dict[str, Any]], **kw: Any
) -> int:
    """Tokens of the prompt as the server should build it: our template, our vocabulary."""

    def tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, **_: Any) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent)

    # The environment both servers use (transformers' and llama-cpp-python's are alike).
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    text = env.from_string(TEMPLATE).render(
        messages=messages, bos_token=BOS, add_generation_prompt=True, **kw
    )
    tokenizer = Tokenizer.from_file(str(upstream.tokenizer_json))
    return len(tokenizer.encode(text, add_special_tokens=False).ids)


def test_models_lists_the_served_model(upstream: RunningUpstream) -> None:
    with urllib.request.urlopen(upstream.openai_base_url + "/models", timeout=10) as response:
        body = json.load(response)
    assert [m["id"] for m in body["data"]] == [upstream.model]
    if upstream.name == "vllm":
        assert body["data"][0]["max_model_len"] == 4096


def test_chat_reports_the_template_s_prompt_tokens(
    upstream: RunningUpstream, client: openai.OpenAI
) -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "What is the capital of France?"},
    ]
    reply = chat(
        client,
        model=upstream.model,
        messages=messages,
        max_tokens=8,
        temperature=0,
        seed=1,
    )
    choice = reply.choices[0]
    assert isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length")
    assert reply.usage is not None
    assert reply.usage.prompt_tokens == rendered_prompt_tokens(upstream, messages)
    assert 0 < reply.usage.completion_tokens <= 8


def test_content_parts_render_like_a_string(
    upstream: RunningUpstream, client: openai.OpenAI
) -> None:
    parts = [{"type": "text", "text": "What is the "}, {"type": "text", "text": "capital?"}]
    as_parts = chat(
        client,
        model=upstream.model,
        messages=[{"role": "user", "content": parts}],
        max_tokens=1,
    )
    as_string = chat(
        client,
        model=upstream.model,
        messages=[{"role": "user", "content": "What is the capital?"}],
        max_tokens=1,
    )
    assert as_parts.usage is not None and as_string.usage is not None
    assert as_parts.usage.prompt_tokens == as_string.usage.prompt_tokens


def test_stream(upstream: RunningUpstream, client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=upstream.model,
        messages=[{"role": "user", "content": "Count to five."}],
        max_tokens=8,
        stream=True,
    )
    chunks = list(stream)
    assert chunks, "no chunks"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert isinstance(text, str)
    finish = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finish and finish[-1] in ("stop", "length")


def test_chat_with_tools_and_a_past_tool_call(
    upstream: RunningUpstream, client: openai.OpenAI
) -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            # OpenAI clients send null here; llama-cpp-python 0.3.36 answers that with a 500
            # (test_llamacpp_quirks), so it gets the empty string, which renders the same.
            "content": None if upstream.name == "vllm" else "",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
        {"role": "user", "content": "And in Rome?"},
    ]
    reply = chat(
        client,
        model=upstream.model,
        messages=messages,
        tools=TOOLS,
        tool_choice="auto",
        max_tokens=16,
        temperature=0,
    )
    assert reply.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert reply.usage is not None
    # vLLM parses each call's arguments into a mapping before rendering (the template writes
    # keyword arguments); llama-cpp-python passes the JSON string through (`**{...}`).
    if upstream.name == "vllm":
        call = messages[1]["tool_calls"][0]["function"]
        call["arguments"] = json.loads(call["arguments"])
    assert reply.usage.prompt_tokens == rendered_prompt_tokens(upstream, messages, tools=TOOLS)


def test_named_tool_choice(upstream: RunningUpstream, client: openai.OpenAI) -> None:
    """A forced call of a named function: vLLM constrains the output to that function's
    arguments schema and answers with a parsed tool call."""
    if upstream.name == "llamacpp":
        pytest.skip("llama-cpp-python 0.3.36 forces a named tool only with its functionary / "
                    "chatml-function-calling formats, not with a GGUF's own chat template")  # fmt: skip
    reply = chat(
        client,
        model=upstream.model,
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=48,
        temperature=0,
    )
    calls = reply.choices[0].message.tool_calls or []
    assert reply.choices[0].finish_reason in ("stop", "length", "tool_calls")
    if reply.choices[0].finish_reason == "length":
        return  # a random model may spend its budget on the whitespace the schema allows
    assert [c.function.name for c in calls if c.type == "function"] == ["get_weather"]
    args = json.loads(calls[0].function.arguments)  # type: ignore[union-attr]
    assert isinstance(args, dict) and isinstance(args.get("city", ""), str)


def test_response_format_json_schema(upstream: RunningUpstream, client: openai.OpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "enum": [1, 2, 3]}},
        "required": ["ok", "n"],
        "additionalProperties": False,
    }
    # llama-cpp-python 0.3.36 has no `json_schema` type: its form is json_object + schema.
    response_format: dict[str, Any] = (
        {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}
        if upstream.name == "vllm"
        else {"type": "json_object", "schema": schema}
    )
    reply = chat(
        client,
        model=upstream.model,
        messages=[{"role": "user", "content": "Give me the object."}],
        response_format=response_format,
        max_tokens=48,
        temperature=0,
    )
    content = reply.choices[0].message.content or ""
    if reply.choices[0].finish_reason == "stop":
        value = json.loads(content)
        assert isinstance(value["ok"], bool) and value["n"] in (1, 2, 3)
    else:
        # A random model may spend its budget on the whitespace the grammar allows; what it
        # wrote is still the start of a schema-shaped object.
        assert content.lstrip().startswith("{"), content


def test_llamacpp_quirks(llamacpp_upstream: RunningUpstream) -> None:
    """What llama-cpp-python 0.3.36 does with valid OpenAI requests it does not model: a 500
    whose message is pydantic's error list (the guard must not pass these through as is)."""
    with openai.OpenAI(
        base_url=llamacpp_upstream.openai_base_url, api_key="unused", max_retries=0
    ) as c:
        with pytest.raises(openai.InternalServerError, match="json_object"):
            chat(
                c,
                model=llamacpp_upstream.model,
                messages=[{"role": "user", "content": "x"}],
                response_format={
                    "type": "json_schema",
                    "json_schema": {"name": "a", "schema": {"type": "object"}},
                },
                max_tokens=2,
            )
        with pytest.raises(openai.InternalServerError, match="valid string"):
            chat(
                c,
                model=llamacpp_upstream.model,
                messages=[
                    {"role": "user", "content": "x"},
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": "c1",
                                "type": "function",
                                "function": {"name": "f", "arguments": "{}"},
                            }
                        ],
                    },
                ],
                max_tokens=2,
            )


def test_both_upstreams_share_one_vocabulary(
    vllm_upstream: RunningUpstream, llamacpp_upstream: RunningUpstream
) -> None:
    """Trained separately in each venv from the same stdlib text: the same merges, so the
    guard's token counts hold for either upstream."""
    vllm_model = json.loads(vllm_upstream.tokenizer_json.read_text())["model"]
    llamacpp_model = json.loads(llamacpp_upstream.tokenizer_json.read_text())["model"]
    assert vllm_model["vocab"] == llamacpp_model["vocab"]
    assert vllm_model["merges"] == llamacpp_model["merges"]
