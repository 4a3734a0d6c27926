"""Per-key and global concurrency limits; the global slots released by weighted fair queuing.

::

    async with limiter.slot(tenant, flow=client, work=tokens, weight=1.0):
        await forward(...)

A request needs a slot of its key and then a global slot (the upstream's capacity, see
:meth:`ConcurrencyLimiter.set_capacity`). When its key is at its limit it waits in the key's own
queue, in arrival order; when the global slots are taken it waits in the global queue, where
slots are released by start-time fair queuing on the requests' estimated work
(:class:`~guard.admission._fair.FairGate`): between flows (a tenant, or an anonymous client's
address) in proportion to weight over work, so a tenant that floods the guard with long
requests waits behind the others' short ones rather than ahead of them. Each request waits at
most ``queue_timeout_s`` in total; if the queue is already full, or the wait times out, it is
refused: 429 ``concurrency_limited`` for the key's limit (the caller is over its own
allowance), 503 ``server_busy`` for the global one (the server is). Both carry a
``Retry-After`` estimated from how long slots are being held.

A request keeps its key slot while it waits for a global one, so one tenant never has more
than its own ``max_concurrent`` requests in the global queue; and a full global queue pushes
out the newest waiter of its longest flow for a newcomer from a shorter one.

Cancellation (the client went away) while waiting removes the waiter; a slot handed to a
waiter at the moment it is cancelled is passed on to the next one. Nothing leaks, and idle keys
are forgotten, so memory follows the number of keys with requests in flight or waiting.

The limits are per process. Sharing them through Redis would need leases renewed by every
replica (a crashed replica's slots must expire) and cross-replica wake-ups (polling or pub/sub),
i.e. Redis round trips at both ends of every request; and what a concurrency limit protects is
the capacity behind this replica. With N replicas, give each ``1/N`` of the global limit;
the rate limits, which are about a tenant's total usage, are the ones shared through Redis.
"""

from __future__ import annotations

import asyncio
import math
from collections import OrderedDict
from dataclasses import dataclass, field
from types import TracebackType

from guard.admission._buckets import Listener
from guard.admission._fair import FairGate, PushedOut
from guard.errors import GuardError, Overloaded, RateLimited

__all__ = ["ConcurrencyLimiter", "ConcurrencyLimits", "ConcurrencyMetrics", "Slot"]


@dataclass(frozen=True)
class ConcurrencyLimits:
    """One key's limits: ``max_concurrent`` in flight (``None``: unlimited) and
    ``max_queued`` waiting beyond that (0: refuse at once when the key is at its limit)."""

    max_concurrent: int | None = None
    max_queued: int = 0

    def __post_init__(self) -> None:
        _check_limits("ConcurrencyLimits", self.max_concurrent, self.max_queued)


@dataclass
class ConcurrencyMetrics:
    """Counters the app exports; read at scrape time (nothing is registered here).

    ``listener(event, tenant, value)`` is called for each ``admitted`` request (value: seconds
    waited, 0 when a slot was free: feed a histogram with it), each ``work`` admitted (value:
    the request's estimated work, for the share each tenant gets) and each refusal or
    cancellation (``queue_full``, ``global_queue_full``, ``timeout``, ``global_timeout``,
    ``cancelled``; value: seconds waited before it).
    """

    admitted: int = 0
    waited: int = 0
    wait_seconds_total: float = 0.0
    queue_full: int = 0
    global_queue_full: int = 0
    timeout: int = 0
    global_timeout: int = 0
    cancelled: int = 0
    listener: Listener | None = field(default=None, repr=False, compare=False)

    def count(self, event: str, tenant: str, wait_s: float) -> None:
        setattr(self, event, getattr(self, event) + 1)
        if self.listener is not None:
            self.listener(event, tenant, wait_s)

    def admit(self, tenant: str, wait_s: float, queued: bool, work: float) -> None:
        if queued:
            self.waited += 1
            self.wait_seconds_total += wait_s
        self.count("admitted", tenant, wait_s)
        if self.listener is not None:
            self.listener("work", tenant, work)

    def snapshot(self) -> dict[str, float]:
        return {
            name: value
            for name, value in vars(self).items()
            if name != "listener" and isinstance(value, int | float)
        }


class _Gate:
    """A counting semaphore whose waiters are served strictly in arrival order.

    A released slot is handed directly to the oldest waiter (``active`` unchanged), so a
    newcomer can never take it first.
    """

    __slots__ = ("active", "limit", "max_waiters", "waiters")

    def __init__(self, limit: int, max_waiters: int) -> None:
        self.limit = limit
        self.max_waiters = max_waiters
        self.active = 0
        # Ordered for FIFO, hashed so a cancelled waiter is removed in O(1).
        self.waiters: OrderedDict[asyncio.Future[None], None] = OrderedDict()

    @property
    def idle(self) -> bool:
        return self.active == 0 and not self.waiters

    @property
    def has_room(self) -> bool:
        """A slot is free and nobody queues for it (a newcomer never overtakes a waiter)."""
        return self.active < self.limit and not self.waiters

    def try_enter(self) -> bool:
        if self.has_room:
            self.active += 1
            return True
        return False

    async def wait(self, deadline: float) -> None:
        """Queue until handed a slot; TimeoutError at ``deadline`` (loop time)."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiters[fut] = None
        try:
            async with asyncio.timeout_at(deadline):
                await fut
        except BaseException:
            if fut.done() and not fut.cancelled():
                # The slot arrived as we gave up: hand it on rather than leak it.
                self.leave()
            else:
                self.waiters.pop(fut, None)
            raise

    def leave(self) -> None:
        while self.waiters:
            fut, _ = self.waiters.popitem(last=False)
            if not fut.done():
                fut.set_result(None)
                return
        self.active -= 1

    def resize(self, limit: int, max_waiters: int) -> None:
        """Apply changed limits (a policy reload); a raised limit admits waiters at once."""
        self.limit = limit
        self.max_waiters = max_waiters
        while self.active < self.limit and self.waiters:
            fut, _ = self.waiters.popitem(last=False)
            if not fut.done():
                self.active += 1
                fut.set_result(None)


class _Claim:
    """Who asks for a slot: the key's tenant, its fair-queuing flow and its work, weighted."""

    __slots__ = ("cost", "flow", "limits", "tenant", "work")

    def __init__(
        self, tenant: str, limits: ConcurrencyLimits, flow: str, work: float, weight: float
    ) -> None:
        self.tenant = tenant
        self.limits = limits
        self.flow = flow
        self.work = work
        self.cost = max(1.0, work) / weight


class Slot:
    """``async with limiter.slot(tenant, ...):`` holds one key slot and one global slot."""

    __slots__ = ("_claim", "_entered", "_key", "_limiter", "waited_s")

    def __init__(self, limiter: ConcurrencyLimiter, claim: _Claim):
        self._limiter = limiter
        self._claim = claim
        self._key: _Gate | None = None
        self._entered: float | None = None
        self.waited_s = 0.0

    async def __aenter__(self) -> Slot:
        if self._entered is not None:
            raise RuntimeError("a Slot can be entered only once")
        limiter = self._limiter
        entered = limiter._enter_now(self._claim)
        if entered is not None:  # the common case: room at once, no coroutine to run
            self._key, self._entered = entered
            return self
        self._key, self._entered, self.waited_s = await limiter._acquire(self._claim)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    def release(self) -> None:
        """Give the slots back now (the upstream's work is over while the client is still
        reading the answer); leaving the ``async with`` then does nothing more."""
        if self._entered is not None:
            entered, self._entered = self._entered, None
            self._limiter._release(self._claim.tenant, self._key, entered)


# Retry-After is an estimate; keep it within what a client will sensibly wait.
_RETRY_AFTER_MAX_S = 60
_HOLD_EWMA_WEIGHT = 0.2


class ConcurrencyLimiter:
    """In-process concurrency limits: per key (default ``per_key``, or the ``limits`` passed to
    :meth:`slot`) and global, the global slots released fairly between flows.
    ``queue_timeout_s`` bounds the total wait of one request; 0 disables waiting."""

    def __init__(
        self,
        *,
        per_key: ConcurrencyLimits | None = None,
        global_max_concurrent: int | None = None,
        global_max_queued: int = 0,
        queue_timeout_s: float = 0.0,
        metrics: ConcurrencyMetrics | None = None,
    ) -> None:
        _check_limits("global", global_max_concurrent, global_max_queued)
        if not queue_timeout_s >= 0.0:
            raise ValueError("queue_timeout_s must be >= 0")
        self.per_key = per_key if per_key is not None else ConcurrencyLimits()
        self.queue_timeout_s = queue_timeout_s
        self.metrics = metrics if metrics is not None else ConcurrencyMetrics()
        self._global = (
            None
            if global_max_concurrent is None
            else FairGate(global_max_concurrent, global_max_queued)
        )
        self._keys: dict[str, _Gate] = {}
        self._hold_s = 1.0  # moving average of how long a slot is held; a guess until measured
        self.in_flight = 0
        self.waiting = 0

    def slot(
        self,
        tenant: str,
        limits: ConcurrencyLimits | None = None,
        *,
        flow: str | None = None,
        work: float = 1.0,
        weight: float = 1.0,
    ) -> Slot:
        """A slot for ``tenant`` under ``limits`` (default: ``per_key``). ``flow``: whose turn
        it is in the global queue (default: the tenant); ``work``: the request's estimated
        work (tokens); ``weight``: the flow's share relative to others (1: equal)."""
        if not weight > 0.0:
            raise ValueError("weight must be > 0")
        claim = _Claim(
            tenant,
            limits if limits is not None else self.per_key,
            tenant if flow is None else flow,
            work,
            weight,
        )
        return Slot(self, claim)

    @property
    def capacity(self) -> int | None:
        """The global slots in force (None: no global limit)."""
        return None if self._global is None else self._global.limit

    def set_capacity(self, limit: int) -> None:
        """Change the global slots (the upstream's capacity as read while serving); waiters are
        admitted at once when it grows, in-flight requests finish when it shrinks."""
        if isinstance(limit, bool) or limit < 1:
            raise ValueError("capacity must be >= 1")
        if self._global is not None and limit != self._global.limit:
            self._global.resize(limit, self._global.max_waiters)

    def queued_by_flow(self) -> dict[str, int]:
        """Requests waiting in the global queue, by flow."""
        glob = self._global
        if glob is None:
            return {}
        return {flow: len(waiters) for flow, waiters in glob._flows.items()}

    def tracked_keys(self) -> int:
        """Keys with requests in flight or waiting (the others are forgotten)."""
        return len(self._keys)

    def _enter_now(self, claim: _Claim) -> tuple[_Gate | None, float] | None:
        """Take both slots when both gates have room and nobody waits; None otherwise (the
        caller then queues through :meth:`_acquire`, which sees the same gates)."""
        key = self._key_gate(claim.tenant, claim.limits)
        glob = self._global
        if (key is not None and not key.has_room) or (glob is not None and not glob.has_room):
            return None
        if key is not None:
            key.active += 1
        if glob is not None:
            glob.try_enter(claim.flow, claim.cost)
        self.in_flight += 1
        self.metrics.admit(claim.tenant, 0.0, False, claim.work)
        return key, asyncio.get_running_loop().time()

    async def _acquire(self, claim: _Claim) -> tuple[_Gate | None, float, float]:
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = started + self.queue_timeout_s
        queued = False
        tenant = claim.tenant
        key = self._key_gate(tenant, claim.limits)
        if key is not None and not key.try_enter():
            queued = True
            try:
                await self._wait_key(key, tenant, started, deadline)
            finally:
                if key.idle and self._keys.get(tenant) is key:
                    del self._keys[tenant]
        glob = self._global
        if glob is not None and not glob.try_enter(claim.flow, claim.cost):
            queued = True
            try:
                await self._wait_global(glob, claim, started, deadline)
            except BaseException:
                self._leave_key(tenant, key)
                raise
        now = loop.time()
        waited = now - started if queued else 0.0
        self.in_flight += 1
        self.metrics.admit(tenant, waited, queued, claim.work)
        return key, now, waited

    def _release(self, tenant: str, key: _Gate | None, entered: float) -> None:
        self.in_flight -= 1
        held = asyncio.get_running_loop().time() - entered
        self._hold_s += _HOLD_EWMA_WEIGHT * (held - self._hold_s)
        if self._global is not None:
            self._global.leave()
        self._leave_key(tenant, key)

    def _leave_key(self, tenant: str, key: _Gate | None) -> None:
        if key is None:
            return
        key.leave()
        if key.idle and self._keys.get(tenant) is key:
            del self._keys[tenant]

    def _key_gate(self, tenant: str, limits: ConcurrencyLimits) -> _Gate | None:
        if limits.max_concurrent is None:
            return None
        gate = self._keys.get(tenant)
        if gate is None:
            gate = self._keys[tenant] = _Gate(limits.max_concurrent, limits.max_queued)
        elif gate.limit != limits.max_concurrent or gate.max_waiters != limits.max_queued:
            gate.resize(limits.max_concurrent, limits.max_queued)
        return gate

    async def _wait_key(self, gate: _Gate, tenant: str, started: float, deadline: float) -> None:
        loop = asyncio.get_running_loop()
        if self.queue_timeout_s <= 0.0 or len(gate.waiters) >= gate.max_waiters:
            self.metrics.count("queue_full", tenant, loop.time() - started)
            raise self._refusal(gate.limit, len(gate.waiters), False, "the wait queue is full")
        self.waiting += 1
        try:
            await gate.wait(deadline)
        except TimeoutError:
            self.metrics.count("timeout", tenant, loop.time() - started)
            raise self._timed_out(gate.limit, len(gate.waiters), False) from None
        except asyncio.CancelledError:
            self.metrics.count("cancelled", tenant, loop.time() - started)
            raise
        finally:
            self.waiting -= 1

    async def _wait_global(
        self, gate: FairGate, claim: _Claim, started: float, deadline: float
    ) -> None:
        loop = asyncio.get_running_loop()
        tenant = claim.tenant
        if self.queue_timeout_s <= 0.0 or not gate.can_queue(claim.flow):
            self.metrics.count("global_queue_full", tenant, loop.time() - started)
            raise self._refusal(gate.limit, gate.queued, True, "the wait queue is full")
        self.waiting += 1
        try:
            await gate.wait(claim.flow, claim.cost, deadline)
        except PushedOut:
            self.metrics.count("global_queue_full", tenant, loop.time() - started)
            raise self._refusal(
                gate.limit, gate.queued, True, "the wait queue is full of this client's requests"
            ) from None
        except TimeoutError:
            self.metrics.count("global_timeout", tenant, loop.time() - started)
            raise self._timed_out(gate.limit, gate.queued, True) from None
        except asyncio.CancelledError:
            self.metrics.count("cancelled", tenant, loop.time() - started)
            raise
        finally:
            self.waiting -= 1

    def _timed_out(self, limit: int, queued: int, is_global: bool) -> GuardError:
        why = f"no slot freed within {self.queue_timeout_s:g} s"
        return self._refusal(limit, queued, is_global, why)

    def _refusal(self, limit: int, queued: int, is_global: bool, why: str) -> GuardError:
        # Time for the requests ahead to drain through the gate's slots, at the average hold.
        estimate = self._hold_s * (queued + 1) / limit
        headers = {"retry-after": str(min(_RETRY_AFTER_MAX_S, max(1, math.ceil(estimate))))}
        if is_global:
            return Overloaded(
                "server_busy",
                f"the server is at its limit of {limit} concurrent requests and {why}; retry later",
                headers=headers,
            )
        return RateLimited(
            "concurrency_limited",
            f"this API key is at its limit of {limit} concurrent requests and {why}; retry later",
            headers=headers,
        )


def _check_limits(what: str, max_concurrent: int | None, max_queued: int) -> None:
    if max_concurrent is not None and (isinstance(max_concurrent, bool) or max_concurrent < 1):
        raise ValueError(f"{what}: max_concurrent must be >= 1 or None")
    if isinstance(max_queued, bool) or max_queued < 0:
        raise ValueError(f"{what}: max_queued must be >= 0")
