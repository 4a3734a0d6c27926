"""uvicorn's httptools protocol with a cap on the request head (request line + headers).

httptools has no limit of its own on the request head: a client can stream megabytes of one
header (or of the URL) and the server accumulates them before the app sees anything (vLLM
GHSA-rxc4-3w6r-4v47 is an 8 MB header). This protocol counts the bytes received while a head is
being parsed and, past ``max_head_bytes``, answers 431 ``headers_too_large`` (an OpenAI error
body) and closes the connection. It counts the head's lines too, so that thousands of small
headers get 431 ``too_many_headers`` (the limit they cross first) rather than the byte cap's
code. The app still checks the policy's exact header count and size
(:func:`guard.http._framing.inspect_head`); this is the backstop in front of it, set from the policy
by :func:`configure` with room for the request line.

It also gives each request a :class:`~guard.http._disconnect.DisconnectHook` (in
``scope["extensions"]``), fired when the connection is lost before the response is complete, so
the app learns of a disconnect without a task waiting on ``receive()``.

And it holds each response's head until the body's first write so that both leave in one system
call (:class:`_HeadCork`): about 8% of the guard's CPU per proxied request at 32 connections.

And it enforces the connection limits (:mod:`guard.http._connections`): a head timeout from a
connection's opening (uvicorn has none: a connection that sends nothing stays open), its own
keep-alive timer, and caps on open connections per peer address and per process, checked as
each connection opens (an old connection between requests is closed to make room, else the new
one is refused at once with an OpenAI error body).

Use it with ``uvicorn.run(..., http="guard.http._protocol:GuardHttpToolsProtocol")``.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from guard.errors import GuardError, Overloaded, RateLimited
from guard.http._connections import ConnectionLimits, ConnectionTable, effective_max_connections
from guard.http._disconnect import DISCONNECT_EXTENSION, DisconnectHook

__all__ = [
    "GuardHttpToolsProtocol",
    "configure",
    "connection_table",
    "head_refusals",
    "protocol_with",
]

# Room for the request line (method, URL, version) on top of the policy's header bytes.
URL_ALLOWANCE = 8192 + 256


# A body write up to this is copied behind the held response head to leave in one system call.
_JOIN_MAX = 64 * 1024

# Heads refused here, by code, for this process: they never reach an app, so the app's metrics
# read this at scrape time (see guard.app).
_REFUSED: dict[str, int] = {}


def head_refusals() -> dict[str, int]:
    """How many request heads this process refused (431), by error code."""
    return dict(_REFUSED)


def configure(
    max_header_bytes: int,
    max_header_count: int | None = None,
    connections: ConnectionLimits | None = None,
) -> None:
    """Set the caps for every connection of this process (each uvicorn worker calls it)."""
    GuardHttpToolsProtocol.max_head_bytes = max_header_bytes + URL_ALLOWANCE
    if max_header_count is not None:
        GuardHttpToolsProtocol.max_headers = max_header_count
    if connections is not None:
        GuardHttpToolsProtocol.connection_limits = connections
        GuardHttpToolsProtocol.max_connections = effective_max_connections(connections)


def protocol_with(connections: ConnectionLimits) -> type[GuardHttpToolsProtocol]:
    """The protocol with these connection limits (for a server of its own: tests, benches)."""
    return type(
        "GuardHttpToolsProtocol",
        (GuardHttpToolsProtocol,),
        {
            "connection_limits": connections,
            "max_connections": effective_max_connections(connections),
        },
    )


_TABLE_ATTR = "schedguard_connections"


def connection_table(server_state: Any) -> ConnectionTable:
    """The connection table of one uvicorn server (kept on its ``ServerState``)."""
    table = getattr(server_state, _TABLE_ATTR, None)
    if table is None:
        table = ConnectionTable()
        setattr(server_state, _TABLE_ATTR, table)
    return table


# What a deadline closes a waiting connection for.
_HEAD, _IDLE, _DRAIN = "head", "idle", "drain"


class GuardHttpToolsProtocol(HttpToolsProtocol):
    max_head_bytes: ClassVar[int] = 16384 + URL_ALLOWANCE
    max_headers: ClassVar[int] = 100
    cork_response_head: ClassVar[bool] = True
    connection_limits: ClassVar[ConnectionLimits] = ConnectionLimits()
    max_connections: ClassVar[int] = ConnectionLimits().max_connections

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True
        self._head_bytes = 0
        self._head_lines = 0
        self._tail = b""
        self.timeout_keep_alive = self.connection_limits.keep_alive_timeout_s  # type: ignore[assignment]
        self.peer = ""
        self._table: ConnectionTable | None = None  # None: not counted (refused, closed)
        self._deadline: asyncio.TimerHandle | None = None
        self._deadline_kind = _HEAD
        self._message_done = False

    # -- connection limits --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        client = self.client
        self.peer = client[0] if client else "local"
        table = connection_table(self.server_state)
        limits = self.connection_limits
        full = table.admit(self.peer, limits.max_connections_per_peer, self.max_connections)
        if full is not None:
            self._refuse_connection(full == "peer")
            return
        self._table = table
        table.add(self)
        self._wait(_HEAD, limits.head_timeout_s)

    def _refuse_connection(self, peer_cap: bool) -> None:
        err: GuardError
        if peer_cap:
            err = RateLimited(
                "too_many_connections",
                f"this address has {self.connection_limits.max_connections_per_peer} "
                "connections open, all in requests",
                headers={"retry-after": "1"},
            )
        else:
            err = Overloaded(
                "server_connection_limit",
                f"the guard has {self.max_connections} connections open, all in requests",
                headers={"retry-after": "1"},
            )
        _REFUSED[err.code] = _REFUSED.get(err.code, 0) + 1
        self.transport.write(error_response(err))
        self.transport.close()

    def evict(self) -> None:
        """Closed to make room for a new connection (the table has let go of it already)."""
        self._table = None
        self._cancel_deadline()
        if not self.transport.is_closing():
            self.transport.close()

    def _wait(self, kind: str, timeout: float) -> None:
        """Between requests: evictable, and closed after ``timeout`` unless a head completes."""
        table = self._table
        if table is None:
            return
        table.waiting(self)
        self._arm(kind, timeout)

    def _arm(self, kind: str, timeout: float) -> None:
        self._cancel_deadline()
        self._deadline_kind = kind
        self._deadline = self.loop.call_later(timeout, self._deadline_passed)

    def _cancel_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _deadline_passed(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        if self._deadline_kind == _HEAD and self._head_bytes:
            limit = self.connection_limits.head_timeout_s
            _REFUSED["head_timeout"] = _REFUSED.get("head_timeout", 0) + 1
            err = GuardError(
                "head_timeout",
                f"the request head did not arrive within {limit:g} s",
                status=408,
            )
            self.transport.write(error_response(err))
        self.transport.close()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.transport.is_closing():
            return
        self._unset_keepalive_if_required()  # this protocol's own timers instead
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            return  # a pipelined request started
        limits = self.connection_limits
        if self._message_done:
            self._wait(_IDLE, limits.keep_alive_timeout_s)
        else:
            # The answer is out but the body is still coming: it has the head's time to end.
            self._wait(_DRAIN, limits.head_timeout_s)

    # -- requests -----------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._message_done = False
        extensions: dict[str, Any] = {DISCONNECT_EXTENSION: DisconnectHook()}
        self.scope["extensions"] = extensions

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_deadline()
        table, self._table = self._table, None
        if table is not None:
            table.remove(self)
        cycle = self.cycle
        super().connection_lost(exc)
        if cycle is not None and not cycle.response_complete:
            hook = cycle.scope.get("extensions", {}).get(DISCONNECT_EXTENSION)
            if isinstance(hook, DisconnectHook):
                hook.fire()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._message_done = True
        self._in_head = True  # whatever comes next on this connection is a new head
        self._head_bytes = 0
        self._head_lines = 0
        self._tail = b""
        cycle = self.cycle
        if self._deadline_kind == _DRAIN and cycle is not None and cycle.response_complete:
            # The rest of a body answered early has come: idle until the next request.
            self._wait(_IDLE, self.connection_limits.keep_alive_timeout_s)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._cancel_deadline()
        if self._table is not None:
            self._table.busy(self)
        super().on_headers_complete()
        cycle = self.cycle
        if self.cork_response_head and cycle is not None:
            cycle.transport = _HeadCork(self.transport, self.loop)  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self._table is None or self.transport.is_closing():
            return  # refused or evicted: nothing more is read
        if self._deadline_kind == _IDLE and self._deadline is not None:
            # The first byte of the next request: its head has the head timeout from now.
            self._arm(_HEAD, self.connection_limits.head_timeout_s)
        if self._in_head:
            # Only the bytes up to the blank line that ends the head count; a body sent in the
            # same packet does not. The previous chunk's last 3 bytes catch a split marker.
            window = self._tail + data
            end = window.find(b"\r\n\r\n")
            head_part = len(data) if end < 0 else max(0, end + 4 - len(self._tail))
            self._head_bytes += head_part
            self._head_lines += data.count(b"\n", 0, head_part)
            self._tail = window[-3:]
            # A head of N headers has N + 2 line ends (the request line's, the blank line's).
            if self._head_lines > self.max_headers + 2:
                self._refuse_head(
                    "too_many_headers", f"the request has more than {self.max_headers} headers"
                )
                return
            if self._head_bytes > self.max_head_bytes:
                self._refuse_head(
                    "headers_too_large",
                    f"the request line and headers exceed {self.max_head_bytes} bytes",
                )
                return
        super().data_received(data)

    def send_400_response(self, msg: str) -> None:
        """A head httptools cannot parse (bad bytes in the request line or a header, a request
        smuggling shape): 400 ``invalid_http_request`` as an OpenAI error body, where uvicorn
        sends plain text."""
        self._refuse_head("invalid_http_request", "the request is not valid HTTP/1.1", 400)

    def _refuse_head(self, code: str, message: str, status: int = 431) -> None:
        if self.transport.is_closing():
            return
        _REFUSED[code] = _REFUSED.get(code, 0) + 1
        self.transport.write(error_response(GuardError(code, message, status=status)))
        self.transport.close()


def error_response(err: GuardError) -> bytes:
    """A whole ``connection: close`` response with ``err``'s OpenAI error body, for the server
    protocol to write itself (no app behind it)."""
    body = json.dumps(err.to_body(), separators=(",", ":")).encode()
    extra = "".join(f"{name}: {value}\r\n" for name, value in err.headers.items())
    head = (
        f"HTTP/1.1 {err.status} {_REASONS.get(err.status, 'Error')}\r\n"
        "content-type: application/json\r\n"
        f"content-length: {len(body)}\r\n"
        f"{extra}connection: close\r\n\r\n"
    ).encode()
    return head + body


_REASONS = {
    400: "Bad Request",
    408: "Request Timeout",
    414: "URI Too Long",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    503: "Service Unavailable",
}


class _HeadCork:
    """The transport as one request's response cycle sees it. Its first write (the response
    head) is held until the second one (the body, or a stream's first chunk), the end of the
    event-loop iteration, or a close, whichever comes first; every later write goes straight
    through. uvicorn writes a response's head and body separately: held, a proxied JSON answer
    leaves in one system call instead of two."""

    __slots__ = ("_corked", "_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None
        self._corked = True

    def write(self, data: bytes) -> None:
        if self._corked:
            self._corked = False
            self._held = data
            self._loop.call_soon(self._flush)
            return
        held = self._held
        if held is None:
            self._transport.write(data)
            return
        self._held = None
        if len(data) <= _JOIN_MAX:
            self._transport.write(held + data)
        else:
            self._transport.writelines((held, data))

    def _flush(self) -> None:
        held = self._held
        if held is not None:
            self._held = None
            if not self._transport.is_closing():
                self._transport.write(held)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)
