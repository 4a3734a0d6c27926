"""The guard app over real HTTP (uvicorn, httptools) in front of a fake upstream: every endpoint,
framing limits, keys, limits, streaming, metrics, access log and tracing."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import io
import json
import logging
import re
import sys
import zlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from guard.app import create_app
from guard.errors import GuardError
from guard.http import ClientDisconnected, FramingLimits, inspect_head, read_body
from guard.policy import Policy, policy_from_yaml
from guard.telemetry import AccessLog, make_tracing, otel_requested
from tests._guard_harness import FakeUpstream, fake_upstream, serve
from tests._support import free_port

CHAT = {"model": "fake", "messages": [{"role": "user", "content": "hello there"}]}
KEY = "sk-test-key-123456"


@dataclass
class Guard:
    url: str
    fake: FakeUpstream
    app: Any
    client: httpx.AsyncClient

    def metrics_text(self) -> str:
        return str(self.app.state.metrics.render().decode())


@contextlib.asynccontextmanager
async def guard(policy_yaml: str = "", **kwargs: Any) -> AsyncIterator[Guard]:
    async with fake_upstream() as fake:
        app = create_app(policy_from_yaml(policy_yaml), upstream_url=fake.url, **kwargs)
        async with serve(app) as url, httpx.AsyncClient(base_url=url, timeout=10) as client:
            yield Guard(url, fake, app, client)


def error_code(resp: httpx.Response) -> str:
    body = resp.json()
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return str(body["error"]["code"])


async def raw_request(
    url: str, head: bytes, body_parts: Sequence[bytes] = (), pause: float = 0
) -> bytes:
    """Send a request by hand; return what the server answered (until it closes or 5 s)."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(head)
        for part in body_parts:
            writer.write(part)
            with contextlib.suppress(ConnectionError):
                await writer.drain()
        if pause:
            await asyncio.sleep(pause)
        with contextlib.suppress(ConnectionError):
            return await asyncio.wait_for(reader.read(65536), 5)
        return b""
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await writer.wait_closed()


# --------------------------------------------------------------------------- proxied routes


async def test_chat_completion_is_checked_and_proxied_unchanged() -> None:
    async with guard() as g:
        raw = json.dumps(CHAT).encode()
        headers = {"content-type": "application/json"}
        resp = await g.client.post("/v1/chat/completions", content=raw, headers=headers)
        assert resp.status_code == 200
        assert resp.json()["choices"][0]["message"]["content"] == "tok tok tok "
        assert g.fake.received[-1].body == raw  # nothing injected
    # The seed preset injects its default output cap.
    async with guard("preset: seed") as g:
        resp = await g.client.post("/v1/chat/completions", json=CHAT)
        assert resp.status_code == 200
        forwarded = json.loads(g.fake.received[-1].body)
        assert forwarded["max_tokens"] == 256 and forwarded["messages"] == CHAT["messages"]


async def test_request_id_is_propagated_generated_or_replaced() -> None:
    async with guard() as g:
        resp = await g.client.post(
            "/v1/completions",
            json={"model": "m", "prompt": "hi"},
            headers={"x-request-id": "req-42"},
        )
        assert resp.headers["x-request-id"] == "req-42"
        assert g.fake.received[-1].headers["X-Request-ID"] == "req-42"
        resp = await g.client.post("/v1/completions", json={"model": "m", "prompt": "hi"})
        generated = resp.headers["x-request-id"]
        assert len(generated) == 32 and g.fake.received[-1].headers["X-Request-ID"] == generated
        resp = await g.client.post(
            "/v1/completions",
            json={"model": "m", "prompt": "hi"},
            headers={"x-request-id": "bad id " + "x" * 300},
        )
        assert resp.headers["x-request-id"] != "bad id" and " " not in resp.headers["x-request-id"]
        # Rejections carry one too.
        resp = await g.client.post(
            "/v1/completions",
            json={"model": "m", "prompt": "hi", "n": 999},
            headers={"x-request-id": "req-43"},
        )
        assert resp.status_code == 400 and resp.headers["x-request-id"] == "req-43"


async def test_models_embeddings_and_allowlisted_routes() -> None:
    async with guard("routes: [/tokenize]") as g:
        resp = await g.client.get("/v1/models")
        assert resp.status_code == 200 and resp.json()["data"][0]["id"] == "fake"
        resp = await g.client.get("/v1/models/fake")
        assert resp.status_code == 200 and resp.json()["id"] == "fake"
        resp = await g.client.post("/v1/embeddings", json={"model": "m", "input": "hello"})
        assert resp.status_code == 200 and resp.json()["data"][0]["embedding"] == [0.0, 1.0]
        resp = await g.client.post("/tokenize", json={"model": "m", "prompt": "hi"})
        assert resp.status_code == 200
    async with guard() as g:
        resp = await g.client.post("/tokenize", json={"model": "m", "prompt": "hi"})
        assert resp.status_code == 404 and error_code(resp) == "route_not_allowed"
        resp = await g.client.get("/v1/chat/completions")
        assert resp.status_code == 405 and error_code(resp) == "method_not_allowed"
        assert resp.headers["allow"] == "POST"
        resp = await g.client.post("/guard/v1/check/../../v1/x", json={})
        assert resp.status_code == 404
        assert all(r.path != "/tokenize" for r in g.fake.received)


async def test_upstream_errors_pass_through_and_refund() -> None:
    async with guard() as g:
        resp = await g.client.post(
            "/v1/chat/completions", json=CHAT, headers={"x-fake": "status", "x-fake-status": "429"}
        )
        assert resp.status_code == 429 and error_code(resp) == "fake"


async def test_big_unsized_upstream_body_is_relayed_and_usage_read_from_its_tail() -> None:
    async with guard() as g:
        resp = await g.client.post(
            "/v1/completions",
            json={"model": "m", "prompt": "hi"},
            headers={"x-fake": "big", "x-fake-bytes": "3000000"},
        )
        assert resp.status_code == 200 and len(resp.content) > 2_900_000
        assert resp.json()["usage"]["completion_tokens"] == 7
        assert 'schedguard_guard_tokens_total{direction="out",tenant="anonymous"} 7.0' in (
            g.metrics_text()
        )


BAD_BODIES: list[tuple[bytes, str]] = [
    (b"", "invalid_json"),
    (b"not json", "invalid_json"),
    (b"[1, 2]", ""),
    (b"[" * 5000 + b"]" * 5000, "json_depth_exceeded"),
    (b'{"model": "m", "prompt": "hi", "n": 1e999}', ""),
    (b'{"model": "m", "prompt": "\xff\xfe"}', "invalid_utf8"),
    (b'{"model": "m", "model": "n", "prompt": "x"}', "json_duplicate_key"),
    (b'{"model": "m", "prompt": "x", "n": NaN}', ""),
    (b'{"model": 1, "prompt": {"a": [1]}}', ""),
    (b'{"model": "m", "prompt_template": "' + b"{{" * 1024 + b'x}}"}', ""),
    (b'{"model": "m", "prompt": "x", "max_tokens": 100000000}', "max_tokens_exceeded"),
]


@pytest.mark.parametrize(("body", "code"), BAD_BODIES)
async def test_bad_bodies_get_an_openai_error_never_a_500(body: bytes, code: str) -> None:
    async with guard() as g:
        resp = await g.client.post(
            "/v1/completions", content=body, headers={"content-type": "application/json"}
        )
        assert 400 <= resp.status_code < 500, resp.text
        got = error_code(resp)
        assert got and (not code or got == code), got
        assert g.fake.received == []


# --------------------------------------------------------------------------------- dry run


async def test_dry_run_verdicts() -> None:
    async with guard() as g:
        resp = await g.client.post("/guard/v1/check", json=CHAT)
        body = resp.json()
        assert resp.status_code == 200 and body["allowed"] is True and body["code"] is None
        assert body["costs"]["prompt_tokens"] > 0
        assert body["mutations"] == []
        assert [c["outcome"] for c in body["checks"]] == ["pass"] * len(body["checks"])
        resp = await g.client.post(
            "/guard/v1/check?path=/v1/completions", json={"model": "m", "prompt": "x", "n": 1000}
        )
        body = resp.json()
        assert resp.status_code == 200 and body["allowed"] is False
        assert (body["code"], body["status"], body["param"]) == ("n_exceeded", 400, "n")
        assert body["checks"][-1] == {"name": "fanout", "outcome": "n_exceeded"}
        resp = await g.client.post("/guard/v1/check", content=b"x" * (4 << 20) + b"x" * 1000)
        assert resp.json()["code"] == "body_too_large"
        resp = await g.client.post("/guard/v1/check?path=/nope", json=CHAT)
        assert resp.status_code == 404 and error_code(resp) == "route_not_allowed"
        resp = await g.client.get("/guard/v1/check")
        assert resp.status_code == 405 and error_code(resp) == "method_not_allowed"
        assert g.fake.received == []


async def test_dry_run_gives_the_proxied_paths_verdict() -> None:
    # One front half (proxy.admit) serves both: each request gets the same status and code.
    chat = json.dumps(CHAT).encode()
    cases: list[tuple[str, bytes, dict[str, str]]] = [
        ("/v1/chat/completions", chat, {}),
        ("/v1/chat/completions", json.dumps({**CHAT, "n": 1000}).encode(), {}),
        ("/v1/chat/completions", b'{"model": "m", "messages": [', {}),
        ("/v1/chat/completions", b'{"x": "' + b"a" * 3000 + b'"}', {}),
        ("/v1/chat/completions", gzip.compress(chat), {"content-encoding": "gzip"}),
        ("/v1/chat/completions", chat, {f"x-h{i}": "1" for i in range(30)}),
        ("/v1/completions", b'{"model": "m", "prompt": "{{{{{{{{{{x}}}}}}}}}}"}', {}),
        ("/v1/models", b"", {}),
        ("/v1/models", b"{}", {}),
    ]
    async with guard("limits: {body: {max_body_bytes: 2000, max_header_count: 20}}") as g:
        for path, content, headers in cases:
            method = "GET" if path == "/v1/models" else "POST"
            hdrs = {"content-type": "application/json", **headers}
            proxied = await g.client.request(method, path, content=content, headers=hdrs)
            dry = await g.client.post(
                "/guard/v1/check", params={"path": path}, content=content, headers=hdrs
            )
            assert dry.status_code == 200, (path, content[:40], dry.text)
            verdict = dry.json()
            if proxied.status_code == 200:
                assert verdict["allowed"] is True, (path, content[:40], verdict)
            else:
                got = (verdict["status"], verdict["code"])
                assert got == (proxied.status_code, error_code(proxied)), (path, content[:40])


# ----------------------------------------------------------------------- health and metrics


async def test_healthz_readyz_metrics_and_openapi() -> None:
    async with guard() as g:
        assert (await g.client.get("/healthz")).json() == {"status": "ok"}
        assert (await g.client.get("/readyz")).status_code == 200
        await g.client.post("/v1/chat/completions", json=CHAT)
        await g.client.post("/v1/chat/completions", json={**CHAT, "n": 999})
        text = (await g.client.get("/metrics")).text
        assert (
            'schedguard_guard_requests_total{route="/v1/chat/completions",status="200"} 1.0' in text
        )
        assert (
            'schedguard_guard_requests_total{route="/v1/chat/completions",status="400"} 1.0' in text
        )
        assert 'schedguard_guard_rejections_total{code="n_exceeded"} 1.0' in text
        assert 'schedguard_guard_tokens_total{direction="in",tenant="anonymous"} 5.0' in text
        assert 'schedguard_guard_tokens_total{direction="out",tenant="anonymous"} 3.0' in text
        assert "schedguard_guard_overhead_seconds_count 1.0" in text
        assert (
            'schedguard_guard_upstream_latency_seconds_count{route="/v1/chat/completions"} 1.0'
            in text
        )
        assert "schedguard_guard_in_flight_requests 0.0" in text
        assert "schedguard_guard_queue_wait_seconds_count 1.0" in text
        assert 'schedguard_guard_check_seconds_total{check="tokens"}' in text
        schema = (await g.client.get("/openapi.json")).json()
        for path in ("/v1/chat/completions", "/v1/models", "/guard/v1/check", "/readyz"):
            assert path in schema["paths"]
    app = create_app(policy_from_yaml(""), upstream_url=f"http://127.0.0.1:{free_port()}")
    async with serve(app) as url, httpx.AsyncClient(base_url=url) as client:
        resp = await client.get("/readyz")
        assert resp.status_code == 503 and error_code(resp) == "upstream_unavailable"
        assert (await client.get("/healthz")).status_code == 200


# -------------------------------------------------------------------------- keys and limits

KEYS = f"""
keys:
  - {{key: {KEY}, tenant: team-a}}
"""


async def test_api_keys() -> None:
    async with guard(KEYS) as g:
        resp = await g.client.post("/v1/chat/completions", json=CHAT)
        assert resp.status_code == 401 and error_code(resp) == "missing_api_key"
        resp = await g.client.post(
            "/v1/chat/completions", json=CHAT, headers={"authorization": "Bearer wrong-key-1234"}
        )
        assert resp.status_code == 401 and error_code(resp) == "invalid_api_key"
        resp = await g.client.get("/v1/models", headers={"authorization": "Basic abc"})
        assert resp.status_code == 401
        resp = await g.client.post("/guard/v1/check", json=CHAT)
        assert resp.status_code == 401
        assert g.fake.received == []
        resp = await g.client.post(
            "/v1/chat/completions", json=CHAT, headers={"authorization": f"Bearer {KEY}"}
        )
        assert resp.status_code == 200
        # The guard's key is not the upstream's business.
        assert "Authorization" not in g.fake.received[-1].headers
        assert 'tenant="team-a"' in g.metrics_text()
    async with guard() as g:
        resp = await g.client.post(
            "/v1/chat/completions", json=CHAT, headers={"authorization": "Bearer upstream-key"}
        )
        assert resp.status_code == 200
        assert g.fake.received[-1].headers["Authorization"] == "Bearer upstream-key"


async def test_rate_limit_gives_429_with_retry_after() -> None:
    async with guard("rate: {anonymous: {requests_per_minute: 1, burst: 1}}") as g:
        assert (await g.client.post("/v1/chat/completions", json=CHAT)).status_code == 200
        resp = await g.client.post("/v1/chat/completions", json=CHAT)
        assert resp.status_code == 429 and error_code(resp) == "rate_limited_requests"
        assert int(resp.headers["retry-after"]) >= 1
        assert len(g.fake.received) == 1


async def test_token_reservation_refuses_a_request_bigger_than_the_bucket() -> None:
    async with guard("rate: {anonymous: {tokens_per_minute: 100}}") as g:
        resp = await g.client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 500})
        assert resp.status_code in (400, 429), resp.text
        assert g.fake.received == []


async def test_concurrency_limit_refuses_while_a_request_is_in_flight() -> None:
    policy = "rate: {anonymous: {concurrency: 1}, queue_size: 0, queue_timeout_s: 0.1}"
    async with guard(policy) as g:
        first = asyncio.create_task(
            g.client.post("/v1/chat/completions", json=CHAT, headers={"x-fake": "hang"})
        )
        while not g.fake.received:
            await asyncio.sleep(0.01)  # waiting for the first request to reach the upstream
        resp = await g.client.post("/v1/chat/completions", json=CHAT)
        assert resp.status_code in (429, 503) and error_code(resp) in (
            "concurrency_limited",
            "server_busy",
        )
        first.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await first
        while not g.fake.cancelled:
            await asyncio.sleep(0.01)  # the guard cancels the upstream request
        assert (await g.client.post("/v1/chat/completions", json=CHAT)).status_code == 200


# ------------------------------------------------------------------------------- streaming


def sse_events(text: str) -> list[Any]:
    out: list[Any] = []
    for block in text.split("\n\n"):
        if block.startswith("data: "):
            data = block[6:]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


async def test_stream_is_relayed_and_counted() -> None:
    async with guard() as g:
        body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
        async with g.client.stream(
            "POST", "/v1/chat/completions", json=body, headers={"x-fake-tokens": "4"}
        ) as resp:
            assert resp.status_code == 200
            assert resp.headers["content-type"].startswith("text/event-stream")
            assert resp.headers["x-request-id"]
            text = (await resp.aread()).decode()
        events = sse_events(text)
        assert events[-1] == "[DONE]" and events[-2]["usage"]["completion_tokens"] == 4
        assert sum(1 for e in events[:-2] if e["choices"][0]["delta"].get("content")) == 4
        assert 'schedguard_guard_tokens_total{direction="out",tenant="anonymous"} 4.0' in (
            g.metrics_text()
        )


async def test_stream_over_the_output_cap_is_ended_cleanly_and_the_upstream_aborted() -> None:
    async with guard() as g:
        body = {**CHAT, "stream": True, "max_tokens": 5}
        resp = await g.client.post("/v1/chat/completions", json=body, headers={"x-fake": "endless"})
        events = sse_events(resp.text)
        assert events[-1] == "[DONE]"
        assert events[-2]["choices"][0]["finish_reason"] == "length"
        assert sum(1 for e in events[:-2] if e["choices"][0]["delta"].get("content")) == 5
        while not g.fake.cancelled:
            await asyncio.sleep(0.01)  # the fake notices the abort
        assert 'schedguard_guard_upstream_aborts_total{reason="output_cap"} 1.0' in g.metrics_text()


# --------------------------------------------------------------------------------- framing

SMALL = (
    "limits: {body: {max_body_bytes: 65536, max_inflated_bytes: 200000, body_read_timeout_s: 0.5}}"
)


def _head(path: str, headers: dict[str, str]) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "host: x", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def test_oversize_declared_body_gets_413_before_it_is_sent() -> None:
    async with guard(SMALL) as g:
        head = _head("/v1/completions", {"content-length": str(100 << 20)})
        answer = await raw_request(g.url, head, [b"{" * 1000])
        assert answer.startswith(b"HTTP/1.1 413")
        assert b"body_too_large" in answer and b"connection: close" in answer.lower()


async def test_oversize_chunked_body_gets_413_while_it_is_sent() -> None:
    async with guard(SMALL) as g:
        head = _head("/v1/completions", {"transfer-encoding": "chunked"})
        chunk = b"%x\r\n" % 16384 + b"x" * 16384 + b"\r\n"
        answer = await raw_request(g.url, head, [chunk] * 6)  # 96 KiB, never terminated
        assert answer.startswith(b"HTTP/1.1 413") and b"body_too_large" in answer


async def test_slow_body_gets_408() -> None:
    async with guard(SMALL) as g:
        head = _head("/v1/completions", {"content-length": "100"})
        answer = await raw_request(g.url, head, [b'{"model":'])
        assert answer.startswith(b"HTTP/1.1 408") and b"body_timeout" in answer
        assert g.fake.received == []


async def test_header_caps_give_431() -> None:
    async with guard("limits: {body: {max_header_count: 20, max_header_bytes: 4096}}") as g:
        many = {f"x-h{i}": "1" for i in range(30)}
        resp = await g.client.post("/v1/chat/completions", json=CHAT, headers=many)
        assert resp.status_code == 431 and error_code(resp) == "too_many_headers"
        resp = await g.client.post("/v1/chat/completions", json=CHAT, headers={"x-big": "a" * 5000})
        assert resp.status_code == 431 and error_code(resp) == "headers_too_large"
        resp = await g.client.post("/guard/v1/check", json=CHAT, headers={"x-big": "a" * 5000})
        assert resp.json()["code"] == "headers_too_large"
    # The default cap is the policy's 16 KiB: a 20 KB header gets the app's 431 (bigger heads are
    # cut by the protocol, see the header bomb test).
    async with guard() as g:
        resp = await g.client.get("/v1/models", headers={"x-big": "a" * 20_000})
        assert resp.status_code == 431 and error_code(resp) == "headers_too_large"
        assert g.fake.received == []


async def test_header_bomb_is_cut_by_the_protocol_before_the_head_ends() -> None:
    async with guard() as g:
        host, port = g.url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"GET /v1/models HTTP/1.1\r\nhost: x\r\nx-bomb: ")
        sent = 0
        with contextlib.suppress(ConnectionError):
            while sent < 64 << 20:
                writer.write(b"a" * 65536)
                await writer.drain()
                sent += 65536
        with contextlib.suppress(ConnectionError):
            answer = await asyncio.wait_for(reader.read(4096), 5)
            assert answer == b"" or answer.startswith(b"HTTP/1.1 431")
        writer.close()
        assert sent < 64 << 20  # the guard hung up long before the header ended
        assert g.fake.received == []
        assert (await g.client.get("/v1/models")).status_code == 200
        # Refused by the server before any app saw it, and still counted by the app's metrics.
        metrics = (await g.client.get("/metrics")).text
        counted = re.search(
            r'schedguard_guard_rejections_total\{code="headers_too_large"\} (\S+)', metrics
        )
        assert counted is not None and float(counted.group(1)) >= 1


async def test_content_encoding_refused_by_default() -> None:
    async with guard() as g:
        resp = await g.client.post(
            "/v1/chat/completions",
            content=gzip.compress(json.dumps(CHAT).encode()),
            headers={"content-encoding": "gzip"},
        )
        assert resp.status_code == 415 and error_code(resp) == "unsupported_content_encoding"


INFLATE = SMALL[:-2] + ", content_encoding: inflate, max_inflate_ratio: 50}}"


async def test_gzip_and_deflate_bodies_are_inflated_and_checked() -> None:
    async with guard(INFLATE) as g:
        raw = json.dumps(CHAT).encode()
        for encoding, data in (("gzip", gzip.compress(raw)), ("deflate", zlib.compress(raw))):
            resp = await g.client.post(
                "/v1/chat/completions", content=data, headers={"content-encoding": encoding}
            )
            assert resp.status_code == 200, resp.text
            forwarded = g.fake.received[-1]
            assert json.loads(forwarded.body)["messages"] == CHAT["messages"]
            assert "Content-Encoding" not in forwarded.headers
        resp = await g.client.post(
            "/v1/chat/completions",
            content=gzip.compress(raw)[:-6],
            headers={"content-encoding": "gzip"},
        )
        assert resp.status_code == 400 and error_code(resp) == "invalid_content_encoding"
        resp = await g.client.post(
            "/v1/chat/completions",
            content=gzip.compress(raw),
            headers={"content-encoding": "gzip, gzip"},
        )
        assert resp.status_code == 415
        resp = await g.client.post(
            "/v1/chat/completions", content=b"x", headers={"content-encoding": "br"}
        )
        assert resp.status_code == 415


async def test_gzip_bomb_is_stopped_at_the_cap() -> None:
    bomb = gzip.compress(b"\0" * (50 << 20), compresslevel=9)  # 50 MiB in ~50 KiB
    assert len(bomb) < 65536
    async with guard(INFLATE) as g:
        resp = await g.client.post(
            "/v1/completions", content=bomb, headers={"content-encoding": "gzip"}
        )
        assert resp.status_code == 413
        assert error_code(resp) in ("compression_ratio_exceeded", "decompressed_body_too_large")
    async with guard(INFLATE.replace("max_inflate_ratio: 50", "max_inflate_ratio: 100000")) as g:
        resp = await g.client.post(
            "/v1/completions", content=bomb, headers={"content-encoding": "gzip"}
        )
        assert resp.status_code == 413 and error_code(resp) == "decompressed_body_too_large"


class _Script:
    """A scripted ASGI receive channel that counts what was consumed."""

    def __init__(self, messages: list[dict[str, Any]]) -> None:
        self.messages = messages
        self.consumed = 0

    async def __call__(self) -> dict[str, Any]:
        if self.consumed >= len(self.messages):
            await asyncio.sleep(3600)
        self.consumed += 1
        return self.messages[self.consumed - 1]


async def test_read_body_stops_at_the_first_chunk_over_the_cap() -> None:
    limits = FramingLimits(max_body_bytes=1000)
    head = inspect_head([], limits)
    script = _Script([{"type": "http.request", "body": b"x" * 400, "more_body": True}] * 100)
    with pytest.raises(GuardError) as exc:
        await read_body(script, head, limits, linger_bytes=1)
    assert exc.value.code == "body_too_large" and exc.value.status == 413
    assert exc.value.headers == {"connection": "close"}
    assert script.consumed == 3
    head = inspect_head([(b"content-length", b"5000")], limits)
    script = _Script([])
    with pytest.raises(GuardError):
        await read_body(script, head, limits, linger_bytes=1)
    assert script.consumed == 0


async def test_read_body_lingers_within_its_budget_then_closes() -> None:
    limits = FramingLimits(max_body_bytes=1000)
    head = inspect_head([], limits)
    more = {"type": "http.request", "body": b"x" * 400, "more_body": True}
    last = {"type": "http.request", "body": b"x" * 400, "more_body": False}
    script = _Script([more, more, more, last])  # 1600 bytes: over the cap, within the linger
    with pytest.raises(GuardError) as exc:
        await read_body(script, head, limits, linger_bytes=1000)
    assert exc.value.code == "body_too_large" and "connection" not in exc.value.headers
    assert script.consumed == 4
    script = _Script([more] * 10)  # 4000 bytes and still going: left unread
    with pytest.raises(GuardError) as exc:
        await read_body(script, head, limits, linger_bytes=1000)
    assert exc.value.headers == {"connection": "close"} and script.consumed == 6


async def test_read_body_disconnect_and_timeout() -> None:
    limits = FramingLimits(max_body_bytes=1000, body_read_timeout_s=0.05)
    head = inspect_head([], limits)
    with pytest.raises(ClientDisconnected):
        await read_body(_Script([{"type": "http.disconnect"}]), head, limits)
    with pytest.raises(GuardError) as exc:
        await read_body(_Script([]), head, limits)
    assert (exc.value.code, exc.value.status) == ("body_timeout", 408)


def test_inspect_head_rejects_bad_content_length() -> None:
    limits = FramingLimits()
    for value in (b"abc", b"-1", b"9" * 40):
        with pytest.raises(GuardError) as exc:
            inspect_head([(b"content-length", value)], limits)
        assert exc.value.code == "invalid_content_length"
    with pytest.raises(GuardError):
        inspect_head([(b"content-length", b"1"), (b"content-length", b"2")], limits)
    head = inspect_head([(b"content-encoding", b"identity"), (b"x-request-id", b"\x01")], limits)
    assert head.content_encoding is None and head.request_id is None


# ------------------------------------------------------------------ access log and tracing


async def test_access_log_is_one_json_line_without_prompt_text(
    caplog: pytest.LogCaptureFixture,
) -> None:
    secret = "my secret prompt text"
    async with guard() as g:
        with caplog.at_level(logging.INFO, logger="schedguard.access"):
            await g.client.post(
                "/v1/chat/completions",
                headers={"x-request-id": "log-1"},
                json={"model": "m", "messages": [{"role": "user", "content": secret}]},
            )
            await g.client.post("/v1/chat/completions", json={**CHAT, "n": 1000})
            await g.client.post(
                "/v1/chat/completions",
                json=CHAT,
                headers={"x-fake": "status", "x-fake-status": "503"},
            )
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "schedguard.access"]
    assert len(lines) == 3
    ok, rejected, relayed = lines
    # An error the upstream answered with: its status and its own code, beside the guard's.
    assert relayed["status"] == 503 and "code" not in relayed
    assert relayed["upstream_code"] == "fake"
    assert ok["request_id"] == "log-1" and ok["status"] == 200 and ok["tenant"] == "anonymous"
    assert ok["route"] == "/v1/chat/completions" and ok["completion_tokens"] == 3
    assert {"duration_ms", "guard_ms", "upstream_ms", "bytes_in"} <= set(ok)
    assert rejected["status"] == 400 and rejected["code"] == "n_exceeded"
    assert all(secret not in r.getMessage() for r in caplog.records)


async def test_a_refusals_access_line_has_the_bytes_sent_and_the_guards_time(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A check's refusal, the key's (before the body is read) and the rate limit's: each line
    # counts the error body the client got and the guard's own time, not 0 and 0.000.
    policy = KEYS + "rate:\n  requests_per_minute: 1\n  burst: 1\n"
    auth = {"authorization": f"Bearer {KEY}"}
    async with guard(policy) as g:
        with caplog.at_level(logging.INFO, logger="schedguard.access"):
            sent = [
                await g.client.post("/v1/chat/completions", json={**CHAT, "n": 1000}, headers=auth),
                await g.client.post("/v1/chat/completions", json=CHAT),
                await g.client.post("/v1/chat/completions", json=CHAT, headers=auth),
                await g.client.post("/v1/chat/completions", json=CHAT, headers=auth),
            ]
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "schedguard.access"]
    assert [(line["status"], line.get("code")) for line in lines] == [
        (400, "n_exceeded"),
        (401, "missing_api_key"),
        (200, None),
        (429, "rate_limited_requests"),
    ]
    for line, resp in zip(lines, sent, strict=True):
        assert line["bytes_out"] == len(resp.content) > 0, line
        assert line["guard_ms"] > 0, line


def test_tracing_is_off_without_otel_env_or_package(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not otel_requested({})
    assert not otel_requested({"OTEL_SDK_DISABLED": "true", "OTEL_SERVICE_NAME": "x"})
    assert otel_requested({"OTEL_SERVICE_NAME": "x"})
    assert make_tracing(env={}) is None
    monkeypatch.setitem(sys.modules, "opentelemetry", None)  # not installed
    assert make_tracing(env={"OTEL_SERVICE_NAME": "x"}) is None


async def test_a_span_per_request_with_the_check_verdicts() -> None:
    sdk = pytest.importorskip("opentelemetry.sdk.trace")
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = sdk.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    async with guard(tracer_provider=provider) as g:
        parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        await g.client.post("/v1/chat/completions", json=CHAT, headers={"traceparent": parent})
        await g.client.post("/v1/chat/completions", json={**CHAT, "n": 100})
        sent = {k.lower(): v for k, v in g.fake.received[-1].headers.items()}
        assert sent["traceparent"].startswith("00-0af7651916cd43dd8448eb211c80319c-")
        assert sent["traceparent"] != parent  # the guard's span is the upstream's parent
    ok, rejected = exporter.get_finished_spans()
    assert ok.name == "POST /v1/chat/completions"
    assert ok.attributes is not None and rejected.attributes is not None
    assert ok.attributes["schedguard.verdict"] == "allowed"
    assert ok.attributes["schedguard.check.tokens"] == "pass"
    assert ok.attributes["http.response.status_code"] == 200
    assert f"{ok.context.trace_id:032x}" == "0af7651916cd43dd8448eb211c80319c"
    assert rejected.attributes["schedguard.verdict"] == "rejected"
    assert rejected.attributes["schedguard.code"] == "n_exceeded"
    assert rejected.attributes["schedguard.check.fanout"] == "n_exceeded"


def test_create_app_needs_an_upstream() -> None:
    with pytest.raises(ValueError):
        create_app(Policy())


async def test_refusal_before_the_body_is_read_closes_the_connection() -> None:
    async with guard(KEYS) as g:
        resp = await g.client.post("/v1/chat/completions", json=CHAT)
        assert resp.status_code == 401 and resp.headers["connection"] == "close"
        resp = await g.client.get("/v1/models")
        assert resp.status_code == 401 and "connection" not in resp.headers


async def test_access_log_stream_sink_batches_lines() -> None:
    stream = io.StringIO()
    log = AccessLog(stream=stream, flush_interval_s=0.01)
    log.emit({"route": "/v1/models", "status": 200, "code": None})
    log.emit({"route": "/v1/models", "status": 404})
    assert stream.getvalue() == ""  # batched until the loop flushes
    log.flush()
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [line["status"] for line in lines] == [200, 404] and "code" not in lines[0]
    AccessLog(enabled=False, stream=stream).emit({"status": 1})
    assert len(stream.getvalue().splitlines()) == 2
    # A batch is bounded (a flush holds the event loop while it formats): the 64th line
    # writes the batch without waiting for the interval.
    stream = io.StringIO()
    log = AccessLog(stream=stream, flush_interval_s=3600)
    for i in range(64):
        assert stream.getvalue().count("\n") == 0
        log.emit({"status": 200, "n": i})
    assert stream.getvalue().count("\n") == 64


async def test_token_reservations_are_reconciled_with_the_upstream_usage() -> None:
    # Each request reserves prompt + 256 output tokens of a 600-token bucket, then uses 8:
    # without the refund the third request would be refused.
    async with guard("rate: {anonymous: {tokens_per_minute: 600}}") as g:
        for _ in range(5):
            resp = await g.client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 256})
            assert resp.status_code == 200, resp.text
        text = g.metrics_text()
        assert 'schedguard_guard_rate_limit_tokens_total{kind="refunded"}' in text
        resp = await g.client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 2000})
        assert resp.status_code in (400, 429) and len(g.fake.received) == 5


def _tokens_reserved(text: str) -> float:
    found = re.search(r'schedguard_guard_rate_limit_tokens_total\{kind="reserved"\} (\S+)', text)
    return float(found.group(1)) if found else 0.0


async def test_a_chat_without_max_tokens_goes_unchanged_and_reserves_the_window() -> None:
    # In front of an upstream reporting a 32k window, with a key whose bucket holds more: the
    # body reaches the upstream as it was sent (no max_tokens injected), and the token bucket
    # is charged the prompt plus the window's remainder, i.e. the whole window.
    window = 32_768
    policy = policy_from_yaml(
        f"keys: [{{key: {KEY}, tenant: t, rate: {{tokens_per_minute: 1000000}}}}]"
    )
    async with fake_upstream() as fake:
        fake.models = {"max_model_len": window, "owned_by": "vllm"}
        app = create_app(policy, upstream_url=fake.url)
        async with serve(app) as url, httpx.AsyncClient(base_url=url, timeout=10) as client:
            ready = await client.get("/readyz")
            assert ready.json()["context_length"] == window
            raw = json.dumps({**CHAT, "stream": False}).encode()
            headers = {"authorization": f"Bearer {KEY}", "content-type": "application/json"}
            resp = await client.post("/v1/chat/completions", content=raw, headers=headers)
            assert resp.status_code == 200, resp.text
            assert fake.received[-1].body == raw
            g = Guard(url, fake, app, client)
            assert _tokens_reserved(g.metrics_text()) == window
            # A cap set by the client is what is reserved instead (prompt + 100).
            body = {**CHAT, "max_tokens": 100}
            resp = await client.post("/v1/chat/completions", json=body, headers=headers)
            assert resp.status_code == 200
            assert window < _tokens_reserved(g.metrics_text()) < window + 200
            # A bucket smaller than the window is charged at most its size, never refused for it.
    small = policy_from_yaml(
        f"keys: [{{key: {KEY}, tenant: t, rate: {{tokens_per_minute: 5000}}}}]"
    )
    async with fake_upstream() as fake:
        fake.models = {"max_model_len": window, "owned_by": "vllm"}
        app = create_app(small, upstream_url=fake.url)
        async with serve(app) as url, httpx.AsyncClient(base_url=url, timeout=10) as client:
            await client.get("/readyz")
            resp = await client.post("/v1/chat/completions", json=CHAT, headers=headers)
            assert resp.status_code == 200, resp.text
            assert _tokens_reserved(Guard(url, fake, app, client).metrics_text()) == 5000


async def test_a_bug_in_the_guard_is_a_logged_500_not_a_hang(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import guard.gateway as gateway_module

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("bug")

    monkeypatch.setattr(gateway_module, "check_body", broken)
    async with guard() as g:
        resp = await g.client.post("/v1/chat/completions", json=CHAT)
        assert resp.status_code == 500 and error_code(resp) == "internal_error"
        assert resp.json()["error"]["type"] == "server_error" and "bug" not in resp.text
        assert (await g.client.get("/v1/models")).status_code == 200
    assert any("unexpected error" in r.getMessage() for r in caplog.records)
