"""Stateful property tests: submit, cancel, step, priority arrivals and clock ticks in any order.

Invariants checked after every rule:

- boundedness: the inbox never holds more than its capacity, the scheduler never more than
  ``max_num_seqs + max_waiting`` requests, never more than ``max_num_seqs`` running;
- KV conservation: allocated + free == total, and allocated == the sum of live requests' blocks;
- no duplicate execution or completion: a request is scheduled at most once per step and only
  while running; every output position is sampled once, in order, with the model's token;
  every request finishes at most once and never produces after finishing;
- timely preemption: a waiting request that would fit once the lower-priority running requests
  were preempted runs at the latest in the K-th step in which that is so (an independent
  oracle recomputes "would fit" from the scheduler's public state);
- liveness: once arrivals stop, every request finishes within a bounded number of steps
  (teardown), with every block back in the pool.
"""

from __future__ import annotations

from collections import defaultdict

import hypothesis.strategies as st
from hypothesis import HealthCheck, event, settings
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
)

from guard.errors import Overloaded
from scheduler_ref.config import SchedulerConfig
from scheduler_ref.engine import EngineCore
from scheduler_ref.executor import EOS_TOKEN_ID, SimulatedExecutor
from scheduler_ref.output import RequestOutput, SchedulerOutput
from scheduler_ref.request import RequestStatus, SamplingParams

SMALL_LEN = 64
BIG_LEN = 17_000  # > 16k tokens: 32-token blocks, mixed with 16-token ones


# prompt length, big (mixed mode only), max_tokens, priority, dependencies, SLA
Spec = tuple[int, bool, int, int, list[int], float | None]
REQUEST = st.tuples(
    st.integers(1, SMALL_LEN - 1),
    st.booleans(),
    st.integers(1, 12),
    st.sampled_from([3, 0, 1, 2]),
    st.lists(st.integers(0, 50), max_size=2),
    st.sampled_from([None, None, None, 1.0, 5.0]),
)


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class SchedulerMachine(RuleBasedStateMachine):
    @initialize(
        mixed=st.booleans(),
        seqs=st.integers(1, 4),
        waiting=st.integers(0, 4),
        inbox=st.integers(1, 4),
        spare_units=st.integers(0, 8),
        watermark=st.sampled_from([0.0, 0.1]),
        chunked=st.booleans(),
        budget_extra=st.integers(0, 64),
        k=st.integers(1, 3),
        aging=st.sampled_from([0.0, 0.1, 1.0]),
        eos=st.sampled_from([0.0, 0.2]),
    )
    def setup(
        self,
        mixed: bool,
        seqs: int,
        waiting: int,
        inbox: int,
        spare_units: int,
        watermark: float,
        chunked: bool,
        budget_extra: int,
        k: int,
        aging: float,
        eos: float,
    ) -> None:
        max_len = BIG_LEN if mixed else SMALL_LEN
        probe = SchedulerConfig(
            max_model_len=max_len, max_num_batched_tokens=max_len, num_kv_blocks=1 << 20
        )
        need = probe.units_for_sequence(max_len)
        units = need + spare_units * (100 if mixed else 1)
        if watermark:  # keep max_model_len admissible above the watermark
            units = int(units / (1 - watermark)) + 2
        min_budget = (4096 if mixed else 8) if chunked else max_len
        budget = min_budget + budget_extra
        self.config = SchedulerConfig(
            inbox_capacity=inbox,
            max_waiting=waiting,
            max_num_seqs=seqs,
            max_num_batched_tokens=budget,
            enable_chunked_prefill=chunked,
            max_model_len=max_len,
            num_kv_blocks=units,
            watermark=watermark,
            aging_rate=aging,
            preemption_bound_steps=k,
        )
        self.mixed = mixed
        self.clock = FakeClock()
        self.executor = SimulatedExecutor(eos_probability=eos)
        self.core = EngineCore(self.config, self.executor, clock=self.clock)
        self.sched = self.core.scheduler
        self.n = 0
        self.submitted: list[str] = []
        self.max_tokens: dict[str, int] = {}
        self.tokens: dict[str, list[int]] = defaultdict(list)
        self.finished: dict[str, str | None] = {}
        # Steps in which the waiting head would fit (oracle) and still waited.
        self.fitting_waits: dict[str, int] = defaultdict(int)
        self.max_fitting_wait = 0

    # -- rules -------------------------------------------------------------------------------

    @rule(spec=REQUEST)
    def submit(self, spec: Spec) -> None:
        self._submit(spec)

    @rule(specs=st.lists(REQUEST, min_size=2, max_size=5))
    def burst(self, specs: list[Spec]) -> None:
        """Several arrivals between two steps, in any priority order."""
        for spec in specs:
            self._submit(spec)

    @rule(spec=REQUEST, priority=st.integers(-8, -1))
    def urgent_arrival(self, spec: Spec, priority: int) -> None:
        """A request more urgent than any ordinary one arrives while others run."""
        self._submit(spec, priority)

    def _submit(self, spec: Spec, priority_override: int | None = None) -> None:
        prompt, big, max_tokens, priority, deps, sla = spec
        if priority_override is not None:
            priority = priority_override
        if big and self.mixed:
            prompt = BIG_LEN - 700 + prompt * 10
        rid = f"r{self.n}"
        self.n += 1
        req = self.core.make_request(
            rid, [3] * prompt, SamplingParams(max_tokens=max_tokens, priority=priority)
        )
        depends = [self.submitted[d % len(self.submitted)] for d in deps if self.submitted]
        was_full = self.core.inbox.full()
        try:
            self.core.inbox.put_nowait(self.core.instruction(req, depends, sla))
        except Overloaded as exc:
            assert exc.code == "queue_full" and was_full
            event("queue_full")
            return
        assert not was_full
        self.submitted.append(rid)
        self.max_tokens[rid] = req.max_tokens

    @rule(index=st.integers(0, 1000))
    def cancel(self, index: int) -> None:
        if not self.submitted:
            return
        rid = self.submitted[index % len(self.submitted)]
        out = self.core.abort(rid)  # finished or unknown ids are ignored
        if out is not None:  # cancelled in the inbox, on the spot
            assert out.finish_reason == "abort" and rid not in self.core.inbox
            self._record([out])

    @rule(seconds=st.sampled_from([0.5, 2.0]))
    def tick(self, seconds: float) -> None:
        self.clock.t += seconds

    @rule()
    def step(self) -> None:
        self._step()

    @rule(n=st.integers(2, 6))
    def steps(self, n: int) -> None:
        for _ in range(n):
            self._step()

    # -- one step, checked -------------------------------------------------------------------

    def _step(self) -> None:
        self._record(self.core.pump())
        pair = self.core.schedule_step()
        if pair is None:
            return
        so, mro = pair
        self._check_schedule(so)
        for rid in mro.sampled_token_ids:
            s = next(x for x in so.scheduled if x.request_id == rid)
            assert s.samples and s.num_output_tokens == len(self.tokens[rid]), "sampled twice"
        self._check_timely_preemption(so)
        self._record(self.core.complete_step(so, mro))

    def _check_schedule(self, so: SchedulerOutput) -> None:
        cfg = self.config
        ids = [s.request_id for s in so.scheduled]
        assert len(ids) == len(set(ids)), "a request scheduled twice in one step"
        assert not set(ids) & set(so.preempted_request_ids)
        assert so.total_num_scheduled_tokens <= cfg.max_num_batched_tokens
        assert len(ids) <= cfg.max_num_seqs
        for s in so.scheduled:
            req = self.sched.requests[s.request_id]
            assert req.status is RequestStatus.RUNNING and s.request_id not in self.finished
            assert s.num_computed_tokens + s.num_new_tokens <= req.num_tokens
            assert self.sched.kv.units_held(s.request_id) > 0
        if self.sched.has_unfinished():
            assert ids, "live requests but nothing scheduled: the loop would stall"
        # Only the lowest-priority requests are preempted: every request left running has a
        # better key than every request preempted in this step.
        if so.preempted_request_ids:
            worst_running = max((r.sort_key for r in self.sched.running), default=None)
            best_preempted = min(
                self.sched.requests[rid].sort_key for rid in so.preempted_request_ids
            )
            assert worst_running is None or worst_running < best_preempted

    def _check_timely_preemption(self, so: SchedulerOutput) -> None:
        """Oracle: would the best waiting request fit if every worse runner were preempted?"""
        cfg = self.config
        sched = self.sched
        kv = sched.kv
        for req in sched.running:
            self.fitting_waits.pop(req.request_id, None)
        for rid in so.preempted_request_ids:
            self.fitting_waits.pop(rid, None)
        waiting = list(sched.waiting)
        if not waiting:
            return
        head = min(waiting, key=lambda r: r.sort_key)
        if head.request_id in so.preempted_request_ids:
            return
        better = [r for r in sched.running if r.sort_key < head.sort_key]
        better_ids = {r.request_id for r in better}
        leftover = cfg.max_num_batched_tokens - sum(
            s.num_new_tokens for s in so.scheduled if s.request_id in better_ids
        )
        need = head.num_tokens - head.num_computed_tokens
        if cfg.enable_chunked_prefill:
            need = min(need, leftover)
        if need < 1 or need > leftover:
            return
        held = sum(kv.units_held(r.request_id) for r in better)
        fits = (
            len(better) < cfg.max_num_seqs
            and kv.pool.num_units - held - kv.units_needed(head, need) >= kv.watermark_units
        )
        if fits:
            self.fitting_waits[head.request_id] += 1
            self.max_fitting_wait = max(self.max_fitting_wait, self.fitting_waits[head.request_id])
            assert self.fitting_waits[head.request_id] <= cfg.preemption_bound_steps - 1, (
                f"{head.request_id} could run by preemption but waited "
                f"{self.fitting_waits[head.request_id]} steps (K={cfg.preemption_bound_steps})"
            )

    def _record(self, outs: list[RequestOutput]) -> None:
        for o in outs:
            rid = o.request_id
            assert rid not in self.finished, f"{rid} produced output after finishing"
            for tok in o.new_token_ids:
                assert tok == self.executor.token_at(rid, len(self.tokens[rid]))
                self.tokens[rid].append(tok)
            if o.finished:
                self.finished[rid] = o.finish_reason
                toks = self.tokens[rid]
                if o.finish_reason == "length":
                    assert len(toks) == self.max_tokens[rid]
                elif o.finish_reason == "stop":
                    assert toks and toks[-1] == EOS_TOKEN_ID
                else:
                    assert o.finish_reason == "abort"
                    assert o.error is None or o.error.code == "queue_timeout"
                assert rid not in self.sched.requests and rid not in self.core.inbox

    # -- invariants --------------------------------------------------------------------------

    @invariant()
    def bounded(self) -> None:
        cfg = self.config
        sched = self.sched
        assert len(self.core.inbox) <= cfg.inbox_capacity
        assert len(sched.running) <= cfg.max_num_seqs
        assert len(sched.waiting) + len(sched.running) <= cfg.max_num_seqs + cfg.max_waiting
        assert len(sched.requests) == len(sched.waiting) + len(sched.running)
        assert self.core.inbox.num_aborts <= cfg.max_num_seqs + cfg.max_waiting

    @invariant()
    def kv_conserved(self) -> None:
        kv = self.sched.kv
        pool = kv.pool
        assert pool.num_allocated_units + pool.num_free_units == pool.num_units
        held = sum(kv.units_held(rid) for rid in self.sched.requests)
        assert held == pool.num_allocated_units
        assert 0.0 <= kv.fragmentation <= 1.0

    @invariant()
    def statuses_match_queues(self) -> None:
        sched = self.sched
        running = {r.request_id for r in sched.running}
        waiting = {r.request_id for r in sched.waiting}
        assert not running & waiting
        assert all(r.status is RequestStatus.RUNNING for r in sched.running)
        assert all(
            r.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED) for r in sched.waiting
        )
        assert not (running | waiting) & set(self.finished)

    def teardown(self) -> None:
        if not hasattr(self, "core"):
            return
        # Liveness: with arrivals stopped, everything finishes, and the pool is whole again.
        for _ in range(5_000):
            if not self.core.has_work():
                break
            self._step()
        assert not self.core.has_work(), "requests left after 5000 steps: starvation"
        sched = self.sched
        event(f"mixed block sizes: {self.mixed}")
        event(f"preempted for priority: {sched.preemptions_for_priority > 0}")
        event(f"preempted for memory: {sched.preemptions_for_memory > 0}")
        event(f"a fitting request waited (grace): {self.max_fitting_wait > 0}")
        event(f"submitted: {min(self.n // 5 * 5, 20)}+")
        event(f"reasons: {sorted(set(self.finished.values()), key=str)}")
        event(f"watermark refusals: {sched.kv.admission_refusals > 0}")
        assert set(self.finished) == set(self.submitted)
        pool = self.sched.kv.pool
        assert pool.num_free_units == pool.num_units


SchedulerMachine.TestCase.settings = settings(
    max_examples=400,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestScheduler = SchedulerMachine.TestCase
