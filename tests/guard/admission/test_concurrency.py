"""Concurrency limits: per key and global, bounded FIFO queue, timeout, cancellation.

Tasks are stepped with ``asyncio.sleep(0)`` until the limiter reaches the state under test; the
only real waits are the queue timeouts themselves (tens of milliseconds).
"""

from __future__ import annotations

import asyncio
import random

import pytest

from guard.admission import ConcurrencyLimiter, ConcurrencyLimits, ConcurrencyMetrics
from guard.errors import GuardError, Overloaded, RateLimited
from tests._support import until


class Holder:
    """A request that holds its slot until told to finish."""

    def __init__(
        self,
        limiter: ConcurrencyLimiter,
        tenant: str,
        log: list[str] | None = None,
        label: str | None = None,
    ) -> None:
        self.label = label or tenant
        self.done = asyncio.Event()
        self.entered = asyncio.Event()
        self.limiter = limiter
        self.tenant = tenant
        self.log = log
        self.task = asyncio.create_task(self.run())

    async def run(self) -> None:
        async with self.limiter.slot(self.tenant):
            self.entered.set()
            if self.log is not None:
                self.log.append(self.label)
            await self.done.wait()


def assert_idle(limiter: ConcurrencyLimiter) -> None:
    assert limiter.in_flight == 0
    assert limiter.waiting == 0
    assert limiter.tracked_keys() == 0
    if limiter._global is not None:
        assert limiter._global.active == 0
        assert not limiter._global.queued


def per_key(n: int, queued: int = 0) -> ConcurrencyLimits:
    return ConcurrencyLimits(max_concurrent=n, max_queued=queued)


async def test_slots_are_counted_and_released() -> None:
    limiter = ConcurrencyLimiter(per_key=per_key(2), global_max_concurrent=3)
    async with limiter.slot("a") as first:
        assert first.waited_s == 0.0
        async with limiter.slot("a"):
            assert limiter.in_flight == 2
            assert limiter.tracked_keys() == 1
    assert_idle(limiter)
    assert limiter.metrics.admitted == 2


async def test_an_exception_in_the_body_releases_the_slot() -> None:
    limiter = ConcurrencyLimiter(per_key=per_key(1))
    with pytest.raises(ZeroDivisionError):
        async with limiter.slot("a"):
            1 / 0  # noqa: B018
    assert_idle(limiter)


async def test_key_queue_full_is_a_429_with_retry_after() -> None:
    limiter = ConcurrencyLimiter(per_key=per_key(1, queued=1), queue_timeout_s=30)
    holder = Holder(limiter, "a")
    await holder.entered.wait()
    waiter = Holder(limiter, "a")
    await until(lambda: limiter.waiting == 1)
    with pytest.raises(RateLimited) as info:
        async with limiter.slot("a"):
            pass
    assert info.value.status == 429
    assert info.value.code == "concurrency_limited"
    assert int(info.value.headers["retry-after"]) >= 1
    async with limiter.slot("b"):  # another key is not affected
        pass
    holder.done.set()
    await waiter.entered.wait()
    waiter.done.set()
    await asyncio.gather(holder.task, waiter.task)
    assert_idle(limiter)
    assert limiter.metrics.queue_full == 1
    assert limiter.metrics.waited == 1


async def test_no_queue_refuses_at_once() -> None:
    limiter = ConcurrencyLimiter(per_key=per_key(1, queued=5), queue_timeout_s=0)
    async with limiter.slot("a"):
        with pytest.raises(RateLimited, match="queue is full"):
            async with limiter.slot("a"):
                pass
    assert_idle(limiter)


async def test_global_queue_full_is_a_503_server_busy() -> None:
    limiter = ConcurrencyLimiter(global_max_concurrent=2, global_max_queued=0, queue_timeout_s=5)
    holders = [Holder(limiter, f"t{i}") for i in range(2)]
    await asyncio.gather(*(h.entered.wait() for h in holders))
    with pytest.raises(Overloaded) as info:
        async with limiter.slot("t9"):
            pass
    assert info.value.status == 503
    assert info.value.code == "server_busy"
    assert "retry-after" in info.value.headers
    for h in holders:
        h.done.set()
    await asyncio.gather(*(h.task for h in holders))
    assert_idle(limiter)
    assert limiter.metrics.global_queue_full == 1


async def test_waiting_times_out_with_429_for_the_key() -> None:
    limiter = ConcurrencyLimiter(per_key=per_key(1, queued=4), queue_timeout_s=0.05)
    async with limiter.slot("a"):
        with pytest.raises(RateLimited, match=r"within 0\.05 s") as info:
            async with limiter.slot("a"):
                pass
        assert info.value.code == "concurrency_limited"
        assert limiter.waiting == 0
    assert_idle(limiter)
    assert limiter.metrics.timeout == 1


async def test_waiting_times_out_with_503_for_the_global_limit() -> None:
    limiter = ConcurrencyLimiter(
        per_key=per_key(5), global_max_concurrent=1, global_max_queued=4, queue_timeout_s=0.05
    )
    async with limiter.slot("a"):
        with pytest.raises(Overloaded) as info:
            async with limiter.slot("b"):
                pass
        assert info.value.code == "server_busy"
        assert limiter.tracked_keys() == 1  # b's key slot was given back
    assert_idle(limiter)
    assert limiter.metrics.global_timeout == 1


async def test_waiters_are_served_first_come_first_served() -> None:
    limiter = ConcurrencyLimiter(global_max_concurrent=1, global_max_queued=10, queue_timeout_s=30)
    order: list[str] = []
    first = Holder(limiter, "first", order)
    await first.entered.wait()
    waiters = []
    for i in range(6):
        waiters.append(Holder(limiter, f"w{i}", order))
        await until(lambda n=i + 1: limiter.waiting == n)
    first.done.set()
    for w in waiters:
        await w.entered.wait()
        # A newcomer arriving now must queue behind the remaining waiters.
        w.done.set()
    await asyncio.gather(first.task, *(w.task for w in waiters))
    assert order == ["first", *(f"w{i}" for i in range(6))]
    assert_idle(limiter)


async def test_a_newcomer_does_not_jump_the_queue() -> None:
    limiter = ConcurrencyLimiter(per_key=per_key(1, queued=5), queue_timeout_s=30)
    order: list[str] = []
    holder = Holder(limiter, "a", order, "holder")
    await holder.entered.wait()
    queued = Holder(limiter, "a", order, "queued")
    await until(lambda: limiter.waiting == 1)
    holder.done.set()
    await holder.task  # the slot went to `queued`; it has not run yet
    late = Holder(limiter, "a", order, "late")
    await queued.entered.wait()
    queued.done.set()
    await late.entered.wait()
    late.done.set()
    await asyncio.gather(queued.task, late.task)
    assert order == ["holder", "queued", "late"]
    assert limiter.metrics.waited == 2


async def test_cancelling_a_waiter_removes_it() -> None:
    limiter = ConcurrencyLimiter(per_key=per_key(1, queued=1), queue_timeout_s=30)
    holder = Holder(limiter, "a")
    await holder.entered.wait()
    waiter = Holder(limiter, "a")
    await until(lambda: limiter.waiting == 1)
    waiter.task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter.task
    assert limiter.waiting == 0
    assert not limiter._keys["a"].waiters
    replacement = Holder(limiter, "a")  # the queue place is free again
    await until(lambda: limiter.waiting == 1)
    holder.done.set()
    await replacement.entered.wait()
    replacement.done.set()
    await asyncio.gather(holder.task, replacement.task)
    assert_idle(limiter)
    assert limiter.metrics.cancelled == 1


async def test_a_slot_handed_to_a_cancelled_waiter_is_passed_on() -> None:
    limiter = ConcurrencyLimiter(per_key=per_key(1, queued=5), queue_timeout_s=30)
    held = limiter.slot("a")
    await held.__aenter__()
    doomed, next_in_line = Holder(limiter, "a"), Holder(limiter, "a")
    await until(lambda: limiter.waiting == 2)
    # Neither call yields: the slot is handed to `doomed`, which is cancelled before it runs.
    await held.__aexit__(None, None, None)
    doomed.task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await doomed.task
    assert not doomed.entered.is_set()
    assert limiter.metrics.cancelled == 1
    await next_in_line.entered.wait()
    next_in_line.done.set()
    await next_in_line.task
    assert_idle(limiter)


async def test_cancelling_a_global_waiter_gives_back_its_key_slot() -> None:
    limiter = ConcurrencyLimiter(
        per_key=per_key(1, queued=5), global_max_concurrent=1, global_max_queued=5,
        queue_timeout_s=30,
    )  # fmt: skip
    holder = Holder(limiter, "a")
    await holder.entered.wait()
    waiter = Holder(limiter, "b")
    await until(lambda: limiter.waiting == 1)
    assert limiter._keys["b"].active == 1  # b holds its key slot while queued globally
    waiter.task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter.task
    assert "b" not in limiter._keys
    holder.done.set()
    await holder.task
    assert_idle(limiter)


async def test_one_tenant_cannot_fill_the_global_queue() -> None:
    limiter = ConcurrencyLimiter(
        per_key=per_key(1, queued=10), global_max_concurrent=1, global_max_queued=2,
        queue_timeout_s=30,
    )  # fmt: skip
    holder = Holder(limiter, "other")
    await holder.entered.wait()
    flood = [Holder(limiter, "flood") for _ in range(5)]
    await until(lambda: limiter.waiting == 5)
    assert limiter._global is not None
    assert limiter._global.queued == 1  # the rest wait in the key's own queue
    polite = Holder(limiter, "polite")  # still finds room in the global queue
    await until(lambda: limiter.waiting == 6)
    holder.done.set()
    for h in flood:
        h.done.set()
    polite.done.set()
    await asyncio.gather(holder.task, polite.task, *(h.task for h in flood))
    assert_idle(limiter)


async def test_raising_a_key_limit_admits_waiters() -> None:
    limiter = ConcurrencyLimiter(per_key=per_key(1, queued=5), queue_timeout_s=30)
    holder = Holder(limiter, "a")
    await holder.entered.wait()
    waiter = Holder(limiter, "a")
    await until(lambda: limiter.waiting == 1)
    async with limiter.slot("a", per_key(3, queued=5)):  # a policy reload raised the limit
        await waiter.entered.wait()
        assert limiter.in_flight == 3
    holder.done.set()
    waiter.done.set()
    await asyncio.gather(holder.task, waiter.task)
    assert_idle(limiter)


async def test_listener_sees_waits_and_refusals() -> None:
    events: list[tuple[str, str, float]] = []
    metrics = ConcurrencyMetrics(listener=lambda *event: events.append(event))
    limiter = ConcurrencyLimiter(per_key=per_key(1), metrics=metrics)
    async with limiter.slot("a"):
        with pytest.raises(RateLimited):
            async with limiter.slot("a"):
                pass
    assert [(name, tenant) for name, tenant, _ in events] == [
        ("admitted", "a"),
        ("work", "a"),
        ("queue_full", "a"),
    ]
    assert metrics.snapshot()["admitted"] == 1


def test_limits_are_validated() -> None:
    with pytest.raises(ValueError, match="max_concurrent"):
        ConcurrencyLimits(max_concurrent=0)
    with pytest.raises(ValueError, match="max_queued"):
        ConcurrencyLimiter(global_max_concurrent=1, global_max_queued=-1)
    with pytest.raises(ValueError, match="queue_timeout_s"):
        ConcurrencyLimiter(queue_timeout_s=-1)


async def test_random_traffic_with_cancellations_leaks_nothing() -> None:
    rng = random.Random(1234)
    limiter = ConcurrencyLimiter(
        per_key=per_key(2, queued=3), global_max_concurrent=4, global_max_queued=6,
        queue_timeout_s=30,
    )  # fmt: skip
    peak = 0
    outcomes: dict[str, int] = {}

    async def request(tenant: str, hold_steps: int) -> None:
        nonlocal peak
        try:
            async with limiter.slot(tenant):
                peak = max(peak, limiter.in_flight)
                for _ in range(hold_steps):
                    await asyncio.sleep(0)
            outcomes["ok"] = outcomes.get("ok", 0) + 1
        except GuardError as err:
            outcomes[err.code] = outcomes.get(err.code, 0) + 1

    tasks = []
    for _ in range(300):
        tasks.append(asyncio.create_task(request(f"t{rng.randrange(4)}", rng.randrange(30))))
        if rng.random() < 0.3:
            rng.choice(tasks).cancel()
        for _ in range(rng.randrange(3)):
            await asyncio.sleep(0)
    await asyncio.gather(*tasks, return_exceptions=True)
    assert peak <= 4
    assert outcomes["ok"] > 50
    assert outcomes.get("concurrency_limited", 0) + outcomes.get("server_busy", 0) > 0
    assert_idle(limiter)
