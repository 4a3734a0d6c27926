"""The global queue's fair share: a fake upstream of N slots on a fake clock.

Requests are tasks that take a slot from the limiter and hold it for ``work / RATE`` fake
seconds; the simulator moves the clock from one finish to the next and counts the work each
tenant got done. Nothing here sleeps: the assertions are about the order the gate chose.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from dataclasses import dataclass, field

import pytest

from guard.admission import ConcurrencyLimiter
from guard.errors import Overloaded
from tests._support import until

RATE = 1000.0  # tokens a slot serves per fake second
FAR = 1e9  # no request times out in the simulations


@dataclass
class Upstream:
    """N slots; each admitted request finishes ``work / RATE`` fake seconds after it started."""

    limiter: ConcurrencyLimiter
    now: float = 0.0
    done: dict[str, float] = field(default_factory=dict)  # work finished, by tenant
    waits: dict[str, list[float]] = field(default_factory=dict)
    _finishes: list[tuple[float, int, asyncio.Event]] = field(default_factory=list)
    _seq: itertools.count[int] = field(default_factory=itertools.count)
    _running: int = 0

    def submit(self, tenant: str, work: float, weight: float = 1.0) -> asyncio.Task[None]:
        return asyncio.create_task(self._request(tenant, work, weight))

    async def _request(self, tenant: str, work: float, weight: float) -> None:
        asked = self.now
        async with self.limiter.slot(tenant, flow=tenant, work=work, weight=weight):
            self.waits.setdefault(tenant, []).append(self.now - asked)
            finished = asyncio.Event()
            heapq.heappush(self._finishes, (self.now + work / RATE, next(self._seq), finished))
            self._running += 1
            await finished.wait()
            self._running -= 1
            self.done[tenant] = self.done.get(tenant, 0.0) + work

    async def settle(self) -> None:
        """Let every task run until none can make progress without the clock moving."""
        for _ in range(50):
            await asyncio.sleep(0)

    async def run_until(self, end: float) -> None:
        await self.settle()
        while self._finishes and self._finishes[0][0] <= end:
            self.now, _, finished = heapq.heappop(self._finishes)
            finished.set()
            await self.settle()
        self.now = end


def limiter(slots: int, queue: int = 10_000) -> ConcurrencyLimiter:
    return ConcurrencyLimiter(
        global_max_concurrent=slots, global_max_queued=queue, queue_timeout_s=FAR
    )


async def test_a_flood_of_long_requests_gets_half_not_all() -> None:
    """Both tenants backlogged, equal weights: each gets about half of the upstream's work,
    although the flood queued first and its requests are ten times longer."""
    up = Upstream(limiter(4))
    tasks = [up.submit("flood", 2000.0) for _ in range(200)]
    await up.settle()
    tasks += [up.submit("chat", 200.0) for _ in range(400)]
    await up.run_until(40.0)
    flood, chat = up.done["flood"], up.done["chat"]
    assert abs(flood - chat) / (flood + chat) < 0.1, (flood, chat)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_weights_set_the_shares() -> None:
    up = Upstream(limiter(4))
    tasks = [up.submit("gold", 500.0, weight=3.0) for _ in range(300)]
    tasks += [up.submit("free", 500.0, weight=1.0) for _ in range(300)]
    await up.run_until(40.0)
    share = up.done["gold"] / (up.done["gold"] + up.done["free"])
    assert 0.7 < share < 0.8, share
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_an_ordinary_request_waits_for_one_slot_not_for_the_flood() -> None:
    """A tenant that sends one short request at a time behind a queued flood waits at most
    until the next slot is freed, never behind the flood's queue (FIFO would make it wait for
    all 64 long requests: 64 x 2 s / 4 slots)."""
    up = Upstream(limiter(4))
    flood = [up.submit("flood", 2000.0) for _ in range(64)]
    await up.settle()
    for second in range(0, 20, 2):
        await up.run_until(float(second) + 0.5)
        up.submit("chat", 100.0)
    await up.run_until(24.0)
    waits = up.waits["chat"]
    assert len(waits) == 10
    assert max(waits) <= 2000.0 / RATE  # one long request's service time at most
    for task in flood:
        task.cancel()
    await asyncio.gather(*flood, return_exceptions=True)


async def test_an_idle_tenant_banks_no_credit() -> None:
    """A tenant idle for a while does not come back with a lead that starves the other."""
    up = Upstream(limiter(2))
    busy = [up.submit("busy", 1000.0) for _ in range(100)]
    await up.run_until(20.0)  # 'late' was idle all this time
    late = [up.submit("late", 1000.0) for _ in range(100)]
    before = up.done["busy"]
    await up.run_until(30.0)
    gained = up.done["busy"] - before
    late_done = up.done.get("late", 0.0)
    assert abs(gained - late_done) <= 2000.0, (gained, late_done)  # alternating, not all 'late'
    for task in busy + late:
        task.cancel()
    await asyncio.gather(*busy, *late, return_exceptions=True)


async def test_a_full_queue_pushes_out_the_longest_flows_newest() -> None:
    lim = limiter(1, queue=4)
    up = Upstream(lim)
    holder = up.submit("flood", 1000.0)
    await up.settle()
    flood = [up.submit("flood", 1000.0) for _ in range(4)]
    await until(lambda: lim.waiting == 4)
    chat = up.submit("chat", 10.0)
    await until(lambda: flood[-1].done())
    with pytest.raises(Overloaded) as refused:
        flood[-1].result()
    assert refused.value.code == "server_busy"
    assert lim.queued_by_flow() == {"flood": 3, "chat": 1}
    # A flow can never push out its own: a fifth flood request is refused at once.
    extra = up.submit("flood", 1000.0)
    await until(extra.done)
    assert isinstance(extra.exception(), Overloaded)
    await up.run_until(1.0)  # the holder finishes: the chat goes first
    assert up.waits["chat"] == [1.0]
    for task in [holder, chat, *flood[:-1]]:
        task.cancel()
    await asyncio.gather(holder, chat, *flood[:-1], return_exceptions=True)


async def test_a_dead_clients_slot_goes_to_the_next_waiter() -> None:
    """The client of a request holding a slot goes away (its task is cancelled, as the proxy
    cancels it): the slot is released at once to the next in line, and a cancelled waiter
    leaves the queue without being charged."""
    lim = limiter(1)
    up = Upstream(lim)
    dead = up.submit("gone", 5000.0)
    await up.settle()
    queued_dead = up.submit("gone", 5000.0)
    alive = up.submit("alive", 100.0)
    await until(lambda: lim.waiting == 2)
    queued_dead.cancel()
    dead.cancel()
    await up.settle()
    assert lim.in_flight == 1 and lim.waiting == 0
    assert up.waits["alive"] == [0.0]
    await up.run_until(1.0)
    assert up.done == {"alive": 100.0}
    await asyncio.gather(dead, queued_dead, alive, return_exceptions=True)
    assert lim.in_flight == 0 and lim.queued_by_flow() == {}


async def test_capacity_changes_admit_or_hold_waiters() -> None:
    lim = limiter(1)
    up = Upstream(lim)
    tasks = [up.submit("t", 1000.0) for _ in range(4)]
    await up.settle()
    assert lim.in_flight == 1
    lim.set_capacity(3)
    await up.settle()
    assert lim.in_flight == 3 and lim.capacity == 3
    lim.set_capacity(1)  # in flight finish; nothing new starts until below the limit
    await up.run_until(1.0)
    assert lim.in_flight == 1
    with pytest.raises(ValueError):
        lim.set_capacity(0)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
