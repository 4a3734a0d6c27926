"""Unit tests of the scheduling policy, driven step by step (no timing)."""

from __future__ import annotations

from collections import defaultdict

import pytest

from guard.errors import GuardError, Overloaded
from scheduler_ref.config import SchedulerConfig
from scheduler_ref.engine import EngineCore
from scheduler_ref.executor import EOS_TOKEN_ID, SimulatedExecutor
from scheduler_ref.output import ModelRunnerOutput, RequestOutput
from scheduler_ref.request import Request, RequestStatus, SamplingParams
from scheduler_ref.request_queue import PriorityAgingQueue
from scheduler_ref.scheduler import Scheduler


def cfg(**kw: object) -> SchedulerConfig:
    base: dict[str, object] = {
        "num_kv_blocks": 64,
        "max_model_len": 128,
        "max_num_batched_tokens": 256,
        "max_num_seqs": 8,
        "watermark": 0.0,
        "aging_rate": 0.0,
        "preemption_bound_steps": 1,
        "max_waiting": 64,
    }
    base.update(kw)
    return SchedulerConfig(**base)  # type: ignore[arg-type]


class Harness:
    """A scheduler + simulated executor, with every delta recorded."""

    def __init__(self, config: SchedulerConfig, executor: SimulatedExecutor | None = None):
        self.core = EngineCore(config, executor or SimulatedExecutor())
        self.sched = self.core.scheduler
        self.tokens: dict[str, list[int]] = defaultdict(list)
        self.finish: dict[str, str | None] = {}
        self.started_at: dict[str, int] = {}

    def add(self, rid: str, prompt: int, max_tokens: int = 4, priority: int = 0) -> Request:
        req = self.core.make_request(
            rid, [7] * prompt, SamplingParams(max_tokens=max_tokens, priority=priority)
        )
        self.sched.add_request(req)
        return req

    def record(self, outs: list[RequestOutput]) -> None:
        for o in outs:
            assert o.request_id not in self.finish, f"{o.request_id} produced after finishing"
            self.tokens[o.request_id] += o.new_token_ids
            if o.finished:
                self.finish[o.request_id] = o.finish_reason

    def step(self) -> set[str]:
        pair = self.core.schedule_step()
        assert pair is not None
        so, mro = pair
        ids = set(so.num_scheduled_tokens)
        assert len(ids) == len(so.scheduled)
        for rid in ids:
            self.started_at.setdefault(rid, so.step)
        self.record(self.core.complete_step(so, mro))
        return ids

    def run(self, limit: int = 10_000) -> int:
        n = 0
        while self.sched.has_unfinished():
            self.step()
            n += 1
            assert n < limit, "did not drain"
        return n

    def expected(self, rid: str, n: int) -> list[int]:
        ex = self.core.executor
        assert isinstance(ex, SimulatedExecutor)
        return [ex.token_at(rid, i) for i in range(n)]


def test_priority_order_then_fcfs() -> None:
    h = Harness(cfg(max_num_seqs=1))
    h.add("low", 4, priority=5)
    h.add("first", 4, priority=1)
    h.add("urgent", 4, priority=0)
    h.add("second", 4, priority=1)
    h.run()
    order = sorted(h.started_at, key=h.started_at.__getitem__)
    assert order == ["urgent", "first", "second", "low"]


def test_aging_makes_an_old_low_priority_request_win() -> None:
    q = PriorityAgingQueue(aging_rate=1.0)
    old = Request("old", [1], SamplingParams(priority=5), max_tokens=1)
    new = Request("new", [1], SamplingParams(priority=0), max_tokens=1)
    q.key_for(old, 0)
    q.key_for(new, 6)  # arrived 6 steps later: 5 - 6 < 0 effective
    q.push(new)
    q.push(old)
    assert q.peek() is old
    assert q.effective_priority(old, 6) == -1.0 < q.effective_priority(new, 6)
    assert q.remove("old") is old and q.pop() is new and q.peek() is None


def test_queue_removal_is_lazy_but_bounded() -> None:
    q = PriorityAgingQueue(0.0)
    for i in range(200):
        r = Request(f"r{i}", [1], SamplingParams(priority=i % 7), max_tokens=1)
        q.key_for(r, 0)
        q.push(r)
    for i in range(190):
        q.remove(f"r{i}")
    assert len(q) == 10 and len(q._heap) <= 2 * 10 + 16
    assert sorted(r.request_id for r in q) == sorted(f"r{i}" for i in range(190, 200))


def test_batch_respects_max_num_seqs_and_token_budget() -> None:
    h = Harness(cfg(max_num_seqs=3, max_num_batched_tokens=100, max_model_len=64))
    for i in range(6):
        h.add(f"r{i}", 40, max_tokens=3)
    for _ in range(20):
        if not h.sched.has_unfinished():
            break
        pair = h.core.schedule_step()
        assert pair is not None
        so, mro = pair
        assert len(h.sched.running) <= 3
        assert so.total_num_scheduled_tokens <= 100
        h.record(h.core.complete_step(so, mro))
    assert not h.sched.has_unfinished()
    assert all(h.tokens[f"r{i}"] == h.expected(f"r{i}", 3) for i in range(6))


def test_chunked_prefill_splits_long_prompts() -> None:
    h = Harness(cfg(max_model_len=256, max_num_batched_tokens=64, enable_chunked_prefill=True))
    h.add("long", 150, max_tokens=2)
    chunks = []
    while h.sched.has_unfinished():
        pair = h.core.schedule_step()
        assert pair is not None
        so, mro = pair
        chunks.append(so.num_scheduled_tokens["long"])
        assert ("long" in mro.sampled_token_ids) == so.scheduled[0].samples
        h.record(h.core.complete_step(so, mro))
    assert chunks == [64, 64, 22, 1]
    assert h.tokens["long"] == h.expected("long", 2)


def test_long_prompt_waits_for_budget_without_chunking() -> None:
    h = Harness(cfg(max_num_batched_tokens=128))
    h.add("a", 100, max_tokens=3)
    h.add("b", 100, max_tokens=3)
    assert h.step() == {"a"}  # b's prompt does not fit the rest of the budget
    assert h.step() == {"a", "b"}


def test_preemption_for_priority_is_immediate_with_k1() -> None:
    h = Harness(cfg(num_kv_blocks=8, max_model_len=64, max_num_batched_tokens=128))
    h.add("low1", 48, max_tokens=10, priority=5)  # 4 units each when grown
    h.add("low2", 48, max_tokens=10, priority=5)
    h.step()
    assert h.sched.kv.pool.num_free_units <= 2
    h.add("high", 48, max_tokens=4, priority=0)
    ids = h.step()
    assert "high" in ids
    so_preempted = h.sched.preemptions_for_priority
    assert so_preempted >= 1
    h.run()
    for rid, n in (("low1", 10), ("low2", 10), ("high", 4)):
        assert h.tokens[rid] == h.expected(rid, n), rid  # recompute: no dup, no gap
        assert h.finish[rid] == "length"


@pytest.mark.parametrize("k", [1, 2, 4])
def test_a_fitting_higher_priority_request_runs_within_k_steps(k: int) -> None:
    h = Harness(
        cfg(
            num_kv_blocks=8,
            max_model_len=64,
            max_num_batched_tokens=128,
            preemption_bound_steps=k,
        )
    )
    h.add("low", 50, max_tokens=14, priority=9)  # 4 of the 8 units each
    h.add("low2", 50, max_tokens=14, priority=9)
    h.step()
    h.add("high", 40, max_tokens=2, priority=0)
    waited = 0
    while "high" not in h.step():
        waited += 1
    assert waited == k - 1
    assert h.sched.preemptions_for_priority >= 1


def test_no_preemption_when_it_would_not_help() -> None:
    # "mid" is blocked by a *better* request's blocks: preempting the worse one would not
    # make room, so nothing is preempted.
    h = Harness(cfg(num_kv_blocks=7, max_model_len=64, max_num_batched_tokens=128))
    h.add("best", 48, max_tokens=16, priority=0)  # 3 units, 4 once it grows
    h.add("low", 16, max_tokens=4, priority=9)  # 1 unit, 2 once it grows
    h.step()
    h.add("mid", 60, max_tokens=4, priority=1)  # needs 4; at most 7 - 4 = 3 reclaimable
    ids = h.step()
    assert ids == {"best", "low"}
    assert h.sched.num_preemptions == 0
    h.run()
    assert h.finish == {"best": "length", "low": "length", "mid": "length"}


def test_memory_pressure_preempts_the_worst_and_everything_completes() -> None:
    h = Harness(cfg(num_kv_blocks=6, max_model_len=64, max_num_batched_tokens=256))
    for i in range(4):
        h.add(f"r{i}", 8, max_tokens=50, priority=i)
    h.run()
    assert h.sched.preemptions_for_memory > 0
    for i in range(4):
        assert h.tokens[f"r{i}"] == h.expected(f"r{i}", 50)
        assert h.finish[f"r{i}"] == "length"
    assert h.sched.kv.pool.num_free_units == 6


def test_abort_frees_blocks_and_queue_entries() -> None:
    h = Harness(cfg(max_num_seqs=1))
    h.add("run", 40, max_tokens=50)
    h.add("wait", 40, max_tokens=50)
    h.step()
    assert h.sched.kv.units_held("run") > 0
    out = h.sched.abort_request("run")
    assert out is not None and out.finished and out.finish_reason == "abort"
    assert h.sched.kv.pool.num_free_units == 64
    out = h.sched.abort_request("wait")
    assert out is not None and out.finish_reason == "abort"
    assert len(h.sched.waiting) == 0 and not h.sched.has_unfinished()
    assert h.sched.abort_request("wait") is None  # finishes exactly once
    so = h.sched.schedule()
    assert so.is_empty and set(so.finished_request_ids) == {"run", "wait"}


def test_output_of_a_request_aborted_mid_step_is_dropped() -> None:
    h = Harness(cfg())
    h.add("a", 4, max_tokens=5)
    pair = h.core.schedule_step()
    assert pair is not None
    h.sched.abort_request("a")
    assert h.core.complete_step(*pair) == []


def test_eos_stops_and_ignore_eos_continues() -> None:
    h = Harness(cfg(), SimulatedExecutor(eos_after=3))
    h.add("a", 4, max_tokens=10)
    req = h.core.make_request("b", [7] * 4, SamplingParams(max_tokens=5, ignore_eos=True))
    h.sched.add_request(req)
    h.run()
    assert h.tokens["a"][-1] == EOS_TOKEN_ID and len(h.tokens["a"]) == 3
    assert h.finish["a"] == "stop"
    assert len(h.tokens["b"]) == 5 and h.finish["b"] == "length"


def test_stop_token_ids() -> None:
    h = Harness(cfg())
    ex = h.core.executor
    assert isinstance(ex, SimulatedExecutor)
    stop = ex.token_at("a", 2)
    req = h.core.make_request("a", [1], SamplingParams(max_tokens=10, stop_token_ids=(stop,)))
    h.sched.add_request(req)
    h.run()
    assert h.finish["a"] == "stop" and h.tokens["a"][-1] == stop
    assert len(h.tokens["a"]) <= 3


def test_scheduler_capacity_and_duplicates() -> None:
    h = Harness(cfg(max_num_seqs=1, max_waiting=1))
    h.add("a", 4)
    h.add("b", 4)
    assert not h.sched.can_accept()
    with pytest.raises(Overloaded) as err:
        h.add("c", 4)
    assert err.value.code == "waiting_queue_full"
    with pytest.raises(GuardError) as dup:
        h.sched.add_request(h.core.make_request("a", [1], SamplingParams()))
    assert dup.value.code == "duplicate_request_id"


def test_statuses_move_through_the_enum() -> None:
    h = Harness(cfg(num_kv_blocks=4, max_model_len=64, max_num_batched_tokens=64))
    low = h.add("low", 40, max_tokens=20, priority=5)
    seen = [low.status]
    h.step()
    seen.append(low.status)
    h.add("high", 40, max_tokens=2, priority=0)
    h.step()
    seen.append(low.status)
    assert "low" in h.sched.waiting
    h.run()
    seen.append(low.status)
    assert seen == [
        RequestStatus.WAITING,
        RequestStatus.RUNNING,
        RequestStatus.PREEMPTED,
        RequestStatus.FINISHED_LENGTH,
    ]
    assert low.status.is_finished and low.status.finish_reason == "length"
    assert low.num_preemptions == 1


def _flood(aging: float, steps: int) -> int | None:
    """A low-priority request under a steady flood of urgent ones: when does it start?"""
    h = Harness(cfg(max_num_seqs=1, aging_rate=aging, max_waiting=10_000))
    h.add("victim", 4, max_tokens=1, priority=10)
    for t in range(steps):
        h.add(f"u{t}", 4, max_tokens=1, priority=0)
        if "victim" in h.step():
            return t
    return None


def test_aging_prevents_starvation_and_its_absence_starves() -> None:
    started = _flood(aging=1.0, steps=500)
    assert started is not None and started <= 12
    assert _flood(aging=0.0, steps=500) is None


def test_update_requires_a_token_for_each_completed_sequence() -> None:
    s = Scheduler(cfg())
    s.add_request(Request("a", [1, 2], SamplingParams(max_tokens=2), max_tokens=2))
    so = s.schedule()
    with pytest.raises(KeyError):
        s.update_from_output(so, ModelRunnerOutput({}))
