"""Token-bucket math and the plain data shared by the in-memory and Redis rate limiters.

A bucket holds at most ``capacity`` units and refills continuously at ``rate`` units per second.
A charge is taken only when every bucket involved can pay it; otherwise nothing is charged and
the caller learns how long until it could be. Reconciliation may push a bucket below zero (the
upstream reported more output than was reserved): that debt is real usage and delays the next
request, which is what stops bursts from overshooting the limit.

The Lua scripts in :mod:`guard.admission._lua` implement exactly these formulas; the tests run
the same scenarios through both.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Final, Literal

import pydantic.dataclasses
from pydantic import Field

from guard._limits import LIMITS_CONFIG, PosFloat, PosInt
from guard.errors import LimitExceeded, Overloaded, RateLimited

# Refills are floats; without a tolerance a bucket refilled to 29.999999999 would refuse a
# charge of 30 with a Retry-After of one second.
EPSILON: Final = 1e-9

FailurePolicy = Literal["closed", "open"]

Listener = Callable[[str, str, float], None]
"""``listener(event, tenant, value)``: called for every counted event (see the metrics)."""


@pydantic.dataclasses.dataclass(frozen=True, config=LIMITS_CONFIG)
class RateLimits:
    """One tenant's allowances (the bucket fields of the policy's ``rate`` section). ``None``
    disables that bucket; a bucket's capacity is its largest burst."""

    requests_per_minute: PosInt | None = Field(
        default=600,
        description="Requests per minute per API key (token bucket refilled continuously). "
        "`null`: unlimited.",
    )
    tokens_per_minute: PosInt | None = Field(
        default=200_000,
        description="Tokens per minute per API key, charged before forwarding with the prompt "
        "tokens plus the reserved output (`max_tokens` x sequences), reconciled from the "
        "upstream's `usage`. `null`: unlimited.",
    )
    burst: PosInt = Field(
        default=20, description="Requests one key may send at once: the request bucket's capacity."
    )
    token_burst: PosInt | None = Field(
        default=None,
        description="The token bucket's capacity. `null`: `tokens_per_minute` (a minute's worth).",
    )
    guided_compile_s_per_minute: PosFloat | None = Field(
        default=60.0,
        description="Structured-output compile CPU-seconds per minute per API key (a bucket "
        "refilled continuously): each constraint the upstream has not compiled recently (the "
        "guard's LRU of what it admitted, kind and text as vLLM keys its grammar cache) is "
        "charged its estimated cold compile at the model's vocabulary; exact repeats are "
        "free. 429 `guided_compile_budget_exhausted` with `retry-after` when short. `null`: "
        "unlimited (the global caps in `limits.guided` still apply).",
    )
    guided_compile_burst_s: PosFloat = Field(
        default=120.0,
        description="The compile bucket's capacity in CPU-seconds: what one key may compile "
        "at once, such as an application warming its few dozen schemas (the heaviest benign "
        "ones cost ~2-4 s each at a 100k vocabulary). A request costing more is charged a "
        "full bucket.",
    )

    @cached_property  # read on every request
    def request_capacity(self) -> int | None:
        if self.requests_per_minute is None:
            return None
        return self.burst

    @cached_property  # read on every request
    def token_capacity(self) -> int | None:
        if self.tokens_per_minute is None:
            return None
        return self.token_burst or self.tokens_per_minute

    @cached_property  # read on every structured request
    def compile_limits(self) -> RateLimits | None:
        """The compile bucket as a token bucket of milliseconds (None: unlimited)."""
        per_minute = self.guided_compile_s_per_minute
        if per_minute is None:
            return None
        return RateLimits(
            requests_per_minute=None,
            tokens_per_minute=max(1, round(per_minute * 1000)),
            token_burst=max(1, round(self.guided_compile_burst_s * 1000)),
            guided_compile_s_per_minute=None,
        )

    @cached_property  # read on every request
    def request_rate(self) -> float:
        """Requests refilled per second (0 when unlimited)."""
        return (self.requests_per_minute or 0) / 60.0

    @cached_property  # read on every request
    def token_rate(self) -> float:
        """Tokens refilled per second (0 when unlimited)."""
        return (self.tokens_per_minute or 0) / 60.0


@dataclass
class Reservation:
    """What :meth:`RateLimiter.reserve` charged; settle it once with ``reconcile`` or ``release``.

    ``degraded`` is true when the backend failed and the policy let the request through
    uncharged (fail open); settling such a reservation does nothing. ``remaining`` is what the
    buckets held after the charge (requests, tokens); :attr:`headers` turns it into the
    ``x-ratelimit-*`` headers only when someone asks for them.
    """

    tenant: str
    limits: RateLimits
    requests: int
    tokens: int
    remaining: tuple[float, float] | None = None
    degraded: bool = False
    settled: bool = False

    @property
    def headers(self) -> dict[str, str]:
        """The ``x-ratelimit-*`` headers for this reservation (none when degraded)."""
        if self.remaining is None:
            return {}
        return ratelimit_headers(self.limits, views(self.limits, True, *self.remaining))


@dataclass
class RateLimiterMetrics:
    """Counters the app exports (read them at scrape time; nothing is registered here).

    ``listener``, when set, is also called as ``listener(event, tenant, value)`` with the
    counter's name as the event, so per-tenant series can be kept by the app.
    """

    allowed: int = 0
    rejected_requests: int = 0
    rejected_tokens: int = 0
    rejected_oversize: int = 0
    tokens_reserved: int = 0
    tokens_refunded: int = 0
    tokens_overshoot: int = 0
    backend_errors: int = 0
    fail_open: int = 0
    fail_closed: int = 0
    settle_errors: int = 0
    listener: Listener | None = field(default=None, repr=False, compare=False)

    def count(self, event: str, tenant: str, value: int = 1) -> None:
        setattr(self, event, getattr(self, event) + value)
        if self.listener is not None:
            self.listener(event, tenant, float(value))

    def snapshot(self) -> dict[str, int]:
        return {
            name: value
            for name, value in vars(self).items()
            if name != "listener" and isinstance(value, int)
        }


def count_settlement(metrics: RateLimiterMetrics, tenant: str, refund: int) -> None:
    """Count a reconciliation: ``refund`` > 0 gives tokens back, < 0 charges an overshoot."""
    if refund > 0:
        metrics.count("tokens_refunded", tenant, refund)
    elif refund < 0:
        metrics.count("tokens_overshoot", tenant, -refund)


def refill(level: float, stamp: float, now: float, capacity: float, rate: float) -> float:
    """The bucket's level at ``now``; a clock that went backwards refills nothing."""
    return min(capacity, level + max(0.0, now - stamp) * rate)


def wait_for(level: float, cost: float, rate: float) -> float:
    """Seconds until a bucket at ``level`` can pay ``cost`` (0 when it can now)."""
    if level + EPSILON >= cost:
        return 0.0
    return (cost - level) / rate


def reset_after(level: float, capacity: float, rate: float) -> float:
    """Seconds until the bucket is full again (when it is as good as never used)."""
    return max(0.0, (capacity - level) / rate)


@dataclass(frozen=True)
class BucketView:
    """A bucket after a decision, for headers: its level and seconds until full."""

    level: float
    reset_s: float


@dataclass(frozen=True)
class Decision:
    """The outcome of one reserve: allowed, or which bucket refused and for how long."""

    allowed: bool
    requests: BucketView | None
    tokens: BucketView | None
    retry_after_s: float = 0.0
    limited_by: Literal["requests", "tokens", None] = None


def decide(
    limits: RateLimits, req_level: float, tok_level: float, requests: int, tokens: int
) -> Decision:
    """Whether both buckets (at these refilled levels) can pay; levels are before the charge."""
    req_wait = tok_wait = 0.0
    if limits.request_capacity is not None:
        req_wait = wait_for(req_level, requests, limits.request_rate)
    if limits.token_capacity is not None:
        tok_wait = wait_for(tok_level, tokens, limits.token_rate)
    if req_wait == 0.0 and tok_wait == 0.0:
        return views(limits, True, req_level - requests, tok_level - tokens)
    denied = views(limits, False, req_level, tok_level)
    return Decision(
        False,
        denied.requests,
        denied.tokens,
        retry_after_s=max(req_wait, tok_wait),
        limited_by="requests" if req_wait >= tok_wait else "tokens",
    )


def views(limits: RateLimits, allowed: bool, req_level: float, tok_level: float) -> Decision:
    """A decision without a wait, with the buckets' levels as they now stand."""
    req_cap, tok_cap = limits.request_capacity, limits.token_capacity
    return Decision(
        allowed,
        None
        if req_cap is None
        else BucketView(req_level, reset_after(req_level, req_cap, limits.request_rate)),
        None
        if tok_cap is None
        else BucketView(tok_level, reset_after(tok_level, tok_cap, limits.token_rate)),
    )


def check_fits(limits: RateLimits, requests: int, tokens: int) -> None:
    """Refuse a charge no bucket could ever pay: waiting would not help, so 400, not 429."""
    if requests < 0 or tokens < 0:
        raise ValueError("requests and tokens must be non-negative")
    token_capacity = limits.token_capacity
    if token_capacity is not None and tokens > token_capacity:
        raise LimitExceeded(
            "request_exceeds_token_budget",
            f"this request needs {tokens} tokens (prompt plus max_tokens), more than the "
            f"{token_capacity} tokens this API key may use at once; lower max_tokens or "
            "shorten the prompt",
            param="max_tokens",
        )
    request_capacity = limits.request_capacity
    if request_capacity is not None and requests > request_capacity:
        raise ValueError(f"requests={requests} exceeds the request burst {request_capacity}")


def format_duration(seconds: float) -> str:
    """OpenAI's ``x-ratelimit-reset-*`` format: ``250ms``, ``1.5s``, ``6m0s``."""
    if seconds < 1.0:
        return f"{math.ceil(seconds * 1000)}ms"
    if seconds < 60.0:
        return f"{math.ceil(seconds * 1000) / 1000:g}s"
    minutes, rest = divmod(math.ceil(seconds), 60)
    return f"{minutes}m{rest}s"


def ratelimit_headers(limits: RateLimits, decision: Decision) -> dict[str, str]:
    """``x-ratelimit-{limit,remaining,reset}-{requests,tokens}`` for the buckets in use."""
    headers: dict[str, str] = {}
    for kind, per_minute, view in (
        ("requests", limits.requests_per_minute, decision.requests),
        ("tokens", limits.tokens_per_minute, decision.tokens),
    ):
        if per_minute is None or view is None:
            continue
        headers[f"x-ratelimit-limit-{kind}"] = str(per_minute)
        headers[f"x-ratelimit-remaining-{kind}"] = str(max(0, math.floor(view.level + EPSILON)))
        headers[f"x-ratelimit-reset-{kind}"] = format_duration(view.reset_s)
    return headers


def retry_after_header(seconds: float) -> str:
    """Whole seconds, rounded up, at least 1: a client retrying then will succeed."""
    return str(max(1, math.ceil(seconds - EPSILON)))


def rejection(limits: RateLimits, decision: Decision) -> RateLimited:
    headers = ratelimit_headers(limits, decision)
    headers["retry-after"] = retry_after_header(decision.retry_after_s)
    wait = f"{decision.retry_after_s:.3g}"
    if decision.limited_by == "requests":
        return RateLimited(
            "rate_limited_requests",
            f"rate limit of {limits.requests_per_minute} requests per minute reached; "
            f"retry in {wait} s",
            headers=headers,
        )
    return RateLimited(
        "rate_limited_tokens",
        f"rate limit of {limits.tokens_per_minute} tokens per minute reached; retry in {wait} s",
        headers=headers,
    )


def unavailable(detail: str) -> Overloaded:
    return Overloaded(
        "rate_limiter_unavailable",
        f"the rate limiter's shared store is unavailable ({detail}); retry shortly",
        headers={"retry-after": "1"},
    )
