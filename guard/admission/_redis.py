"""Rate limits shared between guard replicas through Redis, one Lua script per operation.

``redis`` is an optional extra: it is imported when a :class:`RedisRateLimiter` is created, so
the guard imports and runs without it.

Failure handling is explicit. Any Redis failure (refused connection, timeout, error reply) is
counted in ``metrics.backend_errors`` and then either rejects the request (``on_error="closed"``,
503 ``rate_limiter_unavailable``) or lets it through uncharged (``on_error="open"``, counted in
``metrics.fail_open``). There is no silent fallback to per-replica memory: N replicas each
enforcing the full limit would multiply it by N without anyone noticing.

Whether Redis answers is also watched without traffic (:meth:`RedisRateLimiter.watch`: at start,
then every few seconds) and asked by ``/readyz`` (:meth:`RedisRateLimiter.healthy`); a failure is
logged when it starts, whoever sees it first (a request, the watch, a probe), and again when
Redis answers again, never once per request.
"""

from __future__ import annotations

import asyncio
import logging
import urllib.parse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from guard.admission._buckets import (
    FailurePolicy,
    RateLimiterMetrics,
    RateLimits,
    Reservation,
    check_fits,
    count_settlement,
    decide,
    rejection,
    unavailable,
)
from guard.admission._lua import ADJUST, RESERVE
from guard.errors import LimitExceeded

if TYPE_CHECKING:
    from redis.asyncio import Redis

log = logging.getLogger("guard.admission._ratelimit")

DEFAULT_PREFIX = "schedguard:rl:"
WATCH_INTERVAL_S = 5.0


class RedisRateLimiter:
    """Token buckets in Redis, atomic across replicas. See :mod:`guard.admission._ratelimit` for the API.

    ``op_timeout_s`` bounds each operation end to end (connect, one retry on a stale pooled
    connection, the script): a hung Redis costs a request at most that long. ``clock`` replaces
    Redis's ``TIME`` (tests only: replicas must share one clock). ``client`` lets the app pass a
    configured ``redis.asyncio.Redis`` (TLS, auth, sentinel); it is then not closed here.
    """

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        on_error: FailurePolicy = "closed",
        op_timeout_s: float = 0.25,
        key_prefix: str = DEFAULT_PREFIX,
        clock: Callable[[], float] | None = None,
        metrics: RateLimiterMetrics | None = None,
        client: Redis | None = None,
    ) -> None:
        if on_error not in ("closed", "open"):
            raise ValueError(f"on_error must be 'closed' or 'open', not {on_error!r}")
        from redis.asyncio import Redis
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        self.on_error: FailurePolicy = on_error
        self.where = _without_credentials(url) if client is None else "the configured client"
        self.metrics = metrics if metrics is not None else RateLimiterMetrics()
        self._prefix = key_prefix
        self._clock = clock
        self._timeout = op_timeout_s
        self._owns_client = client is None
        if client is None:
            # One retry covers a pooled connection that died since its last use; redis-py's
            # default (ten, with backoff) would hold requests for seconds while Redis is down.
            client = Redis.from_url(
                url,
                socket_timeout=op_timeout_s,
                socket_connect_timeout=op_timeout_s,
                retry=Retry(NoBackoff(), 1),
            )
        self._client = client
        self._reserve = client.register_script(RESERVE)
        self._adjust = client.register_script(ADJUST)
        self._failing = False

    def key(self, tenant: str) -> str:
        """The tenant's hash; the braces keep it in one Redis Cluster slot."""
        return f"{self._prefix}{{{tenant}}}"

    async def reserve(
        self, tenant: str, *, limits: RateLimits, requests: int = 1, tokens: int = 0
    ) -> Reservation:
        try:
            check_fits(limits, requests, tokens)
        except LimitExceeded:
            self.metrics.count("rejected_oversize", tenant)
            raise
        args = _args(self._now(), limits, requests, tokens)
        try:
            result = await self._call(self._reserve, tenant, args)
        except Exception as exc:
            if not _is_backend_error(exc):
                raise
            self._backend_failed(tenant, exc)
            if self.on_error == "closed":
                self.metrics.count("fail_closed", tenant)
                raise unavailable(type(exc).__name__) from exc
            self.metrics.count("fail_open", tenant)
            return Reservation(tenant, limits, requests, tokens, degraded=True)
        allowed, req, tok = _parse(result)
        if not allowed:
            decision = decide(limits, req, tok, requests, tokens)
            if decision.allowed:
                # Float formatting put Python on the other side of the epsilon: still refused.
                decision = decide(limits, req - 1e-6, tok - 1e-6, requests, tokens)
            self.metrics.count(
                "rejected_requests" if decision.limited_by == "requests" else "rejected_tokens",
                tenant,
            )
            raise rejection(limits, decision)
        self.metrics.count("allowed", tenant)
        if tokens:
            self.metrics.count("tokens_reserved", tenant, tokens)
        return Reservation(tenant, limits, requests, tokens, remaining=(req, tok))

    async def reconcile(self, reservation: Reservation, actual_tokens: int) -> None:
        if reservation.settled:
            return
        reservation.settled = True
        if reservation.degraded:
            return
        refund = reservation.tokens - max(0, actual_tokens)
        if (
            refund
            and reservation.limits.token_capacity is not None
            and await self._settle(reservation, 0, refund)
        ):
            count_settlement(self.metrics, reservation.tenant, refund)

    async def release(self, reservation: Reservation) -> None:
        if reservation.settled:
            return
        reservation.settled = True
        if reservation.degraded:
            return
        settled = await self._settle(reservation, reservation.requests, reservation.tokens)
        if settled and reservation.limits.token_capacity is not None:
            count_settlement(self.metrics, reservation.tenant, reservation.tokens)

    @property
    def failing(self) -> bool:
        """Whether the last operation or check of Redis failed."""
        return self._failing

    async def healthy(self) -> bool:
        """Whether Redis answers a PING within the operation timeout (for ``/readyz`` and
        :meth:`watch`); a change from the last operation's outcome is logged."""
        try:
            async with asyncio.timeout(self._timeout):
                ok = bool(await self._client.ping())
        except Exception as exc:
            if not _is_backend_error(exc):
                raise
            self._mark_failing(exc)
            return False
        if ok:
            self._mark_answering()
        return ok

    async def watch(self, interval_s: float | None = None) -> None:
        """Check Redis now and every ``interval_s`` (default :data:`WATCH_INTERVAL_S`) until
        cancelled, so that a Redis that is down at start, or goes down or comes back while no
        request comes, is logged then (the app runs this for its lifetime)."""
        if await self.healthy():
            log.info("rate limiter: Redis at %s answers", self.where)
        while True:
            await asyncio.sleep(WATCH_INTERVAL_S if interval_s is None else interval_s)
            await self.healthy()

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.aclose()

    async def _settle(self, reservation: Reservation, req_delta: int, tok_delta: int) -> bool:
        """Apply a refund or overshoot. A failure is counted, logged and swallowed: the
        response has already gone out, and the bucket heals by refilling."""
        tenant = reservation.tenant
        try:
            await self._call(
                self._adjust, tenant, _args(self._now(), reservation.limits, req_delta, tok_delta)
            )
        except Exception as exc:
            if not _is_backend_error(exc):
                raise
            self._backend_failed(tenant, exc)
            self.metrics.count("settle_errors", tenant)
            return False
        return True

    async def _call(self, script: Any, tenant: str, args: list[str]) -> Any:
        async with asyncio.timeout(self._timeout):
            result = await script(keys=[self.key(tenant)], args=args)
        if self._failing:
            self._mark_answering()
        return result

    def _backend_failed(self, tenant: str, exc: BaseException) -> None:
        self.metrics.count("backend_errors", tenant)
        self._mark_failing(exc)

    def _mark_failing(self, exc: BaseException) -> None:
        if self._failing:
            return  # log the transition, not every request: an outage must not flood the log
        self._failing = True
        consequence = (
            "failing closed: every request gets 503 rate_limiter_unavailable and /readyz "
            "answers 503 until Redis answers"
            if self.on_error == "closed"
            else "failing open: requests pass without rate limits until Redis answers"
        )
        log.warning(
            "rate limiter: Redis at %s failed (%s: %s); %s",
            self.where,
            type(exc).__name__,
            exc,
            consequence,
        )

    def _mark_answering(self) -> None:
        if self._failing:
            self._failing = False
            log.warning("rate limiter: Redis at %s is answering again", self.where)

    def _now(self) -> str:
        return "" if self._clock is None else repr(float(self._clock()))


def _args(now: str, limits: RateLimits, requests: int, tokens: int) -> list[str]:
    return [
        now,
        str(limits.request_capacity or 0),
        repr(limits.request_rate),
        str(requests),
        str(limits.token_capacity or 0),
        repr(limits.token_rate),
        str(tokens),
    ]


def _parse(result: Any) -> tuple[bool, float, float]:
    allowed, req, tok = result
    return int(allowed) == 1, float(req), float(tok)


def _without_credentials(url: str) -> str:
    """``url`` without a user or password (it goes into the log)."""
    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "the configured URL"
    netloc = f"[{host}]{port}" if ":" in host else f"{host}{port}"
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def _is_backend_error(exc: BaseException) -> bool:
    """Redis down, slow or refusing: anything but a bug in this module."""
    from redis.exceptions import RedisError

    return isinstance(exc, RedisError | OSError | TimeoutError)


__all__ = ["DEFAULT_PREFIX", "WATCH_INTERVAL_S", "RedisRateLimiter"]
