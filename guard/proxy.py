"""The proxied path over HTTP: the gateway's core (:mod:`guard.gateway`) as a pure ASGI handler
(no Starlette request, no buffering), with the guard's own upstream client.

:func:`admit` is the front half over ASGI (the head, then the body read from ``receive`` under
the framing caps, then the checks); the dry run (``POST /guard/v1/check``) runs the same
function, so its verdict is the proxied path's by construction. Then :class:`AsgiProxy`: rate
limit reservation -> concurrency slot -> upstream -> response relayed (SSE chunk by chunk with
output accounting, :class:`~guard.answer.Answer`) -> reconciliation; metrics, the access line
and the span are written once per request in ``finally``.

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
import gc
import json
import logging
import os
import time
from collections.abc import Callable

from starlette.types import Message, Receive, Scope, Send

from guard.admission import Reservation, Slot
from guard.answer import Answer
from guard.errors import ClientDisconnected, ClientTooSlow, GuardError, InternalError
from guard.exchange import Admission, Exchange
from guard.gateway import Forward, Gateway, framing_refused
from guard.http import (
    DISCONNECT_EXTENSION,
    DisconnectHook,
    Pipe,
    ReadAheadBudget,
    UpstreamError,
    UpstreamResponse,
    read_body,
    response_headers,
)
from guard.routing import upstream_query
from guard.telemetry import RequestSpan

__all__ = ["AsgiProxy", "admit", "peer_of", "send_error"]

_log = logging.getLogger("schedguard.guard")

# Non-streamed responses up to this size (by Content-Length) are read whole and sent in one
# message; bigger or unsized ones are relayed in chunks, keeping only a tail to find `usage`.
_BUFFER_MAX = 1 << 20
# After a stream's [DONE], how long the rest of the upstream's body (the chunked terminator) is
# waited for so that the connection goes back to the pool; past this it is dropped.
_DRAIN_AFTER_DONE_S = 0.5
_ACCEL = b"x-accel-buffering"
_JSON = (b"content-type", b"application/json")


def peer_of(scope: Scope) -> str:
    """The connection's client address (``""`` when the server does not say)."""
    client = scope.get("client")
    return str(client[0]) if client else ""


async def admit(
    gateway: Gateway,
    ex: Exchange,
    headers: list[tuple[bytes, bytes]],
    receive: Receive,
    peer: str = "",
) -> Admission:
    """The front half of a request over ASGI, proxied or dry run: :meth:`Gateway.open`, the
    body read from ``receive`` under the framing caps, :meth:`Gateway.judge`.

    Refusals of the caller (404 route, 405 method, 401 key) raise; refusals of the request
    (its framing, a check) are the verdict's, so that the dry run reports them as verdicts
    while the proxied path answers them as errors. A disconnect raises
    :class:`~guard.errors.ClientDisconnected`. ``peer``: the connection's client address.
    """
    opened = gateway.open(ex, headers, peer)
    if isinstance(opened, Admission):
        return opened
    t_read = time.perf_counter()
    ex.body_pending = False  # read_body decides about the connection if it refuses
    try:
        body = await read_body(receive, opened.head, gateway.framing)
    except ClientDisconnected:
        raise
    except GuardError as err:
        return framing_refused(ex, err)
    ex.read_s = time.perf_counter() - t_read
    return gateway.judge(ex, opened, body)


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


class AsgiProxy:
    """The proxied routes of the guard's app: one ASGI handler around a :class:`Gateway`."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.metrics = gateway.metrics
        connections = gateway.policy.limits.connections
        self.read_ahead = connections.read_ahead_bytes
        self.read_ahead_budget = ReadAheadBudget(connections.read_ahead_total_bytes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not _heap_frozen:
            _freeze_startup_heap()
        gateway = self.gateway
        ex = gateway.exchange(scope["path"], scope["method"])
        span = (
            gateway.tracing.start(ex.method, ex.route, scope["headers"])
            if gateway.tracing is not None
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
            gateway.record(ex, span)

    async def _handle(
        self,
        ex: Exchange,
        scope: Scope,
        receive: Receive,
        send: Send,
        arm: Callable[[], None],
        span: RequestSpan | None,
    ) -> None:
        gateway = self.gateway
        admission = await admit(gateway, ex, scope["headers"], receive, peer_of(scope))
        gateway.judged(ex, admission, span is not None)
        if admission.verdict.rejection is not None:
            raise admission.verdict.rejection
        forward = gateway.prepare(ex, admission)
        reservation = await gateway.reserve(ex, admission, forward.tokens)
        settled = False
        try:
            arm()  # from here a disconnect cancels the request, queued or forwarded
            t_queue = time.perf_counter()
            async with gateway.slot(admission, forward.tokens) as slot:
                gateway.queued(ex, t_queue)
                assert admission.head is not None  # read, since the request was admitted
                authorization = admission.head.authorization
                settled = await self._forward(
                    ex, scope, forward, authorization, send, span, reservation, slot
                )
        finally:
            if not settled:
                with contextlib.suppress(Exception):
                    await gateway.settle_unfinished(ex, reservation)

    async def _forward(
        self,
        ex: Exchange,
        scope: Scope,
        forward: Forward,
        authorization: str | None,
        send: Send,
        span: RequestSpan | None,
        reservation: Reservation,
        slot: Slot,
    ) -> bool:
        """Send upstream and relay the answer; True once the reservation is settled. The
        slot is given back as soon as the upstream's answer is all read, before the client has
        taken all of it."""
        gateway = self.gateway
        extra: dict[str, str] = {}
        if span is not None:
            span.inject(extra)
        # The client's key is the guard's business when the guard has keys; else it is passed.
        auth = None if gateway.policy.keys else authorization
        upstream = gateway.upstream
        assert upstream is not None  # the app's gateway always has its upstream
        t_up = time.perf_counter()
        resp = await upstream.send(
            ex.method,
            ex.target,
            upstream_query(scope.get("query_string", b"")),
            scope["headers"],
            forward.body if ex.method == "POST" else None,
            request_id=ex.request_id,
            authorization=auth,
            extra_headers=extra,
        )
        ex.upstream_s = time.perf_counter() - t_up
        self.metrics.upstream_answered(ex.route, ex.upstream_s)
        answer = gateway.answer(ex, forward.relay_args)
        try:
            if resp.is_event_stream:
                await self._relay_stream(ex, resp, send, answer, slot)
            else:
                await self._relay_body(ex, resp, send, answer, slot)
        finally:
            resp.release()
        await gateway.settle(answer, reservation)
        return True

    async def _relay_body(
        self, ex: Exchange, resp: UpstreamResponse, send: Send, answer: Answer, slot: Slot
    ) -> None:
        headers = response_headers(resp)
        headers.append((b"x-request-id", ex.request_id.encode()))
        length = resp.content_length
        if length is not None and length <= _BUFFER_MAX:
            data = await resp.read(_BUFFER_MAX)
            slot.release()  # the upstream is done: the client's reading is not its work
            headers.append((b"content-length", str(len(data)).encode()))
            ex.finished = True  # nothing left to cancel; a disconnect from here is harmless
            answer.start(resp.status, False)
            await send({"type": "http.response.start", "status": resp.status, "headers": headers})
            await send({"type": "http.response.body", "body": data})
            ex.bytes_out = len(data)
            answer.whole(data)
            return
        if length is not None:
            headers.append((b"content-length", str(length).encode()))
        answer.start(resp.status, False)
        await send({"type": "http.response.start", "status": resp.status, "headers": headers})
        try:
            async for chunk in resp.chunks():
                await self._write(send, chunk)
                ex.bytes_out += len(chunk)
                answer.observe(chunk)
        except UpstreamError as err:
            # Headers are out: the client can only see a cut connection.
            answer.failed(err)
            return
        ex.finished = True
        await send({"type": "http.response.body", "body": b""})
        answer.ended()

    async def _relay_stream(
        self, ex: Exchange, resp: UpstreamResponse, send: Send, answer: Answer, slot: Slot
    ) -> None:
        """The upstream's events are read (and accounted) by a task of their own into a
        bounded pipe (:class:`~guard.http.Pipe`) that this task writes to the client: a slow
        client does not hold the upstream back, and the slot is freed when the upstream ends."""
        headers = [pair for pair in response_headers(resp) if pair[0] != _ACCEL]
        headers.append((b"x-request-id", ex.request_id.encode()))
        headers.append((_ACCEL, b"no"))
        answer.start(resp.status, True)
        await send({"type": "http.response.start", "status": resp.status, "headers": headers})
        pipe = Pipe(self.read_ahead, self.read_ahead_budget)
        reader = asyncio.create_task(self._read_stream(resp, answer, pipe, slot))
        try:
            while (data := await pipe.get()) is not None:
                await self._write(send, data)
                ex.bytes_out += len(data)
            await send({"type": "http.response.body", "body": b""})
            ex.ended = time.perf_counter()
            await reader  # the connection back to the pool (drained after [DONE])
        finally:
            reader.cancel()  # if still reading: the client is gone or too slow
            # Its outcome is known (a failure was raised through the pipe): only collect it.
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader
            pipe.discard()

    @staticmethod
    async def _read_stream(resp: UpstreamResponse, answer: Answer, pipe: Pipe, slot: Slot) -> None:
        """The upstream's side of :meth:`_relay_stream`."""
        try:
            try:
                async for chunk in resp.chunks():
                    out = answer.relay_chunk(chunk)
                    if out:
                        await pipe.put(out)
                    if answer.done:
                        break
                else:  # the upstream ended without [DONE]
                    out = answer.ended()
                    if out:
                        await pipe.put(out)
            except UpstreamError as err:
                out = answer.failed(err)
                if out:
                    await pipe.put(out)
            if answer.close():
                resp.abort()
        except Exception as exc:
            pipe.close(exc)
            raise
        slot.release()  # the upstream's work is over: its slot to the next request
        pipe.close()
        relay = answer.relay
        if relay is not None and relay.upstream_done:
            await resp.drain(_DRAIN_AFTER_DONE_S)

    async def _write(self, send: Send, data: bytes) -> None:
        """Send one body chunk; a client that stops reading for ``client_timeout_s`` is cut."""
        try:
            async with asyncio.timeout(self.gateway.client_timeout_s):
                await send({"type": "http.response.body", "body": data, "more_body": True})
        except TimeoutError:
            raise ClientTooSlow() from None

    async def _fail(self, ex: Exchange, send: Send, err: GuardError) -> None:
        if isinstance(err, ClientTooSlow):
            self.metrics.aborted("client_too_slow")
        self.gateway.refused(ex, err)
        if ex.response_started:
            return  # the connection is closed by the server when the app returns unfinished
        if not ex.request_id:
            ex.request_id = os.urandom(16).hex()
        if ex.body_pending and "connection" not in err.headers:
            # Refused before its body was read: drop the connection rather than drain the body.
            err.headers = {**err.headers, "connection": "close"}
        ex.bytes_out += await send_error(send, err, ex.request_id)
        ex.response_started = True


async def send_error(send: Send, err: GuardError, request_id: str) -> int:
    """An OpenAI error body with the error's status and headers; the body's size is returned
    (the access line's ``bytes_out``)."""
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
    return len(data)
