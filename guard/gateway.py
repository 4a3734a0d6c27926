"""The proxied request path, as a pure ASGI handler (no Starlette request, no buffering).

The front half, :meth:`Gateway.admit`: framing of the head (header caps) -> route and method
and the path sent upstream (a model id the upstream could not be sent as it was judged: 400
``invalid_path``) -> API key -> the body read under caps -> checks (the pipeline's verdict).
The dry run (``POST /guard/v1/check``) runs the same method, so its verdict is the proxied
path's by construction. Then: rate limit reservation -> concurrency slot -> upstream -> response relayed
(SSE chunk by chunk with output accounting) -> reconciliation; metrics, the access line and the
span are written once per request in ``finally``.

Once the body has been read, a disconnect cancels the request's task, which aborts the upstream
request wherever it is (connecting, waiting, streaming). The guard's own server says so through
a hook (:mod:`guard.http._disconnect`); under any other ASGI server a watcher task waits on
``receive``, which can then only report a disconnect. Either is disarmed before the response's
last message, because uvicorn's ``receive`` also returns ``http.disconnect`` once the response
is complete.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from starlette.types import Message, Receive, Scope, Send

from guard.admission import (
    ConcurrencyLimiter,
    MemoryRateLimiter,
    RateLimiter,
    RateLimits,
    Reservation,
)
from guard.errors import ClientDisconnected, ClientTooSlow, GuardError, InternalError
from guard.http import (
    DISCONNECT_EXTENSION,
    DisconnectHook,
    RequestHead,
    SseRelay,
    Upstream,
    UpstreamError,
    UpstreamResponse,
    error_event,
    inspect_head,
    read_body,
    response_headers,
)
from guard.pipeline import Verdict, check_body
from guard.policy import ANONYMOUS_TENANT, KeyEntry, Policy
from guard.request_view import (
    KEPT_HEADERS,
    method_of,
    normalise_headers,
    resolve_key,
    route_not_allowed,
    route_of,
    upstream_query,
    upstream_target,
)
from guard.telemetry import AccessLog, GuardMetrics, RequestFields, RequestSpan, Tracing

__all__ = [
    "Admission",
    "Exchange",
    "Gateway",
    "check_outcomes",
    "extract_usage",
    "forward_body",
    "reservable",
    "upstream_error_code",
]

_log = logging.getLogger("schedguard.guard")

TRUNCATED_CODE = "upstream_stream_truncated"

# Non-streamed responses up to this size (by Content-Length) are read whole and sent in one
# message; bigger or unsized ones are relayed in chunks, keeping only a tail to find `usage`.
_BUFFER_MAX = 1 << 20
_USAGE_TAIL = 16 << 10
_USAGE_MAX = 4096  # a usage object (with its token details) is a few hundred bytes
_ERROR_BODY_MAX = 64 << 10  # an upstream error body bigger than this is not looked into
# After a stream's [DONE], how long the rest of the upstream's body (the chunked terminator) is
# waited for so that the connection goes back to the pool; past this it is dropped.
_DRAIN_AFTER_DONE_S = 0.5
_ACCEL = b"x-accel-buffering"
_DECODER = json.JSONDecoder()
_JSON = (b"content-type", b"application/json")
_VIEWED = frozenset(name.encode("latin-1") for name in (*KEPT_HEADERS, "authorization"))


@dataclass(slots=True)
class Exchange:
    """What is known about one request, filled in as it goes; read by the recorders."""

    method: str
    route: str
    path: str
    start: float
    target: str = ""  # the path sent upstream (upstream_target), once the route is settled
    request_id: str = ""
    tenant: str | None = None
    status: int = 500
    code: str | None = None
    stream: bool = False
    bytes_in: int = 0
    bytes_out: int = 0
    overhead_s: float = 0.0
    queue_s: float | None = None
    upstream_s: float | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    response_started: bool = False
    client_gone: bool = False
    finished: bool = False  # the last message is being sent: a disconnect now is not one
    body_pending: bool = False  # a body was announced and not read yet
    checks: tuple[tuple[str, str], ...] = ()
    upstream_code: str | None = None  # the code of an error the upstream answered with
    read_s: float = 0.0  # reading the body: the client's time, not the guard's overhead
    relay: SseRelay | None = None  # a streamed response's relay (its token count so far)
    truncated: str | None = None  # how the upstream's stream ended early, if it did
    ended: float = 0.0  # when the response's last message went out (0: at the record)


@dataclass(slots=True)
class Admission:
    """What the front half decided about one request (:meth:`Gateway.admit`).

    ``verdict``: allowed, or refused for its framing (step ``framing``) or by a check;
    ``checked``: whether the checks ran (their timings are metrics); ``key`` and ``tenant``: the
    caller's entry (None: anonymous) and tenant; ``head`` and ``body``: the request as read,
    when it was.
    """

    verdict: Verdict
    checked: bool = False
    key: KeyEntry | None = None
    tenant: str = ANONYMOUS_TENANT
    head: RequestHead | None = None
    body: bytes = b""


_NOTHING_TO_CHECK = Verdict(True)  # a GET without a body


def extract_usage(data: bytes) -> dict[str, Any] | None:
    """The last ``"usage": {...}`` object in ``data`` (a JSON body or its tail), if any."""
    pos = data.rfind(b'"usage"')
    while pos >= 0:
        rest = data[pos + 7 : pos + 7 + _USAGE_MAX].lstrip()
        if rest.startswith(b":"):
            rest = rest[1:].lstrip()
            if rest.startswith(b"{"):
                try:
                    value, _ = _DECODER.raw_decode(rest.decode("utf-8", "replace"))
                except ValueError:
                    value = None
                if isinstance(value, dict):
                    return value
        pos = data.rfind(b'"usage"', 0, pos)
    return None


def upstream_error_code(data: bytes) -> str | None:
    """``error.code`` of an OpenAI error body from the upstream, if it is a short printable
    token (it goes into the access log: upstream text is not trusted further than that)."""
    if len(data) > _ERROR_BODY_MAX:
        return None
    try:
        body = json.loads(data)
    except ValueError:
        return None
    error = body.get("error") if isinstance(body, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    if isinstance(code, int) and not isinstance(code, bool):
        code = str(code)
    if isinstance(code, str) and 0 < len(code) <= 64 and code.isascii() and code.isprintable():
        return code
    return None


def check_outcomes(verdict: Verdict) -> tuple[tuple[str, str], ...]:
    """``(step, "pass" or the code)`` for each step the pipeline ran, in order."""
    names = list(verdict.durations)
    outcomes = [(name, "pass") for name in names]
    if verdict.rejection is not None and outcomes:
        outcomes[-1] = (names[-1], verdict.rejection.code)
    return tuple(outcomes)


def _framing_refused(ex: Exchange, err: GuardError) -> Admission:
    """A refusal of the request's framing, as a verdict whose one step is ``framing``."""
    durations = MappingProxyType({"framing": time.perf_counter() - ex.start})
    return Admission(Verdict(False, err, durations=durations))


def _costs(ex: Exchange, verdict: Verdict) -> tuple[int, dict[str, Any]]:
    """The tokens to reserve for an allowed body and the relay's arguments, from what the
    checks measured; fills in the exchange's prompt tokens and whether it streams."""
    costs = verdict.costs
    ex.prompt_tokens = costs.get("prompt_tokens", 0)
    obj = verdict.view.obj if verdict.view is not None else None
    ex.stream = obj is not None and obj.get("stream") is True
    relay_args = {
        "max_tokens": costs.get("output_tokens") or None,
        "n": costs.get("sequences", 1),
        "include_usage": _include_usage(obj),
        "prompt_tokens": ex.prompt_tokens,
    }
    return costs.get("tokens_reserved", ex.prompt_tokens), relay_args


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
    return isinstance(options, dict) and options.get("include_usage") is True


def _usage_int(usage: dict[str, Any] | None, key: str) -> int | None:
    if usage is None:
        return None
    value = usage.get(key)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


_heap_frozen = False


def _freeze_startup_heap() -> None:
    """Take what is alive at the first proxied request (modules, the policy, compiled patterns,
    the tokenizer's tables: it lives as long as the process) out of the cyclic collector's
    reach (``gc.freeze``), once per process. Otherwise each full collection, triggered by the
    garbage requests make, traverses all of it: measured on a guard under load, about a quarter
    of its CPU time per request and pauses of tens of milliseconds in the latency tail."""
    global _heap_frozen
    _heap_frozen = True
    gc.freeze()


class Gateway:
    """Everything the proxied path needs, shared by all requests of one app."""

    def __init__(
        self,
        policy: Policy,
        *,
        upstream: Upstream,
        limiter: RateLimiter,
        concurrency: ConcurrencyLimiter,
        metrics: GuardMetrics,
        access_log: AccessLog,
        tracing: Tracing | None,
        count_tokens: Callable[[str], int],
        client_timeout_s: float,
    ) -> None:
        self.policy = policy
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

    async def admit(
        self, ex: Exchange, headers: list[tuple[bytes, bytes]], receive: Receive
    ) -> Admission:
        """The front half of every request, proxied or dry run: framing of the head, route and
        method, API key, the body read under the framing caps, then the checks.

        Refusals of the caller (404 route, 405 method, 401 key) raise; refusals of the request
        (its framing, a check) are the verdict's, so that the dry run reports them as verdicts
        while the proxied path answers them as errors. A disconnect raises
        :class:`~guard.errors.ClientDisconnected`.
        """
        try:
            head = inspect_head(headers, self.framing)
        except GuardError as err:
            return _framing_refused(ex, err)
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
        t_read = time.perf_counter()
        ex.body_pending = False  # read_body decides about the connection if it refuses
        try:
            body = await read_body(receive, head, self.framing)
        except ClientDisconnected:
            raise
        except GuardError as err:
            return _framing_refused(ex, err)
        ex.read_s = time.perf_counter() - t_read
        ex.bytes_in = len(body)
        if expected == "POST":
            verdict = check_body(body, ex.path, pairs, key, self.policy)
            return Admission(verdict, checked=True, key=key, tenant=tenant, head=head, body=body)
        if body:
            unexpected = GuardError("unexpected_body", f"GET {ex.route} takes no body")
            return _framing_refused(ex, unexpected)
        return Admission(_NOTHING_TO_CHECK, key=key, tenant=tenant, head=head, body=body)

    # ------------------------------------------------------------------------------ handling

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not _heap_frozen:
            _freeze_startup_heap()
        ex = self.exchange(scope["path"], scope["method"])
        span = (
            self.tracing.start(ex.method, ex.route, scope["headers"])
            if self.tracing is not None
            else None
        )
        task = asyncio.current_task()
        watcher: asyncio.Future[Message] | None = None
        extensions = scope.get("extensions")
        hook = extensions.get(DISCONNECT_EXTENSION) if extensions else None

        def client_gone() -> None:
            if ex.finished or task is None:
                return
            ex.client_gone = True
            task.cancel()

        def arm() -> None:
            nonlocal watcher
            if isinstance(hook, DisconnectHook):  # the server tells us: no task needed
                if hook.lost:
                    client_gone()
                else:
                    hook.callback = client_gone
                return
            watcher = asyncio.ensure_future(receive())
            watcher.add_done_callback(on_receive)

        def on_receive(fut: asyncio.Future[Message]) -> None:
            if fut.cancelled():
                return
            if fut.exception() is None and fut.result()["type"] == "http.disconnect":
                client_gone()

        self.metrics.in_flight += 1
        try:
            await self._handle(ex, scope, receive, send, arm, span)
        except asyncio.CancelledError:
            if not ex.client_gone or task is None:
                raise
            task.uncancel()
            ex.status, ex.code = 499, "client_disconnected"
            self.metrics.aborted("client_gone")
            if ex.relay is not None:  # what the upstream generated until the client left
                ex.completion_tokens = ex.relay.completion_tokens
        except ClientDisconnected:
            ex.status, ex.code = 499, "client_disconnected"
        except GuardError as err:
            await self._fail(ex, send, err)
        except Exception:
            _log.exception("unexpected error handling %s %s", ex.method, ex.route)
            await self._fail(ex, send, InternalError())
        finally:
            ex.finished = True
            if watcher is not None and not watcher.done():
                watcher.cancel()
            if isinstance(hook, DisconnectHook):
                hook.callback = None
            self.metrics.in_flight -= 1
            self._record(ex, span)

    async def _handle(
        self,
        ex: Exchange,
        scope: Scope,
        receive: Receive,
        send: Send,
        arm: Callable[[], None],
        span: RequestSpan | None,
    ) -> None:
        admission = await self.admit(ex, scope["headers"], receive)
        verdict = admission.verdict
        if admission.checked:
            if span is not None:
                ex.checks = check_outcomes(verdict)
            self.metrics.checks_ran(verdict.durations)
        if verdict.rejection is not None:
            raise verdict.rejection
        body = admission.body
        reserve_tokens = 0
        relay_args: dict[str, Any] = {}
        if admission.checked:
            body = forward_body(verdict, body)
            reserve_tokens, relay_args = _costs(ex, verdict)
        t_limit = time.perf_counter()
        overhead = t_limit - ex.start - ex.read_s
        tenant = admission.tenant
        rate = self.policy.rate_for(admission.key)
        if admission.checked:
            reserve_tokens = reservable(verdict.costs, reserve_tokens, rate)
        if self._reserve_now is not None:  # in memory: no coroutine needed
            reservation = self._reserve_now(tenant, limits=rate, tokens=reserve_tokens)
        else:
            reservation = await self.limiter.reserve(
                tenant, limits=rate, requests=1, tokens=reserve_tokens
            )
        ex.overhead_s = overhead = overhead + time.perf_counter() - t_limit
        self.metrics.overhead.observe(overhead)
        settled = False
        try:
            arm()  # from here a disconnect cancels the request, queued or forwarded
            t_queue = time.perf_counter()
            async with self.concurrency.slot(tenant, rate.slot_limits):
                ex.queue_s = time.perf_counter() - t_queue
                self.metrics.queue_wait.observe(ex.queue_s)
                assert admission.head is not None  # read, since the request was admitted
                authorization = admission.head.authorization
                settled = await self._forward(
                    ex, scope, body, authorization, send, span, reservation, relay_args
                )
        finally:
            if not settled:
                with contextlib.suppress(Exception):
                    await self._settle_unfinished(ex, reservation)

    async def _settle_unfinished(self, ex: Exchange, reservation: Reservation) -> None:
        """The request ended before it was settled (the client left, was too slow, a failure):
        a stream that was under way is charged what the upstream generated so far; anything
        else is given back."""
        relay = ex.relay
        if relay is not None and (relay.events or relay.usage):
            await self.limiter.reconcile(reservation, ex.prompt_tokens + relay.completion_tokens)
        else:
            await self.limiter.release(reservation)

    async def _forward(
        self,
        ex: Exchange,
        scope: Scope,
        body: bytes,
        authorization: str | None,
        send: Send,
        span: RequestSpan | None,
        reservation: Reservation,
        relay_args: dict[str, Any],
    ) -> bool:
        """Send upstream and relay the answer; True once the reservation is settled."""
        extra: dict[str, str] = {}
        if span is not None:
            span.inject(extra)
        # The client's key is the guard's business when the guard has keys; else it is passed.
        auth = None if self.policy.keys else authorization
        t_up = time.perf_counter()
        resp = await self.upstream.send(
            ex.method,
            ex.target,
            upstream_query(scope.get("query_string", b"")),
            scope["headers"],
            body if ex.method == "POST" else None,
            request_id=ex.request_id,
            authorization=auth,
            extra_headers=extra,
        )
        ex.upstream_s = time.perf_counter() - t_up
        self.metrics.upstream_answered(ex.route, ex.upstream_s)
        try:
            if resp.is_event_stream:
                ex.stream = True
                usage, completion = await self._relay_stream(ex, resp, send, relay_args)
            else:
                usage = await self._relay_body(ex, resp, send)
                completion = _usage_int(usage, "completion_tokens")
        finally:
            resp.release()
        if resp.status >= 400:
            await self.limiter.release(reservation)
            return True
        prompt = _usage_int(usage, "prompt_tokens")
        if prompt is not None:
            ex.prompt_tokens = prompt
        if completion is not None:
            ex.completion_tokens = completion
        total = _usage_int(usage, "total_tokens")
        if completion is not None:
            actual = ex.prompt_tokens + completion
        elif total is not None:  # embeddings: prompt tokens only
            actual = total
        else:
            actual = reservation.tokens  # nothing to settle with: keep it as charged
        await self.limiter.reconcile(reservation, actual)
        return True

    async def _relay_body(
        self, ex: Exchange, resp: UpstreamResponse, send: Send
    ) -> dict[str, Any] | None:
        headers = response_headers(resp)
        headers.append((b"x-request-id", ex.request_id.encode()))
        length = resp.content_length
        if length is not None and length <= _BUFFER_MAX:
            data = await resp.read(_BUFFER_MAX)
            headers.append((b"content-length", str(len(data)).encode()))
            ex.finished = True  # nothing left to cancel; a disconnect from here is harmless
            ex.status = resp.status
            ex.response_started = True
            await send({"type": "http.response.start", "status": resp.status, "headers": headers})
            await send({"type": "http.response.body", "body": data})
            ex.bytes_out = len(data)
            if resp.status >= 400:
                ex.upstream_code = upstream_error_code(data)
                return None
            return extract_usage(data)
        if length is not None:
            headers.append((b"content-length", str(length).encode()))
        ex.status = resp.status
        ex.response_started = True
        await send({"type": "http.response.start", "status": resp.status, "headers": headers})
        tail = b""
        try:
            async for chunk in resp.chunks():
                await self._write(send, chunk)
                ex.bytes_out += len(chunk)
                tail = (tail + chunk)[-_USAGE_TAIL:]
        except UpstreamError as err:
            # Headers are out: the client can only see a cut connection.
            ex.status, ex.code = err.status, err.code
            self.metrics.rejected(err.code)
            return None
        ex.finished = True
        await send({"type": "http.response.body", "body": b""})
        return extract_usage(tail) if resp.status < 400 else None

    async def _relay_stream(
        self, ex: Exchange, resp: UpstreamResponse, send: Send, relay_args: dict[str, Any]
    ) -> tuple[dict[str, Any] | None, int | None]:
        ex.relay = relay = SseRelay(self.count_tokens, **{"max_tokens": None, **relay_args})
        headers = [pair for pair in response_headers(resp) if pair[0] != _ACCEL]
        headers.append((b"x-request-id", ex.request_id.encode()))
        headers.append((_ACCEL, b"no"))
        ex.status = resp.status
        ex.response_started = True
        await send({"type": "http.response.start", "status": resp.status, "headers": headers})
        try:
            async for chunk in resp.chunks():
                out = relay.feed(chunk)
                if relay.done:
                    # The stream's last event goes out now. A client that has read it may close
                    # at once, and the server reports that as a disconnect until the response is
                    # complete: it is not an abort (the request is a 200 with its token counts).
                    ex.finished = True
                if out:
                    await self._write(send, out)
                    ex.bytes_out += len(out)
                if relay.done:
                    break
            else:  # the upstream ended without [DONE]
                rest = relay.finish()  # an unterminated last event, passed on as it is
                out = (rest + b"\n\n" if rest else b"") + self._truncated(ex, "no_done")
                ex.finished = True
                await self._write(send, out)
                ex.bytes_out += len(out)
        except UpstreamError as err:
            ex.code = err.code
            self.metrics.rejected(err.code)
            if not relay.done:
                out = error_event(err.to_body())  # ends with [DONE]: the stream's last event
                ex.finished = True
                await self._write(send, out)
                ex.bytes_out += len(out)
        if relay.cut or relay.oversized:
            resp.abort()
            self.metrics.aborted("output_cap" if relay.cut else "bad_event")
        if relay.oversized:
            ex.code = "upstream_error"
            self.metrics.rejected("upstream_error")
        ex.finished = True
        await send({"type": "http.response.body", "body": b""})
        ex.ended = time.perf_counter()
        if relay.upstream_done:
            if relay.unfinished:
                self._truncated(ex, "no_finish_reason")
            await resp.drain(_DRAIN_AFTER_DONE_S)
        completion = relay.completion_tokens if (relay.events or relay.usage) else None
        return relay.usage, completion

    def _truncated(self, ex: Exchange, how: str) -> bytes:
        """Flag a stream the upstream ended early (``how``: ``no_done``, it ended without
        ``[DONE]``; ``no_finish_reason``, a choice never got one). Without ``[DONE]`` the client
        gets an error event and ``[DONE]`` (returned), as for any upstream failure mid-stream:
        the SDKs raise it rather than return a partial answer as whole. A ``[DONE]`` without a
        ``finish_reason`` is relayed as it is (the client sees ``finish_reason: null``)."""
        ex.truncated = how
        self.metrics.stream_truncated(ex.route, how)
        if how != "no_done":
            return b""
        err = UpstreamError(TRUNCATED_CODE, "the upstream ended the stream before it was complete")
        ex.code = err.code
        self.metrics.rejected(err.code)
        return error_event(err.to_body())

    async def _write(self, send: Send, data: bytes) -> None:
        """Send one body chunk; a client that stops reading for ``client_timeout_s`` is cut."""
        try:
            async with asyncio.timeout(self.client_timeout_s):
                await send({"type": "http.response.body", "body": data, "more_body": True})
        except TimeoutError:
            raise ClientTooSlow() from None

    async def _fail(self, ex: Exchange, send: Send, err: GuardError) -> None:
        ex.status, ex.code = err.status, err.code
        if isinstance(err, ClientTooSlow):
            self.metrics.aborted("client_too_slow")
        self.metrics.rejected(err.code)
        if ex.response_started:
            return  # the connection is closed by the server when the app returns unfinished
        if not ex.request_id:
            ex.request_id = os.urandom(16).hex()
        if ex.body_pending and "connection" not in err.headers:
            # Refused before its body was read: drop the connection rather than drain the body.
            err.headers = {**err.headers, "connection": "close"}
        await send_error(send, err, ex.request_id)
        ex.response_started = True

    def _record(self, ex: Exchange, span: RequestSpan | None) -> None:
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


async def send_error(send: Send, err: GuardError, request_id: str) -> None:
    """An OpenAI error body with the error's status and headers."""
    data = json.dumps(err.to_body(), separators=(",", ":")).encode()
    headers = [
        _JSON,
        (b"content-length", str(len(data)).encode()),
        (b"x-request-id", request_id.encode()),
    ]
    headers.extend(
        (k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in err.headers.items()
    )
    status = err.status if 400 <= err.status <= 599 else 400
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})
