"""A lean HTTP/1.1 client for one upstream: pooled keep-alive connections on asyncio transports,
responses parsed by httptools (the parser under uvicorn's server).

Why not aiohttp: the client dominates a gateway's cost, and on this machine (bench/gateway.py
setup, 32 connections) a uvicorn pass-through proxy spent about 138 us of CPU per request with
an aiohttp ``ClientSession`` and about 48 us with this client. The guard talks to one base URL,
sends bodies it already holds in memory and needs none of aiohttp's cookies, redirects, auth,
proxies or multipart, which is what makes the difference.

:class:`ConnectionPool` ``.request()`` returns a :class:`PooledResponse` once the status line
and headers are in; its body is read whole or chunk by chunk, then the response is released
(the connection goes back to the pool when the body was read to its end, and is closed
otherwise). Failures raise (the classes are in :mod:`guard.errors`):

- :class:`ConnectFailed`: the connection could not be made (refused, unresolvable, TLS);
- :class:`ResponseBroken`: reset or closed early, a malformed response, headers over the caps;
- :class:`UpstreamTimeout` (a :class:`TimeoutError`): pool wait plus connect, the gap between
  two reads (response headers included), or the whole exchange took too long.

A request that meets a pooled connection the upstream had just closed (the keep-alive race:
nothing at all came back) is sent once more on a new connection.
"""

from __future__ import annotations

import asyncio
import collections
import re
import ssl
from collections.abc import Iterable
from typing import Literal, cast
from urllib.parse import urlsplit

import httptools
import pydantic
import pydantic.dataclasses
from pydantic import Field

from guard._limits import LIMITS_CONFIG, PosFloat, PosInt
from guard.errors import ConnectFailed, ResponseBroken, UpstreamTimeout

__all__ = [
    "KEEPALIVE_S",
    "PRIORITY_HEADER",
    "UPSTREAM_CONTROL_HEADERS",
    "ConnectionPool",
    "PooledResponse",
    "UpstreamConfig",
    "UpstreamKind",
]

# Buffered response bytes above which the socket is not read until the consumer catches up.
_HIGH_WATER = 256 * 1024
_MAX_HEADER_BYTES = 64 * 1024
_MAX_HEADER_COUNT = 256
# Status line and line ends on top of the header bytes counted by name and value.
_HEAD_SLACK = 4 * 1024 + 4 * _MAX_HEADER_COUNT


class _StaleConnection(ResponseBroken):
    """A reused connection closed before any byte of the response: safe to send again (a
    signal inside the pool, never raised out of it)."""


# What the upstream is (``upstream.kind`` once ``auto`` is decided).
UpstreamKind = Literal["vllm", "llama_cpp", "other"]
# vLLM's request header that overrides the body's `priority` (chat, completions, responses).
PRIORITY_HEADER = "x-vllm-priority"
# Request headers through which a client steers vLLM's scheduler, routing or answers.
UPSTREAM_CONTROL_HEADERS: tuple[str, ...] = (
    PRIORITY_HEADER,
    "x-session-id",
    "x-data-parallel-rank",
    "endpoint-load-metrics-format",
)

# Idle pooled connections are closed after this; below the upstream's own keep-alive timeout
# (uvicorn's default is 5 s), so that a connection the upstream is closing is not reused.
KEEPALIVE_S = 4.0
_URL = re.compile(r"https?://[^\s/?#]+(/[^\s?#]*)?")


@pydantic.dataclasses.dataclass(frozen=True, config=LIMITS_CONFIG)
class UpstreamConfig:
    """Where the upstream is and how long to wait for it: the policy's ``upstream`` section.

    The read timeout runs between two reads of the response (headers included), so a stream
    that goes silent is cut while a long one that keeps producing is not.
    """

    url: str | None = Field(
        default=None,
        description="Base URL of the upstream server (vLLM, SGLang, llama.cpp, TGI or the "
        "reference scheduler), e.g. `http://127.0.0.1:8000`. `null`: `schedguard serve` starts "
        "the reference scheduler (hardened profile) as an embedded upstream.",
    )
    connect_timeout_s: PosFloat = Field(
        default=5.0, description="Seconds to open a connection to the upstream (then 502)."
    )
    read_timeout_s: PosFloat = Field(
        default=60.0,
        description="Seconds to wait for the next bytes of an upstream response, streamed or "
        "not (then 504). Covers the time to the first token of a long prompt.",
    )
    total_timeout_s: PosFloat = Field(
        default=600.0,
        description="Seconds one upstream request may take in all, stream included (then 504 "
        "or, mid-stream, a cleanly ended stream).",
    )
    max_connections: PosInt = Field(
        default=256,
        description="Pooled keep-alive connections to the upstream, at most; as many as the "
        "upstream's concurrent requests (vLLM's default `max_num_seqs` is 256).",
    )
    capacity: PosInt | None = Field(
        default=None,
        description="Requests the upstream serves at once: the guard lets this many through "
        "(at most `rate.global_concurrency`) and queues the rest fairly. `null` (default): "
        "read from the upstream while serving -- vLLM's (and SGLang's, and the reference "
        "scheduler's) `/metrics`: running and waiting requests and KV-cache use, the limit "
        "shrinking while the upstream queues and growing back while it has room; llama.cpp's "
        "`llama-server`: `/props` `total_slots`; llama-cpp-python: one slot (plus one request "
        "let through to wait at its lock, for which it ends a running stream); otherwise "
        "`rate.global_concurrency`. `/readyz` says the capacity in force and where it came "
        "from.",
    )
    capacity_poll_s: PosFloat = Field(
        default=1.0,
        description="How often the upstream's load is read for the capacity in force (vLLM's "
        "`/metrics`), while serving.",
    )
    kind: Literal["auto", UpstreamKind] = Field(
        default="auto",
        description="What the upstream is, for what the guard knows of the requests it "
        "accepts: `vllm`, `llama_cpp` (llama-cpp-python 0.3.36's server: every request its "
        "own request models reject, which it answers with a 500, is refused with a 400 "
        "`unsupported_by_upstream`, and a list of more than one prompt with "
        "`prompts_exceeded`) or `other`. `auto` (default): read from the upstream's "
        "`GET /v1/models` at start-up and on each readiness check (entries `owned_by: vllm` "
        "are vLLM's, `owned_by: me` llama-cpp-python's); `other` until it answers. "
        "`/readyz`, the dry run and `schedguard policy show --upstream` say the kind in force.",
    )
    priority_scheduling: bool = Field(
        default=False,
        description="Whether the upstream schedules by the requests' `priority`, lower "
        "first: vLLM started with `--scheduling-policy priority`, SGLang with "
        "`--enable-priority-scheduling --schedule-low-priority-values-first`. `true`: each "
        "request is scheduled with its key's `rate.priority` or a worse one its client asks "
        "for, and `X-Vllm-Priority` is never forwarded (its value goes in the body). `false` "
        "(default): a `priority` other than 0 is refused (`field_not_allowed`) and nothing is "
        "injected. Needs the `schema` check, which decides it; not with `kind: llama_cpp` (it "
        'has no priorities). See "Priorities" above.',
    )
    strip_headers: tuple[str, ...] = Field(
        default=UPSTREAM_CONTROL_HEADERS,
        description="Client headers never forwarded, by name (any case): vLLM 0.32 reads "
        "`X-Vllm-Priority` (overrides the body's `priority`: preempts other tenants under "
        "priority scheduling), `X-Session-ID` (session affinity), `X-data-parallel-rank` (pins "
        "the data-parallel rank) and `endpoint-load-metrics-format` (answers with the engine's "
        "load: KV-cache use, queue). Hop-by-hop and framing headers, `authorization` and "
        "`x-request-id` are the guard's own business in any case.",
    )

    @pydantic.field_validator("strip_headers")
    @classmethod
    def _header_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            if not re.fullmatch(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}", name):
                raise ValueError(f"{name[:40]!r} is not a header name")
        return tuple(name.lower() for name in value)

    @pydantic.model_validator(mode="after")
    def _priority_upstream(self) -> UpstreamConfig:
        if self.priority_scheduling and self.kind == "llama_cpp":
            # llama-cpp-python's request models have no `priority`: nothing would schedule by it.
            raise ValueError("priority_scheduling: llama.cpp has no priority scheduling")
        return self

    @pydantic.field_validator("url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None and not _URL.fullmatch(value):
            raise ValueError("must be an http:// or https:// URL without query or fragment")
        return value.rstrip("/") if value is not None else None


class PooledResponse:
    """A response whose status and headers are in. ``raw_headers``: (name, value) as received."""

    __slots__ = ("_conn", "content_length", "raw_headers", "status")

    def __init__(
        self,
        conn: _Connection,
        status: int,
        raw_headers: list[tuple[bytes, bytes]],
        content_length: int | None,
    ) -> None:
        self._conn = conn
        self.status = status
        self.raw_headers = raw_headers
        self.content_length = content_length

    @property
    def at_eof(self) -> bool:
        """Whether the whole body has been read."""
        return self._conn.body_read

    async def read_chunk(self) -> bytes:
        """What arrived since the last call (waiting for something); ``b""`` at the end."""
        return await self._conn.read_chunk()

    def release(self) -> None:
        """Back to the pool when the body was read to its end; closed otherwise."""
        self._conn.release()

    def close(self) -> None:
        """Drop the connection (the upstream sees a disconnect and can stop working)."""
        self._conn.close()


class _Connection(asyncio.Protocol):
    """One keep-alive connection, one exchange at a time."""

    def __init__(self, pool: ConnectionPool) -> None:
        self.pool = pool
        self.loop = pool.loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.idle_since = 0.0
        self.exchanges = 0
        self._reset_exchange()

    def _reset_exchange(self) -> None:
        self._headers: list[tuple[bytes, bytes]] = []
        self._header_bytes = 0
        self._head_bytes = 0
        self._length: int | None = None
        self._chunked = False
        self._received = False
        self._head: asyncio.Future[PooledResponse] | None = None
        self._chunks: list[bytes] = []
        self._buffered = 0
        self._waiter: asyncio.Future[None] | None = None
        self._error: BaseException | None = None
        self._headers_done = False
        self.body_read = False
        self._reusable = False
        self._paused = False
        self._last_read = 0.0
        self._deadline = 0.0
        self._read_timeout = 0.0
        self._timer: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------------ the exchange

    def send(
        self, head: bytes, body: bytes | None, read_timeout: float, total_timeout: float
    ) -> asyncio.Future[PooledResponse]:
        transport = self.transport
        if transport is None or self.closed or transport.is_closing():
            # Closed by the upstream between the pool and here: as good as stale.
            raise _StaleConnection("the pooled connection was closed")
        self._reset_exchange()
        self.exchanges += 1
        now = self.loop.time()
        self._last_read = now
        self._read_timeout = read_timeout
        self._deadline = now + total_timeout
        self._head = head_future = self.loop.create_future()
        self._arm(now)
        if body:
            transport.writelines((head, body))
        else:
            transport.write(head)
        return head_future

    async def read_chunk(self) -> bytes:
        while True:
            if self._chunks:
                chunks = self._chunks
                data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
                self._chunks = []
                self._buffered = 0
                if self._paused and not self.closed and self.transport is not None:
                    self._paused = False
                    self._last_read = self.loop.time()
                    self.transport.resume_reading()
                return data
            if self._error is not None:
                raise self._error
            if self.body_read:
                return b""
            waiter = self._waiter = self.loop.create_future()
            try:
                await waiter
            finally:
                self._waiter = None

    def release(self) -> None:
        if self.body_read and self._reusable and not self.closed and self._error is None:
            self._cancel_timer()
            self._head = None  # idle: any byte from now on is unsolicited
            self.pool._release(self)
        else:
            self.close()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._cancel_timer()
            if self.transport is not None:
                self.transport.close()
            self.pool._forget(self)

    # ------------------------------------------------------------------ timeouts

    def _arm(self, now: float) -> None:
        when = min(self._deadline, self._last_read + self._read_timeout)
        self._timer = self.loop.call_at(when, self._on_timer)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _on_timer(self) -> None:
        self._timer = None
        now = self.loop.time()
        if now >= self._deadline:
            self._fail(UpstreamTimeout("the upstream exchange exceeded its total timeout"))
        elif self._paused:  # we stopped reading, not the upstream: wait for the consumer
            self._last_read = now
            self._arm(now)
        elif now - self._last_read >= self._read_timeout:
            self._fail(UpstreamTimeout("the upstream sent nothing within the read timeout"))
        else:
            self._arm(now)

    # ------------------------------------------------------------------ protocol callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio.Transport; they implement it.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self._head is None or self.body_read:
            # Bytes nobody asked for (on an idle connection, or after the whole response):
            # the connection cannot be trusted with another exchange.
            self.close()
            return
        self._received = True
        self._last_read = self.loop.time()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(ResponseBroken("the upstream switched protocols"))
            return
        except httptools.HttpParserError as exc:
            if self.body_read:  # the response is whole; what followed it is not one
                self.close()
            else:
                self._fail(ResponseBroken(f"malformed upstream response: {exc}"))
            return
        if not self._headers_done:
            # httptools holds a header line until it ends: cap what it may hold.
            self._head_bytes += len(data)
            if self._head_bytes > _MAX_HEADER_BYTES + _HEAD_SLACK:
                self._fail(ResponseBroken("upstream response headers over the caps"))

    def connection_lost(self, exc: Exception | None) -> None:
        was_closed = self.closed
        self.closed = True
        self._cancel_timer()
        self.pool._forget(self)
        if self._head is None or self.body_read or self._error is not None:
            return
        if exc is None and self._headers_done and self._length is None and not self._chunked:
            self._message_done()  # a body delimited by a clean end of the connection
            return
        if was_closed:
            error: ResponseBroken = ResponseBroken("the connection was closed")
        elif not self._received and self.exchanges > 1:
            error = _StaleConnection("the upstream closed a pooled connection")
        else:
            error = ResponseBroken("the upstream closed the connection before the response ended")
        self._fail(error)

    # httptools callbacks

    def on_message_begin(self) -> None:
        if self.body_read:  # a second response to one request
            raise ValueError("more than one response")

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_bytes += len(name) + len(value)
        self._headers.append((name, value))
        if self._header_bytes > _MAX_HEADER_BYTES or len(self._headers) > _MAX_HEADER_COUNT:
            raise ValueError("upstream response headers over the caps")
        lname = name.lower()
        if lname == b"content-length":
            try:
                self._length = int(value)
            except ValueError:
                raise ValueError("bad content-length") from None
        elif lname == b"transfer-encoding":
            self._chunked = b"chunked" in value.lower()

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if 100 <= status < 200:  # an interim response: the real one follows
            self._headers, self._header_bytes = [], 0
            self._length, self._chunked = None, False
            return
        self._headers_done = True
        head = self._head
        if head is not None and not head.done():
            head.set_result(PooledResponse(self, status, self._headers, self._length))

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        self._buffered += len(body)
        self._wake()
        if self._buffered > _HIGH_WATER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()

    def on_message_complete(self) -> None:
        if not self._headers_done:  # the end of an interim response
            return
        self._reusable = self.parser.should_keep_alive()
        self._message_done()

    # ------------------------------------------------------------------ internals

    def _message_done(self) -> None:
        self.body_read = True
        self._cancel_timer()
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, error: BaseException) -> None:
        if self._error is None:
            self._error = error
        head = self._head
        if head is not None and not head.done():
            head.set_exception(error)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(error)
        self.close()


class ConnectionPool:
    """Keep-alive connections to one ``http://`` or ``https://`` origin, at most
    ``max_connections`` open; callers beyond wait in line (within the connect timeout)."""

    def __init__(self, config: UpstreamConfig, *, keepalive_s: float = KEEPALIVE_S) -> None:
        parts = urlsplit(config.url or "")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {config.url!r}")
        self.config = config
        self.keepalive_s = keepalive_s
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.ssl: ssl.SSLContext | None = (
            ssl.create_default_context() if parts.scheme == "https" else None
        )
        default_port = self.port == (443 if parts.scheme == "https" else 80)
        host = f"[{self.host}]" if ":" in self.host else self.host
        self._host_line = b"host: " + (host if default_port else f"{host}:{self.port}").encode(
            "idna"
        )
        self._base_path = parts.path.rstrip("/")
        self._idle: collections.deque[_Connection] = collections.deque()
        self._open: set[_Connection] = set()
        self._waiters: collections.deque[asyncio.Future[_Connection | None]] = collections.deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        return loop

    @property
    def open_connections(self) -> int:
        return len(self._open)

    @property
    def idle_connections(self) -> int:
        return len(self._idle)

    async def request(
        self,
        method: str,
        path: str,
        headers: Iterable[tuple[bytes, bytes]],
        body: bytes | None,
        *,
        total_timeout_s: float | None = None,
    ) -> PooledResponse:
        """Send one request (``path`` joined to the base URL's path, query included) and
        return once the response headers are in. ``headers`` must not carry ``host`` or
        framing headers: the client writes those."""
        if method == "HEAD":  # the parser would wait for a body that never comes
            raise ValueError("HEAD requests are not supported by this client")
        head = self._head(method, path, headers, body)
        cfg = self.config
        total = cfg.total_timeout_s if total_timeout_s is None else total_timeout_s
        read = min(cfg.read_timeout_s, total)
        conn = await self._acquire()
        try:
            return await conn.send(head, body, read, total)
        except _StaleConnection:
            conn.close()
        except BaseException:
            conn.close()
            raise
        conn = await self._acquire(fresh=True)
        try:
            return await conn.send(head, body, read, total)
        except BaseException:
            conn.close()
            raise

    def _head(
        self, method: str, path: str, headers: Iterable[tuple[bytes, bytes]], body: bytes | None
    ) -> bytes:
        lines = [
            f"{method} {self._base_path}{path} HTTP/1.1".encode("latin-1"),
            self._host_line,
        ]
        lines.extend(name + b": " + value for name, value in headers)
        if body is not None:
            lines.append(b"content-length: %d" % len(body))
        block = b"\r\n".join(lines)
        # Names and values come from clients: a CR, LF or NUL in one would split the request.
        if (
            block.count(b"\n") != len(lines) - 1
            or block.count(b"\r") != len(lines) - 1
            or b"\0" in block
        ):
            raise ValueError("a request line or header contains CR, LF or NUL")
        return block + b"\r\n\r\n"

    # ------------------------------------------------------------------ the pool

    async def _acquire(self, fresh: bool = False) -> _Connection:
        if self._closed:
            raise ConnectFailed("the connection pool is closed")
        if not fresh:
            idle = self._idle
            if idle:
                now = self.loop.time()
                keepalive = self.keepalive_s
                while idle:
                    conn = idle.pop()
                    if not conn.closed and now - conn.idle_since < keepalive:
                        return conn
                    conn.close()
        try:
            async with asyncio.timeout(self.config.connect_timeout_s):
                return await self._connect_or_wait(fresh)
        except TimeoutError:
            raise UpstreamTimeout("no upstream connection within the connect timeout") from None

    async def _connect_or_wait(self, fresh: bool) -> _Connection:
        while len(self._open) >= self.config.max_connections:
            waiter: asyncio.Future[_Connection | None] = self.loop.create_future()
            self._waiters.append(waiter)
            try:
                conn = await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    handed = waiter.result()
                    if handed is not None:
                        self._release(handed)  # handed over just as we gave up: pass it on
                    else:
                        self._wake_waiter()
                raise
            if self._closed:
                if conn is not None:
                    conn.close()
                raise ConnectFailed("the connection pool is closed")
            if conn is not None and not conn.closed and not fresh:
                return conn
            if conn is not None:
                conn.close()
        conn = _Connection(self)
        self._open.add(conn)
        try:
            transport, _ = await self.loop.create_connection(
                lambda: conn,
                self.host,
                self.port,
                ssl=self.ssl,
                server_hostname=self.host if self.ssl is not None else None,
            )
        except BaseException as exc:
            conn.closed = True
            self._forget(conn)
            if isinstance(exc, OSError | ssl.SSLError):
                raise ConnectFailed(f"cannot connect to the upstream: {exc}") from None
            raise
        if conn.transport is None:
            conn.transport = transport
        return conn

    def _release(self, conn: _Connection) -> None:
        if conn.closed or self._closed:
            conn.close()
            return
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return
        now = self.loop.time()
        conn.idle_since = now
        idle = self._idle
        idle.append(conn)
        # The oldest idle connection is the first to expire: close it here, not by a timer.
        keepalive = self.keepalive_s
        while idle and now - idle[0].idle_since >= keepalive:
            idle.popleft().close()

    def _forget(self, conn: _Connection) -> None:
        if conn in self._open:
            self._open.discard(conn)
            if conn.idle_since and conn in self._idle:
                self._idle.remove(conn)
            self._wake_waiter()

    def _wake_waiter(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # a slot is free: connect
                return

    async def aclose(self) -> None:
        """Close every connection; requests after this fail with :class:`ConnectFailed`."""
        self._closed = True
        waiters, self._waiters = self._waiters, collections.deque()
        for waiter in waiters:
            if not waiter.done():
                waiter.set_exception(ConnectFailed("the connection pool is closed"))
        for conn in list(self._open):
            conn.close()
        self._idle.clear()
        await asyncio.sleep(0)  # let the transports run their close callbacks
