"""The asyncio engine: inbox -> loop -> streams, cancellation, queue full, flow control."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from guard.errors import GuardError, LimitExceeded, Overloaded, RateLimited
from scheduler_ref.config import CostModel, SchedulerConfig
from scheduler_ref.engine import Engine
from scheduler_ref.executor import SimulatedExecutor, detokenize
from scheduler_ref.output import RequestOutput
from scheduler_ref.request import SamplingParams

pytestmark = pytest.mark.timeout(120)  # an engine loop that never ends, not a speed check


def cfg(**kw: object) -> SchedulerConfig:
    base: dict[str, object] = {
        "num_kv_blocks": 256,
        "max_model_len": 512,
        "max_num_batched_tokens": 1024,
        "max_num_seqs": 8,
        "inbox_capacity": 8,
        "max_waiting": 8,
    }
    base.update(kw)
    return SchedulerConfig(**base)  # type: ignore[arg-type]


async def until(predicate: object, rounds: int = 10_000) -> None:
    """Yield to the loop until ``predicate()`` holds (no wall-clock sleeps)."""
    for _ in range(rounds):
        if predicate():  # type: ignore[operator]
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never became true")


async def collect(agen: object) -> list[RequestOutput]:
    return [out async for out in agen]  # type: ignore[attr-defined]


async def test_generate_streams_deterministic_tokens_with_usage() -> None:
    ex = SimulatedExecutor()
    async with Engine(cfg(), ex) as engine:
        outs = await collect(engine.generate("a", [1, 2, 3], SamplingParams(max_tokens=6)))
        tokens = [t for o in outs for t in o.new_token_ids]
        assert tokens == [ex.token_at("a", i) for i in range(6)]
        assert "".join(o.text for o in outs) == detokenize(tokens)
        last = outs[-1]
        assert last.finished and last.finish_reason == "length"
        assert (last.num_prompt_tokens, last.num_output_tokens) == (3, 6)
        assert all(not o.finished for o in outs[:-1])
        stats = engine.stats()
        assert stats.kv_blocks_used == 0 and stats.running == 0 and stats.waiting == 0
        assert stats.finished == {"finished_length": 1}


async def test_concurrent_requests_all_complete() -> None:
    async with Engine(cfg(max_num_seqs=2), SimulatedExecutor(eos_probability=0.1)) as engine:
        results = await asyncio.gather(
            *(
                collect(engine.generate(f"r{i}", [5] * (10 + i), SamplingParams(20, priority=i)))
                for i in range(12)
            )
        )
    for outs in results:
        assert outs[-1].finished and outs[-1].finish_reason in ("stop", "length")


async def test_cancel_mid_stream_frees_everything() -> None:
    async with Engine(cfg()) as engine:
        got = 0
        async with contextlib.aclosing(
            engine.generate("a", [1] * 40, SamplingParams(max_tokens=400))
        ) as agen:
            async for out in agen:
                got += len(out.new_token_ids)
                if got >= 3:
                    assert engine.stats().kv_blocks_used > 0
                    break
        await until(lambda: engine.stats().running == 0)
        stats = engine.stats()
        assert stats.kv_blocks_used == 0 and stats.waiting == 0 and stats.inbox == 0
        assert stats.finished == {"finished_aborted": 1}
        assert not engine.abort("a")  # gone


async def test_client_disconnect_cancels_the_consumer_task_and_aborts() -> None:
    async with Engine(cfg()) as engine:
        first = asyncio.Event()

        async def handler() -> None:
            async for _ in engine.generate("a", [1] * 8, SamplingParams(max_tokens=400)):
                first.set()
                await asyncio.sleep(3600)  # the client stops reading

        task = asyncio.create_task(handler())
        await first.wait()
        task.cancel()  # what Starlette does on disconnect
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await until(lambda: engine.stats().running == 0)
        assert engine.stats().kv_blocks_used == 0
        assert engine.stats().finished == {"finished_aborted": 1}


async def test_abort_before_the_loop_takes_it_cancels_in_the_inbox() -> None:
    engine = Engine(cfg())  # not started: the add stays in the inbox
    stream = await engine.add_request("a", [1, 2], SamplingParams(max_tokens=4))
    assert engine.stats().inbox == 1
    assert engine.abort("a")
    assert engine.stats().inbox == 0
    outs = [o async for o in stream]
    assert outs[-1].finish_reason == "abort" and outs[-1].num_output_tokens == 0


async def test_queue_full_after_the_dispatch_timeout() -> None:
    engine = Engine(cfg(inbox_capacity=1, dispatch_timeout_s=0.05))  # nothing drains it
    await engine.add_request("a", [1], SamplingParams())
    t0 = time.monotonic()
    with pytest.raises(Overloaded) as err:
        await engine.add_request("b", [1], SamplingParams())
    assert time.monotonic() - t0 >= 0.04
    assert err.value.code == "queue_full" and err.value.status == 503
    assert "instruction queue full" in err.value.message
    assert engine.stats().rejections == {"queue_full": 1}
    assert engine.stats().inbox == 1


async def test_a_full_scheduler_backs_up_into_the_inbox_then_drains() -> None:
    cost = CostModel(decode_s_per_seq=0.0005, prefill_s_per_token=0.0)
    config = cfg(max_num_seqs=1, max_waiting=0, inbox_capacity=2, dispatch_timeout_s=5.0)
    async with Engine(config, SimulatedExecutor(cost)) as engine:
        streams = [
            await engine.add_request(f"r{i}", [1] * 4, SamplingParams(max_tokens=5))
            for i in range(5)
        ]
        assert engine.stats().inbox <= 2
        for s in streams:
            outs = [o async for o in s]
            assert outs[-1].finish_reason == "length"


async def test_waiting_for_a_slot_then_aborted_never_runs() -> None:
    engine = Engine(cfg(inbox_capacity=1, dispatch_timeout_s=5.0))
    await engine.add_request("a", [1], SamplingParams())
    pending = asyncio.create_task(engine.add_request("b", [1], SamplingParams()))
    await until(lambda: "b" in engine._streams)
    assert engine.abort("b")  # still waiting for a slot
    assert engine.abort("a")  # frees the slot: b gets in, then is aborted at once
    stream_b = await pending
    outs = [o async for o in stream_b]
    assert outs[-1].finish_reason == "abort"
    assert engine.stats().inbox == 0


async def test_instruction_sla_expiry_fails_the_stream() -> None:
    now = [0.0]
    engine = Engine(cfg(), clock=lambda: now[0])
    stream = await engine.add_request("a", [1], SamplingParams(), sla_s=1.0)
    now[0] = 2.0
    await engine.start()
    try:
        with pytest.raises(Overloaded) as err:
            async for _ in stream:
                pass
        assert err.value.code == "queue_timeout"
        assert engine.stats().rejections == {"queue_timeout": 1}
    finally:
        await engine.stop()


async def test_dependencies_order_requests() -> None:
    async with Engine(cfg()) as engine:
        order: list[str] = []

        async def run(rid: str, deps: tuple[str, ...], n: int) -> None:
            async for out in engine.generate(rid, [1], SamplingParams(n), depends_on=deps):
                if out.finished:
                    order.append(rid)

        first = asyncio.create_task(run("first", (), 30))
        await until(lambda: "first" in engine._streams)
        await run("second", ("first",), 1)
        await first
        assert order == ["first", "second"]


async def test_request_validation_errors() -> None:
    config = cfg(max_prompt_tokens=8, max_output_tokens=4)
    async with Engine(config) as engine:
        with pytest.raises(LimitExceeded) as err:
            await engine.add_request("a", [1] * 9, SamplingParams())
        assert err.value.code == "prompt_tokens_exceeded"
        stream = await engine.add_request("d", [1], SamplingParams(max_tokens=100))
        with pytest.raises(GuardError) as dup:
            await engine.add_request("d", [1], SamplingParams())
        assert dup.value.code == "duplicate_request_id" and dup.value.status == 409
        outs = [o async for o in stream]
        assert outs[-1].finish_reason == "length" and outs[-1].num_output_tokens == 4
        assert engine.stats().rejections == {
            "prompt_tokens_exceeded": 1,
            "duplicate_request_id": 1,
        }
    async with Engine(cfg()) as engine:  # no prompt cap: the context length still applies
        with pytest.raises(LimitExceeded) as err:
            await engine.add_request("c", [1] * 512, SamplingParams())
        assert err.value.code == "context_length_exceeded"


async def test_tenant_token_bucket_limits_and_refunds() -> None:
    now = [0.0]
    config = cfg(tenant_tokens_per_s=10.0, tenant_burst_tokens=100)
    async with Engine(config, clock=lambda: now[0]) as engine:
        # 10 prompt + 40 reserved output = 50 each.
        s1 = await engine.add_request("a", [1] * 10, SamplingParams(40), tenant="t")
        await engine.add_request("b", [1] * 10, SamplingParams(40), tenant="t")
        with pytest.raises(RateLimited) as err:
            await engine.add_request("c", [1] * 10, SamplingParams(40), tenant="t")
        assert err.value.code == "tenant_tokens_exhausted"
        assert err.value.headers["Retry-After"] == "5"
        await engine.add_request("d", [1] * 10, SamplingParams(40), tenant="other")
        with pytest.raises(LimitExceeded) as big:
            await engine.add_request("e", [1] * 10, SamplingParams(200), tenant="x")
        assert big.value.code == "tenant_burst_exceeded"
        assert engine.abort("a")
        [o async for o in s1]
        assert engine.limiter is not None
        # a was aborted before producing its 40 tokens: the unused output comes back.
        await until(lambda: not engine._streams)
        assert engine.limiter.available("t") >= 40
        stats = engine.stats()
        assert stats.tenants == 2  # "x" was refused before it got a bucket
        assert stats.finished == {"finished_aborted": 1, "finished_length": 2}


async def test_stop_aborts_streams_in_flight() -> None:
    cost = CostModel(decode_s_per_seq=0.001)
    engine = Engine(cfg(), SimulatedExecutor(cost))
    await engine.start()
    stream = await engine.add_request("a", [1], SamplingParams(max_tokens=500))
    await stream.__anext__()
    await engine.stop()
    outs = [o async for o in stream]
    assert outs[-1].finish_reason == "abort"
    stats = engine.stats()
    assert stats.kv_blocks_used == 0 and stats.running == 0


async def test_idle_loop_waits_without_stepping() -> None:
    async with Engine(cfg()) as engine:
        await collect(engine.generate("a", [1], SamplingParams(max_tokens=2)))
        steps = engine.stats().steps
        for _ in range(200):
            await asyncio.sleep(0)
        assert engine.stats().steps == steps and engine.is_running
        await collect(engine.generate("b", [1], SamplingParams(max_tokens=2)))
        assert engine.stats().steps > steps


async def test_simulated_step_time_is_awaited() -> None:
    cost = CostModel(step_overhead_s=0.01)
    async with Engine(cfg(), SimulatedExecutor(cost)) as engine:
        t0 = time.monotonic()
        await collect(engine.generate("a", [1], SamplingParams(max_tokens=3)))
        assert time.monotonic() - t0 >= 0.025
