"""Rate limits shared through Redis: the same math as in memory, one limit across limiter
instances under concurrent load, key expiry, and failing closed or open when Redis goes away.

Each test starts from a private redis-server (tests/_redis_server.py); without the binary these
tests skip, or fail under CI=true. Scenarios that step time pass a fake clock to the scripts;
the shared-limit tests use Redis's own TIME.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest

from guard.admission import (
    MemoryRateLimiter,
    RateLimiter,
    RateLimits,
    RedisRateLimiter,
    Reservation,
    make_rate_limiter,
)
from guard.errors import GuardError, LimitExceeded, Overloaded, RateLimited
from tests._redis_server import RedisServer, require_binary
from tests._support import FakeClock


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    """One server for the tests that leave it running; each test uses its own key prefix."""
    with RedisServer(require_binary()) as srv:
        yield srv


@pytest.fixture
def private_server() -> Iterator[RedisServer]:
    """A server the test may stop, pause or restart."""
    with RedisServer(require_binary()) as srv:
        yield srv


# Tests of what is charged, not of how fast: a generous per-operation timeout, so that a loaded
# CI machine (100 concurrent scripts at once) is not mistaken for a Redis failure.
PATIENT = 10.0


@pytest.fixture
def prefix() -> str:
    return f"test:{uuid.uuid4().hex[:8]}:"


@pytest.fixture
async def limiters(server: RedisServer, prefix: str) -> AsyncIterator[list[RedisRateLimiter]]:
    """Two independent limiters (two connection pools: two replicas) on the same Redis."""
    pair = [RedisRateLimiter(server.url, key_prefix=prefix, op_timeout_s=PATIENT) for _ in range(2)]
    yield pair
    for limiter in pair:
        await limiter.aclose()


async def attempt(
    limiter: RateLimiter, limits: RateLimits, tokens: int = 0, tenant: str = "t"
) -> Reservation | GuardError:
    try:
        return await limiter.reserve(tenant, limits=limits, tokens=tokens)
    except GuardError as err:
        return err


# --- the shared limit ---------------------------------------------------------------------


async def test_two_replicas_enforce_one_request_limit(limiters: list[RedisRateLimiter]) -> None:
    # Burst 30, refilling one request per minute: nothing refills during the test.
    limits = RateLimits(requests_per_minute=1, tokens_per_minute=None, burst=30)
    results = await asyncio.gather(
        *(attempt(limiters[i % 2], limits) for i in range(100))  # 2 x 50, interleaved
    )
    granted = [r for r in results if isinstance(r, Reservation)]
    refused = [r for r in results if isinstance(r, RateLimited)]
    assert len(granted) == 30
    assert len(refused) == 70
    assert {r.code for r in refused} == {"rate_limited_requests"}
    assert all(int(r.headers["retry-after"]) >= 59 for r in refused)
    assert sum(lim.metrics.allowed for lim in limiters) == 30


async def test_two_replicas_enforce_one_token_limit(limiters: list[RedisRateLimiter]) -> None:
    limits = RateLimits(requests_per_minute=None, tokens_per_minute=1, token_burst=3000)
    results = await asyncio.gather(*(attempt(limiters[i % 2], limits, 100) for i in range(100)))
    granted = [r for r in results if isinstance(r, Reservation)]
    assert len(granted) == 30
    # A refund on one replica is visible to the other.
    await limiters[0].reconcile(granted[0], 0)
    assert isinstance(await attempt(limiters[1], limits, 100), Reservation)
    assert isinstance(await attempt(limiters[0], limits, 100), RateLimited)


# --- same math as in memory -----------------------------------------------------------------

# (clock advance in s, tokens to reserve, tokens the upstream reports, or None: release)
SCENARIO: list[tuple[float, int, int | None]] = [
    (0, 900, 100),  # refund 800
    (0, 900, 900),  # tokens empty
    (0.5, 300, 0),  # 429 tokens: 50 there, 2.5 s to wait
    (2.5, 300, 700),  # granted, then 400 overshoot: the bucket owes 400
    (0, 1, 0),  # 429 tokens: 4.01 s to repay the debt
    (4.02, 1, None),  # granted, released
    *[(0, 0, 0)] * 4,  # four requests at once empty the request bucket (burst 4)...
    (0, 0, 0),  # ...so 429 requests
    (0, 2000, None),  # over the token burst: 400, whatever the buckets hold
    (60, 1000, 1000),
    (0, 1, 1),  # 429 tokens
]


async def run_scenario(limiter: RateLimiter, clock: FakeClock) -> list[object]:
    limits = RateLimits(requests_per_minute=120, tokens_per_minute=6000, burst=4, token_burst=1000)  # fmt: skip
    seen: list[object] = []
    for advance, reserve, used in SCENARIO:
        clock.now += advance
        outcome = await attempt(limiter, limits, reserve)
        if isinstance(outcome, Reservation):
            seen.append(("ok", outcome.headers))
            if used is None:
                await limiter.release(outcome)
            else:
                await limiter.reconcile(outcome, used)
        else:
            assert isinstance(outcome, GuardError)
            seen.append((outcome.status, outcome.code, outcome.headers))
    return seen


async def test_redis_and_memory_agree_step_by_step(server: RedisServer, prefix: str) -> None:
    redis_clock, memory_clock = FakeClock(), FakeClock()
    redis_limiter = RedisRateLimiter(
        server.url, key_prefix=prefix, clock=redis_clock, op_timeout_s=PATIENT
    )
    try:
        from_redis = await run_scenario(redis_limiter, redis_clock)
    finally:
        await redis_limiter.aclose()
    from_memory = await run_scenario(MemoryRateLimiter(clock=memory_clock), memory_clock)
    assert from_redis == from_memory
    codes = [step[0] if step[0] == "ok" else step[1] for step in from_memory]  # type: ignore[index]
    assert codes == [
        "ok", "ok", "rate_limited_tokens", "ok", "rate_limited_tokens", "ok",
        "ok", "ok", "ok", "ok", "rate_limited_requests", "request_exceeds_token_budget",
        "ok", "rate_limited_tokens",
    ]  # fmt: skip
    assert from_memory[4][2]["retry-after"] == "5"  # type: ignore[index]


async def test_reconcile_and_release_through_redis(server: RedisServer, prefix: str) -> None:
    clock = FakeClock()
    limiter = RedisRateLimiter(server.url, key_prefix=prefix, clock=clock, op_timeout_s=PATIENT)
    limits = RateLimits(requests_per_minute=2, tokens_per_minute=1000, burst=2)
    try:
        first = await limiter.reserve("t", limits=limits, tokens=800)
        await limiter.reconcile(first, 300)  # refund 500
        second = await limiter.reserve("t", limits=limits, tokens=700)
        assert second.headers["x-ratelimit-remaining-tokens"] == "0"
        assert second.headers["x-ratelimit-remaining-requests"] == "0"
        await limiter.release(second)  # refunds the request too
        third = await limiter.reserve("t", limits=limits, tokens=100)
        await limiter.reconcile(third, 700)  # overshoot: 600 more, the bucket goes into debt
        err = await attempt(limiter, limits, 1)
        assert isinstance(err, RateLimited)
        assert err.code == "rate_limited_requests"  # the request bucket is empty too
        assert limiter.metrics.tokens_refunded == 1200
        assert limiter.metrics.tokens_overshoot == 600
        oversized = await attempt(limiter, limits, 1001)
        assert isinstance(oversized, LimitExceeded)
        assert oversized.code == "request_exceeds_token_budget"
    finally:
        await limiter.aclose()


async def test_keys_expire_once_the_buckets_would_be_full(server: RedisServer, prefix: str) -> None:
    limiter = RedisRateLimiter(server.url, key_prefix=prefix, op_timeout_s=PATIENT)  # Redis TIME
    limits = RateLimits(requests_per_minute=600, tokens_per_minute=60_000, burst=600)
    try:
        await limiter.reserve("t", limits=limits, tokens=30_000)  # full again in 30 s
        ttl_ms = await limiter._client.pttl(limiter.key("t"))
        assert 30_000 < ttl_ms <= 31_000
        await limiter.reserve(
            "idle",
            limits=RateLimits(requests_per_minute=60_000, tokens_per_minute=None, burst=60_000),
        )
        ttl_ms = await limiter._client.pttl(limiter.key("idle"))
        assert 0 < ttl_ms <= 1_001
    finally:
        await limiter.aclose()


async def test_redis_time_refills(server: RedisServer, prefix: str) -> None:
    """With Redis's clock, a bucket refills in real time (60,000 per minute: 1 per ms)."""
    limiter = RedisRateLimiter(server.url, key_prefix=prefix, op_timeout_s=PATIENT)
    limits = RateLimits(requests_per_minute=60_000, tokens_per_minute=None, burst=1)
    try:
        await limiter.reserve("t", limits=limits)
        deadline = time.monotonic() + 2
        while isinstance(await attempt(limiter, limits), RateLimited):
            assert time.monotonic() < deadline, "the bucket never refilled"
        assert await limiter.healthy()
    finally:
        await limiter.aclose()


# --- Redis failures --------------------------------------------------------------------------


async def test_fails_closed_when_redis_stops_and_recovers(private_server: RedisServer) -> None:
    limiter = RedisRateLimiter(private_server.url, on_error="closed")
    limits = RateLimits(requests_per_minute=100, tokens_per_minute=10_000, burst=100)
    try:
        before = await limiter.reserve("t", limits=limits, tokens=10)
        private_server.stop()
        started = time.monotonic()
        with pytest.raises(Overloaded) as info:
            await limiter.reserve("t", limits=limits, tokens=10)
        assert time.monotonic() - started < 5.0  # one refused connect, not redis-py's retries
        assert info.value.status == 503
        assert info.value.code == "rate_limiter_unavailable"
        assert info.value.headers["retry-after"] == "1"
        await limiter.reconcile(before, 5)  # settling during the outage: counted, not raised
        assert limiter.metrics.backend_errors == 2
        assert limiter.metrics.fail_closed == 1
        assert limiter.metrics.settle_errors == 1
        assert not await limiter.healthy()
        private_server.start()
        await limiter.reserve("t", limits=limits, tokens=10)  # the pool reconnects
        assert await limiter.healthy()
    finally:
        await limiter.aclose()


async def test_fails_open_when_redis_stops_and_counts_it(private_server: RedisServer) -> None:
    limiter = RedisRateLimiter(private_server.url, on_error="open")
    limits = RateLimits(requests_per_minute=1, tokens_per_minute=None, burst=1)
    try:
        await limiter.reserve("t", limits=limits)
        assert isinstance(await attempt(limiter, limits), RateLimited)
        private_server.stop()
        passed = [await limiter.reserve("t", limits=limits) for _ in range(3)]
        assert all(r.degraded and r.headers == {} for r in passed)
        for reservation in passed:  # nothing was charged, so nothing to settle
            await limiter.reconcile(reservation, 1000)
        assert limiter.metrics.fail_open == 3
        assert limiter.metrics.backend_errors == 3
        assert limiter.metrics.settle_errors == 0
    finally:
        await limiter.aclose()


async def test_a_hung_redis_costs_one_timeout(private_server: RedisServer) -> None:
    limiter = RedisRateLimiter(private_server.url, on_error="closed", op_timeout_s=0.2)
    limits = RateLimits(requests_per_minute=100, tokens_per_minute=None, burst=100)
    try:
        await limiter.reserve("t", limits=limits)
        private_server.pause()  # accepts nothing, answers nothing
        started = time.monotonic()
        results = await asyncio.gather(*(attempt(limiter, limits) for _ in range(10)))
        elapsed = time.monotonic() - started
        assert all(isinstance(r, Overloaded) for r in results)
        assert elapsed < 4.0  # one op timeout, not one per attempt (10 x 0.25 s)
        private_server.resume()
        await limiter.reserve("t", limits=limits)
    finally:
        private_server.resume()
        await limiter.aclose()


def test_make_rate_limiter_uses_redis_when_given_a_url(server: RedisServer) -> None:
    limiter = make_rate_limiter(server.url, on_error="open")
    assert isinstance(limiter, RedisRateLimiter)
    assert limiter.on_error == "open"
    with pytest.raises(ValueError, match="on_error"):
        RedisRateLimiter(server.url, on_error="sideways")  # type: ignore[arg-type]


# --- the fixture's contract with CI ------------------------------------------------------------


@pytest.mark.parametrize(
    ("ci", "outcome"), [("true", pytest.fail.Exception), ("", pytest.skip.Exception)]
)
def test_a_missing_redis_server_fails_in_ci_and_skips_elsewhere(
    monkeypatch: pytest.MonkeyPatch, ci: str, outcome: type[BaseException]
) -> None:
    monkeypatch.delenv("REDIS_SERVER_BIN", raising=False)
    monkeypatch.setattr("tests._redis_server.shutil.which", lambda name: None)
    monkeypatch.setenv("CI", ci)
    with pytest.raises(outcome, match="apt-get install -y redis-server"):
        require_binary()
