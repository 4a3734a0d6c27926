"""Forced tool calls through the reference scheduler's API: ``tool_choice`` ``"required"`` or a
named function is answered with a well-formed call (OpenAI's and vLLM's shape, whole and
streamed), whose arguments satisfy the function's parameters; the OpenAI SDK reads it, and so
does a client through the guard in front (the demo's path)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import jsonschema_rs
import openai
import pytest
import tiktoken

from guard.app import create_app as create_guard
from guard.policy import load_policy
from scheduler_ref.profiles import HARDENED, VULNERABLE
from scheduler_ref.prompt_template import TOKEN_ENCODING
from scheduler_ref.server import create_app
from tests._guard_harness import serve
from tests.scheduler_ref.test_schema_instance import ORDER

MODEL = "schedguard-ref"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "minLength": 2},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
        },
    },
}
ORDER_TOOL = {"type": "function", "function": {"name": "place_order", "parameters": ORDER}}
NO_PARAMS = {"type": "function", "function": {"name": "ping"}}
NAMED_ORDER = {"type": "function", "function": {"name": "place_order"}}


def _tokens(text: str) -> int:
    return len(tiktoken.get_encoding(f"{TOKEN_ENCODING}_offline").encode_ordinary(text))


def _chat(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "Order it."}], **extra}


@pytest.fixture(params=["hardened", "vulnerable"])
async def client(request: pytest.FixtureRequest) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(HARDENED if request.param == "hardened" else VULNERABLE)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
            yield c


def _events(text: str) -> list[dict[str, Any]]:
    assert text.endswith("data: [DONE]\n\n"), text[-200:]
    frames = [f for f in text.split("\n\n") if f]
    assert all(f.startswith("data: ") for f in frames)
    return [json.loads(f[len("data: ") :]) for f in frames[:-1]]


def _the_call(body: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The only choice's only call, checked to be shaped as OpenAI's, and its finish reason."""
    (choice,) = body["choices"]
    message = choice["message"]
    assert message == {"role": "assistant", "content": None, "tool_calls": message["tool_calls"]}
    (call,) = message["tool_calls"]
    assert set(call) == {"id", "type", "function"} and call["type"] == "function"
    assert call["id"].startswith("call_") and len(call["id"]) == len("call_") + 24
    assert set(call["function"]) == {"name", "arguments"}
    assert isinstance(call["function"]["arguments"], str)
    return call, choice["finish_reason"]


async def test_required_calls_the_first_tool_with_valid_arguments(
    client: httpx.AsyncClient,
) -> None:
    r = await client.post(
        "/v1/chat/completions", json=_chat(tools=[ORDER_TOOL, WEATHER], tool_choice="required")
    )
    assert r.status_code == 200, r.text
    call, reason = _the_call(r.json())
    assert reason == "tool_calls"
    assert call["function"]["name"] == "place_order"
    arguments = json.loads(call["function"]["arguments"])
    assert jsonschema_rs.Draft202012Validator(ORDER).is_valid(arguments)
    # The arguments are the output: counted by the reference's tokenizer.
    usage = r.json()["usage"]
    assert usage["completion_tokens"] == _tokens(call["function"]["arguments"]) > 10
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


async def test_a_named_tool_is_called_and_finishes_with_stop(client: httpx.AsyncClient) -> None:
    r = await client.post(
        "/v1/chat/completions",
        json=_chat(tools=[WEATHER, ORDER_TOOL], tool_choice=NAMED_ORDER, max_tokens=512),
    )
    assert r.status_code == 200, r.text
    call, reason = _the_call(r.json())
    # OpenAI's reason for a forced named function, which vLLM follows (vllm-project/vllm#25054).
    assert (call["function"]["name"], reason) == ("place_order", "stop")
    assert jsonschema_rs.Draft202012Validator(ORDER).is_valid(
        json.loads(call["function"]["arguments"])
    )


async def test_a_function_without_parameters_is_called_with_an_empty_object(
    client: httpx.AsyncClient,
) -> None:
    r = await client.post(
        "/v1/chat/completions", json=_chat(tools=[NO_PARAMS], tool_choice="required")
    )
    call, _ = _the_call(r.json())
    assert call["function"] == {"name": "ping", "arguments": "{}"}
    assert r.json()["usage"]["completion_tokens"] == 1


async def test_max_tokens_cuts_the_arguments(client: httpx.AsyncClient) -> None:
    whole = await client.post(
        "/v1/chat/completions", json=_chat(tools=[ORDER_TOOL], tool_choice="required")
    )
    cut = await client.post(
        "/v1/chat/completions",
        json=_chat(tools=[ORDER_TOOL], tool_choice="required", max_tokens=5),
    )
    full, _ = _the_call(whole.json())
    part, reason = _the_call(cut.json())
    assert reason == "length"
    assert full["function"]["arguments"].startswith(part["function"]["arguments"])
    assert _tokens(part["function"]["arguments"]) == 5
    assert cut.json()["usage"]["completion_tokens"] == 5


async def test_each_choice_calls_with_its_own_id(client: httpx.AsyncClient) -> None:
    r = await client.post(
        "/v1/chat/completions", json=_chat(tools=[WEATHER], tool_choice="required", n=2)
    )
    body = r.json()
    calls = [c["message"]["tool_calls"][0] for c in body["choices"]]
    assert [c["index"] for c in body["choices"]] == [0, 1]
    assert calls[0]["function"] == calls[1]["function"]
    assert calls[0]["id"] != calls[1]["id"]
    assert body["usage"]["completion_tokens"] == 2 * _tokens(calls[0]["function"]["arguments"])


@pytest.mark.parametrize("choice", ["required", "named"])
async def test_the_stream_carries_the_call_as_vllm_streams_it(
    client: httpx.AsyncClient, choice: str
) -> None:
    tool_choice = "required" if choice == "required" else NAMED_ORDER
    whole = await client.post(
        "/v1/chat/completions", json=_chat(tools=[ORDER_TOOL], tool_choice=tool_choice)
    )
    r = await client.post(
        "/v1/chat/completions",
        json=_chat(
            tools=[ORDER_TOOL],
            tool_choice=tool_choice,
            stream=True,
            stream_options={"include_usage": True},
        ),
    )
    assert r.status_code == 200, r.text
    events = _events(r.text)
    *chunks, usage_chunk = events
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    deltas = [c["choices"][0]["delta"] for c in chunks[1:]]
    reasons = [c["choices"][0]["finish_reason"] for c in chunks[1:]]
    # The first delta opens the call: id, type, name and the first arguments.
    first = deltas[0]["tool_calls"][0]
    assert set(first) == {"index", "id", "type", "function"}
    assert first["index"] == 0 and first["type"] == "function" and first["id"].startswith("call_")
    assert first["function"]["name"] == "place_order" and first["function"]["arguments"]
    # Then arguments only, then the finish reason (on the last chunk only).
    rest = [d["tool_calls"][0] for d in deltas[1:] if d]
    assert rest and all(set(t) == {"index", "function"} and t["index"] == 0 for t in rest)
    assert all(set(t["function"]) == {"arguments"} for t in rest)
    want = "tool_calls" if choice == "required" else "stop"
    assert reasons[-1] == want and set(reasons[:-1]) == {None}
    arguments = first["function"]["arguments"] + "".join(t["function"]["arguments"] for t in rest)
    (whole_call, _) = _the_call(whole.json())
    assert arguments == whole_call["function"]["arguments"]
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"]["completion_tokens"] == _tokens(arguments)


@pytest.mark.parametrize("tool_choice", [None, "auto", "none"])
async def test_no_forced_choice_keeps_plain_text(
    client: httpx.AsyncClient, tool_choice: str | None
) -> None:
    extra = {} if tool_choice is None else {"tool_choice": tool_choice}
    r = await client.post(
        "/v1/chat/completions", json=_chat(tools=[WEATHER], max_tokens=6, **extra)
    )
    (choice,) = r.json()["choices"]
    assert choice["finish_reason"] == "length"
    assert isinstance(choice["message"]["content"], str) and "tool_calls" not in choice["message"]


async def test_required_with_an_empty_tools_list_is_none(client: httpx.AsyncClient) -> None:
    # vLLM's check_tool_usage: "required" with tools [] behaves as "none".
    r = await client.post(
        "/v1/chat/completions", json=_chat(tools=[], tool_choice="required", max_tokens=3)
    )
    assert r.status_code == 200, r.text
    assert isinstance(r.json()["choices"][0]["message"]["content"], str)


@pytest.mark.parametrize(
    ("extra", "param", "code"),
    [
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "x"}}},
            "tool_choice.function.name",
            "invalid_request",
        ),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {}}},
            "tool_choice.function.name",
            "invalid_request",
        ),
        ({"tool_choice": "required"}, "tools", "invalid_request"),
        ({"tool_choice": NAMED_ORDER}, "tools", "invalid_request"),
        ({"tools": [{"type": "custom"}], "tool_choice": "required"}, "tools", "invalid_request"),
        (
            {
                "tools": [{"type": "function", "function": {"name": "f", "parameters": [1]}}],
                "tool_choice": "required",
            },
            "tools[0].function.parameters",
            "invalid_request",
        ),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {
                            "name": "f",
                            "parameters": {
                                "type": "object",
                                "properties": {"a": {"type": "array", "minItems": 10**9}},
                                "required": ["a"],
                            },
                        },
                    }
                ],
                "tool_choice": "required",
            },
            "tools[0].function.parameters",
            "tool_arguments_too_large",
        ),
    ],
    ids=[
        "unknown name",
        "no name",
        "required no tools",
        "named no tools",
        "no function",
        "parameters not an object",
        "arguments too large",
    ],
)
async def test_bad_tool_choices_are_a_typed_400(
    client: httpx.AsyncClient, extra: dict[str, Any], param: str, code: str
) -> None:
    r = await client.post("/v1/chat/completions", json=_chat(**extra))
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["code"], err["param"]) == (code, param)


async def test_the_openai_sdk_reads_the_call() -> None:
    app = create_app(HARDENED)
    async with app.router.lifespan_context(app):
        http = httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://test/v1")
        sdk = openai.AsyncOpenAI(api_key="k", base_url="http://test/v1", http_client=http)
        reply = await sdk.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Weather?"}],
            tools=[WEATHER],
            tool_choice="required",
        )
        (call,) = reply.choices[0].message.tool_calls or []
        assert reply.choices[0].finish_reason == "tool_calls"
        assert call.type == "function" and call.function.name == "get_weather"
        assert json.loads(call.function.arguments) == {"city": "aa", "unit": "celsius"}
        # Streamed: the SDK's accumulator rebuilds the same call from the deltas.
        async with sdk.chat.completions.stream(
            model=MODEL,
            messages=[{"role": "user", "content": "Weather?"}],
            tools=[WEATHER],
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
        ) as stream:
            final = await stream.get_final_completion()
        (streamed,) = final.choices[0].message.tool_calls or []
        assert final.choices[0].finish_reason == "stop"
        assert streamed.function.name == "get_weather"
        assert streamed.function.arguments == call.function.arguments
        await http.aclose()


async def test_the_guard_in_front_passes_the_call_through() -> None:
    # The demo's path: `schedguard serve` (default policy) in front of the reference scheduler.
    async with (
        serve(create_app(HARDENED)) as upstream,
        serve(create_guard(load_policy(None, {}), upstream_url=upstream)) as guard,
        httpx.AsyncClient(base_url=guard, timeout=30) as http,
    ):
        r = await http.post(
            "/v1/chat/completions", json=_chat(tools=[ORDER_TOOL], tool_choice="required")
        )
        assert r.status_code == 200, r.text
        call, reason = _the_call(r.json())
        assert reason == "tool_calls"
        assert jsonschema_rs.Draft202012Validator(ORDER).is_valid(
            json.loads(call["function"]["arguments"])
        )
        r = await http.post(
            "/v1/chat/completions",
            json=_chat(tools=[WEATHER], tool_choice="required", stream=True),
        )
        assert r.status_code == 200, r.text
        opened = _events(r.text)[1]["choices"][0]["delta"]["tool_calls"][0]
        assert opened["function"]["name"] == "get_weather"
