"""Admission: per-key request and token buckets (in memory or Redis, one Lua script per
operation), concurrency slots with a bounded queue released by weighted fair queuing (flows:
tenants, anonymous callers by address), and the structured-output compile budget (cold
compiles charged per key, exact repeats free, global caps).
"""

from __future__ import annotations

from guard.admission._compile import (
    BUDGET_EXHAUSTED,
    POOL_BUSY,
    ColdCost,
    CompileBudget,
    CompileCaps,
    CompileMetrics,
)
from guard.admission._concurrency import (
    ConcurrencyLimiter,
    ConcurrencyLimits,
    ConcurrencyMetrics,
    Slot,
)
from guard.admission._flow import ANONYMOUS_FLOW_PREFIX, TrustedProxies, address_flow
from guard.admission._ratelimit import (
    FailurePolicy,
    Listener,
    MemoryRateLimiter,
    RateLimiter,
    RateLimiterMetrics,
    RateLimits,
    RedisRateLimiter,
    Reservation,
    make_rate_limiter,
)

__all__ = [
    "ANONYMOUS_FLOW_PREFIX",
    "BUDGET_EXHAUSTED",
    "POOL_BUSY",
    "ColdCost",
    "CompileBudget",
    "CompileCaps",
    "CompileMetrics",
    "ConcurrencyLimiter",
    "ConcurrencyLimits",
    "ConcurrencyMetrics",
    "FailurePolicy",
    "Listener",
    "MemoryRateLimiter",
    "RateLimiter",
    "RateLimiterMetrics",
    "RateLimits",
    "RedisRateLimiter",
    "Reservation",
    "Slot",
    "TrustedProxies",
    "address_flow",
    "make_rate_limiter",
]
