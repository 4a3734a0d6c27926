"""The upstream's answer to one admitted request, observed whatever carries it.

:class:`Answer` is the back half's accounting without I/O: the transport (the ASGI proxy, which
reads the upstream itself; the ext_proc server, to which Envoy hands the response) tells it the
status and passes the body through it, and sends on what it returns. It finds ``usage`` in a
body or its tail, relays an event stream through :class:`~guard.http.SseRelay` (output tokens
counted, the output cap enforced, a stream the upstream ended early flagged), and gives the
tokens the rate limiter is settled with (:meth:`Answer.settlement`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from guard.errors import UpstreamError
from guard.exchange import Exchange
from guard.http import SseRelay, error_event
from guard.telemetry import GuardMetrics

__all__ = [
    "TRUNCATED_CODE",
    "Answer",
    "RelayArgs",
    "extract_usage",
    "upstream_error_code",
]

TRUNCATED_CODE = "upstream_stream_truncated"

_USAGE_TAIL = 16 << 10
_USAGE_MAX = 4096  # a usage object (with its token details) is a few hundred bytes
_ERROR_BODY_MAX = 64 << 10  # an upstream error body bigger than this is not looked into
_DECODER = json.JSONDecoder()

# The relay's arguments for one admitted request (max_tokens, n, include_usage, prompt_tokens).
RelayArgs = dict[str, Any]


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


def _usage_int(usage: dict[str, Any] | None, key: str) -> int | None:
    if usage is None:
        return None
    value = usage.get(key)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


class Answer:
    """One answer, from its status to its end. ``ex`` is the request's
    :class:`~guard.exchange.Exchange` (status, code, tokens and flags are written into it).

    :meth:`start` with the status and whether it is an event stream; then, for a stream,
    :meth:`relay` each chunk (send on what it returns, stop once :attr:`done`), :meth:`ended`
    when the upstream's body ended or :meth:`failed` when it broke, and :meth:`close` (True: the
    upstream request should be aborted, the relay cut it short); for any other body,
    :meth:`whole` or :meth:`observe` each chunk then :meth:`ended`, or :meth:`failed`.
    :meth:`settlement` is what the reservation is settled with.
    """

    __slots__ = (
        "_count",
        "_metrics",
        "_relay_args",
        "_tail",
        "ex",
        "relay",
        "status",
        "usage",
    )

    def __init__(
        self,
        ex: Exchange,
        metrics: GuardMetrics,
        count_tokens: Callable[[str], int],
        relay_args: RelayArgs,
    ) -> None:
        self.ex = ex
        self._metrics = metrics
        self._count = count_tokens
        self._relay_args = relay_args
        self._tail = b""
        self.relay: SseRelay | None = None
        self.status = 0
        self.usage: dict[str, Any] | None = None

    def start(self, status: int, event_stream: bool) -> None:
        """The answer's head is in (and about to go to the client)."""
        ex = self.ex
        self.status = status
        if event_stream:
            ex.stream = True
            ex.relay = self.relay = SseRelay(
                self._count, **{"max_tokens": None, **self._relay_args}
            )
        ex.status = status
        ex.response_started = True

    @property
    def done(self) -> bool:
        """The stream's last event has been given out: nothing more goes to the client."""
        relay = self.relay
        return relay is not None and relay.done

    # --------------------------------------------------------------------------- a stream

    def relay_chunk(self, chunk: bytes) -> bytes:
        """What goes to the client for one chunk of the upstream's stream."""
        relay = self.relay
        assert relay is not None
        out = relay.feed(chunk)
        if relay.done:
            # The stream's last event goes out now. A client that has read it may close at
            # once, and that is not an abort (the request is a 200 with its token counts).
            self.ex.finished = True
        return out

    def ended(self) -> bytes:
        """The upstream's body ended. A stream without ``[DONE]``: its unterminated last event,
        passed on as it is, and an error event (returned, to send last). Any other body:
        ``usage`` is read from its tail."""
        relay = self.relay
        if relay is None:
            if self.status < 400 and self._tail:  # (a body read whole has had its usage)
                self.usage = extract_usage(self._tail)
            return b""
        if relay.done:
            return b""
        rest = relay.finish()
        out = (rest + b"\n\n" if rest else b"") + self._truncated("no_done")
        self.ex.finished = True
        return out

    def failed(self, err: UpstreamError) -> bytes:
        """The upstream's body broke off: for a stream under way an error event and ``[DONE]``
        (returned, to send last); the headers are out, so any other body is just cut."""
        ex = self.ex
        self._metrics.rejected(err.code)
        if self.relay is None:
            ex.status, ex.code = err.status, err.code
            return b""
        ex.code = err.code
        if self.relay.done:
            return b""
        ex.finished = True
        return error_event(err.to_body())

    def close(self) -> bool:
        """The stream is over for the client. True when the upstream request should be aborted
        (the relay cut it at the output cap, or an event was too big)."""
        relay = self.relay
        ex = self.ex
        ex.finished = True
        if relay is None:
            return False
        abort = relay.cut or relay.oversized
        if abort:
            self._metrics.aborted("output_cap" if relay.cut else "bad_event")
        if relay.oversized:
            ex.code = "upstream_error"
            self._metrics.rejected("upstream_error")
        if relay.upstream_done and relay.unfinished:
            self._truncated("no_finish_reason")
        self.usage = relay.usage
        return abort

    def _truncated(self, how: str) -> bytes:
        """Flag a stream the upstream ended early (``how``: ``no_done``, it ended without
        ``[DONE]``; ``no_finish_reason``, a choice never got one). Without ``[DONE]`` the client
        gets an error event and ``[DONE]`` (returned), as for any upstream failure mid-stream:
        the SDKs raise it rather than return a partial answer as whole. A ``[DONE]`` without a
        ``finish_reason`` is relayed as it is (the client sees ``finish_reason: null``)."""
        ex = self.ex
        ex.truncated = how
        self._metrics.stream_truncated(ex.route, how)
        if how != "no_done":
            return b""
        err = UpstreamError(TRUNCATED_CODE, "the upstream ended the stream before it was complete")
        ex.code = err.code
        self._metrics.rejected(err.code)
        return error_event(err.to_body())

    # ----------------------------------------------------------------------- any other body

    def whole(self, data: bytes) -> None:
        """A body read whole: ``usage``, or an error body's ``code``."""
        if self.status >= 400:
            self.ex.upstream_code = upstream_error_code(data)
        else:
            self.usage = extract_usage(data)

    def observe(self, chunk: bytes) -> None:
        """One chunk of a body relayed as it comes (only its tail is kept, for ``usage``)."""
        self._tail = (self._tail + chunk)[-_USAGE_TAIL:]

    # ----------------------------------------------------------------------------- settling

    def settlement(self, reserved: int) -> int | None:
        """The tokens to settle the reservation (``reserved`` tokens) with; None: release it
        (the upstream answered with an error: it did no work). Fills in the exchange's token
        counts from the upstream's ``usage``, or from the relay's count."""
        if self.status >= 400:
            return None
        ex = self.ex
        usage = self.usage
        relay = self.relay
        if relay is not None:
            completion = relay.completion_tokens if (relay.events or relay.usage) else None
        else:
            completion = _usage_int(usage, "completion_tokens")
        prompt = _usage_int(usage, "prompt_tokens")
        if prompt is not None:
            ex.prompt_tokens = prompt
        if completion is not None:
            ex.completion_tokens = completion
        total = _usage_int(usage, "total_tokens")
        if completion is not None:
            return int(ex.prompt_tokens + completion)
        if total is not None:  # embeddings: prompt tokens only
            return total
        return reserved  # nothing to settle with: keep it as charged
