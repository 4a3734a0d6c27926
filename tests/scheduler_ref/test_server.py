"""In-process tests of the reference scheduler's OpenAI-compatible API (both profiles).

The seed payload is only ever sent to the hardened profile here: the vulnerable profile would
exhaust this process (the demo and the isolation tests run it in a capped child).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, MutableMapping
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from scheduler_ref._stop import StopMatcher
from scheduler_ref.config import CostModel, SchedulerConfig
from scheduler_ref.profiles import HARDENED, VULNERABLE, Profile
from scheduler_ref.server import HARDENED_MAX_BODY_BYTES, create_app, tenant_of

MODEL = "schedguard-ref"
SEED = "{{" * 1024 + "system_prompt}}" * 512
PROFILES = {"hardened": HARDENED, "vulnerable": VULNERABLE}


@pytest.fixture(params=["hardened", "vulnerable"])
def profile(request: pytest.FixtureRequest) -> Profile:
    return PROFILES[request.param]


async def _client(app: FastAPI, *, raise_errors: bool = True) -> AsyncIterator[httpx.AsyncClient]:
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app, raise_app_exceptions=raise_errors)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            yield client


@pytest.fixture
async def client(profile: Profile) -> AsyncIterator[httpx.AsyncClient]:
    async for c in _client(create_app(profile)):
        yield c


@pytest.fixture
async def hard() -> AsyncIterator[httpx.AsyncClient]:
    async for c in _client(create_app(HARDENED)):
        yield c


@pytest.fixture
async def vuln() -> AsyncIterator[httpx.AsyncClient]:
    async for c in _client(create_app(VULNERABLE)):
        yield c


def _error(resp: httpx.Response, status: int, code: str, param: str | None = "*") -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"error"}
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["code"] == code, err
    assert isinstance(err["message"], str) and err["message"]
    if param != "*":
        assert err["param"] == param, err
    return dict(err)


def _events(text: str) -> list[Any]:
    """The data payloads of an SSE body; asserts the framing and the final [DONE]."""
    assert text.endswith("data: [DONE]\n\n"), text[-200:]
    frames = text.split("\n\n")
    assert frames[-1] == ""
    out: list[Any] = []
    for frame in frames[:-1]:
        assert frame.startswith("data: "), frame
        data = frame[len("data: ") :]
        out.append(data if data == "[DONE]" else json.loads(data))
    assert out.count("[DONE]") == 1
    return out[:-1]


# -- plain requests ------------------------------------------------------------------------------


async def test_health_and_models(client: httpx.AsyncClient) -> None:
    r = await client.get("/health")
    assert r.status_code == 200 and r.json()["status"] == "ok"
    r = await client.get("/v1/models")
    assert r.status_code == 200
    assert [m["id"] for m in r.json()["data"]] == [MODEL]
    r = await client.get(f"/v1/models/{MODEL}")
    assert r.json()["id"] == MODEL
    _error(await client.get("/v1/models/nope"), 404, "model_not_found", "model")


async def test_completion(client: httpx.AsyncClient) -> None:
    r = await client.post(
        "/v1/completions", json={"model": MODEL, "prompt": "Hello there", "max_tokens": 7}
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "text_completion" and body["model"] == MODEL
    assert body["id"].startswith("cmpl-")
    (choice,) = body["choices"]
    assert choice["index"] == 0 and choice["finish_reason"] == "length" and choice["text"]
    assert body["usage"] == {"prompt_tokens": 2, "completion_tokens": 7, "total_tokens": 9}


async def test_completion_defaults_to_16_tokens(hard: httpx.AsyncClient) -> None:
    r = await hard.post("/v1/completions", json={"model": MODEL, "prompt": "x"})
    assert r.json()["usage"]["completion_tokens"] == 16


async def test_completion_n_list_prompts_token_ids_and_echo(client: httpx.AsyncClient) -> None:
    r = await client.post(
        "/v1/completions",
        json={
            "model": MODEL,
            "prompt": ["one", "two three"],
            "n": 2,
            "max_tokens": 3,
            "echo": True,
        },
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    assert [c["text"][:3] for c in body["choices"]] == ["one", "one", "two", "two"]
    assert body["usage"]["prompt_tokens"] == 1 + 2
    assert body["usage"]["completion_tokens"] == 4 * 3
    r = await client.post(
        "/v1/completions", json={"model": MODEL, "prompt": [[1, 2, 3], [4]], "max_tokens": 2}
    )
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == 4


async def test_priority_and_unknown_openai_fields_accepted(client: httpx.AsyncClient) -> None:
    r = await client.post(
        "/v1/completions",
        json={
            "model": MODEL,
            "prompt": "hi",
            "max_tokens": 2,
            "priority": -5,
            "logprobs": None,
            "presence_penalty": 0.5,
            "some_future_field": {"x": [1, 2]},
        },
    )
    assert r.status_code == 200, r.text


async def test_chat_completion(client: httpx.AsyncClient) -> None:
    r = await client.post(
        "/v1/chat/completions",
        json={
            "model": MODEL,
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
            ],
            "max_completion_tokens": 5,
        },
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    (choice,) = body["choices"]
    assert choice["message"]["role"] == "assistant" and choice["message"]["content"]
    assert choice["finish_reason"] == "length"
    usage = body["usage"]
    assert usage["completion_tokens"] == 5 and usage["prompt_tokens"] > 2
    assert usage["total_tokens"] == usage["prompt_tokens"] + 5


async def test_prompt_template_renders_into_the_prompt(client: httpx.AsyncClient) -> None:
    plain = await client.post(
        "/v1/completions",
        json={"model": MODEL, "prompt": "You are a helpful assistant. Say hi in French"},
    )
    templated = await client.post(
        "/v1/completions",
        json={
            "model": MODEL,
            "prompt_template": "{{system_prompt}} Say hi in {{ {{lang}}_name }}",
            "template_vars": {"lang": "fr", "fr_name": "French"},
        },
    )
    assert templated.status_code == 200, templated.text
    assert templated.json()["usage"]["prompt_tokens"] == plain.json()["usage"]["prompt_tokens"]


async def test_prompt_template_in_chat_is_a_system_message(client: httpx.AsyncClient) -> None:
    base = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    plain = await client.post("/v1/chat/completions", json=base)
    templated = await client.post(
        "/v1/chat/completions",
        json={
            **base,
            "prompt_template": "{{system_prompt}} Answer in {{lang}}.",
            "template_vars": {"lang": "French"},
        },
    )
    assert templated.status_code == 200, templated.text
    assert templated.json()["usage"]["prompt_tokens"] > plain.json()["usage"]["prompt_tokens"]


async def test_stop_strings(client: httpx.AsyncClient) -> None:
    # Every simulated word starts with a space: the first token reaches the stop string.
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 50, "stop": [" "]}
    r = await client.post("/v1/completions", json=body)
    (choice,) = r.json()["choices"]
    assert (choice["text"], choice["finish_reason"]) == ("", "stop")
    # Usage counts the tokens generated, which may run past the stop before it is seen.
    assert r.json()["usage"]["completion_tokens"] >= 1
    r = await client.post("/v1/completions", json={**body, "stream": True})
    (event,) = _events(r.text)
    assert event["choices"][0]["finish_reason"] == "stop"


def test_stop_matcher_holds_back_partial_matches() -> None:
    m = StopMatcher(["STOP", "xy"])
    assert m.feed("abcST") == ("ab", False)
    assert m.feed("O") == ("c", False)
    assert m.feed("P and more") == ("", True)
    m = StopMatcher(["STOP"])
    assert m.feed("aST") == ("", False)
    assert m.feed("OX") == ("aS", False)
    assert m.flush() == "TOX"
    assert not StopMatcher([""]) and StopMatcher(["x"])


async def test_hardened_caps_stop_strings(hard: httpx.AsyncClient) -> None:
    base = {"model": MODEL, "prompt": "x", "max_tokens": 1}
    r = await hard.post("/v1/completions", json={**base, "stop": ["a", "b", "c", "d", "e"]})
    _error(r, 400, "stop_exceeded", "stop")
    r = await hard.post("/v1/completions", json={**base, "stop": "s" * 257})
    _error(r, 400, "stop_exceeded", "stop")


# -- streaming -----------------------------------------------------------------------------------


async def test_stream_completion(client: httpx.AsyncClient) -> None:
    r = await client.post(
        "/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 6, "stream": True}
    )
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    events = _events(r.text)
    assert all(e["object"] == "text_completion" and "usage" not in e for e in events)
    assert len({e["id"] for e in events}) == 1
    assert events[-1]["choices"][0]["finish_reason"] == "length"
    assert all(e["choices"][0]["finish_reason"] is None for e in events[:-1])
    text = "".join(e["choices"][0]["text"] for e in events)
    assert len(text.split()) == 6


async def test_stream_include_usage(client: httpx.AsyncClient) -> None:
    r = await client.post(
        "/v1/completions",
        json={
            "model": MODEL,
            "prompt": "hi",
            "max_tokens": 4,
            "stream": True,
            "n": 2,
            "stream_options": {"include_usage": True},
        },
    )
    events = _events(r.text)
    *chunks, last = events
    assert all(c["usage"] is None for c in chunks)
    assert last["choices"] == []
    assert last["usage"] == {"prompt_tokens": 1, "completion_tokens": 8, "total_tokens": 9}
    finished = {c["choices"][0]["index"] for c in chunks if c["choices"][0]["finish_reason"]}
    assert finished == {0, 1}


async def test_stream_chat(client: httpx.AsyncClient) -> None:
    r = await client.post(
        "/v1/chat/completions",
        json={
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 5,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    assert r.status_code == 200, r.text
    *chunks, last = _events(r.text)
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    content = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert len(content.split()) == 5
    assert last["usage"]["completion_tokens"] == 5


# -- errors --------------------------------------------------------------------------------------


BAD_BODIES: list[tuple[str, bytes | dict[str, Any], str, str | None]] = [
    ("/v1/completions", b"{not json", "invalid_json", None),
    ("/v1/completions", b"", "invalid_json", None),
    ("/v1/completions", b"\xff\xfe", "invalid_json", None),
    ("/v1/completions", b"[" * 100_000, "invalid_json", None),
    ("/v1/completions", b'{"model": 1' + b"0" * 10_000 + b"}", "invalid_json", None),
    ("/v1/completions", b'{"model": NaN, "prompt": "x"}', "invalid_json", None),
    ("/v1/completions", b'{"model": "m", "temperature": Infinity}', "invalid_json", None),
    ("/v1/completions", b"[1, 2]", "invalid_request", None),
    ("/v1/completions", {"prompt": "x"}, "invalid_request", "model"),
    ("/v1/completions", {"model": MODEL}, "invalid_request", "prompt"),
    ("/v1/completions", {"model": MODEL, "prompt": 3}, "invalid_request", "prompt"),
    ("/v1/completions", {"model": MODEL, "prompt": ""}, "invalid_request", "prompt"),
    ("/v1/completions", {"model": MODEL, "prompt": []}, "invalid_request", "prompt"),
    ("/v1/completions", {"model": MODEL, "prompt": [[]]}, "invalid_request", "prompt"),
    ("/v1/completions", {"model": MODEL, "prompt": [-1]}, "invalid_request", "prompt"),
    ("/v1/completions", {"model": MODEL, "prompt": [10**9]}, "invalid_request", "prompt"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "n": 0}, "invalid_request", "n"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 0}, "invalid_request",
     "max_tokens"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": "many"},
     "invalid_request", "max_tokens"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "priority": 10**40}, "invalid_request",
     "priority"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "stream": "yes please"},
     "invalid_request", "stream"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "template_vars": {"a": 1}},
     "invalid_request", "template_vars.a"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "prompt_template": "{{a}}"},
     "invalid_request", "prompt_template"),
    ("/v1/completions", {"model": "gpt-4", "prompt": "x"}, "model_not_found", "model"),
    ("/v1/chat/completions", {"model": MODEL}, "invalid_request", "messages"),
    ("/v1/chat/completions", {"model": MODEL, "messages": []}, "invalid_request", "messages"),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "robot", "content": "x"}]},
     "invalid_request", "messages[0].role"),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": 5}]},
     "invalid_request", "messages[0].content"),
    ("/v1/chat/completions",
     {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "text"}]}]},
     "invalid_request", "messages[0].content[0]"),
    ("/v1/chat/completions",
     {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "unsupported_content", "messages[0].content[0].type"),
    ("/v1/chat/completions",
     {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": 3},
     "invalid_request", "chat_template_kwargs"),
    ("/v1/chat/completions", {"model": "nope", "messages": [{"role": "user", "content": "x"}]},
     "model_not_found", "model"),
]  # fmt: skip


@pytest.mark.parametrize(("path", "body", "code", "param"), BAD_BODIES)
async def test_bad_input_is_a_typed_400(
    client: httpx.AsyncClient,
    path: str,
    body: bytes | dict[str, Any],
    code: str,
    param: str | None,
) -> None:
    if isinstance(body, bytes):
        r = await client.post(path, content=body, headers={"content-type": "application/json"})
    else:
        r = await client.post(path, json=body)
    _error(r, 404 if code == "model_not_found" else 400, code, param)


class _Body(BaseModel):
    x: int


async def test_fastapi_validation_errors_become_typed_400s() -> None:
    # Routes that let FastAPI validate (query parameters, typed bodies) get the same errors.
    app = create_app(HARDENED)

    @app.get("/q")
    async def q(n: int) -> int:
        return n

    @app.post("/b")
    async def b(body: _Body) -> int:
        return body.x

    async for c in _client(app):
        _error(await c.get("/q?n=abc"), 400, "invalid_request", "n")
        _error(await c.get("/q"), 400, "invalid_request", "n")
        r = await c.post("/b", content=b"{", headers={"content-type": "application/json"})
        _error(r, 400, "invalid_json", None)
        _error(await c.post("/b", json={"x": []}), 400, "invalid_request", "x")


async def test_routes_and_methods(client: httpx.AsyncClient) -> None:
    _error(await client.get("/v1/nothing"), 404, "not_found")
    _error(await client.get("/v1/completions"), 405, "method_not_allowed")


async def test_hardened_caps_fan_out(hard: httpx.AsyncClient) -> None:
    base = {"model": MODEL, "prompt": "x", "max_tokens": 1}
    _error(await hard.post("/v1/completions", json={**base, "n": 9}), 400, "n_exceeded", "n")
    r = await hard.post("/v1/completions", json={**base, "prompt": ["a"] * 9})
    _error(r, 400, "prompts_exceeded", "prompt")
    r = await hard.post("/v1/completions", json={**base, "max_tokens": 2049})
    _error(r, 400, "max_tokens_exceeded", "max_tokens")
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "x"}]}
    r = await hard.post("/v1/chat/completions", json={**chat, "max_completion_tokens": 4096})
    _error(r, 400, "max_tokens_exceeded", "max_completion_tokens")
    r = await hard.post("/v1/chat/completions", json={**chat, "max_tokens": 4096})
    _error(r, 400, "max_tokens_exceeded", "max_tokens")
    _error(await hard.post("/v1/chat/completions", json={**chat, "n": 100}), 400, "n_exceeded", "n")


async def test_vulnerable_accepts_fan_out(vuln: httpx.AsyncClient) -> None:
    r = await vuln.post(
        "/v1/completions",
        json={"model": MODEL, "prompt": ["a"] * 3, "n": 3, "max_tokens": 3000},
    )
    assert r.status_code == 200, r.text
    assert len(r.json()["choices"]) == 9


async def test_hardened_prompt_token_cap(hard: httpx.AsyncClient) -> None:
    r = await hard.post("/v1/completions", json={"model": MODEL, "prompt": "word " * 3000})
    _error(r, 400, "prompt_tokens_exceeded", "prompt")
    r = await hard.post("/v1/completions", json={"model": MODEL, "prompt": [1] * 2049})
    _error(r, 400, "prompt_tokens_exceeded", "prompt")
    long_chat = [{"role": "user", "content": "word " * 3000}]
    r = await hard.post("/v1/chat/completions", json={"model": MODEL, "messages": long_chat})
    _error(r, 400, "prompt_tokens_exceeded")


async def test_hardened_body_cap(hard: httpx.AsyncClient) -> None:
    big = {"model": MODEL, "prompt": "a" * HARDENED_MAX_BODY_BYTES}
    _error(await hard.post("/v1/completions", json=big), 413, "request_too_large")


async def test_hardened_refuses_the_seed_fast(hard: httpx.AsyncClient) -> None:
    for body in (
        {"model": MODEL, "prompt_template": SEED},
        {"model": MODEL, "prompt_template": "{{x}}", "template_vars": {"x": SEED}},
        {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "prompt_template": SEED},
    ):
        path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
        err = _error(await hard.post(path, json=body), 400, "template_depth_exceeded")
        assert err["type"] == "invalid_request_error"


async def test_hardened_template_errors(hard: httpx.AsyncClient) -> None:
    for template, code in [
        ("{{ unclosed", "template_unbalanced"),
        ("{{nobody}}", "template_unknown_variable"),
    ]:
        r = await hard.post("/v1/completions", json={"model": MODEL, "prompt_template": template})
        _error(r, 400, code)
    # Self-reference and billion laughs: refused, never expanded.
    r = await hard.post(
        "/v1/completions",
        json={"model": MODEL, "prompt_template": "{{a}}", "template_vars": {"a": "x{{a}}"}},
    )
    _error(r, 400, "template_recursion")
    laughs = {f"l{i}": f"{{{{l{i + 1}}}}}" * 10 for i in range(5)}
    laughs["l5"] = "lol "  # 10**5 of them
    r = await hard.post(
        "/v1/completions",
        json={"model": MODEL, "prompt_template": "{{l0}}", "template_vars": laughs},
    )
    _error(r, 400, "prompt_tokens_exceeded")


async def test_vulnerable_renders_templates_leniently(vuln: httpx.AsyncClient) -> None:
    # Unclosed delimiters are text, unknown variables are empty: no error.
    r = await vuln.post(
        "/v1/completions",
        json={"model": MODEL, "prompt_template": "hi {{ there {{nobody}}", "max_tokens": 1},
    )
    assert r.status_code == 200, r.text


async def test_request_chat_template_refused_by_hardened(hard: httpx.AsyncClient) -> None:
    tpl = "{% for m in messages %}{{ m.content }}{% endfor %}"
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "x"}]}
    for extra in ({"chat_template": tpl}, {"chat_template_kwargs": {"chat_template": tpl}}):
        r = await hard.post("/v1/chat/completions", json={**chat, **extra})
        assert r.status_code == 400, r.text
        assert "chat_template" in r.json()["error"]["code"]


async def test_request_chat_template_used_by_vulnerable(vuln: httpx.AsyncClient) -> None:
    tpl = "{% for m in messages %}{{ m.content }}{% endfor %}"
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "one two three"}]}
    r = await vuln.post("/v1/chat/completions", json={**chat, "chat_template": tpl})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == 3


async def test_tenant_token_bucket() -> None:
    config = SchedulerConfig.for_profile(
        HARDENED, tenant_tokens_per_s=0.001, tenant_burst_tokens=20
    )
    async for c in _client(create_app(HARDENED, config)):
        body = {"model": MODEL, "prompt": "hello", "max_tokens": 10}
        alice = {"Authorization": "Bearer alice-key"}
        assert (await c.post("/v1/completions", json=body, headers=alice)).status_code == 200
        r = await c.post("/v1/completions", json=body, headers=alice)
        _error(r, 429, "tenant_tokens_exhausted")
        assert int(r.headers["retry-after"]) >= 1
        assert r.json()["error"]["type"] == "rate_limit_error"
        # Another key has its own bucket; anonymous callers share one.
        bob = {"Authorization": "Bearer bob-key"}
        assert (await c.post("/v1/completions", json=body, headers=bob)).status_code == 200
        r = await c.post("/v1/completions", json={**body, "max_tokens": 100})
        _error(r, 400, "tenant_burst_exceeded")


def test_tenant_of_hashes_bearer_tokens() -> None:
    def req(headers: dict[str, str]) -> Any:
        from starlette.requests import Request

        raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
        return Request({"type": "http", "headers": raw})

    assert tenant_of(req({})) == "anonymous"
    assert tenant_of(req({"Authorization": "Basic abc"})) == "anonymous"
    assert tenant_of(req({"Authorization": "Bearer "})) == "anonymous"
    a = tenant_of(req({"Authorization": "Bearer secret-a"}))
    assert a.startswith("key-") and "secret" not in a
    assert a == tenant_of(req({"Authorization": "bearer  secret-a"}))
    assert a != tenant_of(req({"Authorization": "Bearer secret-b"}))


async def test_queue_full_is_503() -> None:
    # The engine is not started, so nothing leaves the one-slot inbox.
    config = SchedulerConfig.for_profile(HARDENED, inbox_capacity=1, dispatch_timeout_s=0.0)
    app = create_app(HARDENED, config)
    transport = httpx.ASGITransport(app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
        body = {"model": MODEL, "prompt": "x", "max_tokens": 1}
        first = asyncio.create_task(c.post("/v1/completions", json=body))
        for _ in range(100):  # until the first request holds the slot
            await asyncio.sleep(0)
            if len(app.state.server.engine.core.inbox):
                break
        r = await c.post("/v1/completions", json=body)
        err = _error(r, 503, "queue_full")
        assert err["type"] == "server_error"
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        await app.state.server.engine.stop()


async def test_internal_error_hides_the_traceback() -> None:
    app = create_app(HARDENED)

    @app.get("/boom")
    async def boom() -> None:
        raise RuntimeError("secret internals /etc/passwd")

    async for c in _client(app, raise_errors=False):
        r = await c.get("/boom")
        err = _error(r, 500, "internal_error")
        assert "secret" not in r.text and "Traceback" not in r.text
        assert err["type"] == "server_error"
        metrics = (await c.get("/metrics")).text
        assert 'schedguard_rejections_total{code="internal_error"} 1.0' in metrics


# -- metrics -------------------------------------------------------------------------------------


async def test_metrics(hard: httpx.AsyncClient) -> None:
    await hard.post("/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 3})
    await hard.post("/v1/completions", json={"model": "other", "prompt": "x"})
    await hard.post("/v1/completions", content=b"{")
    r = await hard.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    text = r.text
    for line in (
        'schedguard_rejections_total{code="model_not_found"} 1.0',
        'schedguard_rejections_total{code="invalid_json"} 1.0',
        'schedguard_requests_total{endpoint="/v1/completions",status="200"} 1.0',
        'schedguard_requests_total{endpoint="/v1/completions",status="404"} 1.0',
        "schedguard_prompt_tokens_total 1.0",
        "schedguard_generation_tokens_total 3.0",
        "schedguard_queue_depth 0.0",
        "schedguard_running 0.0",
        "schedguard_kv_usage_ratio 0.0",
        "schedguard_preemptions_total 0.0",
        "schedguard_kv_allocation_failures_total 0.0",
    ):
        assert line in text, line
    assert "schedguard_kv_blocks_total 8192.0" in text


async def test_metrics_registries_are_per_app() -> None:
    a, b = create_app(HARDENED), create_app(HARDENED)
    assert a.state.server.metrics.registry is not b.state.server.metrics.registry


# -- client disconnects --------------------------------------------------------------------------


async def _asgi_post(
    app: FastAPI, path: str, body: dict[str, Any], gone: asyncio.Event, disconnect_after_chunks: int
) -> list[bytes]:
    """POST straight to the ASGI app; the client vanishes once ``gone`` is set or after
    ``disconnect_after_chunks`` body chunks."""
    sent: list[bytes] = []
    raw = json.dumps(body).encode()
    body_sent = False

    async def receive() -> dict[str, Any]:
        nonlocal body_sent
        if not body_sent:
            body_sent = True
            return {"type": "http.request", "body": raw, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.body" and message.get("body"):
            sent.append(message["body"])
        if disconnect_after_chunks and len(sent) >= disconnect_after_chunks:
            gone.set()

    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json")],
        "client": ("127.0.0.1", 1),
        "server": ("test", 80),
    }
    await asyncio.wait_for(app(scope, receive, send), timeout=10)
    return sent


def _slow_config() -> SchedulerConfig:
    # 1 ms per decode step: a 2000-token request would take 2 s; it is aborted long before.
    return SchedulerConfig.for_profile(HARDENED, cost=CostModel(decode_s_per_seq=0.001))


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize("stream", [True, False])
async def test_disconnect_aborts_and_frees_blocks(path: str, stream: bool) -> None:
    app = create_app(HARDENED, _slow_config())
    server = app.state.server
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 2000, "stream": stream}
    if path == "/v1/completions":
        body["prompt"] = "tell me a long story"
    else:
        body["messages"] = [{"role": "user", "content": "tell me a long story"}]
    gone = asyncio.Event()

    async def leave_once_running() -> None:
        while not server.engine.stats().running:
            await asyncio.sleep(0)
        gone.set()

    async with app.router.lifespan_context(app):
        leaver = asyncio.create_task(leave_once_running())
        sent = await _asgi_post(app, path, body, gone, disconnect_after_chunks=3 if stream else 0)
        await leaver
        for _ in range(1000):  # the abort is applied at the engine's next step
            stats = server.engine.stats()
            if stats.running == 0 and stats.kv_blocks_used == 0:
                break
            await asyncio.sleep(0.001)
        assert stats.running == 0 and stats.waiting == 0 and stats.kv_blocks_used == 0
        assert stats.finished == {"finished_aborted": 1}
        metrics = server.metrics.render().decode()
        assert "schedguard_aborted_requests_total 1.0" in metrics
        assert "schedguard_running 0.0" in metrics and "schedguard_kv_blocks_used 0.0" in metrics
        if stream:
            assert sent[0].startswith(b"data: ")
            assert b"[DONE]" not in b"".join(sent)


@pytest.mark.parametrize("stream", [True, False])
async def test_disconnect_at_once_leaves_nothing_behind(stream: bool) -> None:
    # The client is gone before the response starts: whether admission or the disconnect wins,
    # no engine request survives (a stream that never started is still cleaned up).
    app = create_app(HARDENED, _slow_config())
    server = app.state.server
    body = {"model": MODEL, "prompt": "story", "max_tokens": 2000, "stream": stream}
    gone = asyncio.Event()
    gone.set()
    async with app.router.lifespan_context(app):
        await _asgi_post(app, "/v1/completions", body, gone, disconnect_after_chunks=0)
        for _ in range(1000):
            stats = server.engine.stats()
            if stats.running == stats.waiting == stats.inbox == stats.kv_blocks_used == 0:
                break
            await asyncio.sleep(0.001)
        assert stats.running == stats.waiting == stats.inbox == stats.kv_blocks_used == 0
        assert "finished_length" not in stats.finished


# -- no bad input reaches the catch-all ----------------------------------------------------------

_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
_FIELDS = [
    "model", "prompt", "messages", "n", "max_tokens", "max_completion_tokens", "stream",
    "stream_options", "priority", "prompt_template", "template_vars", "chat_template",
    "chat_template_kwargs", "tools", "echo", "stop", "temperature", "top_p",
]  # fmt: skip


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    path=st.sampled_from(["/v1/completions", "/v1/chat/completions"]),
    fields=st.dictionaries(st.sampled_from(_FIELDS), _json, max_size=6),
    valid_model=st.booleans(),
)
def test_fuzzed_bodies_never_500(path: str, fields: dict[str, Any], valid_model: bool) -> None:
    if valid_model:
        fields["model"] = MODEL
    fields["max_tokens"] = 2  # keep generation short; fuzz the rest
    fields.pop("max_completion_tokens", None)
    if isinstance(fields.get("n"), int):
        fields["n"] = max(1, min(fields["n"], 3))

    async def run() -> None:
        async for c in _client(create_app(HARDENED)):
            r = await c.post(path, json=fields)
            assert r.status_code < 500, r.text
            if r.status_code >= 400:
                assert r.json()["error"]["code"] != "internal_error"

    asyncio.run(run())
