"""The scheduler core as a state machine: the input is a configuration byte and a list of ops.

Ops (one opcode byte, ``% 5``, then its operands)::

    0 submit   len, max_tokens, priority     prompt of 1 + 8*len tokens, priority (p % 8) - 2
    1 cancel   index                          abort the index-th submitted request
    2 step     n                              run 1 + n % 8 engine steps
    3 urgent   len, max_tokens                submit at priority -8 (preempts others)
    4 tick     n                              advance the fake clock by (n % 4) / 2 s

After every op the invariants of ``tests/scheduler_ref/test_scheduler_stateful.py`` that are cheap to check
hold (bounded queues, KV conservation, statuses match queues); at the end the engine must drain
within a bounded number of steps (liveness). A violation is a crash. ``queue_full`` and the
token caps are the documented rejections of a submit and do not end the run.

Cost: ``steps`` is the model work (tokens scheduled, recomputation after preemption included),
``output_tokens`` the tokens sampled; amplification shows as cost per input byte.
"""

from __future__ import annotations

import random
from typing import Any

from fuzz._exceptions import InvariantViolation
from fuzz.targets._base import Budgets, Cost
from fuzz.targets._common import TargetBase
from fuzz.targets._mutate import byte_mutate
from guard.errors import GuardError

__all__ = ["SchedulerState"]

_OP_ARGS = (3, 1, 1, 2, 1)
_DRAIN_STEPS = 20_000
_MIB = 1 << 20


class SchedulerState(TargetBase):
    source = "scheduler_ref/scheduler.py"
    name = "scheduler-state"
    description = "the scheduler core as a state machine (submit/cancel/step/priority/tick ops)"
    exercises = "scheduler_ref.engine.EngineCore: inbox -> scheduler -> simulated executor"
    kind = "state"
    budgets = Budgets(
        wall_s=1.0, mem_bytes=64 * _MIB, steps=5_000_000, output_tokens=None, cost_per_byte=50.0
    )
    expected = (GuardError,)
    isolate_by_default = False
    endpoint = "/internal/scheduler"
    class_ = "volume"
    target_field = "ops"
    max_size = 512
    _seeds = (b"\x00\x00\x04\x04\x00\x02\x01", b"\x01\x00\x10\x08\x01\x03\x20\x04\x02\x05")
    _dictionary = (
        b"\x00\xff\x3f\x07",
        b"\x03\xff\x3f",
        b"\x02\x07",
        b"\x01\x00",
        b"\x04\x03",
    )

    def __init__(self) -> None:
        self._work = 0
        self._sampled = 0

    def mutate(self, data: bytes, max_size: int, rng: random.Random) -> bytes:
        return byte_mutate(data, max_size, rng, self._dictionary)

    def progress(self) -> Cost:
        return Cost(steps=self._work, output_tokens=self._sampled)

    def execute(self, data: bytes) -> Cost:
        from guard.errors import Overloaded
        from scheduler_ref.engine import EngineCore
        from scheduler_ref.executor import SimulatedExecutor
        from scheduler_ref.request import SamplingParams

        self._work = self._sampled = 0
        conf = data[0] if data else 0
        config = _config(conf)
        clock = _Clock()
        core = EngineCore(
            config, SimulatedExecutor(eos_probability=0.2 if conf & 8 else 0.0), clock=clock
        )
        submitted: list[str] = []
        pos = 1
        n = 0
        while pos < len(data):
            op = data[pos] % 5
            args = data[pos + 1 : pos + 1 + _OP_ARGS[op]].ljust(_OP_ARGS[op], b"\0")
            pos += 1 + _OP_ARGS[op]
            if op in (0, 3):
                length = 1 + 8 * args[0]
                max_tokens = 1 + args[1] % 64
                priority = -8 if op == 3 else args[2] % 8 - 2
                rid = f"r{n}"
                n += 1
                try:
                    req = core.make_request(
                        rid, [3] * length, SamplingParams(max_tokens=max_tokens, priority=priority)
                    )
                    core.inbox.put_nowait(core.instruction(req))
                except (Overloaded, GuardError):
                    pass  # queue full / over a cap: documented, the run goes on
                else:
                    submitted.append(rid)
            elif op == 1:
                if submitted:
                    core.abort(submitted[args[0] % len(submitted)])
            elif op == 2:
                for _ in range(1 + args[0] % 8):
                    self._step(core)
            else:
                clock.t += (args[0] % 4) / 2
            _check(core)
        for _ in range(_DRAIN_STEPS):
            if not core.has_work():
                break
            self._step(core)
        else:
            raise InvariantViolation(f"requests left after {_DRAIN_STEPS} steps: starvation")
        _check(core)
        return Cost(steps=self._work, output_tokens=self._sampled)

    def _step(self, core: Any) -> None:
        core.pump()
        pair = core.schedule_step()
        if pair is None:
            return
        so, mro = pair
        self._work += so.total_num_scheduled_tokens
        self._sampled += len(mro.sampled_token_ids)
        core.complete_step(so, mro)


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _config(conf: int) -> Any:
    from scheduler_ref.config import SchedulerConfig

    chunked = bool(conf & 1)
    max_len = 2048 + 64
    probe = SchedulerConfig(
        max_model_len=max_len, max_num_batched_tokens=max_len, num_kv_blocks=1 << 20
    )
    need = probe.units_for_sequence(max_len)
    return SchedulerConfig(
        inbox_capacity=4 + (conf >> 4) % 4,
        max_waiting=(conf >> 6) * 2,
        max_num_seqs=1 + (conf >> 1) % 4,
        max_num_batched_tokens=256 if chunked else max_len,
        enable_chunked_prefill=chunked,
        max_model_len=max_len,
        num_kv_blocks=need + 4 + (conf % 7) * 8,
        watermark=0.0,
        preemption_bound_steps=1 + conf % 3,
    )


def _check(core: Any) -> None:
    cfg = core.config
    sched = core.scheduler
    if len(core.inbox) > cfg.inbox_capacity:
        raise InvariantViolation("inbox over capacity")
    if len(sched.running) > cfg.max_num_seqs:
        raise InvariantViolation("more running than max_num_seqs")
    if len(sched.waiting) + len(sched.running) > cfg.max_num_seqs + cfg.max_waiting:
        raise InvariantViolation("scheduler holds more than max_num_seqs + max_waiting")
    kv = sched.kv
    pool = kv.pool
    if pool.num_allocated_units + pool.num_free_units != pool.num_units:
        raise InvariantViolation("KV units not conserved")
    if sum(kv.units_held(rid) for rid in sched.requests) != pool.num_allocated_units:
        raise InvariantViolation("KV units held != allocated")
    running = {r.request_id for r in sched.running}
    waiting = {r.request_id for r in sched.waiting}
    if running & waiting:
        raise InvariantViolation("a request both running and waiting")
