"""Configuration of the reference scheduler: one frozen dataclass, validated on construction.

The KV pool is measured in *units* of :data:`~scheduler_ref.block_pool.BASE_BLOCK_TOKENS`
(16) token slots; see :mod:`scheduler_ref.block_pool` for how 32- and 64-token blocks are
accounted. ``SchedulerConfig.for_profile`` applies a profile's token caps.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from scheduler_ref.block_pool import BASE_BLOCK_TOKENS, block_size_for
from scheduler_ref.profiles import Profile


@dataclass(frozen=True)
class CostModel:
    """Simulated step time: ``overhead + prefill_tokens * prefill + decode_seqs * decode``.

    All zero (the default) means the executor never sleeps, which is what unit tests use.
    """

    prefill_s_per_token: float = 0.0
    decode_s_per_seq: float = 0.0
    step_overhead_s: float = 0.0

    def step_time(self, num_prefill_tokens: int, num_decode_seqs: int) -> float:
        if num_prefill_tokens == 0 and num_decode_seqs == 0:
            return 0.0
        return (
            self.step_overhead_s
            + num_prefill_tokens * self.prefill_s_per_token
            + num_decode_seqs * self.decode_s_per_seq
        )


@dataclass(frozen=True)
class SchedulerConfig:
    """Every knob of the scheduler, the inbox, the KV pool and token flow control.

    Priorities follow vLLM: a *lower* ``priority`` value is more urgent. Aging lowers a waiting
    request's effective priority by ``aging_rate`` per scheduler step, so a request of priority
    ``p`` overtakes every request arriving more than ``(p - p_min) / aging_rate`` steps after it.
    """

    # Bounded inbox between API handlers and the core loop.
    inbox_capacity: int = 256
    dispatch_timeout_s: float = 0.5
    # Default SLA of an instruction: how long it may sit in the inbox (None: no expiry).
    default_sla_s: float | None = None
    # Requests held by the scheduler beyond those running (the waiting-queue cap): the
    # scheduler never holds more than ``max_num_seqs + max_waiting`` requests in total.
    max_waiting: int = 1024
    # Continuous batching bounds, per step.
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 8192
    enable_chunked_prefill: bool = False
    # Longest sequence (prompt + output) a request may reach.
    max_model_len: int = 8192
    # KV pool, in 16-token units.
    num_kv_blocks: int = 8192
    dynamic_block_size: bool = True
    # Fraction of the pool kept free when admitting a new request.
    watermark: float = 0.01
    # Effective-priority improvement per step waited.
    aging_rate: float = 0.05
    # K: a waiting request that would fit by preempting lower-priority running requests runs
    # at the latest in the K-th step in which it fits (K=1: preempt at once; larger K gives
    # running requests K-1 steps to finish on their own before recompute is paid).
    preemption_bound_steps: int = 2
    # Token flow control (None: unlimited).
    max_prompt_tokens: int | None = None
    max_output_tokens: int | None = None
    tenant_tokens_per_s: float | None = None
    tenant_burst_tokens: int | None = None
    max_tenants: int = 10_000
    # Simulated executor.
    cost: CostModel = dataclasses.field(default_factory=CostModel)

    def __post_init__(self) -> None:
        positive = (
            "inbox_capacity",
            "max_num_seqs",
            "max_num_batched_tokens",
            "max_model_len",
            "num_kv_blocks",
            "preemption_bound_steps",
            "max_tenants",
        )
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"SchedulerConfig.{name} must be >= 1")
        if self.max_waiting < 0 or self.dispatch_timeout_s < 0 or self.aging_rate < 0:
            raise ValueError("max_waiting, dispatch_timeout_s and aging_rate must be >= 0")
        if not 0.0 <= self.watermark < 1.0:
            raise ValueError("SchedulerConfig.watermark is a fraction in [0, 1)")
        if not self.enable_chunked_prefill and self.max_model_len > self.max_num_batched_tokens:
            raise ValueError(
                "without chunked prefill a whole prompt must fit in one step: set "
                "max_num_batched_tokens >= max_model_len or enable_chunked_prefill"
            )
        need = self.units_for_sequence(self.max_model_len)
        if need > self.num_kv_blocks - self.watermark_units:
            raise ValueError(
                f"a sequence of max_model_len={self.max_model_len} tokens needs {need} KV units "
                f"but only {self.num_kv_blocks - self.watermark_units} are admissible: raise "
                "num_kv_blocks or lower max_model_len/watermark"
            )
        if (self.tenant_tokens_per_s is None) != (self.tenant_burst_tokens is None):
            raise ValueError("set both tenant_tokens_per_s and tenant_burst_tokens, or neither")

    @property
    def watermark_units(self) -> int:
        return math.ceil(self.watermark * self.num_kv_blocks)

    def block_size(self, max_seq_len: int) -> int:
        """The block size (tokens) of a request whose sequence may reach ``max_seq_len``."""
        return block_size_for(max_seq_len) if self.dynamic_block_size else BASE_BLOCK_TOKENS

    def units_for_sequence(self, num_tokens: int) -> int:
        """KV units a sequence of ``num_tokens`` tokens occupies (at its own block size)."""
        bs = self.block_size(num_tokens)
        return -(-num_tokens // bs) * (bs // BASE_BLOCK_TOKENS)

    @classmethod
    def for_profile(cls, profile: Profile, **overrides: Any) -> SchedulerConfig:
        """A config carrying ``profile``'s token caps and per-tenant token bucket."""
        values: dict[str, Any] = {
            "max_prompt_tokens": profile.max_prompt_tokens,
            "max_output_tokens": profile.max_output_tokens,
            "tenant_tokens_per_s": profile.tenant_tokens_per_s,
            "tenant_burst_tokens": profile.tenant_burst_tokens,
        }
        values.update(overrides)
        return cls(**values)
