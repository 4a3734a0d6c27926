"""The compile budget: what structured-output constraints may cost the upstream over time.

vLLM 0.32 compiles a request's grammar (xgrammar) in a thread pool of ``(cpu_count + 1) // 2``
workers off the engine loop, and caches compiled grammars by the constraint's kind and text
(512 MB by default). So a benign application pays its schemas' cold compiles once per upstream
replica and its repeats cost nothing, while a client sending unique schemas makes the server pay
the full cold price every time, fills the compile pool and evicts everyone's grammars. The
guard therefore charges a constraint only when it is cold:

- **Seen recently**: an LRU of the constraints this replica admitted (their 16-byte keys, see
  :func:`guard.guided.compile_key`), each weighed by its compiled grammar's estimated size, as
  large as the upstream's cache (``limits.guided.upstream_grammar_cache_mb``). An exact repeat
  of a constraint in it is free. The LRU stays per replica, also with Redis: each guard replica
  usually fronts its own upstream replica, whose cache is its own, and sharing it would cost a
  Redis round trip per constraint for a cache the guard only mirrors approximately; a replica
  that has not seen a constraint charges it once more, which errs on the side of the upstream.
- **Per tenant**: a bucket of compile CPU-seconds (``rate.guided_compile_s_per_minute``,
  ``rate.guided_compile_burst_s``, per key like the other rates), kept as milliseconds in the
  same token-bucket machinery as the token limits (:class:`~guard.admission.MemoryRateLimiter`,
  or :class:`~guard.admission.RedisRateLimiter` under its own key prefix, so the buckets are
  shared between replicas like the other limits). The charge is the cold constraints'
  estimated compile, capped at the bucket's capacity. Empty: 429
  ``guided_compile_budget_exhausted`` with ``retry-after``.
- **Globally** (per replica): the upstream's compile pool, ``W`` =
  ``limits.guided.upstream_compile_workers`` workers each compiling one grammar at a time, as
  a bucket of worker-seconds refilled at ``W`` a second and holding ``W`` x
  ``limits.guided.compile_queue_s`` (the work the pool may have ahead of it: a burst is
  queued there, as vLLM queues it, but no more than that), each cold compile taking its
  estimate; and cold compiles per second (``limits.guided.max_cold_compiles_per_s``, a bucket
  of five seconds' worth), so a
  flood from many tenants cannot starve the pool or churn the cache. Over either: 503
  ``guided_compile_pool_busy`` with ``retry-after`` (the server is busy, not the client at
  fault). One tenant takes at most half the pool (a bucket of half the size and rate, per
  tenant in memory): beyond, that tenant gets the 429, so its own flood, while its bucket
  lasts, cannot take the whole pool from the others.

A refusal charges nothing: the tenant's charge is refunded when a global cap refuses, and
nothing is remembered as seen.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from guard.admission._buckets import RateLimits, refill, retry_after_header, wait_for
from guard.admission._ratelimit import MemoryRateLimiter, RateLimiter
from guard.errors import GuardError, Overloaded, RateLimited

__all__ = [
    "BUDGET_EXHAUSTED",
    "POOL_BUSY",
    "ColdCost",
    "CompileBudget",
    "CompileCaps",
    "CompileMetrics",
]

BUDGET_EXHAUSTED = "guided_compile_budget_exhausted"
POOL_BUSY = "guided_compile_pool_busy"
# The cold-compiles-per-second bucket holds this many seconds' worth: an application warming
# its schemas at start-up (50 at 10 a second) passes, a sustained flood does not.
_RATE_BURST_S = 5.0


class ColdCost(Protocol):
    """One constraint a request makes the upstream compile (:class:`guard.guided.Compile`)."""

    @property
    def key(self) -> bytes: ...

    @property
    def compile_s(self) -> float: ...

    @property
    def grammar_mb(self) -> float: ...


@dataclass(frozen=True, slots=True)
class CompileCaps:
    """The global caps (per replica): the upstream's compile workers, the seconds of work its
    pool may have ahead, cold compiles per second, and the size of its grammar cache in MB."""

    workers: int
    queue_s: float
    per_s: float
    cache_mb: float


@dataclass
class CompileMetrics:
    """Counters the app exports (read at scrape time)."""

    cold: int = 0  # constraints admitted cold (charged)
    warm: int = 0  # constraints admitted as exact repeats (free)
    charged_ms: int = 0  # estimated compile milliseconds charged to tenants
    refused_budget: int = 0  # requests refused: a tenant's bucket or pool share was short
    refused_pool: int = 0  # requests refused: the compile pool has enough work ahead
    refused_rate: int = 0  # requests refused: cold compiles per second
    evicted: int = 0  # constraints forgotten by the LRU

    def snapshot(self) -> dict[str, int]:
        return dict(vars(self))


class CompileBudget:
    """The compile budget of one guard replica; ``limiter`` keeps the tenants' buckets (in
    memory by default; a :class:`~guard.admission.RedisRateLimiter` with its own key prefix to
    share them). ``clock``: monotonic seconds, injectable so tests step time."""

    def __init__(
        self,
        limiter: RateLimiter | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limiter: RateLimiter = (
            limiter if limiter is not None else MemoryRateLimiter(clock=clock)
        )
        self.metrics = CompileMetrics()
        self._clock = clock
        self._seen: OrderedDict[bytes, float] = OrderedDict()  # key -> grammar MB
        self._seen_mb = 0.0
        self._pool = _Level()  # worker-seconds of the upstream's compile pool
        self._per_s = _Level()  # cold compiles this second
        self._shares: dict[str, _Level] = {}  # each tenant's half of the pool
        self._ops = 0

    def __len__(self) -> int:
        """Constraints remembered as compiled."""
        return len(self._seen)

    def seen(self, key: bytes) -> bool:
        return key in self._seen

    async def admit(
        self,
        tenant: str,
        compiles: Sequence[ColdCost],
        limits: RateLimits,
        caps: CompileCaps,
    ) -> float:
        """Admit a request's constraints: exact repeats free, the cold ones charged to
        ``tenant``'s bucket and counted against the global caps. Returns the estimated
        seconds charged; raises :class:`~guard.errors.RateLimited` (429
        ``guided_compile_budget_exhausted``) or :class:`~guard.errors.Overloaded` (503
        ``guided_compile_pool_busy``), both with ``retry-after``."""
        cold = [c for c in compiles if c.key not in self._seen]
        if not cold:
            for c in compiles:
                self._seen.move_to_end(c.key)
            self.metrics.warm += len(compiles)
            return 0.0
        seconds = sum(c.compile_s for c in cold)
        bucket = limits.compile_limits
        reservation = None
        if bucket is not None:
            capacity = bucket.token_capacity or 0
            ms = min(capacity, max(1, math.ceil(seconds * 1000)))
            try:
                reservation = await self.limiter.reserve(
                    tenant, limits=bucket, requests=0, tokens=ms
                )
            except RateLimited as exc:
                self.metrics.refused_budget += 1
                wait = exc.headers.get("retry-after", "1")
                raise RateLimited(
                    BUDGET_EXHAUSTED,
                    f"this request's structured-output constraints would cost ~{seconds:.3g} s "
                    "of compile CPU on the upstream (constraints it has not compiled recently); "
                    f"this API key's compile budget ({limits.guided_compile_s_per_minute:g} s "
                    f"per minute, {limits.guided_compile_burst_s:g} s at once) is short; retry "
                    f"in {wait} s, or reuse constraints already sent (exact repeats are free)",
                    headers={"retry-after": wait},
                ) from None
        now = self._clock()
        refusal = self._global_refusal(tenant, cold, caps, now)
        if refusal is not None:
            if reservation is not None:
                await self.limiter.release(reservation)
            raise refusal
        self._commit(tenant, cold, caps, now)
        for c in compiles:  # the warm ones are used again: the young end of the LRU
            if c.key in self._seen and c not in cold:
                self._seen.move_to_end(c.key)
        self.metrics.cold += len(cold)
        self.metrics.warm += len(compiles) - len(cold)
        if reservation is not None and not reservation.degraded:
            self.metrics.charged_ms += reservation.tokens
        return seconds

    # ---- the global caps ------------------------------------------------------------------

    def _global_refusal(
        self, tenant: str, cold: Sequence[ColdCost], caps: CompileCaps, now: float
    ) -> GuardError | None:
        work = sum(c.compile_s for c in cold)
        pool_cap, rate = caps.workers * caps.queue_s, float(caps.workers)
        share = self._shares.get(tenant)
        if share is not None:
            wait = share.wait(min(work, pool_cap / 2), now, pool_cap / 2, rate / 2)
            if wait > 0:
                self.metrics.refused_budget += 1
                header = retry_after_header(wait)
                return RateLimited(
                    BUDGET_EXHAUSTED,
                    "this API key's new structured-output constraints already take half the "
                    f"upstream's compile pool ({caps.workers} workers); retry in {header} s, "
                    "or reuse constraints already sent (exact repeats are free)",
                    headers={"retry-after": header},
                )
        wait = self._pool.wait(min(work, pool_cap), now, pool_cap, rate)
        if wait > 0:
            self.metrics.refused_pool += 1
            return _busy(
                f"the upstream's {caps.workers} compile workers have "
                f"{caps.queue_s:g} s of new constraints to compile ahead",
                wait,
            )
        per_s = max(1.0, caps.per_s * _RATE_BURST_S)
        wait = self._per_s.wait(min(float(len(cold)), per_s), now, per_s, caps.per_s)
        if wait > 0:
            self.metrics.refused_rate += 1
            return _busy(
                f"more than {caps.per_s:g} new structured-output constraints a second", wait
            )
        return None

    def _commit(self, tenant: str, cold: Sequence[ColdCost], caps: CompileCaps, now: float) -> None:
        work = sum(c.compile_s for c in cold)
        pool_cap, rate = caps.workers * caps.queue_s, float(caps.workers)
        self._pool.take(min(work, pool_cap), now, pool_cap, rate)
        per_s = max(1.0, caps.per_s * _RATE_BURST_S)
        self._per_s.take(min(float(len(cold)), per_s), now, per_s, caps.per_s)
        share = self._shares.get(tenant)
        if share is None:
            share = self._shares[tenant] = _Level()
        share.take(min(work, pool_cap / 2), now, pool_cap / 2, rate / 2)
        self._ops += 1
        if self._ops % 1024 == 0:  # forget the tenants whose share is whole again
            idle = [t for t, lv in self._shares.items() if lv.full_at <= now]
            for t in idle:
                del self._shares[t]
        for c in cold:
            if c.key in self._seen:  # twice in one request
                continue
            self._seen[c.key] = c.grammar_mb
            self._seen_mb += c.grammar_mb
        while self._seen_mb > caps.cache_mb and len(self._seen) > 1:
            _, mb = self._seen.popitem(last=False)
            self._seen_mb -= mb
            self.metrics.evicted += 1

    async def aclose(self) -> None:
        await self.limiter.aclose()


class _Level:
    """A bucket in this process (full when new): its level at a time, refilled at a rate."""

    __slots__ = ("full_at", "level", "stamp")

    def __init__(self) -> None:
        self.level: float | None = None
        self.stamp = 0.0
        self.full_at = 0.0

    def at(self, now: float, capacity: float, rate: float) -> float:
        if self.level is None:
            return capacity
        return refill(self.level, self.stamp, now, capacity, rate)

    def wait(self, amount: float, now: float, capacity: float, rate: float) -> float:
        """Seconds until ``amount`` can be taken (0: now)."""
        return wait_for(self.at(now, capacity, rate), amount, rate)

    def take(self, amount: float, now: float, capacity: float, rate: float) -> None:
        self.level = self.at(now, capacity, rate) - amount
        self.stamp = now
        self.full_at = now + max(0.0, (capacity - self.level) / rate)


def _busy(why: str, wait_s: float) -> Overloaded:
    header = retry_after_header(max(wait_s, 0.0))
    return Overloaded(
        POOL_BUSY,
        f"{why}; retry in {header} s (constraints already compiled are admitted meanwhile)",
        headers={"retry-after": header},
    )
