"""Token flow control: prompt cap, output cap, per-tenant token bucket."""

from __future__ import annotations

import pytest

from guard.errors import LimitExceeded, RateLimited
from scheduler_ref.config import SchedulerConfig
from scheduler_ref.engine import EngineCore
from scheduler_ref.flow_control import (
    TenantTokenLimiter,
    TokenBucket,
    check_prompt_tokens,
    effective_max_tokens,
)
from scheduler_ref.profiles import HARDENED, VULNERABLE
from scheduler_ref.request import SamplingParams


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_prompt_cap_uses_the_incremental_counters_code() -> None:
    check_prompt_tokens(2048, 2048)
    check_prompt_tokens(10**9, None)
    with pytest.raises(LimitExceeded) as err:
        check_prompt_tokens(2049, 2048)
    assert err.value.code == "prompt_tokens_exceeded" and err.value.status == 400


def test_effective_max_tokens_applies_cap_and_context() -> None:
    assert effective_max_tokens(None, 10, max_output_tokens=2048, max_model_len=8192) == 2048
    assert effective_max_tokens(5000, 10, max_output_tokens=2048, max_model_len=8192) == 2048
    assert effective_max_tokens(16, 10, max_output_tokens=2048, max_model_len=8192) == 16
    assert effective_max_tokens(None, 8000, max_output_tokens=None, max_model_len=8192) == 192
    with pytest.raises(LimitExceeded) as err:
        effective_max_tokens(1, 8192, max_output_tokens=None, max_model_len=8192)
    assert err.value.code == "context_length_exceeded"


def test_output_cap_ends_generation_with_length() -> None:
    cfg = SchedulerConfig.for_profile(HARDENED, max_output_tokens=5, num_kv_blocks=1024)
    core = EngineCore(cfg)
    req = core.make_request("r", [1, 2, 3], SamplingParams(max_tokens=1000))
    assert req.max_tokens == 5
    core.inbox.put_nowait(core.instruction(req))
    outs = []
    while core.has_work():
        outs += core.step()
    assert sum(len(o.new_token_ids) for o in outs) == 5
    assert outs[-1].finished and outs[-1].finish_reason == "length"


def test_profiles_set_the_caps() -> None:
    hard = SchedulerConfig.for_profile(HARDENED)
    assert (hard.max_prompt_tokens, hard.max_output_tokens) == (2048, 2048)
    soft = SchedulerConfig.for_profile(VULNERABLE)
    assert soft.max_prompt_tokens is None and soft.max_output_tokens is None
    core = EngineCore(hard)
    with pytest.raises(LimitExceeded, match="2049 tokens"):
        core.make_request("r", [1] * 2049, SamplingParams())


def test_token_bucket_refills_at_its_rate_up_to_burst() -> None:
    clock = FakeClock()
    bucket = TokenBucket(rate=100.0, burst=500, clock=clock)
    assert bucket.try_consume(400) == 0.0
    assert bucket.try_consume(200) == pytest.approx(1.0)  # 100 left, 100 short at 100/s
    clock.t += 1.0
    assert bucket.try_consume(200) == 0.0
    clock.t += 100.0
    assert bucket.level() == 500  # capped at burst
    bucket.refund(1000)
    assert bucket.level() == 500


def test_tenant_limiter_raises_rate_limited_with_retry_after() -> None:
    clock = FakeClock()
    limiter = TenantTokenLimiter(10.0, 100, clock=clock)
    limiter.acquire("a", 100)
    with pytest.raises(RateLimited) as err:
        limiter.acquire("a", 25)
    e = err.value
    assert e.code == "tenant_tokens_exhausted" and e.status == 429
    assert e.headers["Retry-After"] == "3"  # 25 tokens at 10/s
    limiter.acquire("b", 100)  # tenants are independent
    clock.t += 2.5
    limiter.acquire("a", 25)
    limiter.refund("a", 1000)
    assert limiter.available("a") == 100


def test_a_request_larger_than_the_burst_is_refused_outright() -> None:
    limiter = TenantTokenLimiter(10.0, 100, clock=FakeClock())
    with pytest.raises(LimitExceeded) as err:
        limiter.acquire("a", 101)
    assert err.value.code == "tenant_burst_exceeded"
    assert limiter.available("a") == 100  # nothing charged


def test_tenant_map_is_bounded() -> None:
    clock = FakeClock()
    limiter = TenantTokenLimiter(10.0, 100, max_tenants=3, clock=clock)
    limiter.acquire("busy", 100)
    for i in range(50):
        limiter.acquire(f"t{i}", 1)
        assert len(limiter) <= 3
    limiter.acquire("busy", 0)
    assert len(limiter) == 3
