"""The block pool and the KV cache manager: dynamic block sizes, watermark, counters."""

from __future__ import annotations

import pytest

from scheduler_ref.block_pool import BlockPool, block_size_for
from scheduler_ref.config import SchedulerConfig
from scheduler_ref.kv_cache_manager import KVCacheManager
from scheduler_ref.request import Request, SamplingParams


def _req(rid: str, prompt: int, max_tokens: int = 1) -> Request:
    return Request(rid, [1] * prompt, SamplingParams(max_tokens=max_tokens), max_tokens=max_tokens)


def _cfg(**kw: object) -> SchedulerConfig:
    base: dict[str, object] = {
        "num_kv_blocks": 64,
        "max_model_len": 512,
        "max_num_batched_tokens": 512,
        "watermark": 0.0,
    }
    base.update(kw)
    return SchedulerConfig(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("seq_len", "size"),
    [(1, 16), (16 * 1024, 16), (16 * 1024 + 1, 32), (64 * 1024, 32), (64 * 1024 + 1, 64)],
)
def test_block_size_follows_the_seed_rule(seq_len: int, size: int) -> None:
    assert block_size_for(seq_len) == size


def test_pool_conserves_units_across_mixed_sizes() -> None:
    pool = BlockPool(10)
    a = pool.allocate(2, 16)
    b = pool.allocate(1, 64)
    assert a is not None and b is not None
    assert [len(blk.units) for blk in a + b] == [1, 1, 4]
    assert pool.num_allocated_units == 6 and pool.num_free_units == 4
    assert pool.allocate(1, 64) is not None
    assert pool.allocate(1, 16) is None  # all-or-nothing: nothing taken
    assert pool.num_allocated_units + pool.num_free_units == 10
    pool.free(a + b)
    assert pool.num_free_units == 6
    with pytest.raises(ValueError, match="multiple of 16"):
        pool.allocate(1, 24)


def test_blocks_of_a_long_request_are_larger_and_fewer() -> None:
    cfg = _cfg(
        num_kv_blocks=8192, max_model_len=70_000, max_num_batched_tokens=70_000, watermark=0.0
    )
    kv = KVCacheManager(cfg)
    long = _req("long", 65_600)  # > 64k tokens: 64-token blocks
    assert kv.admit(long, long.num_tokens)
    assert kv.block_size(long) == 64
    assert len(kv.block_ids("long")) == -(-65_600 // 64)  # 1025 entries instead of 4100
    assert kv.units_held("long") == 1025 * 4
    mid = _req("mid", 20_000)  # > 16k: 32
    assert kv.admit(mid, 20_000)
    assert kv.block_size(mid) == 32
    stats = kv.stats()
    assert stats.allocated_units + stats.free_units == stats.total_units


def test_block_size_is_fixed_by_max_sequence_length_not_current_length() -> None:
    cfg = _cfg(num_kv_blocks=4096, max_model_len=20_000, max_num_batched_tokens=20_000)
    kv = KVCacheManager(cfg)
    req = _req("r", 100, max_tokens=17_000)  # may reach 17_100 tokens -> 32-token blocks
    assert kv.admit(req, 100)
    assert kv.block_size(req) == 32 and kv.units_held("r") == 4 * 2


def test_dynamic_block_size_can_be_disabled() -> None:
    cfg = _cfg(
        num_kv_blocks=4096,
        max_model_len=20_000,
        max_num_batched_tokens=20_000,
        dynamic_block_size=False,
    )
    kv = KVCacheManager(cfg)
    req = _req("r", 17_000)
    assert kv.admit(req, 17_000)
    assert kv.block_size(req) == 16


def test_watermark_refuses_admission_but_not_growth() -> None:
    cfg = _cfg(num_kv_blocks=10, max_model_len=64, max_num_batched_tokens=64, watermark=0.2)
    kv = KVCacheManager(cfg)
    assert kv.watermark_units == 2
    a = _req("a", 16 * 8)  # 8 units: leaves exactly the watermark
    b = _req("b", 16)
    cfg_ok = kv.admit(a, a.num_tokens)
    assert cfg_ok
    assert not kv.admit(b, 16)  # would leave 1 < 2
    assert kv.admission_refusals == 1 and kv.allocation_failures == 0
    a.num_computed_tokens = a.num_tokens
    assert kv.allocate_slots(a, 16)  # a running request may dip into the headroom
    assert kv.pool.num_free_units == 1


def test_allocation_failures_are_counted_and_take_nothing() -> None:
    kv = KVCacheManager(_cfg(num_kv_blocks=4, max_model_len=64, max_num_batched_tokens=64))
    a = _req("a", 48)
    assert kv.admit(a, 48)
    b = _req("b", 32)
    assert not kv.admit(b, 32)
    assert kv.allocation_failures == 1 and kv.allocation_attempts == 2
    assert kv.units_held("b") == 0 and kv.pool.num_free_units == 1


def test_fragmentation_is_the_unused_tail_of_last_blocks() -> None:
    kv = KVCacheManager(_cfg())
    assert kv.fragmentation == 0.0
    a = _req("a", 20)  # 2 blocks of 16, 20 of 32 slots used
    assert kv.admit(a, 20)
    assert kv.fragmentation == pytest.approx(12 / 32)
    b = _req("b", 16)
    assert kv.admit(b, 16)
    assert kv.fragmentation == pytest.approx(12 / 48)
    assert kv.free("a") == 2
    assert kv.fragmentation == 0.0
    assert kv.free("a") == 0  # idempotent


def test_growth_allocates_only_when_a_block_fills() -> None:
    kv = KVCacheManager(_cfg())
    r = _req("r", 15, max_tokens=40)
    assert kv.admit(r, 15)
    assert kv.units_held("r") == 1
    r.num_computed_tokens = 15
    r.output_token_ids.append(5)
    assert kv.units_needed(r, 1) == 0
    assert kv.allocate_slots(r, 1) and kv.units_held("r") == 1
    r.num_computed_tokens = 16
    r.output_token_ids.append(5)
    assert kv.units_needed(r, 1) == 1
    assert kv.allocate_slots(r, 1) and kv.units_held("r") == 2


def test_config_refuses_a_pool_that_cannot_hold_one_sequence() -> None:
    with pytest.raises(ValueError, match="num_kv_blocks"):
        SchedulerConfig(num_kv_blocks=10, max_model_len=1024, max_num_batched_tokens=1024)
    with pytest.raises(ValueError, match="chunked prefill"):
        SchedulerConfig(max_model_len=9000, max_num_batched_tokens=8192)
