"""Admission: per-key request and token buckets (in memory or Redis, one Lua script per
operation) and concurrency slots with a bounded FIFO queue.
"""

from __future__ import annotations

from guard.admission._concurrency import (
    ConcurrencyLimiter,
    ConcurrencyLimits,
    ConcurrencyMetrics,
    Slot,
)
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
    "make_rate_limiter",
]
