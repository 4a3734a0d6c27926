"""Faults on either side of the guard: the right status within the timeout, nothing left running.

Upstream: refusing connections, hanging (before and during a stream), resetting (before and
during a stream). Client: disconnecting mid-stream or while waiting, reading too slowly.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from guard.app import create_app
from guard.policy import policy_from_yaml
from tests._guard_harness import FakeUpstream, fake_upstream, serve
from tests._support import free_port

CHAT = {"model": "fake", "messages": [{"role": "user", "content": "hello"}]}
STREAM = {**CHAT, "stream": True}
FAST = "upstream: {read_timeout_s: 0.3, connect_timeout_s: 1.0}"
# For faults that are not timeouts: a busy machine must not turn them into one.
STEADY = "upstream: {read_timeout_s: 30, connect_timeout_s: 10}"
# Outer bounds for the guard's clean-up and cancellations (waits, not speed checks).
WAIT_S = 20.0


@contextlib.asynccontextmanager
async def guard(
    policy_yaml: str = FAST,
    upstream_url: str | None = None,
    http: str | None = None,
    **kwargs: Any,
) -> AsyncIterator[tuple[str, FakeUpstream, Any]]:
    async with fake_upstream() as fake:
        app = create_app(
            policy_from_yaml(policy_yaml), upstream_url=upstream_url or fake.url, **kwargs
        )
        async with serve(app, **({} if http is None else {"http": http})) as url:
            yield url, fake, app
            await settled(app)


async def settled(app: Any, timeout: float = WAIT_S) -> None:
    """Nothing of any request is left in the guard: no request, slot or reservation."""
    gateway = app.state.gateway
    deadline = time.monotonic() + timeout
    while gateway.concurrency.in_flight or app.state.metrics.in_flight:
        assert time.monotonic() < deadline, "requests still in flight"
        await asyncio.sleep(0.01)  # waiting for the guard's cleanup, not timing a test
    assert gateway.concurrency.waiting == 0


async def wait_for_cancel(fake: FakeUpstream, timeout: float = WAIT_S) -> float:
    start = time.monotonic()
    while not fake.cancelled:
        assert time.monotonic() - start < timeout, "the upstream request was not cancelled"
        await asyncio.sleep(0.01)  # waiting for the fake upstream to notice the abort
    return time.monotonic() - start


def code_of(resp: httpx.Response) -> str:
    return str(resp.json()["error"]["code"])


def sse(text: str) -> list[Any]:
    return [
        b[6:] if b[6:] == "[DONE]" else json.loads(b[6:])
        for b in text.split("\n\n")
        if b.startswith("data: ")
    ]


# ------------------------------------------------------------------------------ upstream


async def test_upstream_refusing_connections_is_502() -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    async with guard(upstream_url=dead) as (url, _, app), httpx.AsyncClient(base_url=url) as c:
        resp = await c.post("/v1/chat/completions", json=CHAT)
        assert resp.status_code == 502 and code_of(resp) == "upstream_unavailable"
        assert resp.json()["error"]["type"] == "server_error" and resp.headers["x-request-id"]
        resp = await c.get("/v1/models")
        assert resp.status_code == 502
        text = app.state.metrics.render().decode()
        assert 'schedguard_guard_rejections_total{code="upstream_unavailable"} 2.0' in text


async def test_upstream_hanging_is_504_within_the_timeout() -> None:
    async with guard() as (url, fake, _), httpx.AsyncClient(base_url=url) as c:
        resp = await c.post("/v1/chat/completions", json=CHAT, headers={"x-fake": "hang"})
        # upstream_timeout: the guard's read timeout answered, not a hang (the code says which).
        assert resp.status_code == 504 and code_of(resp) == "upstream_timeout"
        await wait_for_cancel(fake)  # the guard dropped the upstream request


async def test_upstream_reset_is_502() -> None:
    async with guard(STEADY) as (url, _, _app), httpx.AsyncClient(base_url=url) as c:
        resp = await c.post("/v1/chat/completions", json=CHAT, headers={"x-fake": "reset"})
        assert resp.status_code == 502 and code_of(resp) == "upstream_error"
        # The pool recovers: the next request works.
        assert (await c.post("/v1/chat/completions", json=CHAT)).status_code == 200


async def test_upstream_reset_mid_stream_ends_the_stream_with_an_error_event() -> None:
    async with guard(STEADY) as (url, _, _app), httpx.AsyncClient(base_url=url) as c:
        resp = await c.post(
            "/v1/chat/completions", json=STREAM, headers={"x-fake": "reset-mid-stream"}
        )
        assert resp.status_code == 200
        events = sse(resp.text)
        assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == "upstream_error"
        assert events[0]["choices"][0]["delta"]["content"] == "tok "


async def test_upstream_silent_mid_stream_is_cut_at_the_read_timeout() -> None:
    async with guard() as (url, fake, _), httpx.AsyncClient(base_url=url) as c:
        start = time.monotonic()
        resp = await c.post(
            "/v1/chat/completions",
            json=STREAM,
            headers={"x-fake": "endless", "x-fake-interval": "30"},
        )
        assert time.monotonic() - start < WAIT_S  # cut long before the upstream's next event (30 s)
        events = sse(resp.text)
        assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == "upstream_timeout"
        await wait_for_cancel(fake)


async def test_total_timeout_cuts_a_stream_that_keeps_going() -> None:
    policy = "upstream: {read_timeout_s: 5, total_timeout_s: 0.5}"
    async with guard(policy) as (url, fake, _), httpx.AsyncClient(base_url=url) as c:
        resp = await c.post(
            "/v1/chat/completions",
            json={**STREAM, "max_tokens": 2000},
            headers={"x-fake": "endless", "x-fake-interval": "0.05"},
        )
        events = sse(resp.text)
        assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == "upstream_timeout"
        await wait_for_cancel(fake)


# -------------------------------------------------------------------------------- client


# The guard's protocol reports a disconnect through a hook; any other server (h11 here) only
# through receive(), which the gateway's watcher task waits on. Both must cancel the upstream.
SERVERS = pytest.mark.parametrize("http", [None, "h11"], ids=["hook", "watcher"])


@SERVERS
async def test_client_disconnecting_mid_stream_cancels_the_upstream_request(
    http: str | None,
) -> None:
    async with guard(http=http) as (url, fake, app):
        async with (
            httpx.AsyncClient(base_url=url) as c,
            c.stream(
                "POST",
                "/v1/chat/completions",
                json={**STREAM, "max_tokens": 2000},
                headers={"x-fake": "endless", "x-fake-interval": "0.02"},
            ) as resp,
        ):
            assert resp.status_code == 200
            async for line in resp.aiter_lines():
                if line.startswith("data: "):
                    break
            # Leaving the block closes the connection mid-stream.
        await wait_for_cancel(fake)
        await settled(app)
        text = app.state.metrics.render().decode()
        assert 'schedguard_guard_upstream_aborts_total{reason="client_gone"} 1.0' in text


@SERVERS
async def test_client_disconnecting_while_waiting_cancels_the_upstream_request(
    http: str | None,
) -> None:
    policy = "upstream: {read_timeout_s: 30}"
    async with guard(policy, http=http) as (url, fake, app), httpx.AsyncClient(base_url=url) as c:
        task = asyncio.create_task(
            c.post("/v1/chat/completions", json=CHAT, headers={"x-fake": "hang"})
        )
        while not fake.received:
            await asyncio.sleep(0.01)  # waiting for the request to reach the upstream
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await wait_for_cancel(fake)
        await settled(app)


async def _unread_stream(url: str, body: dict[str, Any], fake_headers: str) -> socket.socket:
    """A connection with a tiny receive buffer that sends a streamed request and will never
    read its answer."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, (host, int(port)))
    data = json.dumps(body).encode()
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        f"{fake_headers}content-length: {len(data)}\r\n\r\n"
    ).encode()
    await loop.sock_sendall(sock, head + data)
    return sock


async def test_slow_client_is_cut_and_the_upstream_request_cancelled() -> None:
    async with guard("upstream: {read_timeout_s: 30}", client_timeout_s=0.3) as (url, fake, app):
        endless = "x-fake: endless\r\nx-fake-pad: 65536\r\n"
        sock = await _unread_stream(url, {**STREAM, "max_tokens": 2000}, endless)
        try:
            # Never read: the guard's writes back up and it gives up after client_timeout_s.
            await wait_for_cancel(fake)
            await settled(app)
        finally:
            sock.close()
        text = app.state.metrics.render().decode()
        assert 'schedguard_guard_upstream_aborts_total{reason="client_too_slow"} 1.0' in text


async def test_a_client_that_does_not_read_does_not_hold_the_upstream() -> None:
    """The guard reads a finite stream ahead of a client that reads none of it: the upstream
    finishes (not cancelled), and the concurrency slot is given back while the client's
    connection is still open; the client is cut later, for its own slowness only."""
    policy = STEADY + (
        "\nlimits: {connections: {read_ahead_bytes: 16777216}, tokens: {context_length: 65536}}"
    )
    async with guard(policy, client_timeout_s=3.0) as (url, fake, app):
        gateway = app.state.gateway
        # ~3 MB of events: far more than the socket buffers take.
        sock = await _unread_stream(
            url, {**STREAM, "max_tokens": 30000}, "x-fake-tokens: 30000\r\n"
        )
        try:
            deadline = time.monotonic() + WAIT_S
            while not fake.received or gateway.concurrency.in_flight:
                assert time.monotonic() < deadline, "the slot was held for the client"
                await asyncio.sleep(0.01)  # waiting for the upstream's answer to be read
            assert app.state.metrics.in_flight == 1  # the client still has its answer to read
            assert not fake.cancelled  # the upstream finished its answer
            await settled(app)  # then the unread client is cut
        finally:
            sock.close()
        text = app.state.metrics.render().decode()
        assert 'schedguard_guard_upstream_aborts_total{reason="client_too_slow"} 1.0' in text
        assert not fake.cancelled


@pytest.mark.parametrize("mode", ["hang", "reset", "reset-mid-stream"])
async def test_faults_leave_the_guard_serving(mode: str) -> None:
    # The hung requests end at the read timeout; 3 s leaves the last request room on a busy
    # machine.
    async with (
        guard("upstream: {read_timeout_s: 3, connect_timeout_s: 10}") as (url, _, app),
        httpx.AsyncClient(base_url=url) as c,
    ):
        await asyncio.gather(
            *(
                c.post("/v1/chat/completions", json=STREAM, headers={"x-fake": mode})
                for _ in range(8)
            )
        )
        await settled(app)
        assert (await c.post("/v1/chat/completions", json=CHAT)).status_code == 200
