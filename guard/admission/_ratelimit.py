"""Per-tenant request and token rate limits, charged before forwarding and reconciled after.

Peers such as LiteLLM charge tokens only once the response is in, so a burst of concurrent
requests all pass the check and together overshoot the limit. Here the app reserves
``prompt tokens + max_tokens`` *before* forwarding, then reconciles with the upstream's
``usage`` (refunding the unused reservation, charging any overshoot)::

    reservation = await limiter.reserve(tenant, limits=limits, tokens=prompt + max_tokens)
    try:
        response = await forward(...)
    except UpstreamUnreachable:
        await limiter.release(reservation)  # the upstream did no work: refund everything
        raise
    await limiter.reconcile(reservation, usage.prompt_tokens + usage.completion_tokens)

``reserve`` raises :class:`~guard.errors.RateLimited` (429, ``rate_limited_requests`` or
``rate_limited_tokens``, with ``Retry-After`` from the bucket's refill time and OpenAI's
``x-ratelimit-*`` headers), or :class:`~guard.errors.LimitExceeded` (400,
``request_exceeds_token_budget``) when the request is larger than the bucket could ever hold.

:class:`MemoryRateLimiter` is per process: with several workers or replicas, each would enforce
the whole limit, so those deployments need Redis. :class:`RedisRateLimiter` shares the buckets between
replicas; when Redis fails it fails closed (503 ``rate_limiter_unavailable``) or open (the
request passes uncharged and ``metrics.fail_open`` counts it) as configured.

Pass a tenant *name* (from the policy), never the bearer token itself: it becomes a map key and,
with Redis, part of a key name visible to anyone who can read Redis.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from guard.admission._buckets import (
    EPSILON,
    FailurePolicy,
    Listener,
    RateLimiterMetrics,
    RateLimits,
    Reservation,
    check_fits,
    count_settlement,
    decide,
    refill,
    rejection,
    reset_after,
)
from guard.admission._redis import RedisRateLimiter
from guard.errors import LimitExceeded

__all__ = [
    "FailurePolicy",
    "Listener",
    "MemoryRateLimiter",
    "RateLimiter",
    "RateLimiterMetrics",
    "RateLimits",
    "RedisRateLimiter",
    "Reservation",
    "make_rate_limiter",
]


class RateLimiter(Protocol):
    """What the app calls; both implementations satisfy it."""

    metrics: RateLimiterMetrics

    async def reserve(
        self, tenant: str, *, limits: RateLimits, requests: int = 1, tokens: int = 0
    ) -> Reservation:
        """Charge ``requests`` and ``tokens`` to ``tenant``'s buckets atomically, or raise."""
        ...

    async def reconcile(self, reservation: Reservation, actual_tokens: int) -> None:
        """Settle with the tokens actually used: refund the rest, or charge the overshoot.

        ``actual_tokens`` is the upstream's ``usage.total_tokens``, or, without usage (a
        stream cut short), the prompt tokens plus the output tokens counted in passing.
        """
        ...

    async def release(self, reservation: Reservation) -> None:
        """Refund the whole reservation: the upstream never did the work."""
        ...

    async def aclose(self) -> None: ...


# Pruning looks at every tenant, so it runs once per this many operations: amortised O(1).
_PRUNE_EVERY = 1024


class _Buckets:
    """One tenant's two buckets. A level of ``None`` is a bucket never used, i.e. full."""

    __slots__ = ("full_at", "req_level", "stamp", "tok_level")

    def __init__(self, now: float) -> None:
        self.req_level: float | None = None
        self.tok_level: float | None = None
        self.stamp = now
        self.full_at = now

    def levels(self, limits: RateLimits, now: float) -> tuple[float, float]:
        """Both levels refilled to ``now`` (0 for a disabled bucket)."""
        req = tok = 0.0
        req_cap, tok_cap = limits.request_capacity, limits.token_capacity
        if req_cap is not None:
            req = (
                req_cap
                if self.req_level is None
                else refill(self.req_level, self.stamp, now, req_cap, limits.request_rate)
            )
        if tok_cap is not None:
            tok = (
                tok_cap
                if self.tok_level is None
                else refill(self.tok_level, self.stamp, now, tok_cap, limits.token_rate)
            )
        return req, tok

    def store(self, limits: RateLimits, now: float, req: float, tok: float) -> None:
        req_cap, tok_cap = limits.request_capacity, limits.token_capacity
        full_in = 0.0
        if req_cap is not None:
            self.req_level = req
            full_in = reset_after(req, req_cap, limits.request_rate)
        if tok_cap is not None:
            self.tok_level = tok
            full_in = max(full_in, reset_after(tok, tok_cap, limits.token_rate))
        self.stamp = now
        self.full_at = now + full_in


class MemoryRateLimiter:
    """Token buckets in this process's memory. The default, and exact within one process.

    Every operation runs without awaiting, so check-and-charge is atomic on the event loop.
    ``clock`` is injectable (monotonic seconds) so tests step time instead of sleeping.
    Tenants whose buckets have refilled completely are forgotten, so memory follows the number
    of recently active tenants.
    """

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        metrics: RateLimiterMetrics | None = None,
    ) -> None:
        self._clock = clock
        self.metrics = metrics if metrics is not None else RateLimiterMetrics()
        self._tenants: dict[str, _Buckets] = {}
        self._ops = 0

    def __len__(self) -> int:
        """Tenants currently tracked."""
        return len(self._tenants)

    async def reserve(
        self, tenant: str, *, limits: RateLimits, requests: int = 1, tokens: int = 0
    ) -> Reservation:
        return self.reserve_nowait(tenant, limits=limits, requests=requests, tokens=tokens)

    def reserve_nowait(
        self, tenant: str, *, limits: RateLimits, requests: int = 1, tokens: int = 0
    ) -> Reservation:
        """:meth:`reserve` without the coroutine, for synchronous callers and benchmarks."""
        try:
            check_fits(limits, requests, tokens)
        except LimitExceeded:
            self.metrics.count("rejected_oversize", tenant)
            raise
        now = self._clock()
        self._maybe_prune(now)
        buckets = self._tenants.get(tenant)
        if buckets is None:
            buckets = _Buckets(now)
        req, tok = buckets.levels(limits, now)
        if (limits.request_capacity is not None and req + EPSILON < requests) or (
            limits.token_capacity is not None and tok + EPSILON < tokens
        ):
            decision = decide(limits, req, tok, requests, tokens)
            self.metrics.count(
                "rejected_requests" if decision.limited_by == "requests" else "rejected_tokens",
                tenant,
            )
            raise rejection(limits, decision)
        req -= requests
        tok -= tokens
        buckets.store(limits, now, req, tok)
        self._tenants[tenant] = buckets
        self.metrics.count("allowed", tenant)
        if tokens:
            self.metrics.count("tokens_reserved", tenant, tokens)
        return Reservation(tenant, limits, requests, tokens, remaining=(req, tok))

    async def reconcile(self, reservation: Reservation, actual_tokens: int) -> None:
        if reservation.settled:
            return
        reservation.settled = True
        refund = reservation.tokens - max(0, actual_tokens)
        if refund and reservation.limits.token_capacity is not None:
            count_settlement(self.metrics, reservation.tenant, refund)
            self._adjust(reservation, 0, refund)

    async def release(self, reservation: Reservation) -> None:
        if reservation.settled:
            return
        reservation.settled = True
        if reservation.limits.token_capacity is not None:
            count_settlement(self.metrics, reservation.tenant, reservation.tokens)
        self._adjust(reservation, reservation.requests, reservation.tokens)

    async def aclose(self) -> None:
        self._tenants.clear()

    def _adjust(self, reservation: Reservation, req_delta: int, tok_delta: int) -> None:
        """Add (refund) or, when negative, take (overshoot) without any limit check."""
        if req_delta == 0 and tok_delta == 0:
            return
        limits = reservation.limits
        now = self._clock()
        buckets = self._tenants.get(reservation.tenant)
        if buckets is None:
            buckets = _Buckets(now)
        req, tok = buckets.levels(limits, now)
        if limits.request_capacity is not None:
            req = min(float(limits.request_capacity), req + req_delta)
        if limits.token_capacity is not None:
            tok = min(float(limits.token_capacity), tok + tok_delta)
        buckets.store(limits, now, req, tok)
        self._tenants[reservation.tenant] = buckets

    def _maybe_prune(self, now: float) -> None:
        self._ops += 1
        if self._ops % _PRUNE_EVERY:
            return
        idle = [name for name, buckets in self._tenants.items() if buckets.full_at <= now]
        for name in idle:
            del self._tenants[name]


def make_rate_limiter(
    redis_url: str | None = None,
    *,
    on_error: FailurePolicy = "closed",
    metrics: RateLimiterMetrics | None = None,
    op_timeout_s: float = 0.25,
) -> RateLimiter:
    """The limiter for ``--redis URL``: shared through Redis when given, in memory otherwise."""
    if redis_url:
        return RedisRateLimiter(
            redis_url, on_error=on_error, metrics=metrics, op_timeout_s=op_timeout_s
        )
    return MemoryRateLimiter(metrics=metrics)
