"""Token-bucket rate limits in memory: bucket math, reservation and reconciliation, headers.

Time is a fake clock stepped by the tests; nothing sleeps.
"""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from guard.admission import (
    MemoryRateLimiter,
    RateLimiterMetrics,
    RateLimits,
    Reservation,
    make_rate_limiter,
)
from guard.admission._buckets import format_duration
from guard.errors import LimitExceeded, RateLimited
from tests._support import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1000.0)


@pytest.fixture
def limiter(clock: FakeClock) -> MemoryRateLimiter:
    return MemoryRateLimiter(clock=clock)


async def refused(
    limiter: MemoryRateLimiter, limits: RateLimits, *, tokens: int = 0, tenant: str = "t"
) -> RateLimited:
    with pytest.raises(RateLimited) as info:
        await limiter.reserve(tenant, limits=limits, tokens=tokens)
    return info.value


# --- bucket math -------------------------------------------------------------------------


async def test_request_bucket_allows_a_burst_then_refills_at_the_rate(
    limiter: MemoryRateLimiter, clock: FakeClock
) -> None:
    # One per second, burst of 60.
    limits = RateLimits(requests_per_minute=60, tokens_per_minute=None, burst=60)
    for _ in range(60):
        await limiter.reserve("t", limits=limits)
    err = await refused(limiter, limits)
    assert err.status == 429
    assert err.code == "rate_limited_requests"
    assert err.headers["retry-after"] == "1"
    assert err.headers["x-ratelimit-limit-requests"] == "60"
    assert err.headers["x-ratelimit-remaining-requests"] == "0"
    assert err.headers["x-ratelimit-reset-requests"] == "1m0s"
    clock.advance(0.5)
    err = await refused(limiter, limits)
    assert err.headers["retry-after"] == "1"  # 0.5 s, rounded up
    clock.advance(0.5)
    await limiter.reserve("t", limits=limits)
    await refused(limiter, limits)


async def test_burst_smaller_than_the_minute(limiter: MemoryRateLimiter, clock: FakeClock) -> None:
    limits = RateLimits(requests_per_minute=60, tokens_per_minute=None, burst=5)
    for _ in range(5):
        await limiter.reserve("t", limits=limits)
    await refused(limiter, limits)
    clock.advance(3600)  # a long idle time refills to the burst, not beyond
    for _ in range(5):
        await limiter.reserve("t", limits=limits)
    await refused(limiter, limits)


async def test_retry_after_is_the_refill_time_of_the_missing_tokens(
    limiter: MemoryRateLimiter, clock: FakeClock
) -> None:
    limits = RateLimits(requests_per_minute=None, tokens_per_minute=6000)  # 100 tokens per second
    await limiter.reserve("t", limits=limits, tokens=6000)
    err = await refused(limiter, limits, tokens=250)
    assert err.code == "rate_limited_tokens"
    assert err.headers["retry-after"] == "3"  # 2.5 s
    assert "2.5 s" in err.message
    clock.advance(2.4)
    await refused(limiter, limits, tokens=250)
    clock.advance(0.1)
    await limiter.reserve("t", limits=limits, tokens=250)


async def test_retry_after_waits_for_both_buckets(
    limiter: MemoryRateLimiter, clock: FakeClock
) -> None:
    limits = RateLimits(requests_per_minute=60, tokens_per_minute=600, burst=1)
    await limiter.reserve("t", limits=limits, tokens=600)
    # Requests refill in 1 s, tokens (100 at 10/s) in 10 s: tokens decide.
    with pytest.raises(RateLimited) as info:
        await limiter.reserve("t", limits=limits, tokens=100)
    assert info.value.code == "rate_limited_tokens"
    assert info.value.headers["retry-after"] == "10"
    clock.advance(10)
    await limiter.reserve("t", limits=limits, tokens=100)


async def test_a_refusal_charges_nothing(limiter: MemoryRateLimiter, clock: FakeClock) -> None:
    limits = RateLimits(requests_per_minute=10, tokens_per_minute=1000, burst=10)
    await limiter.reserve("t", limits=limits, tokens=900)
    for _ in range(20):
        await refused(limiter, limits, tokens=200)  # tokens refuse; requests are not charged
    for _ in range(9):
        await limiter.reserve("t", limits=limits, tokens=10)


async def test_clock_going_backwards_refills_nothing(
    limiter: MemoryRateLimiter, clock: FakeClock
) -> None:
    limits = RateLimits(requests_per_minute=60, tokens_per_minute=None, burst=2)
    await limiter.reserve("t", limits=limits)
    await limiter.reserve("t", limits=limits)
    clock.advance(-100)
    await refused(limiter, limits)
    clock.advance(101)
    await limiter.reserve("t", limits=limits)


async def test_tenants_have_separate_buckets(limiter: MemoryRateLimiter) -> None:
    limits = RateLimits(requests_per_minute=1, tokens_per_minute=None, burst=1)
    await limiter.reserve("a", limits=limits)
    await limiter.reserve("b", limits=limits)
    await refused(limiter, limits, tenant="a")


async def test_request_larger_than_the_bucket_is_a_400_not_a_429(
    limiter: MemoryRateLimiter,
) -> None:
    limits = RateLimits(requests_per_minute=None, tokens_per_minute=1000, token_burst=4000)
    with pytest.raises(LimitExceeded) as info:
        await limiter.reserve("t", limits=limits, tokens=4001)
    assert info.value.status == 400
    assert info.value.code == "request_exceeds_token_budget"
    assert info.value.param == "max_tokens"
    assert limiter.metrics.rejected_oversize == 1
    await limiter.reserve("t", limits=limits, tokens=4000)  # nothing was charged


async def test_unlimited_buckets_are_not_tracked(limiter: MemoryRateLimiter) -> None:
    reservation = await limiter.reserve(
        "t", limits=RateLimits(requests_per_minute=None, tokens_per_minute=None), tokens=10**9
    )
    assert reservation.headers == {}
    await limiter.reconcile(reservation, 5)
    assert limiter.metrics.tokens_refunded == 0


def test_limits_are_validated() -> None:
    with pytest.raises(ValueError, match="requests_per_minute"):
        RateLimits(requests_per_minute=0, tokens_per_minute=None)
    with pytest.raises(ValueError, match="token_burst"):
        RateLimits(requests_per_minute=None, tokens_per_minute=10, token_burst=-1)


# --- reservation and reconciliation ------------------------------------------------------


async def test_reconcile_refunds_the_unused_reservation(limiter: MemoryRateLimiter) -> None:
    limits = RateLimits(requests_per_minute=None, tokens_per_minute=3000)
    reservation = await limiter.reserve("t", limits=limits, tokens=1000)
    await limiter.reconcile(reservation, 200)
    assert limiter.metrics.tokens_refunded == 800
    await limiter.reserve("t", limits=limits, tokens=2800)
    await refused(limiter, limits, tokens=1)


async def test_reconcile_charges_an_overshoot_as_debt(
    limiter: MemoryRateLimiter, clock: FakeClock
) -> None:
    limits = RateLimits(
        requests_per_minute=None, tokens_per_minute=6000, token_burst=1000
    )  # 100 tokens per second
    reservation = await limiter.reserve("t", limits=limits, tokens=100)
    await limiter.reconcile(reservation, 1100)  # the upstream used more than reserved
    assert limiter.metrics.tokens_overshoot == 1000
    err = await refused(limiter, limits, tokens=1)
    assert err.headers["retry-after"] == "2"  # 101 tokens at 100/s: 1.01 s
    assert err.headers["x-ratelimit-remaining-tokens"] == "0"
    clock.advance(1.01)
    await limiter.reserve("t", limits=limits, tokens=1)


async def test_release_refunds_requests_and_tokens(limiter: MemoryRateLimiter) -> None:
    limits = RateLimits(requests_per_minute=1, tokens_per_minute=100, burst=1)
    reservation = await limiter.reserve("t", limits=limits, tokens=100)
    await limiter.release(reservation)
    assert reservation.settled
    await limiter.reserve("t", limits=limits, tokens=100)


async def test_a_reservation_settles_once(limiter: MemoryRateLimiter) -> None:
    limits = RateLimits(requests_per_minute=5, tokens_per_minute=1000, burst=5)
    reservation = await limiter.reserve("t", limits=limits, tokens=500)
    await limiter.reconcile(reservation, 100)
    await limiter.reconcile(reservation, 0)
    await limiter.release(reservation)
    assert limiter.metrics.tokens_refunded == 400
    await limiter.reserve("t", limits=limits, tokens=900)
    await refused(limiter, limits, tokens=1)


async def test_reserving_up_front_stops_a_concurrent_burst_from_overshooting(
    limiter: MemoryRateLimiter,
) -> None:
    # Twenty requests of 100 prompt + 400 output tokens arrive together against 2000 tokens per
    # minute. Charging after the response would let all twenty through (10,000 tokens).
    limits = RateLimits(requests_per_minute=None, tokens_per_minute=2000)

    async def one() -> Reservation | RateLimited:
        try:
            return await limiter.reserve("t", limits=limits, tokens=500)
        except RateLimited as err:
            return err

    results = await asyncio.gather(*(one() for _ in range(20)))
    granted = [r for r in results if isinstance(r, Reservation)]
    assert len(granted) == 4
    for reservation in granted:  # each used only 100 output tokens
        await limiter.reconcile(reservation, 200)
    for _ in range(6):  # 4 x 300 refunded: room for 1200 more
        await limiter.reserve("t", limits=limits, tokens=200)
    await refused(limiter, limits, tokens=200)


async def test_success_headers_show_what_is_left(limiter: MemoryRateLimiter) -> None:
    limits = RateLimits(requests_per_minute=10, tokens_per_minute=6000, burst=10)
    reservation = await limiter.reserve("t", limits=limits, tokens=150)
    assert reservation.headers == {
        "x-ratelimit-limit-requests": "10",
        "x-ratelimit-remaining-requests": "9",
        "x-ratelimit-reset-requests": "6s",
        "x-ratelimit-limit-tokens": "6000",
        "x-ratelimit-remaining-tokens": "5850",
        "x-ratelimit-reset-tokens": "1.5s",
    }


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.0, "0ms"), (0.0201, "21ms"), (1.5, "1.5s"), (59.9999, "60s"), (60, "1m0s"), (361, "6m1s")],
)
def test_duration_format(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


# --- memory, metrics ---------------------------------------------------------------------


async def test_idle_tenants_are_forgotten(limiter: MemoryRateLimiter, clock: FakeClock) -> None:
    limits = RateLimits(requests_per_minute=60, tokens_per_minute=60_000, burst=60)
    for i in range(1500):
        await limiter.reserve(f"tenant-{i}", limits=limits, tokens=1000)
    assert len(limiter) == 1500
    clock.advance(61)  # every bucket is full again: as good as never used
    for _ in range(1100):
        await limiter.reserve(
            "busy",
            limits=RateLimits(requests_per_minute=10_000, tokens_per_minute=None, burst=10_000),
        )
    assert len(limiter) <= 2


async def test_metrics_count_and_call_the_listener(clock: FakeClock) -> None:
    events: list[tuple[str, str, float]] = []
    metrics = RateLimiterMetrics(listener=lambda *event: events.append(event))
    limiter = MemoryRateLimiter(clock=clock, metrics=metrics)
    limits = RateLimits(requests_per_minute=1, tokens_per_minute=100, burst=1)
    reservation = await limiter.reserve("t", limits=limits, tokens=40)
    await refused(limiter, limits)
    await limiter.reconcile(reservation, 30)
    assert metrics.snapshot() == {
        "allowed": 1,
        "rejected_requests": 1,
        "rejected_tokens": 0,
        "rejected_oversize": 0,
        "tokens_reserved": 40,
        "tokens_refunded": 10,
        "tokens_overshoot": 0,
        "backend_errors": 0,
        "fail_open": 0,
        "fail_closed": 0,
        "settle_errors": 0,
    }
    assert events == [
        ("allowed", "t", 1.0),
        ("tokens_reserved", "t", 40.0),
        ("rejected_requests", "t", 1.0),
        ("tokens_refunded", "t", 10.0),
    ]


def test_make_rate_limiter_defaults_to_memory() -> None:
    assert isinstance(make_rate_limiter(None), MemoryRateLimiter)


# --- the invariant, under arbitrary traffic ----------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    steps=st.lists(
        st.tuples(st.floats(0, 5), st.integers(1, 400), st.integers(0, 400)), max_size=60
    )
)
def test_never_more_than_burst_plus_refill(steps: list[tuple[float, int, int]]) -> None:
    """Over any run, tokens charged (after reconciliation) <= burst + rate x elapsed + debt."""
    clock = FakeClock(0.0)
    limiter = MemoryRateLimiter(clock=clock)
    limits = RateLimits(
        requests_per_minute=None, tokens_per_minute=1200, token_burst=500
    )  # 20 tokens per second

    async def run() -> None:
        charged = 0
        for dt, reserve, used in steps:
            clock.advance(dt)
            try:
                reservation = limiter.reserve_nowait("t", limits=limits, tokens=reserve)
            except RateLimited as err:
                assert int(err.headers["retry-after"]) >= 1
                continue
            # Overshoot is charged as debt and must be repaid before the next grant.
            await limiter.reconcile(reservation, used)
            charged += used
            assert charged <= 500 + 20 * clock.now + max(0, used - reserve) + 1e-6

    asyncio.run(run())
