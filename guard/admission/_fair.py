"""The global gate: the upstream's slots, released to waiting tenants by weighted fair queuing.

Start-time fair queuing (Goyal et al., 1996) with each request's estimated work as its size: a
request of flow ``f`` (a tenant, or an anonymous client's address) with work ``w`` and weight
``k`` gets the start tag ``S = max(V, F_f)`` and moves the flow's finish tag to
``F_f = S + w / k``; a freed slot goes to the waiting request with the smallest start tag, and
the virtual time ``V`` becomes that tag. So a tenant that queued a lot of work waits behind
one that queued a little, in proportion to weight over work; a flow that was idle starts at
``V`` (no credit is banked while idle, no debt kept beyond its last request), so nobody starves:
every waiting request's tag is fixed and ``V`` only grows. Requests that enter at once, with a
slot free and nobody waiting, are tagged the same way, so the work a tenant has in flight
counts against it when it next queues.

The queue is bounded in all (``max_waiters``); when it is full, a newcomer from a flow with
fewer waiting requests than the longest flow's pushes that flow's newest waiter out (it is
refused as a full queue would refuse it), so one flow cannot hold the whole queue while others
are turned away.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections import deque

__all__ = ["FairGate", "PushedOut"]

# Flows' finish tags are kept while they may still matter (above the virtual time); the table is
# pruned when it grows past this (amortised: the threshold doubles with what survives).
_PRUNE_AT = 4096


class PushedOut(Exception):
    """A waiter was pushed out of the full queue by a newcomer from a shorter flow."""


class _Waiter:
    __slots__ = ("cost", "flow", "fut", "gone", "start")

    def __init__(self, fut: asyncio.Future[None], flow: str, start: float, cost: float) -> None:
        self.fut = fut
        self.flow = flow
        self.start = start
        self.cost = cost
        self.gone = False  # left the queue (timed out, cancelled, pushed out)


class FairGate:
    """``limit`` slots; waiters released by smallest start tag (see the module's docstring)."""

    __slots__ = (
        "_finish",
        "_flows",
        "_heap",
        "_prune_at",
        "_seq",
        "active",
        "limit",
        "max_waiters",
        "queued",
        "vtime",
    )

    def __init__(self, limit: int, max_waiters: int) -> None:
        self.limit = limit
        self.max_waiters = max_waiters
        self.active = 0
        self.queued = 0  # live waiters (the heap may also hold ones that left)
        self.vtime = 0.0
        self._heap: list[tuple[float, int, _Waiter]] = []
        self._flows: dict[str, deque[_Waiter]] = {}  # each flow's live waiters, oldest first
        self._finish: dict[str, float] = {}
        self._seq = itertools.count()  # ties in start tag: arrival order
        self._prune_at = _PRUNE_AT

    @property
    def idle(self) -> bool:
        return self.active == 0 and self.queued == 0

    @property
    def has_room(self) -> bool:
        """A slot is free and nobody queues for it (a newcomer never overtakes a waiter)."""
        return self.active < self.limit and self.queued == 0

    def queued_of(self, flow: str) -> int:
        waiters = self._flows.get(flow)
        return 0 if waiters is None else len(waiters)

    def try_enter(self, flow: str, cost: float) -> bool:
        """Take a slot at once if there is room (the request is tagged all the same)."""
        if not self.has_room:
            return False
        self.vtime = max(self.vtime, self._tag(flow, cost))
        self.active += 1
        return True

    def can_queue(self, flow: str) -> bool:
        """The queue has room for ``flow``, or a longer flow's newest waiter can be pushed out."""
        if self.queued < self.max_waiters:
            return True
        if self.max_waiters == 0:
            return False
        own = self.queued_of(flow)
        return any(len(waiters) > own + 1 for waiters in self._flows.values())

    async def wait(self, flow: str, cost: float, deadline: float) -> None:
        """Queue until handed a slot: TimeoutError at ``deadline`` (loop time), PushedOut when
        a newcomer from a shorter flow took the place. Call :meth:`can_queue` first."""
        if self.queued >= self.max_waiters:
            self._push_out(flow)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiter = _Waiter(fut, flow, self._tag(flow, cost), cost)
        heapq.heappush(self._heap, (waiter.start, next(self._seq), waiter))
        self._flows.setdefault(flow, deque()).append(waiter)
        self.queued += 1
        try:
            async with asyncio.timeout_at(deadline):
                await fut
        except BaseException:
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                self.leave()  # the slot arrived as we gave up: hand it on rather than leak it
            elif not waiter.gone:
                self._forget(waiter)
            raise

    def leave(self) -> bool:
        """A slot is freed: to the waiter with the smallest start tag (True), else back to
        the pool."""
        heap = self._heap
        while heap:
            start, _, waiter = heapq.heappop(heap)
            if waiter.gone or waiter.fut.done():
                continue
            self._unlink(waiter)
            self.vtime = max(self.vtime, start)
            waiter.fut.set_result(None)
            return True
        self.active -= 1
        return False

    def resize(self, limit: int, max_waiters: int) -> None:
        """Apply a changed limit (the upstream's capacity, a policy reload): a raised limit
        admits waiters at once; a lowered one takes effect as slots are freed."""
        self.limit = limit
        self.max_waiters = max_waiters
        while self.active < self.limit and self.queued:
            self.active += 1
            if not self.leave():
                break

    # -- internals

    def _tag(self, flow: str, cost: float) -> float:
        start = max(self.vtime, self._finish.get(flow, 0.0))
        self._finish[flow] = start + cost
        if len(self._finish) > self._prune_at:
            self._prune()
        return start

    def _prune(self) -> None:
        vtime = self.vtime
        self._finish = {
            flow: tag for flow, tag in self._finish.items() if tag > vtime or flow in self._flows
        }
        self._prune_at = max(_PRUNE_AT, 2 * len(self._finish))

    def _push_out(self, flow: str) -> None:
        own = self.queued_of(flow)
        longest = max(self._flows.values(), key=len)
        assert len(longest) > own + 1  # can_queue said so
        victim = longest[-1]
        self._forget(victim)
        victim.fut.set_exception(PushedOut())

    def _forget(self, waiter: _Waiter) -> None:
        """``waiter`` leaves the queue without a slot: it is not charged for its work when it
        was its flow's last request."""
        self._unlink(waiter)
        if self._finish.get(waiter.flow) == waiter.start + waiter.cost:
            self._finish[waiter.flow] = waiter.start
        # Entries of waiters that left stay in the heap until popped; rebuild when they
        # outnumber the live ones, so the heap follows the queue's bound.
        if len(self._heap) > 2 * self.queued + 64:
            self._heap = [entry for entry in self._heap if not entry[2].gone]
            heapq.heapify(self._heap)

    def _unlink(self, waiter: _Waiter) -> None:
        waiter.gone = True
        self.queued -= 1
        waiters = self._flows[waiter.flow]
        if waiters[0] is waiter:
            waiters.popleft()
        else:
            waiters.remove(waiter)
        if not waiters:
            del self._flows[waiter.flow]
