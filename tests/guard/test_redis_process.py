"""Rate limits shared through Redis by two ``schedguard serve`` processes.

Two guards (capped child processes, ``--redis redis://...``) in front of one fake upstream,
with the same request limit: concurrent requests split across both get exactly the limit in
total, the rest 429 with ``Retry-After``. With Redis stopped, the guard whose policy fails closed
answers 503 ``rate_limiter_unavailable`` and the one that fails open lets requests through; once
Redis is back, both enforce the shared limit again. The replicas differ only in
``rate.on_redis_failure``.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import httpx
import pytest

from schedguard.servers import RunningServer
from tests._guard_harness import fake_upstream
from tests._guard_process import guard_spec, start
from tests._redis_server import RedisServer, require_binary

LIMIT = 8  # requests per minute and burst: one request refills every 7.5 s, longer than the test
REQUESTS = 3 * LIMIT
CHAT = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def _policy(tmp: Path, on_failure: str) -> Path:
    path = tmp / f"policy-{on_failure}.yaml"
    path.write_text(
        f"rate: {{anonymous: {{requests_per_minute: {LIMIT}, burst: {LIMIT}}}, "
        # A Redis answering slowly on a busy machine is not the failure under test.
        f"on_redis_failure: {on_failure}, redis_timeout_s: 10}}\n",
        encoding="utf-8",
    )
    return path


def _code(resp: httpx.Response) -> str | None:
    try:
        return str(resp.json()["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return None


async def _burst(urls: Sequence[str], n: int) -> list[httpx.Response]:
    """``n`` requests at once, alternating between the guards."""
    async with httpx.AsyncClient(timeout=10.0, limits=httpx.Limits(max_connections=n)) as client:
        return await asyncio.gather(
            *(client.post(urls[i % len(urls)] + "/v1/chat/completions", json=CHAT)
              for i in range(n))
        )  # fmt: skip


@pytest.mark.timeout(240)
async def test_two_guards_share_one_limit_through_redis_and_fail_as_configured(
    tmp_path: Path,
) -> None:
    require_binary()
    guards: list[RunningServer] = []
    with RedisServer() as redis:
        async with fake_upstream() as fake:
            try:
                for on_failure in ("closed", "open"):
                    spec = guard_spec(
                        f"guard-{on_failure}",
                        fake.url,
                        _policy(tmp_path, on_failure),
                        redis_url=redis.url,
                    )
                    guards.append(start(spec))
                # Blocking polls in threads: the fake upstream answers /readyz on this loop.
                await asyncio.gather(*(asyncio.to_thread(g.wait_ready, 30) for g in guards))
                closed, opened = (g.url for g in guards)

                answers = await _burst([closed, opened], REQUESTS)
                statuses = Counter((r.status_code, _code(r)) for r in answers)
                assert statuses == {
                    (200, None): LIMIT,
                    (429, "rate_limited_requests"): REQUESTS - LIMIT,
                }, statuses
                assert len(fake.received) == LIMIT  # the refused never reached the upstream
                for resp in answers:
                    if resp.status_code == 429:
                        assert int(resp.headers["retry-after"]) >= 1
                        assert resp.headers["x-ratelimit-limit-requests"] == str(LIMIT)

                redis.stop()
                async with httpx.AsyncClient(timeout=10.0) as client:
                    down = await client.post(closed + "/v1/chat/completions", json=CHAT)
                    assert down.status_code == 503, down.text
                    assert _code(down) == "rate_limiter_unavailable"
                    assert down.headers["retry-after"] == "1"
                    for _ in range(3):  # unlimited while Redis is down, as configured
                        up = await client.post(opened + "/v1/chat/completions", json=CHAT)
                        assert up.status_code == 200, up.text

                redis.start()  # same port, empty: full buckets again, shared again
                answers = await _burst([closed, opened], 2 * LIMIT)
                statuses = Counter((r.status_code, _code(r)) for r in answers)
                assert statuses == {
                    (200, None): LIMIT,
                    (429, "rate_limited_requests"): LIMIT,
                }, statuses
                assert all(g.alive() for g in guards), [g.log_tail() for g in guards]
            finally:
                for g in guards:
                    await asyncio.to_thread(g.stop)
