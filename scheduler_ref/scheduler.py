"""The scheduling policy: synchronous, deterministic, testable without timing.

One step is ``schedule()`` -> executor -> ``update_from_output()``.

``schedule()`` walks running requests and the waiting queue *merged in effective-priority
order* (see :mod:`scheduler_ref.request_queue`), under two per-step budgets: ``max_num_seqs``
running requests and ``max_num_batched_tokens`` tokens.

- A running request is given its remaining tokens (1 when decoding; a chunk when prefilling
  with chunked prefill). If its blocks cannot grow, the worst-priority running request not yet
  scheduled this step is preempted (possibly itself). Because of the merged order, every such
  victim has a worse key than the request that needs the room.
- The waiting head is admitted if a sequence slot, its tokens and its blocks (above the
  watermark) are available. If it would fit once every running request of worse priority were
  preempted, those are preempted (worst first, only as many as needed) -- but only in the K-th
  step in which this is so (``preemption_bound_steps``), giving runners K-1 steps to finish on
  their own. If it cannot fit even then, admission stops for this step (strict head-of-line:
  a large request is not overtaken forever by small ones).

Preemption is by recompute: blocks are freed, progress reset, the request goes back to the
waiting queue with its original key. Keys are constant and totally ordered, so a request is
only ever preempted in favour of a strictly better one: no ping-pong, and the best request
always progresses (``max_model_len`` fits the pool by construction).

Finished requests leave the scheduler at once; a request id is scheduled at most once per
step, never after it finished, and finishes exactly once.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

from guard.errors import GuardError, Overloaded
from scheduler_ref.config import SchedulerConfig
from scheduler_ref.kv_cache_manager import KVCacheManager, KVCacheStats
from scheduler_ref.output import ModelRunnerOutput, RequestOutput, ScheduledRequest, SchedulerOutput
from scheduler_ref.request import Request, RequestStatus
from scheduler_ref.request_queue import PriorityAgingQueue


@dataclass(frozen=True)
class SchedulerStats:
    step: int
    waiting: int
    running: int
    preemptions: int
    preemptions_for_priority: int
    preemptions_for_memory: int
    finished: dict[str, int] = field(default_factory=dict)
    kv: KVCacheStats | None = None


class Scheduler:
    def __init__(self, config: SchedulerConfig, eos_token_id: int | None = None) -> None:
        self.config = config
        self.eos_token_id = eos_token_id
        self.kv = KVCacheManager(config)
        self.waiting = PriorityAgingQueue(config.aging_rate)
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.step_count = 0
        self.preemptions_for_priority = 0
        self.preemptions_for_memory = 0
        self.finished_counts: collections.Counter[str] = collections.Counter()
        self._finished_since_step: list[str] = []

    # -- intake ------------------------------------------------------------------------------

    @property
    def capacity(self) -> int:
        """Most requests the scheduler holds at once (running + waiting)."""
        return self.config.max_num_seqs + self.config.max_waiting

    def can_accept(self) -> bool:
        return len(self.requests) < self.capacity

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise GuardError(
                "duplicate_request_id",
                f"request id {request.request_id!r} is already in flight",
                status=409,
            )
        if not self.can_accept():
            raise Overloaded("waiting_queue_full", "the scheduler's waiting queue is full")
        if request.status is not RequestStatus.WAITING or request.num_computed_tokens:
            raise ValueError("only fresh requests can be added")
        if request.max_seq_len > self.config.max_model_len:
            raise ValueError("request exceeds max_model_len; clamp max_tokens first")
        self.waiting.key_for(request, self.step_count)
        self.waiting.push(request)
        self.requests[request.request_id] = request

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """Cancel a request wherever it is and free its blocks; None if it is not here."""
        req = self.requests.get(request_id)
        if req is None:
            return None
        if req.status is RequestStatus.RUNNING:
            self.running.remove(req)
        else:
            self.waiting.remove(request_id)
        self._finish(req, RequestStatus.FINISHED_ABORTED)
        return self._output(req, [], finished=True)

    # -- one step ----------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        cfg = self.config
        kv = self.kv
        self.step_count += 1
        budget = cfg.max_num_batched_tokens
        scheduled: list[ScheduledRequest] = []
        preempted: list[str] = []
        # Running requests not yet handled this step, best first; victims come off the end.
        pending = sorted(self.running, key=_key)
        i = 0
        admit_more = True
        while True:
            run = pending[i] if i < len(pending) else None
            head = self.waiting.peek() if admit_more else None
            if run is None and head is None:
                break
            if head is not None and (run is None or head.sort_key < run.sort_key):
                if head.request_id in preempted:
                    admit_more = False  # it just lost its blocks; no point taking them back
                    continue
                n = self._admissible_tokens(head, budget)
                if n is None or not self._make_room(head, n, pending, i, preempted):
                    admit_more = False
                    continue
                self.waiting.pop()
                if not kv.admit(head, n):  # pragma: no cover - _make_room checked it
                    raise AssertionError("admission failed after room was made")
                head.status = RequestStatus.RUNNING
                head.blocked_steps = 0
                self.running.append(head)
                scheduled.append(_scheduled(head, n))
                budget -= n
                continue
            assert run is not None
            n = run.num_tokens - run.num_computed_tokens
            if cfg.enable_chunked_prefill:
                n = min(n, budget)
            if n == 0 or n > budget:
                i += 1  # stalls this step, keeping its blocks
                continue
            while not kv.allocate_slots(run, n):
                victim = pending.pop()
                self._preempt(victim, preempted)
                self.preemptions_for_memory += 1
                if victim is run:
                    break
            else:
                scheduled.append(_scheduled(run, n))
                budget -= n
                i += 1
        finished, self._finished_since_step = self._finished_since_step, []
        return SchedulerOutput(
            step=self.step_count,
            scheduled=tuple(scheduled),
            preempted_request_ids=tuple(preempted),
            finished_request_ids=tuple(finished),
        )

    def _admissible_tokens(self, req: Request, budget: int) -> int | None:
        need = req.num_tokens - req.num_computed_tokens
        if self.config.enable_chunked_prefill:
            need = min(need, budget)
        return need if 0 < need <= budget else None

    def _make_room(
        self, head: Request, n: int, pending: list[Request], i: int, preempted: list[str]
    ) -> bool:
        """Whether ``head`` can take ``n`` tokens now, preempting worse runners if due."""
        kv = self.kv
        max_seqs = self.config.max_num_seqs
        units = kv.units_needed(head, n)
        if len(self.running) < max_seqs and kv.can_admit(units):
            return True
        victims = pending[i:]  # all unscheduled, all with worse keys than head
        reclaimable = sum(kv.units_held(v.request_id) for v in victims)
        fits = len(self.running) - len(victims) < max_seqs and (
            kv.pool.num_free_units + reclaimable - units >= kv.watermark_units
        )
        if not fits:
            if units > kv.pool.num_free_units:
                kv.allocation_attempts += 1
                kv.allocation_failures += 1
            elif not kv.can_admit(units):
                kv.admission_refusals += 1
            return False
        head.blocked_steps += 1
        if head.blocked_steps < self.config.preemption_bound_steps:
            return False  # grace: runners get K-1 steps to finish by themselves
        while not (len(self.running) < max_seqs and kv.can_admit(units)):
            victim = pending.pop()
            self._preempt(victim, preempted)
            self.preemptions_for_priority += 1
        return True

    def _preempt(self, req: Request, preempted: list[str]) -> None:
        self.running.remove(req)
        self.kv.free(req.request_id)
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self.waiting.push(req)
        preempted.append(req.request_id)

    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_output: ModelRunnerOutput
    ) -> list[RequestOutput]:
        """Advance every scheduled request; return the deltas (new tokens, finishes)."""
        outputs: list[RequestOutput] = []
        sampled = model_output.sampled_token_ids
        for s in scheduler_output.scheduled:
            req = self.requests.get(s.request_id)
            if req is None or req.status is not RequestStatus.RUNNING:
                continue  # aborted while the step ran
            req.num_computed_tokens += s.num_new_tokens
            if req.num_computed_tokens < req.num_tokens:
                continue  # a prefill chunk: nothing sampled yet
            token = sampled[s.request_id]
            req.output_token_ids.append(token)
            status = self._stop_status(req, token)
            if status is not None:
                self.running.remove(req)
                self._finish(req, status)
            outputs.append(self._output(req, [token], finished=status is not None))
        return outputs

    def _stop_status(self, req: Request, token: int) -> RequestStatus | None:
        sp = req.sampling
        if not sp.ignore_eos and token == self.eos_token_id:
            return RequestStatus.FINISHED_STOPPED
        if token in sp.stop_token_ids:
            return RequestStatus.FINISHED_STOPPED
        if req.num_output_tokens >= req.max_tokens or req.num_tokens >= self.config.max_model_len:
            return RequestStatus.FINISHED_LENGTH
        return None

    def _finish(self, req: Request, status: RequestStatus) -> None:
        if req.status.is_finished:  # pragma: no cover - would be a double completion
            raise AssertionError(f"{req.request_id} finished twice")
        req.status = status
        self.kv.free(req.request_id)
        del self.requests[req.request_id]
        self.finished_counts[status.name.lower()] += 1
        self._finished_since_step.append(req.request_id)

    @staticmethod
    def _output(req: Request, tokens: list[int], *, finished: bool) -> RequestOutput:
        return RequestOutput(
            request_id=req.request_id,
            new_token_ids=tokens,
            finished=finished,
            finish_reason=req.status.finish_reason if finished else None,
            num_prompt_tokens=req.num_prompt_tokens,
            num_output_tokens=req.num_output_tokens,
        )

    # -- introspection -----------------------------------------------------------------------

    def get_request(self, request_id: str) -> Request | None:
        return self.requests.get(request_id)

    @property
    def num_preemptions(self) -> int:
        return self.preemptions_for_priority + self.preemptions_for_memory

    def stats(self) -> SchedulerStats:
        return SchedulerStats(
            step=self.step_count,
            waiting=len(self.waiting),
            running=len(self.running),
            preemptions=self.num_preemptions,
            preemptions_for_priority=self.preemptions_for_priority,
            preemptions_for_memory=self.preemptions_for_memory,
            finished=dict(self.finished_counts),
            kv=self.kv.stats(),
        )


def _key(req: Request) -> tuple[float, int]:
    return req.sort_key


def _scheduled(req: Request, n: int) -> ScheduledRequest:
    return ScheduledRequest(
        request_id=req.request_id,
        num_new_tokens=n,
        num_computed_tokens=req.num_computed_tokens,
        num_prompt_tokens=req.num_prompt_tokens,
        num_output_tokens=req.num_output_tokens,
    )
