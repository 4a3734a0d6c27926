"""The engine: inbox -> scheduler -> executor, driven by an asyncio loop, streamed per request.

Public API (what the API server uses)::

    engine = Engine(SchedulerConfig.for_profile(HARDENED), SimulatedExecutor(cost))
    await engine.start()                       # or: async with Engine(...) as engine:
    stream = await engine.add_request(         # validates, charges the tenant, enqueues
        request_id, prompt_token_ids,
        SamplingParams(max_tokens=64, priority=0),
        tenant="key-123", depends_on=(), sla_s=None,
    )                                          # raises GuardError before anything streams
    async for out in stream:                   # RequestOutput deltas, merged if you lag
        out.new_token_ids, out.text, out.finished, out.finish_reason,
        out.num_prompt_tokens, out.num_output_tokens   # usage
    engine.abort(request_id)                   # client went away: frees blocks, queue entry
    engine.stats()                             # EngineStats snapshot (flat, for /metrics)
    await engine.stop()                        # aborts everything in flight

    async for out in engine.generate(...)      # add_request + iterate; aborts when closed
                                               # early (client disconnect cancels the task;
                                               # wrap in contextlib.aclosing to abort at once
                                               # on ``break``)

``priority``: lower is more urgent (vLLM's convention); aging improves a waiting request's
effective priority by ``config.aging_rate`` per step.

``add_request`` raises (all :class:`~guard.errors.GuardError`, with a stable ``code``):
``prompt_tokens_exceeded`` / ``context_length_exceeded`` / ``tenant_burst_exceeded`` (400),
``duplicate_request_id`` (409), ``tenant_tokens_exhausted`` (429, ``Retry-After``),
``queue_full`` (503, "instruction queue full", after the inbox stayed full for the dispatch
timeout). A stream raises ``queue_timeout`` (503) if its instruction outlived its SLA in the
inbox, and ``engine_error`` (503) if the loop itself failed. ``finish_reason`` is ``"stop"`` (EOS/stop token), ``"length"`` (max_tokens, the output
cap or the context length) or ``"abort"``.

The loop waits on an :class:`asyncio.Event` when there is no work (no busy wait), then per
iteration: apply aborts, expire stale instructions, move ready instructions into the scheduler
while it has room (the inbox fills -- and ``queue_full`` starts -- only when the scheduler's
bounded waiting queue is full), schedule, execute (awaiting the simulated step time, or
yielding once), update, and hand each delta to its stream. Aborts are applied between steps
only, so a step's output is never applied to a request that changed under it.

:class:`EngineCore` is the same pipeline without asyncio, for tests and benchmarks that drive
steps directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections import Counter
from collections.abc import AsyncGenerator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from types import TracebackType

from guard.errors import GuardError, Overloaded
from scheduler_ref.config import SchedulerConfig
from scheduler_ref.executor import Executor, SimulatedExecutor
from scheduler_ref.flow_control import (
    TenantTokenLimiter,
    check_prompt_tokens,
    effective_max_tokens,
)
from scheduler_ref.inbox import Inbox, Instruction
from scheduler_ref.output import ModelRunnerOutput, RequestOutput, SchedulerOutput
from scheduler_ref.request import Request, RequestStatus, SamplingParams
from scheduler_ref.scheduler import Scheduler

__all__ = ["Engine", "EngineCore", "EngineStats", "RequestStream"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineStats:
    """A snapshot for metrics. KV quantities are in 16-token units ("blocks")."""

    inbox: int
    inbox_capacity: int
    inbox_aborts: int
    waiting: int
    running: int
    kv_blocks_total: int
    kv_blocks_used: int
    kv_blocks_free: int
    kv_usage: float
    kv_fragmentation: float
    preemptions: int
    preemptions_for_priority: int
    preemptions_for_memory: int
    allocation_attempts: int
    allocation_failures: int
    admission_refusals: int
    steps: int
    tenants: int
    max_num_seqs: int = 0  # requests the scheduler runs at once: a proxy's capacity to read
    finished: dict[str, int] = field(default_factory=dict)
    rejections: dict[str, int] = field(default_factory=dict)

    @property
    def queue_depth(self) -> int:
        return self.inbox + self.waiting


class EngineCore:
    """The synchronous pipeline: inbox -> scheduler -> executor. No event loop needed."""

    def __init__(
        self,
        config: SchedulerConfig | None = None,
        executor: Executor | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config = config or SchedulerConfig()
        self.executor: Executor = executor or SimulatedExecutor(config.cost)
        self.scheduler = Scheduler(config, eos_token_id=self.executor.eos_token_id)
        self.inbox = Inbox(
            config.inbox_capacity,
            config.dispatch_timeout_s,
            clock=clock,
            is_pending=self.scheduler.requests.__contains__,
        )
        self.steps = 0
        # Requests that finished without reaching the scheduler (cancelled, expired).
        self._finished_in_inbox: Counter[str] = Counter()

    def make_request(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        sampling: SamplingParams,
        tenant: str | None = None,
    ) -> Request:
        """Apply the per-request token caps; the output cap becomes the request's limit."""
        cfg = self.config
        check_prompt_tokens(len(prompt_token_ids), cfg.max_prompt_tokens)
        max_tokens = effective_max_tokens(
            sampling.max_tokens,
            len(prompt_token_ids),
            max_output_tokens=cfg.max_output_tokens,
            max_model_len=cfg.max_model_len,
        )
        return Request(request_id, prompt_token_ids, sampling, max_tokens=max_tokens, tenant=tenant)

    def instruction(
        self, request: Request, depends_on: Iterable[str] = (), sla_s: float | None = None
    ) -> Instruction:
        return Instruction.add(
            request, depends_on, self.config.default_sla_s if sla_s is None else sla_s
        )

    def is_pending(self, request_id: str) -> bool:
        return request_id in self.inbox or request_id in self.scheduler.requests

    def has_work(self) -> bool:
        return self.inbox.has_work() or self.scheduler.has_unfinished()

    def abort(self, request_id: str) -> RequestOutput | None:
        """Abort a request: at once if it is still in the inbox (its final output is returned),
        else at the next :meth:`pump`."""
        cancelled = self.inbox.put_nowait(Instruction.abort(request_id))
        if cancelled is None:
            return None
        assert cancelled.request is not None
        self._finished_in_inbox["finished_aborted"] += 1
        return _final(cancelled.request, RequestStatus.FINISHED_ABORTED)

    def pump(self) -> list[RequestOutput]:
        """Apply aborts, expire stale instructions, feed the scheduler while it has room."""
        outs: list[RequestOutput] = []
        sched = self.scheduler
        for rid in self.inbox.pop_aborts():
            out = sched.abort_request(rid)
            if out is not None:
                outs.append(out)
        for instr in self.inbox.expire():
            assert instr.request is not None
            self._finished_in_inbox["finished_expired"] += 1
            out = _final(instr.request, RequestStatus.FINISHED_EXPIRED)
            out.error = Overloaded(
                "queue_timeout",
                f"the request waited longer than its SLA of {instr.timeout_s} s in the queue",
                headers={"Retry-After": "1"},
            )
            outs.append(out)
        while sched.can_accept():
            ready = self.inbox.pop_ready()
            if ready is None:
                break
            assert ready.request is not None
            sched.add_request(ready.request)
        return outs

    def schedule_step(self) -> tuple[SchedulerOutput, ModelRunnerOutput] | None:
        if not self.scheduler.has_unfinished():
            return None
        so = self.scheduler.schedule()
        self.steps += 1
        return so, self.executor.execute(so)

    def complete_step(
        self, scheduler_output: SchedulerOutput, model_output: ModelRunnerOutput
    ) -> list[RequestOutput]:
        outs = self.scheduler.update_from_output(scheduler_output, model_output)
        detok = self.executor.detokenize
        for out in outs:
            out.text = detok(out.new_token_ids)
        return outs

    def step(self) -> list[RequestOutput]:
        """One whole iteration of the loop, synchronously (the step time is not slept)."""
        outs = self.pump()
        pair = self.schedule_step()
        if pair is not None:
            outs += self.complete_step(*pair)
        return outs

    def stats(self) -> EngineStats:
        s = self.scheduler.stats()
        kv = self.scheduler.kv.stats()
        return EngineStats(
            inbox=len(self.inbox),
            inbox_capacity=self.inbox.capacity,
            inbox_aborts=self.inbox.num_aborts,
            waiting=s.waiting,
            running=s.running,
            kv_blocks_total=kv.total_units,
            kv_blocks_used=kv.allocated_units,
            kv_blocks_free=kv.free_units,
            kv_usage=kv.usage,
            kv_fragmentation=kv.fragmentation,
            preemptions=s.preemptions,
            preemptions_for_priority=s.preemptions_for_priority,
            preemptions_for_memory=s.preemptions_for_memory,
            allocation_attempts=kv.allocation_attempts,
            allocation_failures=kv.allocation_failures,
            admission_refusals=kv.admission_refusals,
            steps=self.steps,
            max_num_seqs=self.scheduler.config.max_num_seqs,
            tenants=0,
            finished=dict(Counter(s.finished) + self._finished_in_inbox),
        )


def _final(req: Request, status: RequestStatus) -> RequestOutput:
    req.status = status
    return RequestOutput(
        request_id=req.request_id,
        finished=True,
        finish_reason=status.finish_reason,
        num_prompt_tokens=req.num_prompt_tokens,
        num_output_tokens=req.num_output_tokens,
    )


class RequestStream:
    """The outputs of one request, as an async iterator of :class:`RequestOutput` deltas.

    Holds at most one pending delta: a consumer that lags gets the deltas merged, so a slow
    client costs no more memory than its tokens.
    """

    def __init__(self, engine: Engine, request: Request) -> None:
        self._engine = engine
        self.request_id = request.request_id
        self.num_prompt_tokens = request.num_prompt_tokens
        self.max_tokens = request.max_tokens
        self.tenant = request.tenant
        self._pending: RequestOutput | None = None
        self._ready = asyncio.Event()
        self.finished = False  # the last delta was produced
        self.abort_requested = False
        self._consumed = False  # ... and handed to the consumer
        self.cancelled_in_inbox = False

    def _put(self, out: RequestOutput) -> None:
        if self._pending is None:
            self._pending = out
        else:
            self._pending.merge(out)
        self.finished = self.finished or out.finished
        self._ready.set()

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self._consumed:
            raise StopAsyncIteration
        await self._ready.wait()
        out = self._pending
        assert out is not None
        self._pending = None
        self._ready.clear()
        if out.finished:
            self._consumed = True
        if out.error is not None:
            raise out.error
        return out

    def abort(self) -> None:
        self._engine.abort(self.request_id)


class Engine:
    """The asyncio engine. See the module docstring for the API."""

    def __init__(
        self,
        config: SchedulerConfig | None = None,
        executor: Executor | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.core = core = EngineCore(config, executor, clock=clock)
        self.config = cfg = core.config
        self.limiter: TenantTokenLimiter | None = None
        if cfg.tenant_tokens_per_s is not None and cfg.tenant_burst_tokens is not None:
            self.limiter = TenantTokenLimiter(
                cfg.tenant_tokens_per_s,
                cfg.tenant_burst_tokens,
                max_tenants=cfg.max_tenants,
                clock=clock,
            )
        self._streams: dict[str, RequestStream] = {}
        self._wakeup = asyncio.Event()
        core.inbox.on_put = self._wakeup.set
        self._task: asyncio.Task[None] | None = None
        self._error: Exception | None = None
        self.rejections: Counter[str] = Counter()

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="schedguard-engine")

    async def stop(self) -> None:
        """Stop the loop and abort everything in flight (streams end with "abort")."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for rid in list(self._streams):
            self.abort(rid)
        self._dispatch(self.core.pump())
        for rid in list(self.core.scheduler.requests):  # not from a stream: tests, benches
            self.core.scheduler.abort_request(rid)

    @property
    def is_running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def __aenter__(self) -> Engine:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    # -- requests ----------------------------------------------------------------------------

    async def add_request(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        sampling: SamplingParams | None = None,
        *,
        tenant: str | None = None,
        depends_on: Iterable[str] = (),
        sla_s: float | None = None,
    ) -> RequestStream:
        """Validate, charge the tenant and enqueue; the stream of the request's outputs."""
        sampling = sampling or SamplingParams()
        try:
            if request_id in self._streams:
                raise GuardError(
                    "duplicate_request_id",
                    f"request id {request_id!r} is already in flight",
                    status=409,
                )
            request = self.core.make_request(request_id, prompt_token_ids, sampling, tenant)
            charge = request.num_prompt_tokens + request.max_tokens
            if self.limiter is not None and tenant is not None:
                self.limiter.acquire(tenant, charge)
            if self._error is not None:
                raise Overloaded("engine_error", f"the engine loop failed: {self._error!r}")
            stream = RequestStream(self, request)
            self._streams[request_id] = stream
            try:
                await self.core.inbox.put(self.core.instruction(request, depends_on, sla_s))
            except BaseException:
                del self._streams[request_id]
                if self.limiter is not None and tenant is not None:
                    self.limiter.refund(tenant, charge)
                raise
        except GuardError as exc:
            self.rejections[exc.code] += 1
            raise
        if stream.abort_requested:  # aborted while waiting for a slot
            self.abort(request_id)
        return stream

    async def generate(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        sampling: SamplingParams | None = None,
        *,
        tenant: str | None = None,
        depends_on: Iterable[str] = (),
        sla_s: float | None = None,
    ) -> AsyncGenerator[RequestOutput, None]:
        """Outputs of a new request; closing the generator early aborts the request."""
        stream = await self.add_request(
            request_id,
            prompt_token_ids,
            sampling,
            tenant=tenant,
            depends_on=depends_on,
            sla_s=sla_s,
        )
        try:
            async for out in stream:
                yield out
        finally:
            if not stream.finished:
                self.abort(request_id)

    def abort(self, request_id: str) -> bool:
        """Cancel a request in flight; False if there is none with this id."""
        stream = self._streams.get(request_id)
        if stream is None or stream.finished:
            return False
        stream.abort_requested = True
        if request_id in self.core.inbox:
            stream.cancelled_in_inbox = True
        elif not self.core.is_pending(request_id):
            return True  # still waiting for an inbox slot: add_request aborts it after
        out = self.core.abort(request_id)
        if out is not None:
            self._dispatch([out])
        return True

    # -- the loop ----------------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            await self._loop()
        except Exception as exc:  # a bug: fail every stream rather than hang them
            log.exception("engine loop failed")
            self._error = exc
            for rid in list(self._streams):
                self._dispatch(
                    [
                        RequestOutput(
                            rid,
                            finished=True,
                            finish_reason="abort",
                            error=Overloaded("engine_error", f"the engine loop failed: {exc!r}"),
                        )
                    ]
                )
            raise

    async def _loop(self) -> None:
        core = self.core
        while True:
            if not core.has_work():
                self._wakeup.clear()
                await self._wakeup.wait()
            self._dispatch(core.pump())
            pair = core.schedule_step()
            if pair is None:
                continue
            so, mro = pair
            if so.is_empty:  # pragma: no cover - the best request can always run
                self._wakeup.clear()
                await self._wakeup.wait()
            if mro.step_time_s > 0:
                await asyncio.sleep(mro.step_time_s)
            else:
                await asyncio.sleep(0)  # let handlers run between steps
            self._dispatch(core.complete_step(so, mro))

    def _dispatch(self, outs: list[RequestOutput]) -> None:
        for out in outs:
            stream = self._streams.get(out.request_id)
            if stream is None:
                continue
            stream._put(out)
            if out.finished:
                del self._streams[out.request_id]
                if out.error is not None:
                    self.rejections[out.error.code] += 1
                self._refund(stream, out)

    def _refund(self, stream: RequestStream, out: RequestOutput) -> None:
        if self.limiter is None or stream.tenant is None:
            return
        unused = stream.max_tokens - out.num_output_tokens
        if out.error is not None or stream.cancelled_in_inbox:
            unused += stream.num_prompt_tokens  # it never ran
        self.limiter.refund(stream.tenant, unused)

    # -- metrics -----------------------------------------------------------------------------

    def stats(self) -> EngineStats:
        return dataclasses.replace(
            self.core.stats(),
            tenants=0 if self.limiter is None else len(self.limiter),
            rejections=dict(self.rejections),
        )
