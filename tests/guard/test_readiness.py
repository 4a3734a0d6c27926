"""``/readyz`` means the next request can be served (issue 15): with Redis rate limits that fail
closed and a Redis that does not answer, the guard is not ready (503
``rate_limiter_unavailable``, what every request gets) and says so in its log at start, before
any request; failing open it stays ready and says it is serving without limits. When Redis comes
back, the guard is ready again and logs that, with no request needed."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable

import httpx
import pytest

from guard.admission import _redis
from guard.app import create_app
from guard.policy import policy_from_yaml
from tests._guard_harness import fake_upstream, serve
from tests._redis_server import RedisServer, require_binary
from tests._support import free_port

CHAT = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
LOGGER = "guard.admission._ratelimit"


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno >= 30]


@contextlib.asynccontextmanager
async def _guard(redis_port: int, on_failure: str) -> AsyncIterator[httpx.AsyncClient]:
    policy = policy_from_yaml(
        f"rate: {{redis_url: 'redis://:secret@127.0.0.1:{redis_port}/0', "
        f"on_redis_failure: {on_failure}}}"
    )
    async with fake_upstream() as fake:
        app = create_app(policy, upstream_url=fake.url)
        async with serve(app) as url, httpx.AsyncClient(base_url=url, timeout=10) as client:
            yield client


async def _until(predicate: Callable[[], object]) -> None:
    async with asyncio.timeout(20):
        while not predicate():
            await asyncio.sleep(0.02)  # polling the guard's background watch, not timing it


async def test_fail_closed_without_redis_is_not_ready_and_says_so_at_start(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    require_binary()
    monkeypatch.setattr(_redis, "WATCH_INTERVAL_S", 0.05)
    port = free_port()
    with caplog.at_level(logging.INFO, logger=LOGGER):
        async with _guard(port, "closed") as client:
            # Logged at start, before any request.
            await _until(lambda: _warnings(caplog))
            (warning,) = _warnings(caplog)
            assert f"redis://127.0.0.1:{port}/0" in warning and "failing closed" in warning
            assert "secret" not in warning
            ready = await client.get("/readyz")
            assert ready.status_code == 503
            assert ready.json()["error"]["code"] == "rate_limiter_unavailable"
            refused = await client.post("/v1/chat/completions", json=CHAT)
            assert refused.status_code == 503
            assert refused.json()["error"]["code"] == "rate_limiter_unavailable"
            assert len(_warnings(caplog)) == 1  # the transition, not every request or probe

            with RedisServer(port=port):
                # Logged when Redis comes back, without a request or a probe.
                await _until(lambda: len(_warnings(caplog)) == 2)
                assert "answering again" in _warnings(caplog)[1]
                assert (await client.get("/readyz")).json()["status"] == "ready"
                assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200
            await _until(lambda: len(_warnings(caplog)) == 3)
            assert "failed" in _warnings(caplog)[2]
            assert (await client.get("/readyz")).status_code == 503


async def test_fail_open_without_redis_is_ready_and_serves_without_limits(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger=LOGGER):
        async with _guard(free_port(), "open") as client:
            await _until(lambda: _warnings(caplog))
            assert "failing open" in _warnings(caplog)[0]
            ready = await client.get("/readyz")
            assert ready.status_code == 200
            assert ready.json()["status"] == "ready"
            assert ready.json()["rate_limiter"] == "failing_open"
            assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200


async def test_an_upstream_down_is_reported_before_redis() -> None:
    policy = policy_from_yaml(f"rate: {{redis_url: 'redis://127.0.0.1:{free_port()}/0'}}")
    app = create_app(policy, upstream_url=f"http://127.0.0.1:{free_port()}")
    async with serve(app) as url, httpx.AsyncClient(base_url=url, timeout=10) as client:
        ready = await client.get("/readyz")
        assert ready.status_code == 503
        assert ready.json()["error"]["code"] == "upstream_unavailable"
