"""The structured-output compile budget (issue 23): exact repeats free, cold constraints charged
to the tenant's bucket, the global caps, the LRU, Redis-shared buckets, and the gateway's use.

Decisions only (codes, charges, counts, retry-after); time is a fake clock, nothing sleeps.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from guard.admission import (
    BUDGET_EXHAUSTED,
    POOL_BUSY,
    CompileBudget,
    CompileCaps,
    RateLimits,
    RedisRateLimiter,
)
from guard.errors import GuardError, Overloaded, RateLimited
from guard.guided import Compile, compile_key, grammar_mb
from tests._guard_harness import admit_and_reserve
from tests._support import FakeClock

CAPS = CompileCaps(workers=8, queue_s=10.0, per_s=100.0, cache_mb=512.0)
# 10 s at once, 6 s a minute (0.1 s a second)
SMALL = RateLimits(guided_compile_burst_s=10.0, guided_compile_s_per_minute=6.0)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def schema(i: int, s: float = 3.0, mb: float = 4.0) -> Compile:
    """A distinct constraint estimated at ``s`` CPU seconds."""
    spec = {"type": "object", "properties": {f"p{i}": {"type": "string", "maxLength": 100}}}
    return Compile(compile_key("json", spec), s, mb)


async def outcome(
    budget: CompileBudget,
    tenant: str,
    compiles: list[Compile],
    limits: RateLimits = SMALL,
    caps: CompileCaps = CAPS,
) -> float | GuardError:
    try:
        return await budget.admit(tenant, compiles, limits, caps)
    except GuardError as err:
        return err


def code(result: float | GuardError) -> str | None:
    return result.code if isinstance(result, GuardError) else None


# ---- the key ------------------------------------------------------------------------------------


def test_the_key_is_kind_and_exact_text() -> None:
    a = {"type": "object", "properties": {"x": {}, "y": {}}}
    b = {"type": "object", "properties": {"y": {}, "x": {}}}
    assert compile_key("json", a) == compile_key("json", dict(a))
    assert compile_key("json", a) != compile_key("json", b)  # vLLM's cache misses too
    assert compile_key("regex", "a+") != compile_key("grammar", "a+")
    assert len(compile_key("json", a)) == 16
    assert grammar_mb(0.0, 100_000) == 0.5 and grammar_mb(3.0, 100_000) == 6.5


# ---- per tenant ---------------------------------------------------------------------------------


async def test_an_exact_repeat_is_free(clock: FakeClock) -> None:
    budget = CompileBudget(clock=clock)
    one = schema(1)
    assert await budget.admit("a", [one], SMALL, CAPS) == 3.0
    for _ in range(100):  # the bucket holds 10 s: only free repeats get this far
        assert await budget.admit("a", [one], SMALL, CAPS) == 0.0
    assert budget.metrics.cold == 1 and budget.metrics.warm == 100
    assert budget.metrics.charged_ms == 3000
    # another tenant's exact repeat is free as well: the upstream's cache is shared
    assert await budget.admit("b", [one], SMALL, CAPS) == 0.0


async def test_a_unique_schema_flood_is_refused_once_the_bucket_is_empty(clock: FakeClock) -> None:
    budget = CompileBudget(clock=clock)
    got = []
    for i in range(10):  # 20 a second
        got.append(await outcome(budget, "flood", [schema(i)]))
        clock.advance(0.05)
    # 3 x 3 s out of a 10 s burst (+ the refill of 0.5 s), then refused
    assert [code(r) for r in got] == [None] * 3 + [BUDGET_EXHAUSTED] * 7
    refusal = got[3]
    assert isinstance(refusal, RateLimited) and refusal.status == 429
    assert int(refusal.headers["retry-after"]) >= 1
    # nothing refused is remembered: the same schema is still cold once the bucket refills
    assert not budget.seen(schema(3).key)
    # another tenant is unaffected, cold and warm
    assert await budget.admit("benign", [schema(100)], SMALL, CAPS) == 3.0
    assert await budget.admit("benign", [schema(0)], SMALL, CAPS) == 0.0  # flood's, cached
    # the flood's retry-after is honest: after it, one more cold schema passes
    clock.advance(float(refusal.headers["retry-after"]) + 30)
    assert await outcome(budget, "flood", [schema(50)]) == 3.0


async def test_a_request_is_charged_its_cold_constraints_only(clock: FakeClock) -> None:
    budget = CompileBudget(clock=clock)
    await budget.admit("a", [schema(1), schema(2)], SMALL, CAPS)
    assert await budget.admit("a", [schema(1), schema(2), schema(3, s=1.5)], SMALL, CAPS) == 1.5
    assert budget.metrics.cold == 3 and budget.metrics.warm == 2


async def test_a_request_over_the_burst_is_charged_a_full_bucket(clock: FakeClock) -> None:
    budget = CompileBudget(clock=clock)
    assert await budget.admit("a", [schema(1, s=25.0)], SMALL, CAPS) == 25.0
    assert budget.metrics.charged_ms == 10_000
    assert code(await outcome(budget, "a", [schema(2, s=0.01)])) == BUDGET_EXHAUSTED


async def test_an_unlimited_tenant_is_not_charged_but_the_global_caps_hold(
    clock: FakeClock,
) -> None:
    budget = CompileBudget(clock=clock)
    unlimited = RateLimits(guided_compile_s_per_minute=None)
    assert unlimited.compile_limits is None
    caps = CompileCaps(workers=2, queue_s=5.0, per_s=100.0, cache_mb=512.0)
    assert await budget.admit("anon", [schema(1, s=5.0)], unlimited, caps) == 5.0
    assert code(await outcome(budget, "anon", [schema(2)], unlimited, caps)) == BUDGET_EXHAUSTED
    assert budget.metrics.charged_ms == 0


# ---- the global caps ----------------------------------------------------------------------------


async def test_the_compile_pool_takes_its_workers_seconds_ahead(clock: FakeClock) -> None:
    # 2 workers, 5 s ahead: 10 worker-seconds at once, 2 a second; a tenant at most half
    budget = CompileBudget(clock=clock)
    caps = CompileCaps(workers=2, queue_s=5.0, per_s=100.0, cache_mb=512.0)
    roomy = RateLimits()
    assert await budget.admit("a", [schema(1, s=5.0)], roomy, caps) == 5.0
    assert await budget.admit("b", [schema(2, s=4.0)], roomy, caps) == 4.0
    busy = await outcome(budget, "c", [schema(3)], roomy, caps)
    assert isinstance(busy, Overloaded) and busy.code == POOL_BUSY and busy.status == 503
    assert busy.headers["retry-after"] == "1"  # (3 - 1) / 2 workers
    # a repeat needs no compile
    assert await budget.admit("c", [schema(1)], roomy, caps) == 0.0
    # the refused tenant was not charged: its bucket is whole
    assert budget.metrics.charged_ms == 9000 and budget.metrics.refused_pool == 1
    clock.advance(1.0)
    assert await budget.admit("c", [schema(3)], roomy, caps) == 3.0


async def test_one_tenant_takes_at_most_half_the_pool(clock: FakeClock) -> None:
    # 4 workers, 10 s ahead: 40 worker-seconds, a tenant's half 20 (refilled at 2 a second)
    budget = CompileBudget(clock=clock)
    caps = CompileCaps(workers=4, queue_s=10.0, per_s=100.0, cache_mb=512.0)
    roomy = RateLimits(guided_compile_burst_s=1000.0)
    got = [await outcome(budget, "flood", [schema(i)], roomy, caps) for i in range(8)]
    assert [code(r) for r in got] == [None] * 6 + [BUDGET_EXHAUSTED] * 2
    assert isinstance(got[6], RateLimited) and got[6].headers["retry-after"] == "1"
    # the other half is the others'
    assert [await budget.admit("benign", [schema(10 + i)], roomy, caps) for i in range(6)] == [
        3.0
    ] * 6
    assert code(await outcome(budget, "third", [schema(30, s=5.0)], roomy, caps)) == POOL_BUSY


async def test_cold_compiles_per_second(clock: FakeClock) -> None:
    # 2 a second, five seconds' worth at once (a start-up's warming)
    budget = CompileBudget(clock=clock)
    caps = CompileCaps(workers=100, queue_s=10.0, per_s=2.0, cache_mb=512.0)
    roomy = RateLimits()
    tiny = [schema(i, s=0.002) for i in range(12)]
    got = [code(await outcome(budget, f"t{i}", [c], roomy, caps)) for i, c in enumerate(tiny)]
    assert got == [None] * 10 + [POOL_BUSY] * 2
    assert budget.metrics.refused_rate == 2
    clock.advance(0.5)
    assert await budget.admit("t10", [tiny[10]], roomy, caps) == 0.002
    assert code(await outcome(budget, "t11", [tiny[11]], roomy, caps)) == POOL_BUSY


# ---- the LRU ------------------------------------------------------------------------------------


async def test_the_lru_is_sized_like_the_upstreams_cache(clock: FakeClock) -> None:
    budget = CompileBudget(clock=clock)
    caps = CompileCaps(workers=100, queue_s=10.0, per_s=100.0, cache_mb=10.0)
    roomy = RateLimits()
    for i in range(3):  # 4 MB each: the third evicts the first
        await budget.admit("a", [schema(i, s=0.1, mb=4.0)], roomy, caps)
    assert len(budget) == 2 and budget.metrics.evicted == 1
    assert await budget.admit("a", [schema(2, s=0.1)], roomy, caps) == 0.0
    assert await budget.admit("a", [schema(0, s=0.1)], roomy, caps) == 0.1  # charged again
    # a repeat moves a constraint to the young end: 2 was used after 1, so 1 goes next
    await budget.admit("a", [schema(2, s=0.1)], roomy, caps)
    await budget.admit("a", [schema(5, s=0.1)], roomy, caps)
    assert budget.seen(schema(2).key) and not budget.seen(schema(0).key)


# ---- shared through Redis -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    from tests._redis_server import RedisServer, require_binary

    with RedisServer(require_binary()) as srv:
        yield srv.url


@pytest.fixture
async def replicas(redis_url: str, clock: FakeClock) -> AsyncIterator[list[CompileBudget]]:
    """Two guard replicas' budgets, their tenant buckets in one Redis."""
    prefix = f"test:gc:{uuid.uuid4().hex[:8]}:"
    pair = [
        CompileBudget(
            RedisRateLimiter(redis_url, key_prefix=prefix, op_timeout_s=10.0, clock=clock),
            clock=clock,
        )
        for _ in range(2)
    ]
    yield pair
    for budget in pair:
        await budget.aclose()


async def test_redis_shares_the_tenant_bucket_between_replicas(
    replicas: list[CompileBudget], clock: FakeClock
) -> None:
    one, two = replicas
    assert await one.admit("flood", [schema(1)], SMALL, CAPS) == 3.0
    assert await two.admit("flood", [schema(2)], SMALL, CAPS) == 3.0
    assert await one.admit("flood", [schema(3)], SMALL, CAPS) == 3.0
    # 9 s of a 10 s bucket spent across both replicas: the next is refused on either
    assert code(await outcome(two, "flood", [schema(4)])) == BUDGET_EXHAUSTED
    assert code(await outcome(one, "flood", [schema(5)])) == BUDGET_EXHAUSTED
    assert await two.admit("benign", [schema(6)], SMALL, CAPS) == 3.0
    # the LRU stays per replica: what one admitted is cold on the other
    assert one.seen(schema(1).key) and not two.seen(schema(1).key)
    # refills by the shared clock
    clock.advance(60.0)
    assert await two.admit("flood", [schema(4)], SMALL, CAPS) == 3.0


async def test_a_refusal_by_a_global_cap_refunds_the_shared_bucket(
    replicas: list[CompileBudget], clock: FakeClock
) -> None:
    one, two = replicas
    caps = CompileCaps(workers=2, queue_s=5.0, per_s=100.0, cache_mb=512.0)
    await one.admit("a", [schema(1, s=5.0)], SMALL, caps)
    # a's half of the pool is taken: refused, and its 5 s given back
    assert code(await outcome(one, "a", [schema(2, s=5.0)], SMALL, caps)) == BUDGET_EXHAUSTED
    assert await two.admit("a", [schema(2, s=5.0)], SMALL, caps) == 5.0
    await one.admit("b", [schema(3, s=1.0)], SMALL, caps)
    assert code(await outcome(one, "c", [schema(4, s=4.5)], SMALL, caps)) == POOL_BUSY
    # c's 4.5 s were given back: after 5 s (its bucket refilled by 0.5 s, the pools whole) its
    # whole 10 s are there on the other replica
    clock.advance(5.0)
    assert await two.admit("c", [schema(5, s=10.0)], SMALL, caps) == 10.0


# ---- through the gateway ------------------------------------------------------------------------

KEYS = """
limits: {guided: {upstream_compile_workers: 64, max_cold_compiles_per_s: 100}}
keys:
  - {key: sk-flood-key-000001, tenant: flood, rate: {guided_compile_burst_s: 10}}
  - {key: sk-benign-key-00001, tenant: benign, rate: {guided_compile_burst_s: 10}}
"""


def _chat(schema_: dict[str, Any]) -> dict[str, Any]:
    return {
        "model": "m",
        "max_tokens": 8,
        "messages": [{"role": "user", "content": "Answer."}],
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "out", "schema": schema_},
        },
    }


def _person(i: int) -> dict[str, Any]:
    # a name of maxLength 100: ~2.6 s estimated on xgrammar at cl100k's 100,277 tokens
    return {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 100},
            f"field_{i}": {"type": "integer"},
        },
        "required": ["name"],
    }


async def _send(gw: Any, key: str, body: dict[str, Any]) -> tuple[int, str | None]:
    return await admit_and_reserve(gw, key, json.dumps(body).encode())


async def test_the_gateway_charges_cold_constraints_per_tenant(clock: FakeClock) -> None:
    from guard.gateway import build_gateway
    from guard.policy import policy_from_yaml

    policy = policy_from_yaml(KEYS)
    gw = build_gateway(policy, upstream=None)
    gw.compile_budget = CompileBudget(clock=clock)
    flood, benign = "sk-flood-key-000001", "sk-benign-key-00001"
    # the benign tenant warms its schema once, then repeats it for free
    assert await _send(gw, benign, _chat(_person(0))) == (200, None)
    charged = gw.compile_budget.metrics.charged_ms
    assert 2000 < charged < 3000
    # the flood: unique schemas at 20 a second, refused once its 10 s are spent
    got = []
    for i in range(1, 21):
        got.append(await _send(gw, flood, _chat(_person(i))))
        clock.advance(0.05)
    # three out of the burst, one more from the second's refill (1 s a second), the rest 429
    assert got[:3] == [(200, None)] * 3 and got.count((200, None)) == 4
    assert got.count((429, BUDGET_EXHAUSTED)) == 16
    assert gw.compile_budget.metrics.charged_ms - charged <= 10_000 + 1_000
    for _ in range(20):
        assert await _send(gw, benign, _chat(_person(0))) == (200, None)
    assert gw.compile_budget.metrics.warm == 20
    # over the per-constraint ceiling: 400, whatever the bucket holds
    huge = {
        "type": "object",
        "properties": {f"p{i}": {"type": "string", "maxLength": 101 + i} for i in range(12)},
    }
    assert await _send(gw, benign, _chat(huge)) == (400, "guided_backend_cost_exceeded")


# ---- over HTTP: the error bodies ---------------------------------------------------------------


async def test_the_refusals_over_http_are_openai_errors_with_retry_after() -> None:
    import httpx

    from guard.app import create_app
    from guard.policy import policy_from_yaml
    from tests._guard_harness import fake_upstream, serve

    key = "sk-small-compile-key-1"
    policy = policy_from_yaml(
        f"keys: [{{key: {key}, tenant: small, rate: "
        "{guided_compile_burst_s: 3, guided_compile_s_per_minute: 0.06}}]"
    )
    headers = {"authorization": f"Bearer {key}"}
    async with fake_upstream() as fake:
        app = create_app(policy, upstream_url=fake.url)  # refilled 1 ms a second: no waiting
        async with serve(app) as url, httpx.AsyncClient(base_url=url, timeout=10) as client:
            first = await client.post(
                "/v1/chat/completions", json=_chat(_person(1)), headers=headers
            )
            assert first.status_code == 200, first.text
            again = await client.post(
                "/v1/chat/completions", json=_chat(_person(1)), headers=headers
            )
            assert again.status_code == 200  # an exact repeat: free
            other = await client.post(
                "/v1/chat/completions", json=_chat(_person(2)), headers=headers
            )
            assert other.status_code == 429
            error = other.json()["error"]
            assert error["code"] == BUDGET_EXHAUSTED and error["type"] == "rate_limit_error"
            assert int(other.headers["retry-after"]) >= 1
            costly = {
                "type": "object",
                "properties": {
                    f"p{i}": {"type": "string", "maxLength": 101 + i} for i in range(12)
                },
            }
            over = await client.post("/v1/chat/completions", json=_chat(costly), headers=headers)
            assert over.status_code == 400
            assert over.json()["error"]["code"] == "guided_backend_cost_exceeded"
            assert "ceiling of 10 s" in over.json()["error"]["message"]
            metrics = app.state.metrics.render().decode()
    assert len(fake.received) == 2
    assert 'schedguard_guard_guided_compile_events_total{event="refused_budget"} 1.0' in metrics
