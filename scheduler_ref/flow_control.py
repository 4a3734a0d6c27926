"""Token flow control: per-request prompt cap, output cap, per-tenant token bucket.

- :func:`check_prompt_tokens` refuses a prompt over the per-request cap (the hardened
  profile's 2048) with the same code the incremental counter uses while templates expand.
- :func:`effective_max_tokens` bounds generation by the requested ``max_tokens``, the output
  cap and the context length; the scheduler stops the request there with finish reason
  ``"length"`` -- the cap is enforced during generation, not by refusing the request.
- :class:`TenantTokenLimiter` charges each request ``prompt + max_tokens`` tokens to its
  tenant's bucket *before* it is queued (counting after the response lets bursts overshoot)
  and refunds the unused output when it finishes. An empty bucket raises
  :class:`~guard.errors.RateLimited` ``tenant_tokens_exhausted`` with a ``Retry-After``.
"""

from __future__ import annotations

import itertools
import math
import time
from collections import OrderedDict
from collections.abc import Callable

from guard.errors import LimitExceeded, RateLimited

_EVICT_SCAN = 8


def check_prompt_tokens(num_tokens: int, max_prompt_tokens: int | None) -> None:
    if max_prompt_tokens is not None and num_tokens > max_prompt_tokens:
        raise LimitExceeded(
            "prompt_tokens_exceeded",
            f"the prompt has {num_tokens} tokens; the limit is {max_prompt_tokens}",
            param="prompt",
        )


def effective_max_tokens(
    requested: int | None,
    num_prompt_tokens: int,
    *,
    max_output_tokens: int | None,
    max_model_len: int,
) -> int:
    """How many tokens the request may generate; raises if the prompt leaves no room."""
    room = max_model_len - num_prompt_tokens
    if room < 1:
        raise LimitExceeded(
            "context_length_exceeded",
            f"the prompt has {num_prompt_tokens} tokens; the context length is {max_model_len}",
            param="prompt",
        )
    limit = room
    if requested is not None:
        limit = min(limit, requested)
    if max_output_tokens is not None:
        limit = min(limit, max_output_tokens)
    return limit


class TokenBucket:
    """``burst`` tokens, refilled at ``rate`` tokens per second."""

    __slots__ = ("_clock", "_stamp", "burst", "rate", "tokens")

    def __init__(self, rate: float, burst: int, clock: Callable[[], float]) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("a token bucket needs rate > 0 and burst >= 1")
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._stamp = clock()
        self.tokens = float(burst)

    def _refill(self) -> None:
        now = self._clock()
        self.tokens = min(self.burst, self.tokens + (now - self._stamp) * self.rate)
        self._stamp = now

    def try_consume(self, n: int) -> float:
        """Take ``n`` tokens and return 0.0, or take nothing and return the seconds to wait."""
        self._refill()
        if n <= self.tokens:
            self.tokens -= n
            return 0.0
        return (n - self.tokens) / self.rate

    def refund(self, n: int) -> None:
        self._refill()
        self.tokens = min(self.burst, self.tokens + n)

    def level(self) -> float:
        """Tokens available now."""
        self._refill()
        return self.tokens

    @property
    def is_full(self) -> bool:
        return self.level() >= self.burst


class TenantTokenLimiter:
    """One :class:`TokenBucket` per tenant, at most ``max_tenants`` of them.

    Beyond ``max_tenants`` the least recently used bucket is dropped: a full one loses nothing;
    a partly used one gives its tenant a fresh burst, which bounds memory at the price of some
    leniency -- tenants should be authenticated identities, not client-chosen strings.
    """

    def __init__(
        self,
        tokens_per_s: float,
        burst: int,
        *,
        max_tenants: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        TokenBucket(tokens_per_s, burst, clock)  # validate once
        self.rate = tokens_per_s
        self.burst = burst
        self.max_tenants = max_tenants
        self._clock = clock
        self._buckets: OrderedDict[str, TokenBucket] = OrderedDict()

    def _bucket(self, tenant: str) -> TokenBucket:
        bucket = self._buckets.get(tenant)
        if bucket is None:
            bucket = self._buckets[tenant] = TokenBucket(self.rate, self.burst, self._clock)
            if len(self._buckets) > self.max_tenants:
                self._evict()
        else:
            self._buckets.move_to_end(tenant)
        return bucket

    def _evict(self) -> None:
        # Prefer a full bucket among the few least recently used; never scan them all.
        for name, bucket in itertools.islice(self._buckets.items(), _EVICT_SCAN):
            if bucket.is_full:
                del self._buckets[name]
                return
        self._buckets.popitem(last=False)

    def acquire(self, tenant: str, tokens: int) -> None:
        """Charge ``tokens`` to ``tenant`` or raise without charging anything."""
        if tokens > self.burst:
            raise LimitExceeded(
                "tenant_burst_exceeded",
                f"the request needs {tokens} tokens but a tenant may use at most {self.burst} "
                "at once; lower max_tokens or shorten the prompt",
                param="max_tokens",
            )
        wait = self._bucket(tenant).try_consume(tokens)
        if wait > 0:
            retry = max(1, math.ceil(wait))
            raise RateLimited(
                "tenant_tokens_exhausted",
                f"tenant {tenant!r} has used its token allowance; retry in {retry} s",
                headers={"Retry-After": str(retry)},
            )

    def refund(self, tenant: str, tokens: int) -> None:
        if tokens > 0 and tenant in self._buckets:
            self._buckets[tenant].refund(tokens)

    def available(self, tenant: str) -> float:
        bucket = self._buckets.get(tenant)
        if bucket is None:
            return float(self.burst)
        return bucket.level()

    def __len__(self) -> int:
        return len(self._buckets)
