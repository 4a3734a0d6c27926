"""The default policy does not throttle a single benign client (issue 14 item 6), over real HTTP.

Without keys every caller is the tenant ``anonymous``: by default it has no request or token
rate and the global concurrency, so a service behind the guard sending at full speed gets its
answers; the limits come back where keys exist or the policy asks (``rate.anonymous``).
"""

from __future__ import annotations

import asyncio
from collections import Counter

import httpx

from guard.app import create_app
from guard.policy import default_policy, policy_from_yaml
from tests._guard_harness import fake_upstream, serve

CHAT = {"model": "fake", "messages": [{"role": "user", "content": "ping"}], "max_tokens": 8}
REQUESTS = 300  # 15 times the old default burst of 20, 30 s worth of the old 600/min
AT_ONCE = 48  # 3 times the old 16 in flight


async def _flood(url: str, headers: dict[str, str] | None = None) -> Counter[int]:
    limits = httpx.Limits(max_connections=AT_ONCE, max_keepalive_connections=AT_ONCE)
    statuses: Counter[int] = Counter()
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(REQUESTS):
        queue.put_nowait(i)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=30.0) as client:

        async def worker() -> None:
            while not queue.empty():
                queue.get_nowait()
                resp = await client.post("/v1/chat/completions", json=CHAT, headers=headers)
                statuses[resp.status_code] += 1

        await asyncio.gather(*(worker() for _ in range(AT_ONCE)))
    return statuses


async def test_a_full_speed_anonymous_client_is_not_throttled() -> None:
    async with fake_upstream() as fake:
        app = create_app(default_policy(), upstream_url=fake.url)
        async with serve(app) as url:
            statuses = await _flood(url)
    assert statuses == Counter({200: REQUESTS})
    assert len(fake.received) == REQUESTS


async def test_keys_keep_per_tenant_rates() -> None:
    policy = policy_from_yaml("keys: [{key: sk-tenant-aaaa, tenant: a}]")
    async with fake_upstream() as fake:
        app = create_app(policy, upstream_url=fake.url)
        async with serve(app) as url:
            statuses = await _flood(url, {"authorization": "Bearer sk-tenant-aaaa"})
    assert statuses[429] > 0 and statuses[200] >= policy.rate.burst
    assert set(statuses) <= {200, 429}


async def test_anonymous_limits_apply_when_the_policy_asks() -> None:
    policy = policy_from_yaml("rate: {anonymous: {requests_per_minute: 1, burst: 5}}")
    async with fake_upstream() as fake:
        app = create_app(policy, upstream_url=fake.url)
        async with serve(app) as url:
            statuses = await _flood(url)
    assert 5 <= statuses[200] <= 5 + 1  # the burst, and at most one refilled in a minute
    assert statuses[429] == REQUESTS - statuses[200]
