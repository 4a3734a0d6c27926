"""The guard's core, transport-free: what every request goes through, whatever carries it.

The ASGI proxy (:mod:`guard.proxy`), the dry run (``POST /guard/v1/check``) and the Envoy
ext_proc server (:mod:`guard.extproc`) are adapters around one :class:`Gateway`:

- the front half: :meth:`Gateway.open` (framing of the head: header caps; route and method and
  the path sent upstream, a model id the upstream could not be sent as it was judged: 400
  ``invalid_path``; the API key), then :meth:`Gateway.judge` with the body as read under the
  framing caps (the pipeline's checks) gives the :class:`~guard.exchange.Admission`;
- admitted: :meth:`Gateway.prepare` (the body to forward with its mutations, the tokens to
  reserve), :meth:`Gateway.reserve` (rate limits), :meth:`Gateway.slot` (concurrency);
- the back half: an :class:`~guard.answer.Answer` observes the upstream's answer (usage, the
  streamed output and its cap), :meth:`Gateway.settle` reconciles or releases the reservation
  (:meth:`Gateway.settle_unfinished` when the request ended early), and :meth:`Gateway.record`
  writes the metrics, the access line and the span once per request.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from guard.admission import (
    ANONYMOUS_FLOW_PREFIX,
    CompileBudget,
    CompileCaps,
    ConcurrencyLimiter,
    MemoryRateLimiter,
    RateLimiter,
    RateLimits,
    RedisRateLimiter,
    Reservation,
    Slot,
    address_flow,
    make_rate_limiter,
)
from guard.answer import Answer, RelayArgs
from guard.errors import GuardError
from guard.exchange import Admission, Exchange, Opened, check_outcomes
from guard.http import Upstream, decode_body, head_refusals, inspect_head
from guard.pipeline import Verdict, check_body
from guard.policy import Policy
from guard.request import ANONYMOUS_TENANT, KEPT_HEADERS, lax_bool, normalise_headers
from guard.routing import (
    method_of,
    resolve_key,
    route_not_allowed,
    route_of,
    upstream_target,
)
from guard.telemetry import (
    SYNC_INTERVAL_S,
    AccessLog,
    GuardMetrics,
    RequestFields,
    RequestSpan,
    Tracing,
    make_tracing,
)
from guard.tokens import TokenCounter, get_counter

__all__ = ["Forward", "Gateway", "build_gateway", "forward_body", "reservable"]

_MAX_TOKENIZED_DELTA = 1024
_COMPILE_PREFIX = "schedguard:gc:"  # the compile budget's tenant buckets in Redis
_VIEWED = frozenset(name.encode("latin-1") for name in (*KEPT_HEADERS, "authorization"))
_NOTHING_TO_CHECK = Verdict(True)  # a GET without a body
_WARM_UP_BODIES = (
    ("/v1/chat/completions", b'{"model":"m","messages":[{"role":"user","content":"hi"}]}'),
    ("/v1/completions", b'{"model":"m","prompt":"hi","response_format":{"type":"json_object"}}'),
)


@dataclass(slots=True)
class Forward:
    """What an admitted request sends upstream and reserves (:meth:`Gateway.prepare`)."""

    body: bytes
    tokens: int  # to reserve: prompt tokens plus the reserved output
    relay_args: RelayArgs


def framing_refused(ex: Exchange, err: GuardError) -> Admission:
    """A refusal of the request's framing, as a verdict whose one step is ``framing``."""
    durations = MappingProxyType({"framing": time.perf_counter() - ex.start})
    return Admission(Verdict(False, err, durations=durations))


def reservable(costs: Mapping[str, int], tokens: int, rate: RateLimits) -> int:
    """The tokens to reserve: ``tokens``, except that a request without an output cap (its
    reservation is the window's remainder, a bound rather than a request) is charged at most
    the key's token bucket, never refused for it; ``usage`` settles the rest."""
    capacity = rate.token_capacity
    if not costs.get("output_tokens_implicit") or capacity is None or tokens <= capacity:
        return tokens
    return max(costs.get("prompt_tokens", 0), capacity)


def forward_body(verdict: Verdict, raw: bytes) -> bytes:
    """The body to forward. Mutations that only add top-level keys the body lacks (an injected
    ``max_tokens``: the common case) are spliced into ``raw`` after its opening brace, so the
    body is not re-serialised; anything else goes through :meth:`Verdict.forward_body`."""
    mutations = verdict.mutations
    if not mutations:
        return raw
    obj = verdict.view.obj if verdict.view is not None else None
    head = raw.lstrip()
    if (
        obj is None
        or not head.startswith(b"{")
        or any(
            len(m.path) != 1 or not isinstance(m.path[0], str) or m.path[0] in obj
            for m in mutations
        )
        or len({m.path[0] for m in mutations}) != len(mutations)
    ):
        return verdict.forward_body(raw)
    members = b",".join(_member(m.path[0], m.value) for m in mutations)
    rest = head[1:]
    sep = b"" if rest.lstrip().startswith(b"}") else b","
    return b"{" + members + sep + rest


def _member(name: str | int, value: Any) -> bytes:
    """``"name":value`` as JSON; the usual values (an injected ``max_tokens``: a few policy
    numbers) are encoded once."""
    if type(value) is int:
        return _int_member(name, value)
    return _encode_member(name, value)


def _encode_member(name: str | int, value: Any) -> bytes:
    return json.dumps(name).encode() + b":" + json.dumps(value, separators=(",", ":")).encode()


_int_member = functools.lru_cache(maxsize=256)(_encode_member)


def _include_usage(obj: Any) -> bool:
    if not isinstance(obj, dict):
        return False
    options = obj.get("stream_options")
    return isinstance(options, dict) and lax_bool(options.get("include_usage")) is True


class Gateway:
    """Everything the guarded path needs, shared by all requests of one server. ``upstream``:
    the client the proxy forwards with (None under Envoy, which forwards itself)."""

    def __init__(
        self,
        policy: Policy,
        *,
        upstream: Upstream | None,
        limiter: RateLimiter,
        concurrency: ConcurrencyLimiter,
        metrics: GuardMetrics,
        access_log: AccessLog,
        tracing: Tracing | None,
        count_tokens: Callable[[str], int],
        client_timeout_s: float,
        compile_budget: CompileBudget | None = None,
    ) -> None:
        self.policy = policy
        self.compile_budget = compile_budget if compile_budget is not None else CompileBudget()
        guided = policy.limits.guided
        self.compile_caps = CompileCaps(
            guided.upstream_compile_workers,
            guided.compile_queue_s,
            guided.max_cold_compiles_per_s,
            guided.upstream_grammar_cache_mb,
        )
        self.upstream = upstream
        self.limiter = limiter
        self._reserve_now = limiter.reserve_nowait if type(limiter) is MemoryRateLimiter else None
        self.concurrency = concurrency
        self.metrics = metrics
        self.access_log = access_log
        self.tracing = tracing
        self.count_tokens = count_tokens
        self.client_timeout_s = client_timeout_s
        self.framing = policy.limits.body
        self.routes = policy.allowed_routes

    # ------------------------------------------------------------------------ the front half

    def exchange(self, path: str, method: str | None = None) -> Exchange:
        """The record of a new request to ``path`` (``method`` None: the one its route
        accepts, for the dry run's question "what would this route say to this body")."""
        route = route_of(path, self.routes)
        return Exchange(
            method=method if method is not None else method_of(route or ""),
            route=route or "other",
            path=path if route is not None else "",
            start=time.perf_counter(),
        )

    def open(
        self, ex: Exchange, headers: list[tuple[bytes, bytes]], peer: str | None = ""
    ) -> Opened | Admission:
        """The head of a request: framing of the headers, route and method, API key; ``peer``:
        the connection's client address (``""``: unknown; None: a proxy in front that appends
        it to ``rate.client_address_header``, as Envoy does).

        Returns the :class:`Opened` request (its body is read next, under the framing caps,
        and judged by :meth:`judge`) or, for a refusal of its framing, the refused
        :class:`Admission`. Refusals of the caller (404 route, 405 method, 401 key) raise:
        the dry run answers them as errors, not verdicts. ``headers``: lower-case names.
        """
        try:
            head = inspect_head(headers, self.framing)
        except GuardError as err:
            return framing_refused(ex, err)
        ex.request_id = head.request_id or os.urandom(16).hex()
        ex.body_pending = head.has_body
        if ex.route == "other":
            raise route_not_allowed(self.routes)
        expected = method_of(ex.route)
        if ex.method != expected:
            raise GuardError(
                "method_not_allowed",
                f"{ex.route} accepts {expected} only",
                status=405,
                headers={"allow": expected},
            )
        ex.target = upstream_target(ex.route, ex.path)
        # Only the headers the key and the checks read (RequestView keeps KEPT_HEADERS).
        pairs = normalise_headers([(k, v) for k, v in headers if k.lower() in _VIEWED])
        key = resolve_key(pairs, self.policy)
        ex.tenant = tenant = key.tenant if key is not None else ANONYMOUS_TENANT
        flow = tenant if key is not None else self._address_flow(headers, peer)
        return Opened(head, pairs, key, tenant, expected == "POST", flow)

    def _address_flow(self, headers: list[tuple[bytes, bytes]], peer: str | None) -> str:
        rate = self.policy.rate
        name = rate.client_address_header.encode("latin-1")
        forwarded = None
        if peer is None or rate.proxies:
            values = [v for k, v in headers if k.lower() == name]
            if values:
                forwarded = b",".join(values).decode("latin-1")
        return address_flow(peer, forwarded, rate.proxies, rate.client_address_header)

    def judge(self, ex: Exchange, opened: Opened, body: bytes) -> Admission:
        """The verdict on a request's body, read and decoded under the framing caps: the
        policy's checks for a POST; a GET takes no body."""
        ex.bytes_in = len(body)
        if opened.takes_body:
            verdict = check_body(body, ex.path, opened.pairs, opened.key, self.policy)
            return Admission(
                verdict,
                checked=True,
                key=opened.key,
                tenant=opened.tenant,
                head=opened.head,
                body=body,
                flow=opened.flow,
            )
        if body:
            unexpected = GuardError("unexpected_body", f"GET {ex.route} takes no body")
            return framing_refused(ex, unexpected)
        return Admission(
            _NOTHING_TO_CHECK,
            key=opened.key,
            tenant=opened.tenant,
            head=opened.head,
            body=body,
            flow=opened.flow,
        )

    def judge_buffered(self, ex: Exchange, opened: Opened, raw: bytes) -> Admission:
        """:meth:`judge` for a body that arrived whole (buffered by a proxy in front): the same
        framing caps as a read body (size, ``Content-Encoding``) first."""
        ex.body_pending = False
        try:
            body = decode_body(raw, opened.head, self.framing)
        except GuardError as err:
            return framing_refused(ex, err)
        return self.judge(ex, opened, body)

    def judged(self, ex: Exchange, admission: Admission, traced: bool) -> None:
        """The checks' timings as metrics (and their outcomes for the span)."""
        if admission.checked:
            if traced:
                ex.checks = check_outcomes(admission.verdict)
            self.metrics.checks_ran(admission.verdict.durations)

    def warm_up(self) -> None:
        """Judge a few typical bodies once, so that what loads on first use (the tokenizer's
        tables, the JSON reader's and the checks' lazy parts) is in place before the first
        request: behind Envoy its first answer is timed (``message_timeout``)."""
        for path, body in _WARM_UP_BODIES:
            if path in self.routes:
                check_body(body, path, [], None, self.policy)
        self.count_tokens("warm up")

    # ---------------------------------------------------------------------- admitted: costs

    def prepare(self, ex: Exchange, admission: Admission) -> Forward:
        """The body to forward (mutations such as an injected ``max_tokens`` spliced in), the
        tokens to reserve and the relay's arguments, from what the checks measured; fills in
        the exchange's prompt tokens and whether it streams."""
        verdict = admission.verdict
        if not admission.checked:
            return Forward(admission.body, 0, {})
        costs = verdict.costs
        ex.prompt_tokens = costs.get("prompt_tokens", 0)
        obj = verdict.view.obj if verdict.view is not None else None
        ex.stream = obj is not None and lax_bool(obj.get("stream")) is True
        relay_args = {
            "max_tokens": costs.get("output_tokens") or None,
            "n": costs.get("sequences", 1),
            "include_usage": _include_usage(obj),
            "prompt_tokens": ex.prompt_tokens,
        }
        body = forward_body(verdict, admission.body)
        return Forward(body, costs.get("tokens_reserved", ex.prompt_tokens), relay_args)

    async def reserve(self, ex: Exchange, admission: Admission, tokens: int) -> Reservation:
        """Charge the tenant's request and token buckets (raises 429 when they are short),
        then the compile budget with the structured-output constraints the upstream has not
        compiled recently (429 ``guided_compile_budget_exhausted``, 503
        ``guided_compile_pool_busy``; the rate reservation is released then); the guard's
        overhead (everything but reading the body) is observed up to here."""
        t_limit = time.perf_counter()
        overhead = t_limit - ex.start - ex.read_s
        rate = self.policy.rate_for(admission.key)
        if admission.checked:
            tokens = reservable(admission.verdict.costs, tokens, rate)
        if self._reserve_now is not None:  # in memory: no coroutine needed
            reservation = self._reserve_now(admission.tenant, limits=rate, tokens=tokens)
        else:
            reservation = await self.limiter.reserve(
                admission.tenant, limits=rate, requests=1, tokens=tokens
            )
        compiles = admission.verdict.compiles
        if compiles:
            try:
                await self.compile_budget.admit(admission.tenant, compiles, rate, self.compile_caps)
            except GuardError:
                await self.limiter.release(reservation)
                raise
        ex.overhead_s = overhead = overhead + time.perf_counter() - t_limit
        self.metrics.overhead.observe(overhead)
        return reservation

    def slot(self, admission: Admission, work: int) -> Slot:
        """The concurrency slot of the request's tenant (``async with``: a wait in the queue,
        429 ``concurrency_limited`` or 503 ``server_busy``); ``work``: the tokens it reserves,
        its size in the fair queue."""
        key = admission.key
        rate = self.policy.rate_for(key)
        limits = self.policy.slot_limits_for(key, rate)
        return self.concurrency.slot(
            admission.tenant, limits, flow=admission.flow, work=work, weight=rate.weight
        )

    def queued(self, ex: Exchange, since: float) -> None:
        """The slot was taken (after waiting since ``since``)."""
        ex.queue_s = time.perf_counter() - since
        self.metrics.queue_wait.observe(ex.queue_s)

    # ------------------------------------------------------------------------ the back half

    def answer(self, ex: Exchange, relay_args: RelayArgs) -> Answer:
        """The accounting of the upstream's answer to ``ex``."""
        return Answer(ex, self.metrics, self.count_tokens, relay_args)

    async def settle(self, answer: Answer, reservation: Reservation) -> None:
        """The answer is complete: reconcile the reservation with the tokens used, or release
        it when the upstream answered with an error."""
        actual = answer.settlement(reservation.tokens)
        if actual is None:
            await self.limiter.release(reservation)
        else:
            await self.limiter.reconcile(reservation, actual)

    async def settle_unfinished(self, ex: Exchange, reservation: Reservation) -> None:
        """The request ended before it was settled (the client left, was too slow, a failure):
        a stream that was under way is charged what the upstream generated so far; anything
        else is given back."""
        relay = ex.relay
        if relay is not None and (relay.events or relay.usage):
            await self.limiter.reconcile(reservation, ex.prompt_tokens + relay.completion_tokens)
        else:
            await self.limiter.release(reservation)

    def refused(self, ex: Exchange, err: GuardError) -> None:
        """The request is answered with ``err``. Refused before its admission was settled (a
        framing cap, a check, the key, the rate limit), the guard's own time is its time until
        now, less reading the body: the access line's ``guard_ms``."""
        ex.status, ex.code = err.status, err.code
        if not ex.overhead_s:
            ex.overhead_s = max(0.0, time.perf_counter() - ex.start - ex.read_s)
        self.metrics.rejected(err.code)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """While a server serves with this gateway: a Redis rate limiter's store watched (a
        failure logged at start and whenever it changes) and, with workers, the metrics copied
        where the other workers read them; at the end the access log flushed, this worker taken
        out of the metrics' live gauges and the rate limiter closed."""
        tasks: list[asyncio.Task[None]] = []
        limiter, metrics = self.limiter, self.metrics
        if isinstance(limiter, RedisRateLimiter):
            tasks.append(asyncio.create_task(limiter.watch(), name="schedguard-redis-watch"))
        if metrics.multiprocess_dir is not None:
            metrics.sync()
            tasks.append(asyncio.create_task(_sync_metrics(metrics), name="schedguard-metrics"))
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
            self.access_log.flush()
            metrics.close()
            await limiter.aclose()
            await self.compile_budget.aclose()

    def record(self, ex: Exchange, span: RequestSpan | None) -> None:
        """Metrics, the access line and the span's end: once per request."""
        duration = (ex.ended or time.perf_counter()) - ex.start
        self.metrics.request_done(ex.route, ex.status, duration)
        if ex.tenant is not None and ex.status < 400:
            self.metrics.tokens_used(ex.tenant, ex.prompt_tokens, ex.completion_tokens)
        self.access_log.emit(
            RequestFields(
                ex.request_id,
                ex.method,
                ex.route,
                ex.status,
                ex.code,
                ex.upstream_code,
                ex.truncated,
                ex.tenant,
                ex.stream,
                duration,
                ex.overhead_s,
                ex.queue_s,
                ex.upstream_s,
                ex.prompt_tokens,
                ex.completion_tokens,
                ex.bytes_in,
                ex.bytes_out,
            )
        )
        if span is not None:
            span.set_many(
                {
                    "schedguard.request_id": ex.request_id,
                    "schedguard.tenant": ex.tenant or "",
                    "schedguard.verdict": "allowed" if ex.status < 400 else "rejected",
                    "schedguard.prompt_tokens": ex.prompt_tokens,
                    "schedguard.completion_tokens": ex.completion_tokens,
                }
            )
            if ex.path:
                span.set("url.path", ex.path)
            span.checks(ex.checks)
            span.end(ex.status, ex.code)


def build_gateway(
    policy: Policy,
    *,
    upstream: Upstream | None,
    limiter: RateLimiter | None = None,
    concurrency: ConcurrencyLimiter | None = None,
    tracer_provider: Any = None,
    access_log: AccessLog | None = None,
    client_timeout_s: float | None = None,
    metrics_dir: str | None = None,
) -> Gateway:
    """The gateway the policy describes. ``limiter`` defaults to the policy's (Redis when
    ``rate.redis_url`` is set, else in memory), and so do the compile budget's tenant buckets
    (under their own Redis key prefix); ``concurrency`` to its per-key and global limits.
    ``tracer_provider`` forces OpenTelemetry spans on (tests); otherwise they follow the
    ``OTEL_*`` environment. ``metrics_dir``: the directory the worker processes of one
    server share (``--workers N``)."""
    if limiter is None:
        limiter = make_rate_limiter(
            policy.rate.redis_url,
            on_error=policy.rate.on_redis_failure,
            op_timeout_s=policy.rate.redis_timeout_s,
        )
    compile_limiter: RateLimiter | None = None
    if policy.rate.redis_url:
        compile_limiter = RedisRateLimiter(
            policy.rate.redis_url,
            on_error=policy.rate.on_redis_failure,
            op_timeout_s=policy.rate.redis_timeout_s,
            key_prefix=_COMPILE_PREFIX,
        )
    compile_budget = CompileBudget(compile_limiter)
    if concurrency is None:
        rate = policy.rate
        concurrency = ConcurrencyLimiter(
            per_key=rate.slot_limits,
            global_max_concurrent=rate.global_concurrency,
            global_max_queued=rate.queue_size,
            queue_timeout_s=rate.queue_timeout_s,
        )
    return Gateway(
        policy,
        upstream=upstream,
        limiter=limiter,
        concurrency=concurrency,
        metrics=_metrics(limiter, concurrency, metrics_dir, compile_budget),
        access_log=access_log or AccessLog(policy.observability.access_log),
        tracing=make_tracing(tracer_provider),
        count_tokens=_delta_counter(get_counter(policy.limits.tokens.tokenizer)),
        client_timeout_s=client_timeout_s or policy.limits.connections.send_timeout_s,
        compile_budget=compile_budget,
    )


async def _sync_metrics(metrics: GuardMetrics) -> None:
    """Copy this worker's series for the others' scrapes, every
    :data:`~guard.telemetry.SYNC_INTERVAL_S`."""
    while True:
        await asyncio.sleep(SYNC_INTERVAL_S)
        metrics.sync()


def _metrics(
    limiter: RateLimiter,
    slots: ConcurrencyLimiter,
    metrics_dir: str | None,
    compiles: CompileBudget,
) -> GuardMetrics:
    """The gateway's metrics, with the limiters' and the HTTP server's counters exported."""
    metrics = GuardMetrics(multiprocess_dir=metrics_dir)
    metrics.server_rejections = head_refusals
    metrics.export("rate", limiter.metrics.snapshot)
    metrics.export("guided_compile", compiles.metrics.snapshot)
    metrics.export(
        "concurrency",
        lambda: {
            **slots.metrics.snapshot(),
            "in_flight": slots.in_flight,
            "waiting": slots.waiting,
        },
    )
    slots.metrics.listener = metrics.slot_event
    metrics.queued_by_tenant = functools.partial(_queued_by_tenant, slots)
    return metrics


def _queued_by_tenant(slots: ConcurrencyLimiter) -> dict[str, int]:
    """The global queue by tenant: anonymous callers' flows (one per address) together."""
    out: dict[str, int] = {}
    for flow, count in slots.queued_by_flow().items():
        tenant = ANONYMOUS_TENANT if flow.startswith(ANONYMOUS_FLOW_PREFIX) else flow
        out[tenant] = out.get(tenant, 0) + count
    return out


def _delta_counter(counter: TokenCounter) -> Callable[[str], int]:
    """Tokens of one streamed delta; a delta too long to be one token's worth is estimated
    (4 bytes a token) rather than tokenized, so an upstream cannot make the guard's accounting
    expensive."""

    def count(text: str) -> int:
        if len(text) <= _MAX_TOKENIZED_DELTA:
            return counter.count(text)
        return max(1, len(text) // 4)

    return count
