"""Streams through the guard (uvicorn, httptools) to the fake upstream: how they end.

A client that closes its connection as soon as it has read ``[DONE]`` (the openai client does)
got the whole stream: the guard logs and counts it as a 200 with its token counts, not as a 499
abort, however long the upstream takes to end its response after ``[DONE]`` (issue 15). A client
that leaves mid-stream is a 499, charged for what the upstream generated until then. An
upstream stream that ends early is flagged (a metric and an access-log field), and one without
``[DONE]`` ends, for the client, with an ``upstream_stream_truncated`` error event.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest

from guard.app import create_app
from guard.http._sse_relay import DONE, SseRelay
from guard.policy import policy_from_yaml
from tests._guard_harness import FakeUpstream, fake_upstream, serve

CHAT = {"model": "fake", "messages": [{"role": "user", "content": "hello there"}]}
STREAM = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
ROUTE = "/v1/chat/completions"
# The guard's own protocol tells the app of a disconnect through a hook; uvicorn's stock one
# only through receive() (the gateway's watcher task): both must see a whole stream as whole.
PROTOCOLS = ["guard.http._protocol:GuardHttpToolsProtocol", "httptools"]


@dataclass
class Guard:
    url: str
    fake: FakeUpstream
    app: Any

    def metrics_text(self) -> str:
        return str(self.app.state.metrics.render().decode())

    def requests(self, status: int) -> float:
        counts = self.app.state.metrics.requests
        return float(counts.get((ROUTE, str(status)), 0.0))

    async def recorded(self, n: int) -> None:
        """Wait until ``n`` proxied requests are recorded (the access line and the metrics are
        written once the guard has finished with a request, after the client may have left)."""
        async with asyncio.timeout(20):
            while sum(v for (r, _), v in self.app.state.metrics.requests.items() if r == ROUTE) < n:
                await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def guard(policy_yaml: str = "", http: str = PROTOCOLS[0]) -> AsyncIterator[Guard]:
    async with fake_upstream() as fake:
        app = create_app(policy_from_yaml(policy_yaml), upstream_url=fake.url)
        async with serve(app, http=http) as url:
            yield Guard(url, fake, app)


async def read_until_done_and_close(url: str, body: dict[str, Any], headers: dict[str, str]) -> str:
    """POST a stream by hand, read until ``[DONE]`` and close the connection at once, as the
    openai client does; return the response as read."""
    host, port = url.removeprefix("http://").split(":")
    data = json.dumps(body).encode()
    head = [f"POST {ROUTE} HTTP/1.1", "host: x", "content-type: application/json",
            f"content-length: {len(data)}", *(f"{k}: {v}" for k, v in headers.items())]  # fmt: skip
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + data)
        got = b""
        async with asyncio.timeout(20):
            while b"data: [DONE]" not in got:
                chunk = await reader.read(65536)
                assert chunk, f"the connection ended before [DONE]: {got!r}"
                got += chunk
        return got.decode()
    finally:
        writer.close()


def access_lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [json.loads(r.getMessage()) for r in caplog.records if r.name == "schedguard.access"]


@pytest.mark.parametrize("http", PROTOCOLS, ids=["hook", "watcher"])
async def test_a_stream_read_to_done_is_a_200_when_the_client_closes_at_once(
    http: str, caplog: pytest.LogCaptureFixture
) -> None:
    runs = 5
    async with guard(http=http) as g:
        with caplog.at_level(logging.INFO, logger="schedguard.access"):
            for _ in range(runs):
                # The upstream ends its response 0.3 s after [DONE]; the client is long gone.
                text = await read_until_done_and_close(
                    g.url, STREAM, {"x-fake-tokens": "4", "x-fake-linger": "0.3"}
                )
                assert text.count("x-accel-buffering") == 1
            await g.recorded(runs)
        assert (g.requests(200), g.requests(499)) == (runs, 0)
        text = g.metrics_text()
        assert "schedguard_guard_upstream_aborts_total{" not in text
        assert 'schedguard_guard_tokens_total{direction="out",tenant="anonymous"} 20.0' in text
    lines = access_lines(caplog)
    assert [(line["status"], line.get("code"), line["completion_tokens"]) for line in lines] == [
        (200, None, 4)
    ] * runs


async def test_streamed_headers_carry_x_accel_buffering_once() -> None:
    async with guard() as g, httpx.AsyncClient(base_url=g.url) as client:
        async with client.stream("POST", ROUTE, json=STREAM) as resp:
            await resp.aread()
        assert resp.headers.get_list("x-accel-buffering") == ["no"]
        assert resp.headers.get_list("x-request-id") and resp.status_code == 200


async def test_a_client_leaving_mid_stream_is_a_499_charged_for_what_was_generated(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A token rate, so that there is a bucket to charge (the anonymous tenant has none by default).
    async with (
        guard("rate: {anonymous: {tokens_per_minute: 200000}}") as g,
        httpx.AsyncClient(base_url=g.url) as client,
    ):
        with caplog.at_level(logging.INFO, logger="schedguard.access"):
            body = {**CHAT, "stream": True, "max_tokens": 1000}
            headers = {"x-fake": "endless", "x-fake-interval": "0.01"}
            async with client.stream("POST", ROUTE, json=body, headers=headers) as resp:
                deltas = 0
                async for line in resp.aiter_lines():
                    deltas += line.startswith("data: {")
                    if deltas == 5:
                        break
            await g.recorded(1)
        assert (g.requests(200), g.requests(499)) == (0, 1)
        assert 'schedguard_guard_upstream_aborts_total{reason="client_gone"} 1.0' in (
            g.metrics_text()
        )
        rate = g.app.state.gateway.limiter.metrics
    (line,) = access_lines(caplog)
    assert line["status"] == 499 and line["code"] == "client_disconnected"
    assert line["completion_tokens"] >= 5
    # Reserved: prompt + 1000; refunded: all but prompt + what the upstream generated.
    assert (
        rate.tokens_refunded
        == rate.tokens_reserved - line["prompt_tokens"] - (line["completion_tokens"])
    )


async def test_an_upstream_stream_without_done_is_flagged_and_ends_with_an_error_event(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with guard() as g:
        client = openai.AsyncOpenAI(base_url=g.url + "/v1", api_key="sk-x", max_retries=0)
        with caplog.at_level(logging.INFO, logger="schedguard.access"):
            stream = await client.chat.completions.create(
                model="fake",
                messages=[{"role": "user", "content": "hi"}],
                stream=True,
                extra_headers={"x-fake": "no-done"},
            )
            pieces: list[str] = []
            with pytest.raises(openai.APIError) as exc:
                async for chunk in stream:
                    pieces.append(chunk.choices[0].delta.content or "")
            await client.close()
            await g.recorded(1)
        assert "".join(pieces) == "tok tok tok "  # everything the upstream sent, then the error
        assert "before it was complete" in exc.value.message
        text = g.metrics_text()
        assert (
            'schedguard_guard_upstream_streams_truncated_total{reason="no_done",'
            f'route="{ROUTE}"}} 1.0' in text
        )
        assert 'schedguard_guard_rejections_total{code="upstream_stream_truncated"} 1.0' in text
    (line,) = access_lines(caplog)
    assert line["status"] == 200 and line["code"] == "upstream_stream_truncated"
    assert line["upstream_stream_truncated"] == "no_done"


async def test_done_without_a_finish_reason_is_relayed_and_flagged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with guard() as g, httpx.AsyncClient(base_url=g.url) as client:
        with caplog.at_level(logging.INFO, logger="schedguard.access"):
            resp = await client.post(
                ROUTE, json={**CHAT, "stream": True}, headers={"x-fake": "done-unfinished"}
            )
            whole = await client.post(ROUTE, json={**CHAT, "stream": True})
            await g.recorded(2)
        assert resp.text.endswith("data: [DONE]\n\n") and "error" not in resp.text
        assert '"finish_reason": "stop"' in whole.text
        assert (
            'schedguard_guard_upstream_streams_truncated_total{reason="no_finish_reason",'
            f'route="{ROUTE}"}} 1.0' in g.metrics_text()
        )
    cut, ok = access_lines(caplog)
    assert cut["status"] == 200 and "code" not in cut
    assert cut["upstream_stream_truncated"] == "no_finish_reason"
    assert ok["status"] == 200 and "upstream_stream_truncated" not in ok


# ------------------------------------------------------------------------- the relay alone


def _event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def _choice(delta: dict[str, Any], finish: str | None = None, index: int = 0) -> dict[str, Any]:
    return {"choices": [{"index": index, "delta": delta, "finish_reason": finish}]}


@pytest.mark.parametrize(
    ("events", "upstream_done", "unfinished"),
    [
        # Whole: a finish_reason, then usage, then [DONE].
        ([_choice({"role": "assistant"}), _choice({"content": "a"}), _choice({}, "stop"),
          {"choices": [], "usage": {"completion_tokens": 1}}], True, False),
        # llama-cpp-python's stream cut off by a newer request: a role, then [DONE].
        ([_choice({"role": "assistant"})], True, True),
        ([_choice({"role": "assistant"}), _choice({"content": "a"})], True, True),
        # Two choices, one finished.
        ([_choice({"content": "a"}, index=0), _choice({"content": "b"}, "stop", index=1)],
         True, True),
    ],
)  # fmt: skip
def test_relay_tells_a_done_without_a_finish_reason(
    events: list[dict[str, Any]], upstream_done: bool, unfinished: bool
) -> None:
    relay = SseRelay(len, max_tokens=None)
    stream = b"".join(_event(e) for e in events) + DONE
    assert relay.feed(stream) == stream
    assert relay.done and relay.upstream_done is upstream_done
    assert relay.unfinished is unfinished


def test_relay_cut_at_the_cap_is_not_the_upstreams_done() -> None:
    relay = SseRelay(len, max_tokens=1)
    relay.feed(_event(_choice({"content": "a"})) + _event(_choice({"content": "b"})))
    assert relay.done and relay.cut and not relay.upstream_done and not relay.unfinished
