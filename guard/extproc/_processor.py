"""One HTTP request through Envoy's ext_proc filter: the gateway's core over a gRPC stream.

Envoy opens one ``Process`` stream per HTTP request and sends, as its processing mode says,
the request headers, the request body, the response headers and the response body; every
message is answered (unless the filter runs in ``observability_mode``) before Envoy goes on.
:class:`ExtProcStream` is that conversation as a state machine around the same
:class:`~guard.gateway.Gateway` the proxy uses:

- request headers: :meth:`Gateway.open` (header caps, route, method, key; the client's address,
  for the fair queue, from the ``source.address`` attribute the filter is configured to send:
  an ``x-forwarded-for`` Envoy passes through unchanged is the client's own claim);
  a refusal is an ``ImmediateResponse`` with the proxy's status, OpenAI error body and headers;
- the request body, buffered by Envoy (``BUFFERED``: one message, ``end_of_stream``):
  :meth:`Gateway.judge_buffered` (the framing caps that still apply: size, encoding), the
  checks, then the rate-limit reservation and the concurrency slot (held while the stream
  lives); admitted, the answer carries the mutations: the body the proxy would forward (an
  injected or clamped ``max_tokens``) with its ``content-length``, and the headers the proxy
  would not pass (``upstream.strip_headers``, the client's key when the guard has keys) removed;
- response headers: the status, whether it is an event stream, ``x-request-id``;
- the response body (``STREAMED``): each chunk through :class:`~guard.answer.Answer` (usage,
  output tokens, the output cap: past it the relay's own last events and ``[DONE]`` replace the
  chunk, and later chunks are cleared; Envoy owns the upstream connection, so the upstream is not
  aborted as the proxy does: the cap injected into the request bounds it), settled at its
  ``end_of_stream``.

The stream ending before the answer did (the client left, the upstream failed, Envoy gave up)
settles what is unsettled and frees the slot, in ``finally``; a message out of order or a body
that did not come whole ends the stream with an error status (Envoy, failing closed, answers the
client 500). Cheaper modes work too: no response body (settled at the response headers, the
reservation kept as charged), a buffered response body (one message).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import unquote

from guard.admission import Reservation, Slot
from guard.answer import Answer
from guard.errors import GuardError, Misconfigured, UpstreamError
from guard.exchange import Admission, Exchange, Opened
from guard.extproc._messages import (
    Headers,
    body_response,
    headers_of,
    headers_response,
    immediate_error,
    pb,
    source_address,
)
from guard.gateway import Forward, Gateway
from guard.http import HOP_BY_HOP, check_declared_body, usable_request_id
from guard.routing import invalid_path, upstream_query

__all__ = ["AFTER_DONE_CHUNKS", "BODY_NOT_BUFFERED", "ExtProcStream", "ProtocolError"]

_log = logging.getLogger("schedguard.guard")

BODY_NOT_BUFFERED = "extproc_body_not_buffered"
_NONE = 0  # ProcessingMode.BodySendMode
_BUFFERED = 2
_BUFFERED_PARTIAL = 3
# Headers Envoy's codecs own on the upstream side (it drops, recomputes or refuses to touch
# them); every other header the proxy does not forward is removed by the answer's mutation.
_ENVOY_OWN = HOP_BY_HOP | {"host", "content-length", "expect", "x-request-id", "accept-encoding"}
_SSE = "text/event-stream"
# Headers Envoy's connection manager adds before the filters run: not the client's, so not
# counted against its header caps (the proxy never sees them). Its x-request-id too (it
# replaces a client's by default), which names the exchange instead.
# x-envoy-external-address: as an edge proxy (use_remote_address), the peer, once more.
_ENVOY_ADDED = frozenset({b"x-forwarded-proto", b"x-envoy-internal", b"x-envoy-external-address"})
# Chunks an upstream may still send after the stream's end (the relay cut it at the output cap,
# or its own [DONE]) before the response is reset: a server that honours the cap injected into
# the request ends within a few (its finish chunk, usage, [DONE]).
AFTER_DONE_CHUNKS = 16
_OVERRAN = UpstreamError("upstream_error", "the upstream went on past the output cap")


class ProtocolError(Exception):
    """Envoy's side of the stream broke the ext_proc protocol (a message out of order)."""


class ExtProcStream:
    """The processor's side of one ``Process`` stream."""

    def __init__(self, gateway: Gateway, dropped: frozenset[bytes]) -> None:
        self.gateway = gateway
        self.dropped = dropped  # request headers the upstream is not sent
        self.ex: Exchange | None = None
        self.opened: Opened | None = None
        self.admission: Admission | None = None
        self.forward: Forward | None = None
        self.reservation: Reservation | None = None
        self.answer: Answer | None = None
        self.slot: Slot | None = None  # held from admission to the end of the answer
        self.query = ""
        self.request_headers: Headers = []
        # As the first message's protocol_config says (None: an Envoy that does not say).
        self.request_body_mode: int | None = None
        self.response_body_mode: int | None = None
        self.raw_body = b""
        self.settled = False
        self.complete = False  # the answer ended (or was refused): nothing more to do
        self.t_forward = 0.0
        self.t_headers_answered = 0.0  # from here Envoy buffers the body: the client's time
        self.after_done = 0  # chunks of the upstream's after the stream's last event
        self.admitted = False  # answered with the go-ahead: Envoy forwards it

    # ---------------------------------------------------------------------------- the loop

    async def run(self, requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
        """The answers to ``requests`` (one per message, none in observability mode)."""
        gateway = self.gateway
        gateway.metrics.in_flight += 1
        try:
            async for request in requests:
                kind = request.WhichOneof("request")
                if request.HasField("protocol_config"):
                    config = request.protocol_config
                    self.request_body_mode = config.request_body_mode
                    self.response_body_mode = config.response_body_mode
                answer = await self._on(kind, request)
                if answer is not None and not request.observability_mode:
                    yield answer
        finally:
            gateway.metrics.in_flight -= 1
            await self._end()

    async def _on(self, kind: str | None, request: Any) -> Any:
        if kind == "request_headers":
            return await self._request_headers(request.request_headers, source_address(request))
        if kind == "request_body":
            return await self._request_body(request.request_body)
        if kind == "response_headers":
            return await self._response_headers(request.response_headers)
        if kind == "response_body":
            return await self._response_body(request.response_body)
        if kind == "request_trailers":
            return pb.ProcessingResponse(request_trailers=pb.TrailersResponse())
        if kind == "response_trailers":
            return pb.ProcessingResponse(response_trailers=pb.TrailersResponse())
        raise ProtocolError(f"unexpected message {kind!r}")

    # ------------------------------------------------------------------------ request side

    async def _request_headers(self, message: Any, peer: str) -> Any:
        if self.ex is not None:
            raise ProtocolError("request headers twice")
        pseudo: dict[bytes, bytes] = {}
        headers: Headers = []
        request_id = b""
        for name, value in headers_of(message.headers):
            if name.startswith(b":"):
                pseudo[name] = value
            elif name == b"x-request-id":
                request_id = value  # Envoy's (it sets one on every request it receives)
            elif name not in _ENVOY_ADDED:
                headers.append((name, value))
        if b":authority" in pseudo:  # HTTP/1.1's Host, as the proxy's server counts it
            headers.insert(0, (b"host", pseudo[b":authority"]))
        target = pseudo.get(b":path", b"/").decode("latin-1")
        raw_path, _, query = target.partition("?")
        self.query = query
        path = unquote(raw_path) if "%" in raw_path else raw_path
        method = pseudo.get(b":method", b"GET").decode("latin-1")
        gateway = self.gateway
        self.ex = ex = gateway.exchange(path, method)
        self.request_headers = headers
        envoy_id = usable_request_id(request_id) if request_id else None
        try:
            opened = gateway.open(ex, headers, peer)
        except GuardError as err:
            ex.request_id = envoy_id or ex.request_id
            return self._refuse(err)
        ex.request_id = envoy_id or ex.request_id  # the one Envoy logs too
        if isinstance(opened, Admission):
            return self._refuse_admission(opened)
        self.opened = opened
        if opened.takes_body and opened.head.has_body:
            try:  # refused before Envoy buffers it, as the proxy does before reading it
                check_declared_body(opened.head, gateway.framing)
            except GuardError as err:
                return self._refuse(err)
        if message.end_of_stream:  # no body
            admission = gateway.judge(ex, opened, b"")
            return await self._decide(admission, "request_headers")
        if self.request_body_mode not in (None, _BUFFERED, _BUFFERED_PARTIAL):
            return self._refuse(_not_buffered())
        self.t_headers_answered = time.perf_counter()
        return headers_response("request_headers")

    async def _request_body(self, message: Any) -> Any:
        ex, opened = self.ex, self.opened
        if ex is None or opened is None or self.admission is not None:
            raise ProtocolError("request body out of order")
        if not message.end_of_stream:
            # Not BUFFERED (STREAMED, or BUFFERED_PARTIAL past Envoy's buffer): the checks need
            # the whole body before anything is forwarded.
            return self._refuse(_not_buffered())
        if self.t_headers_answered:  # Envoy's buffering of the body is not the guard's time
            ex.read_s = time.perf_counter() - self.t_headers_answered
        self.raw_body = raw = message.body
        admission = self.gateway.judge_buffered(ex, opened, raw)
        return await self._decide(admission, "request_body")

    async def _decide(self, admission: Admission, phase: str) -> Any:
        """Refuse, or reserve, take a slot and continue with the proxy's mutations."""
        gateway = self.gateway
        ex = self.ex
        assert ex is not None
        self.admission = admission
        gateway.judged(ex, admission, False)
        verdict = admission.verdict
        if verdict.rejection is not None:
            return self._refuse_admission(admission)
        try:
            query = upstream_query(self.query.encode("latin-1")) if self.query else ""
            forward = self.forward = gateway.prepare(ex, admission)
            self.reservation = await gateway.reserve(ex, admission, forward.tokens)
            t_queue = time.perf_counter()
            slot = gateway.slot(admission, forward.tokens)
            await slot.__aenter__()
            self.slot = slot
            gateway.queued(ex, t_queue)
        except GuardError as err:
            return self._refuse(err)
        except UnicodeEncodeError:
            return self._refuse(invalid_path("the query string is not ASCII"))
        self.t_forward = time.perf_counter()
        self.admitted = True
        set_headers, remove = self._request_mutations(query)
        if phase == "request_headers":
            return headers_response(phase, set_headers, remove)
        body: bytes | None = None
        raw = self.raw_body
        if forward.body is not raw and forward.body != raw:  # mutated, or inflated
            body = forward.body
            set_headers.append(("content-length", str(len(body))))
        return body_response(phase, body, set_headers=set_headers, remove=remove)

    def _request_mutations(self, query: str) -> tuple[list[tuple[str, str]], list[str]]:
        """What the proxy would change in the request's headers: the path sent upstream, the
        headers it does not forward, its ``x-request-id`` and ``accept-encoding: identity``."""
        gateway = self.gateway
        ex = self.ex
        assert ex is not None
        dropped = self.dropped
        remove = sorted(
            {
                name.decode("latin-1")
                for name, _ in self.request_headers
                if name in dropped and name.decode("latin-1") not in _ENVOY_OWN
            }
        )
        set_headers = [("x-request-id", ex.request_id), ("accept-encoding", "identity")]
        if ex.target != ex.path:  # a model id, percent-encoded again as the proxy sends it
            set_headers.append((":path", ex.target + ("?" + query if query else "")))
        if "authorization" in remove and not gateway.policy.keys:
            remove.remove("authorization")  # passed on: the upstream's business
        return set_headers, remove

    # ----------------------------------------------------------------------- response side

    async def _response_headers(self, message: Any) -> Any:
        ex = self.ex
        if ex is None:
            raise ProtocolError("response headers before request headers")
        if self.complete or self.forward is None:
            # A local reply (the processor's own refusal, or Envoy's) on its way out.
            return headers_response("response_headers")
        status = 0
        content_type = ""
        for h in message.headers.headers:  # only two of them are read
            key = h.key
            if key == ":status":
                raw = h.raw_value or h.value.encode("latin-1")
                status = int(raw) if raw.isdigit() else 0
            elif key == "content-type":
                content_type = (h.raw_value or h.value.encode("latin-1")).decode("latin-1").lower()
        gateway = self.gateway
        ex.upstream_s = time.perf_counter() - self.t_forward
        gateway.metrics.upstream_answered(ex.route, ex.upstream_s)
        self.answer = answer = gateway.answer(ex, self.forward.relay_args)
        stream = content_type.startswith(_SSE)
        answer.start(status, stream)
        set_headers = [("x-request-id", ex.request_id)]
        if stream:
            set_headers.append(("x-accel-buffering", "no"))
        if message.end_of_stream or self.response_body_mode == _NONE:
            # No body, or none sent to the processor: settled now (a stream's output is not
            # seen: the reservation stays as charged).
            await self._settle(answer)
        return headers_response("response_headers", set_headers)

    async def _response_body(self, message: Any) -> Any:
        answer = self.answer
        ex = self.ex
        if ex is None:
            raise ProtocolError("response body before request headers")
        if answer is None or self.settled:
            return body_response("response_body")  # a local reply's body, or after the end
        chunk: bytes = message.body
        if answer.relay is None:
            if message.end_of_stream and ex.bytes_out == 0:
                answer.whole(chunk)  # buffered, or the one chunk
            else:
                answer.observe(chunk)
            ex.bytes_out += len(chunk)
            if message.end_of_stream:
                answer.ended()
                await self._settle(answer)
            return body_response("response_body")
        if answer.done:
            self.after_done += 1
            if self.after_done > AFTER_DONE_CHUNKS:
                # The upstream goes on past the stream's end (it ignored the output cap): Envoy
                # cannot close a response cleanly from here, so it is reset (the client has
                # had the last event and [DONE]); the proxy aborts the upstream instead.
                await self._settle(answer)
                return immediate_error(_OVERRAN, ex.request_id)
            if message.end_of_stream:
                await self._settle(answer)
            return body_response("response_body", clear=True)
        out = answer.relay_chunk(chunk)
        if message.end_of_stream:
            out += answer.ended()
        ex.bytes_out += len(out)
        if message.end_of_stream:
            await self._settle(answer)
        if out == chunk:
            return body_response("response_body")
        if not out:
            return body_response("response_body", clear=True)
        return body_response("response_body", out)

    async def _settle(self, answer: Answer) -> None:
        ex = self.ex
        assert ex is not None and self.reservation is not None
        answer.close()
        ex.ended = time.perf_counter()
        self.complete = True
        self.settled = True
        await self.gateway.settle(answer, self.reservation)
        await self._free_slot()

    async def _free_slot(self) -> None:
        slot, self.slot = self.slot, None
        if slot is not None:
            await slot.__aexit__(None, None, None)

    # ---------------------------------------------------------------------------- refusals

    def _refuse(self, err: GuardError) -> Any:
        ex = self.ex
        assert ex is not None
        self.gateway.refused(ex, err)
        self.complete = True
        if not ex.request_id:
            ex.request_id = os.urandom(16).hex()
        answer = immediate_error(err, ex.request_id)
        ex.bytes_out += len(answer.immediate_response.body)
        return answer

    def _refuse_admission(self, admission: Admission) -> Any:
        rejection = admission.verdict.rejection
        assert rejection is not None
        return self._refuse(rejection)

    # --------------------------------------------------------------------------- the end

    async def _end(self) -> None:
        """The stream is over: settle what is unsettled, free the slot, record once."""
        ex = self.ex
        gateway = self.gateway
        try:
            if (
                ex is not None
                and not self.complete
                and self.admitted
                and self.answer is None
                and self.response_body_mode == _NONE
                and self.reservation is not None
            ):
                # Admitted by a filter that sends no response body (and here no response
                # headers either: the request phases only): forwarded, its answer unseen.
                # Recorded as 200, the reservation kept as charged.
                ex.status = 200
                self.settled = True
                with contextlib.suppress(Exception):
                    await gateway.limiter.reconcile(self.reservation, self.reservation.tokens)
            elif ex is not None and not self.complete:
                # The exchange ended before its answer did: the client left, the upstream
                # failed, or Envoy gave up on it.
                ex.status, ex.code = 499, "client_disconnected"
                gateway.metrics.aborted("client_gone")
                if ex.relay is not None:
                    ex.completion_tokens = ex.relay.completion_tokens
            if self.reservation is not None and not self.settled:
                self.settled = True
                with contextlib.suppress(Exception):
                    await gateway.settle_unfinished(ex, self.reservation)  # type: ignore[arg-type]
        finally:
            await self._free_slot()
            if ex is not None:
                gateway.record(ex, None)


def _not_buffered() -> GuardError:
    return Misconfigured(
        BODY_NOT_BUFFERED,
        "the ext_proc filter must send the request body buffered (request_body_mode: BUFFERED)",
    )
