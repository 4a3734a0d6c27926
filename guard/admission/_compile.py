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
- **Globally** (per replica): cold compiles at once, each holding one of the upstream's pool
  workers for its estimated seconds (``limits.guided.upstream_compile_workers``), and cold
  compiles per second (``limits.guided.max_cold_compiles_per_s``), so a flood from many
  tenants cannot starve the pool or churn the cache. Over either: 503
  ``guided_compile_pool_busy`` with ``retry-after`` (the server is busy, not the client at
  fault). One tenant's cold compiles hold at most half the workers (at least one): beyond,
  that tenant gets the 429, so its own flood, while its bucket lasts, cannot take the whole
  pool from the others.

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

from guard.admission._buckets import EPSILON, RateLimits, refill, retry_after_header
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
    """The global caps (per replica): the upstream's compile workers, cold compiles per
    second, and the size of its grammar cache in MB."""

    workers: int
    per_s: float
    cache_mb: float


@dataclass
class CompileMetrics:
    """Counters the app exports (read at scrape time)."""

    cold: int = 0  # constraints admitted cold (charged)
    warm: int = 0  # constraints admitted as exact repeats (free)
    charged_ms: int = 0  # estimated compile milliseconds charged to tenants
    refused_budget: int = 0  # requests refused: a tenant's bucket was short
    refused_pool: int = 0  # requests refused: every worker busy
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
        # (when it is free again, the tenant) of each worker held by a cold compile
        self._busy: list[tuple[float, str]] = []
        self._rate_level: float | None = None  # cold compiles the per-second bucket holds
        self._rate_stamp = 0.0

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
        refusal = self._global_refusal(tenant, len(cold), caps, now)
        if refusal is not None:
            if reservation is not None:
                await self.limiter.release(reservation)
            raise refusal
        self._commit(tenant, cold, caps, now)
        self.metrics.cold += len(cold)
        self.metrics.warm += len(compiles) - len(cold)
        self.metrics.charged_ms += 0 if reservation is None else reservation.tokens
        return seconds

    # ---- the global caps ------------------------------------------------------------------

    def _rate(self, caps: CompileCaps, now: float) -> float:
        capacity = max(1.0, caps.per_s)
        if self._rate_level is None:
            return capacity
        return refill(self._rate_level, self._rate_stamp, now, capacity, caps.per_s)

    def _global_refusal(
        self, tenant: str, n: int, caps: CompileCaps, now: float
    ) -> GuardError | None:
        self._busy = [b for b in self._busy if b[0] > now]
        share = max(1, caps.workers // 2)
        need = min(n, share)  # more than that many queue upstream behind them
        mine = sorted(t for t, who in self._busy if who == tenant)
        if len(mine) + need > share:
            # one tenant holds at most half the pool: its own flood cannot starve the others
            self.metrics.refused_budget += 1
            wait = retry_after_header(mine[len(mine) + need - share - 1] - now)
            return RateLimited(
                BUDGET_EXHAUSTED,
                f"this API key's structured-output constraints already hold {len(mine)} of the "
                f"upstream's {caps.workers} compile workers (at most {share} at once); retry "
                f"in {wait} s, or reuse constraints already sent (exact repeats are free)",
                headers={"retry-after": wait},
            )
        if len(self._busy) + need > caps.workers:
            self.metrics.refused_pool += 1
            free_at = sorted(t for t, _ in self._busy)[len(self._busy) + need - caps.workers - 1]
            return _busy(
                f"the upstream's {caps.workers} compile workers are busy with constraints "
                "it has not compiled before",
                free_at - now,
            )
        need_rate = min(float(n), max(1.0, caps.per_s))
        level = self._rate(caps, now)
        if level + EPSILON < need_rate:
            self.metrics.refused_rate += 1
            return _busy(
                f"more than {caps.per_s:g} new structured-output constraints per second",
                (need_rate - level) / caps.per_s,
            )
        return None

    def _commit(self, tenant: str, cold: Sequence[ColdCost], caps: CompileCaps, now: float) -> None:
        share = max(1, caps.workers // 2)
        self._busy.extend((now + c.compile_s, tenant) for c in cold[:share])
        self._rate_level = self._rate(caps, now) - min(float(len(cold)), max(1.0, caps.per_s))
        self._rate_stamp = now
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


def _busy(why: str, wait_s: float) -> Overloaded:
    header = retry_after_header(max(wait_s, 0.0))
    return Overloaded(
        POOL_BUSY,
        f"{why}; retry in {header} s (constraints already compiled are admitted meanwhile)",
        headers={"retry-after": header},
    )
