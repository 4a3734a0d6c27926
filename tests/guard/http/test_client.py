"""guard.http._client against scripted raw asyncio servers on 127.0.0.1: framing (length,
chunked, close-delimited, interim responses), keep-alive and the pool, the stale-connection
retry, timeouts, caps, header injection, flow control and the request line.

Each test runs its own server whose handler writes exactly the bytes the test needs; the server
counts accepted connections and records every request it reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from guard.errors import ConnectFailed, ResponseBroken, UpstreamTimeout
from guard.http._client import KEEPALIVE_S, ConnectionPool, PooledResponse, UpstreamConfig
from tests._support import free_port

# ------------------------------------------------------------------------------ the harness


@dataclass
class Request:
    """One request as the server read it."""

    conn: int  # 1-based accept order of the connection it came on
    head: bytes
    body: bytes

    @property
    def request_line(self) -> bytes:
        return self.head.split(b"\r\n", 1)[0]

    @property
    def headers(self) -> list[tuple[bytes, bytes]]:
        out = []
        for line in self.head.split(b"\r\n")[1:]:
            if line:
                name, _, value = line.partition(b":")
                out.append((name.strip().lower(), value.strip()))
        return out


@dataclass
class Peer:
    """The server's side of one accepted connection."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    index: int
    log: list[Request]

    async def read_request(self) -> Request:
        head = await self.reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        body = await self.reader.readexactly(length) if length else b""
        req = Request(self.index, head, body)
        self.log.append(req)
        return req

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def wait_closed_by_client(self) -> None:
        """Until the client closes (bounded: the harness cancels handlers at the end)."""
        while await self.reader.read(65536):
            pass


Handler = Callable[[Peer], Awaitable[None]]


@dataclass
class Server:
    handler: Handler
    accepts: int = 0
    open_now: int = 0
    max_open: int = 0
    requests: list[Request] = field(default_factory=list)
    port: int = 0
    _tasks: set[asyncio.Task[Any]] = field(default_factory=set)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepts += 1
        self.open_now += 1
        self.max_open = max(self.max_open, self.open_now)
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self.handler(Peer(reader, writer, self.accepts, self.requests))
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # the client went away, or the test is over
        finally:
            self.open_now -= 1
            self._tasks.discard(task)
            writer.close()


@contextlib.asynccontextmanager
async def scripted(handler: Handler) -> AsyncIterator[Server]:
    srv = Server(handler)
    server = await asyncio.start_server(srv.on_connect, "127.0.0.1", 0)
    srv.port = server.sockets[0].getsockname()[1]
    try:
        yield srv
    finally:
        server.close()
        tasks = list(srv._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await server.wait_closed()


@contextlib.asynccontextmanager
async def pool_for(url: str, **kwargs: Any) -> AsyncIterator[ConnectionPool]:
    kwargs.setdefault("connect_timeout_s", 2.0)
    kwargs.setdefault("read_timeout_s", 5.0)
    kwargs.setdefault("total_timeout_s", 10.0)
    keepalive_s = kwargs.pop("keepalive_s", KEEPALIVE_S)
    pool = ConnectionPool(UpstreamConfig(url=url, **kwargs), keepalive_s=keepalive_s)
    try:
        yield pool
    finally:
        await pool.aclose()


def ok(body: bytes = b"ok", extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n%s\r\n%s" % (len(body), extra, body)


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def keep_alive(peer: Peer) -> None:
    """Answer every request on the connection with 200 ``ok``."""
    while True:
        await peer.read_request()
        await peer.send(ok())


async def read_all(resp: PooledResponse) -> bytes:
    out = bytearray()
    while data := await resp.read_chunk():
        out += data
    return bytes(out)


async def get(pool: ConnectionPool, path: str = "/x") -> bytes:
    """One GET read whole and released."""
    resp = await pool.request("GET", path, [], None)
    try:
        assert resp.status == 200
        return await read_all(resp)
    finally:
        resp.release()


async def eventually(predicate: Callable[[], bool], timeout: float = 2.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.01)


# ------------------------------------------------------------------------------ 1. framing


async def test_content_length_body() -> None:
    async def handler(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(ok(b"hello world", extra=b"x-a: b\r\n"))
        await peer.wait_closed_by_client()

    async with scripted(handler) as srv, pool_for(srv.url) as pool:
        resp = await pool.request("GET", "/x", [], None)
        assert resp.status == 200
        assert resp.content_length == 11
        assert (b"x-a", b"b") in resp.raw_headers
        assert await read_all(resp) == b"hello world"
        assert resp.at_eof
        assert await resp.read_chunk() == b""  # stays at the end
        resp.release()
        assert pool.idle_connections == 1


async def test_chunked_body_sent_in_pieces_streams_intact() -> None:
    pieces = [b"first-", b"second-" * 50, b"x", b"fourth" * 1000, b"last"]
    first_seen = asyncio.Event()

    async def handler(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        await peer.send(chunk(pieces[0]))
        # The rest only once the client has the first piece: the body is streamed, not buffered.
        await asyncio.wait_for(first_seen.wait(), 5)
        for piece in pieces[1:]:
            await asyncio.sleep(0.02)
            await peer.send(chunk(piece))
        await peer.send(b"0\r\n\r\n")
        await peer.wait_closed_by_client()

    async with scripted(handler) as srv, pool_for(srv.url) as pool:
        resp = await pool.request("GET", "/x", [], None)
        assert resp.content_length is None
        first = await resp.read_chunk()
        assert first == pieces[0]
        assert not resp.at_eof
        first_seen.set()
        rest = await read_all(resp)
        assert first + rest == b"".join(pieces)
        assert resp.at_eof
        resp.release()
        assert pool.idle_connections == 1  # chunked framing ended cleanly: reusable


async def test_close_delimited_body_arrives_intact() -> None:
    body = b"".join(b"line %d\n" % i for i in range(2000))

    async def handler(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\n")
        for i in range(0, len(body), 3000):
            await peer.send(body[i : i + 3000])
            await asyncio.sleep(0.005)
        # returning closes the connection: the end of the body

    async with scripted(handler) as srv, pool_for(srv.url) as pool:
        resp = await pool.request("GET", "/x", [], None)
        assert resp.content_length is None
        assert await read_all(resp) == body
        assert resp.at_eof
        resp.release()
        assert pool.open_connections == 0  # the connection ended with the body
        assert await get(pool) == body  # the next exchange opens a new connection
        assert srv.accepts == 2


# ------------------------------------------------------------------------------ 2. keep-alive


async def test_keep_alive_reuses_one_connection() -> None:
    async with scripted(keep_alive) as srv, pool_for(srv.url) as pool:
        for _ in range(3):
            assert await get(pool) == b"ok"
        assert srv.accepts == 1
        assert [r.conn for r in srv.requests] == [1, 1, 1]
        assert pool.open_connections == 1
        assert pool.idle_connections == 1


async def test_connection_close_from_server_is_not_reused() -> None:
    async def handler(peer: Peer) -> None:
        while True:  # says close, but leaves the socket open: the client must close it
            await peer.read_request()
            await peer.send(ok(extra=b"connection: close\r\n"))

    async with scripted(handler) as srv, pool_for(srv.url) as pool:
        assert await get(pool) == b"ok"
        assert pool.open_connections == 0
        assert pool.idle_connections == 0
        assert await get(pool) == b"ok"
        assert srv.accepts == 2


async def test_idle_connection_past_keepalive_is_not_reused() -> None:
    async with scripted(keep_alive) as srv, pool_for(srv.url, keepalive_s=0.1) as pool:
        assert await get(pool) == b"ok"
        await asyncio.sleep(0.2)
        assert await get(pool) == b"ok"
        assert srv.accepts == 2
        assert pool.open_connections == 1


# ------------------------------------------------------------------------------ 3. pool limit


async def test_max_connections_one_second_request_waits_then_shares_the_connection() -> None:
    async with scripted(keep_alive) as srv, pool_for(srv.url, max_connections=1) as pool:
        results = await asyncio.gather(get(pool), get(pool))
        assert list(results) == [b"ok", b"ok"]
        assert srv.accepts == 1
        assert srv.max_open == 1
        assert [r.conn for r in srv.requests] == [1, 1]


async def test_max_connections_one_unreleased_means_pool_wait_times_out() -> None:
    async with (
        scripted(keep_alive) as srv,
        pool_for(srv.url, max_connections=1, connect_timeout_s=0.2) as pool,
    ):
        held = await pool.request("GET", "/x", [], None)
        with pytest.raises(UpstreamTimeout) as exc:
            await pool.request("GET", "/x", [], None)
        assert isinstance(exc.value, TimeoutError)
        assert srv.accepts == 1
        held.close()
        # The abandoned wait left the pool usable: the freed slot serves the next request.
        assert await get(pool) == b"ok"


# ------------------------------------------------------------------------------ 4. stale retry


async def test_stale_pooled_connection_is_retried_on_a_new_one() -> None:
    async def handler(peer: Peer) -> None:
        if peer.index == 1:
            await peer.read_request()
            await peer.send(ok(b"one"))
            await peer.read_request()
            return  # the keep-alive race: closes with the second request unanswered
        while True:
            await peer.read_request()
            await peer.send(ok(b"two"))

    async with scripted(handler) as srv, pool_for(srv.url) as pool:
        first = await pool.request("POST", "/x", [], b"body-1")
        assert await read_all(first) == b"one"
        first.release()
        assert pool.idle_connections == 1
        second = await pool.request("POST", "/x", [], b"body-2")
        assert await read_all(second) == b"two"
        second.release()
        assert srv.accepts == 2
        assert [(r.conn, r.body) for r in srv.requests] == [
            (1, b"body-1"),
            (1, b"body-2"),
            (2, b"body-2"),  # sent again, whole, on the new connection
        ]


async def test_idle_connection_closed_by_upstream_is_dropped_from_the_pool() -> None:
    async def handler(peer: Peer) -> None:
        if peer.index == 1:
            await peer.read_request()
            await peer.send(ok(b"one"))
            return  # closes the idle connection
        await keep_alive(peer)

    async with scripted(handler) as srv, pool_for(srv.url) as pool:
        assert await get(pool) == b"one"
        await eventually(lambda: pool.open_connections == 0)
        assert pool.idle_connections == 0
        assert await get(pool) == b"ok"
        assert srv.accepts == 2


async def test_fresh_connection_closed_without_answer_is_broken_not_retried() -> None:
    async def handler(peer: Peer) -> None:
        await peer.read_request()  # and close

    async with scripted(handler) as srv, pool_for(srv.url) as pool:
        with pytest.raises(ResponseBroken) as exc:
            await pool.request("POST", "/x", [], b"once")
        assert type(exc.value) is ResponseBroken
        await asyncio.sleep(0.05)
        assert srv.accepts == 1
        assert len(srv.requests) == 1
        assert pool.open_connections == 0


async def test_reused_connection_that_began_answering_is_not_retried() -> None:
    async def handler(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(ok(b"one"))
        await peer.read_request()
        await peer.send(b"HTTP/1.1 200 OK\r\ncontent-le")  # some of an answer, then gone

    async with scripted(handler) as srv, pool_for(srv.url) as pool:
        assert await get(pool) == b"one"
        with pytest.raises(ResponseBroken):
            await pool.request("POST", "/x", [], b"not twice")
        await asyncio.sleep(0.05)
        assert srv.accepts == 1  # the upstream had started on it: never sent again
        assert len(srv.requests) == 2


async def test_body_cut_short_is_broken() -> None:
    async def handler(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc")

    async with scripted(handler) as srv, pool_for(srv.url) as pool:
        resp = await pool.request("GET", "/x", [], None)
        with pytest.raises(ResponseBroken):
            await read_all(resp)
        assert not resp.at_eof
        resp.release()
        assert pool.open_connections == 0


# ------------------------------------------------------------------------------ 5. timeouts


async def test_read_timeout_after_headers_raises_from_read_chunk() -> None:
    async def handler(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc")
        await peer.wait_closed_by_client()  # then silence

    async with scripted(handler) as srv, pool_for(srv.url, read_timeout_s=0.2) as pool:
        resp = await pool.request("GET", "/x", [], None)
        assert await resp.read_chunk() == b"abc"
        with pytest.raises(UpstreamTimeout, match="read timeout"):
            await resp.read_chunk()
        resp.release()
        assert pool.open_connections == 0


async def test_read_timeout_without_headers_raises_from_request() -> None:
    async def handler(peer: Peer) -> None:
        await peer.read_request()
        await peer.wait_closed_by_client()

    async with scripted(handler) as srv, pool_for(srv.url, read_timeout_s=0.2) as pool:
        with pytest.raises(UpstreamTimeout, match="read timeout"):
            await pool.request("GET", "/x", [], None)
        assert pool.open_connections == 0
        assert srv.accepts == 1  # a timeout is not a stale connection: not sent again


async def test_total_timeout_with_a_trickling_upstream() -> None:
    async def handler(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        for _ in range(60):  # a byte every 50 ms for up to 3 s: always within the read timeout
            await peer.send(chunk(b"x"))
            await asyncio.sleep(0.05)
        await peer.wait_closed_by_client()

    async with scripted(handler) as srv, pool_for(srv.url, read_timeout_s=0.3) as pool:
        resp = await pool.request("GET", "/x", [], None, total_timeout_s=0.5)
        got = bytearray()
        with pytest.raises(UpstreamTimeout, match="total timeout"):
            while data := await resp.read_chunk():
                got += data
        assert len(got) >= 2  # bytes kept coming: it was the total, not the gap
        resp.release()
        assert pool.open_connections == 0


# ------------------------------------------------------------------------------ 6. caps, malformed


def _many_headers(n: int) -> bytes:
    return b"HTTP/1.1 200 OK\r\n" + b"".join(b"x-h%d: v\r\n" % i for i in range(n))


@pytest.mark.parametrize(
    "response",
    [
        pytest.param(_many_headers(300) + b"content-length: 0\r\n\r\n", id="300-headers"),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nx-big: " + b"a" * 70_000 + b"\r\ncontent-length: 0\r\n\r\n",
            id="70KB-header",
        ),
        pytest.param(
            b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nx-big: " + b"a" * 70_000 + b"\r\n\r\n",
            id="70KB-last-header",
        ),
        pytest.param(b"HTTP/1.1 abc OK\r\ncontent-length: 0\r\n\r\n", id="status-not-a-number"),
        pytest.param(b"hello world\r\n\r\n", id="not-http"),
        pytest.param(b"HTTP/1.1 200 OK\r\ncontent-length: x\r\n\r\n", id="bad-content-length"),
        pytest.param(
            b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\ncontent-length: 4\r\n\r\nabcd",
            id="two-content-lengths",
        ),
        pytest.param(
            b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n"
            b"3\r\nabc\r\n0\r\n\r\n",
            id="length-and-chunked",
        ),
        pytest.param(
            b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: upgrade\r\n\r\n",
            id="upgrade",
        ),
    ],
)
async def test_bad_or_oversized_response_head_is_broken(response: bytes) -> None:
    async def handler(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(response)
        await peer.wait_closed_by_client()

    async with scripted(handler) as srv, pool_for(srv.url, read_timeout_s=2.0) as pool:
        with pytest.raises(ResponseBroken):
            await pool.request("GET", "/x", [], None)
        assert pool.open_connections == 0


async def test_headers_just_under_the_caps_are_accepted() -> None:
    big = b"b" * 60_000

    async def handler(peer: Peer) -> None:
        while True:
            await peer.read_request()
            if peer.log[-1].request_line.startswith(b"GET /many"):
                await peer.send(_many_headers(250) + b"content-length: 2\r\n\r\nok")
            else:
                await peer.send(ok(extra=b"x-big: " + big + b"\r\n"))

    async with scripted(handler) as srv, pool_for(srv.url) as pool:
        resp = await pool.request("GET", "/many", [], None)
        assert len(resp.raw_headers) == 251
        assert await read_all(resp) == b"ok"
        resp.release()
        resp = await pool.request("GET", "/big", [], None)
        assert (b"x-big", big) in resp.raw_headers
        assert await read_all(resp) == b"ok"
        resp.release()
        assert srv.accepts == 1


# ------------------------------------------------------------------------------ 7. injection


@pytest.mark.parametrize(
    "header",
    [
        (b"x-a", b"one\rtwo"),
        (b"x-a", b"one\ntwo"),
        (b"x-a", b"one\r\nx-injected: 1"),
        (b"x-a", b"one\0two"),
        (b"x-a\r\nx-injected", b"1"),
        (b"x-a\0", b"1"),
    ],
    ids=["CR", "LF", "CRLF", "NUL", "CRLF-in-name", "NUL-in-name"],
)
async def test_control_characters_in_a_header_are_refused_before_sending(
    header: tuple[bytes, bytes],
) -> None:
    async with scripted(keep_alive) as srv, pool_for(srv.url) as pool:
        with pytest.raises(ValueError, match="CR, LF or NUL"):
            await pool.request("POST", "/x", [(b"x-ok", b"1"), header], b"body")
        await asyncio.sleep(0.05)
        assert srv.accepts == 0  # not even a connection
        assert srv.requests == []
        assert pool.open_connections == 0
        # The next valid request is all the upstream ever sees.
        resp = await pool.request("POST", "/x", [(b"x-ok", b"1")], b"body")
        assert await read_all(resp) == b"ok"
        resp.release()
        assert len(srv.requests) == 1
        assert b"injected" not in srv.requests[0].head
        assert b"two" not in srv.requests[0].head


@pytest.mark.parametrize("path", ["/x\r\nx-injected: 1", "/x\n", "/x\0"])
async def test_control_characters_in_the_path_are_refused(path: str) -> None:
    async with scripted(keep_alive) as srv, pool_for(srv.url) as pool:
        with pytest.raises(ValueError):
            await pool.request("GET", path, [], None)
        assert srv.accepts == 0


# ------------------------------------------------------------------------------ 8. connect


async def test_refused_connection_is_connect_failed() -> None:
    async with pool_for(f"http://127.0.0.1:{free_port()}") as pool:
        with pytest.raises(ConnectFailed):
            await pool.request("GET", "/x", [], None)
        assert pool.open_connections == 0
        with pytest.raises(ConnectFailed):  # and the slot was given back
            await pool.request("GET", "/x", [], None)


def test_pool_rejects_a_non_http_url() -> None:
    with pytest.raises(ValueError):
        ConnectionPool(UpstreamConfig(url="ftp://127.0.0.1/"))


# ------------------------------------------------------------------------------ 9. flow control


async def test_slow_consumer_gets_a_4mb_chunked_body_exactly_with_bounded_buffering() -> None:
    data = random.Random(7).randbytes(4 << 20)
    step = 64 << 10

    async def handler(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        for i in range(0, len(data), step):
            await peer.send(chunk(data[i : i + step]))
        await peer.send(b"0\r\n\r\n")
        await peer.wait_closed_by_client()

    # A read timeout shorter than the first stall: pausing must not count as upstream silence.
    async with scripted(handler) as srv, pool_for(srv.url, read_timeout_s=0.15) as pool:
        resp = await pool.request("GET", "/x", [], None)
        conn = resp._conn
        got = bytearray()
        peak = 0
        paused_seen = False
        stall = 0.3  # the first stall: the upstream has sent far more than the high-water mark
        reads = 0
        while True:
            await asyncio.sleep(stall)
            stall = 0.005
            peak = max(peak, conn._buffered)
            paused_seen = paused_seen or conn._paused
            data_in = await resp.read_chunk()
            if not data_in:
                break
            got += data_in
            reads += 1
        assert bytes(got) == data
        assert resp.at_eof
        assert paused_seen  # the client stopped reading the socket while the consumer slept
        assert peak < 1 << 20  # 256 KB high water plus one socket read, not the whole 4 MB
        assert reads > 4
        resp.release()
        assert pool.idle_connections == 1


# ------------------------------------------------------------------------------ 10. interim


@pytest.mark.parametrize("split", [False, True], ids=["one-write", "two-writes"])
async def test_interim_100_continue_is_skipped(split: bool) -> None:
    interim = b"HTTP/1.1 100 Continue\r\nx-interim: 1\r\n\r\n"
    final = ok(b"done", extra=b"x-final: 1\r\n")

    async def handler(peer: Peer) -> None:
        await peer.read_request()
        if split:
            await peer.send(interim)
            await asyncio.sleep(0.05)
            await peer.send(final)
        else:
            await peer.send(interim + final)
        await keep_alive(peer)

    async with scripted(handler) as srv, pool_for(srv.url) as pool:
        resp = await pool.request("POST", "/x", [], b"body")
        assert resp.status == 200
        assert resp.raw_headers == [(b"content-length", b"4"), (b"x-final", b"1")]
        assert resp.content_length == 4
        assert await read_all(resp) == b"done"
        resp.release()
        assert await get(pool) == b"ok"  # and the connection is still in step
        assert srv.accepts == 1


async def test_103_early_hints_then_chunked_response() -> None:
    async def handler(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(
            b"HTTP/1.1 103 Early Hints\r\nlink: </a>; rel=preload\r\n\r\n"
            b"HTTP/1.1 201 Created\r\ntransfer-encoding: chunked\r\n\r\n"
            + chunk(b"abc")
            + b"0\r\n\r\n"
        )
        await peer.wait_closed_by_client()

    async with scripted(handler) as srv, pool_for(srv.url) as pool:
        resp = await pool.request("GET", "/x", [], None)
        assert resp.status == 201
        assert resp.content_length is None
        assert resp.raw_headers == [(b"transfer-encoding", b"chunked")]
        assert await read_all(resp) == b"abc"
        resp.release()


@pytest.mark.parametrize("status", [204, 304])
async def test_bodyless_statuses_end_at_the_head(status: int) -> None:
    async def handler(peer: Peer) -> None:
        while True:
            await peer.read_request()
            await peer.send(b"HTTP/1.1 %d X\r\ncontent-length: 5\r\n\r\n" % status)

    async with scripted(handler) as srv, pool_for(srv.url, read_timeout_s=1.0) as pool:
        for _ in range(2):
            resp = await pool.request("GET", "/x", [], None)
            assert resp.status == status
            assert await read_all(resp) == b""
            resp.release()
        assert srv.accepts == 1


# ------------------------------------------------------------------------------ 11. release, aclose


async def test_release_before_the_body_was_read_closes_the_connection() -> None:
    async def handler(peer: Peer) -> None:
        if peer.index == 1:
            await peer.read_request()
            await peer.send(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n01234")
            await peer.wait_closed_by_client()
            return
        await keep_alive(peer)

    async with scripted(handler) as srv, pool_for(srv.url) as pool:
        resp = await pool.request("GET", "/x", [], None)
        assert not resp.at_eof
        resp.release()
        assert pool.open_connections == 0
        assert pool.idle_connections == 0
        assert await get(pool) == b"ok"
        assert srv.accepts == 2


async def test_aclose_closes_everything_and_later_requests_fail() -> None:
    async def handler(peer: Peer) -> None:
        while True:
            req = await peer.read_request()
            if req.request_line.startswith(b"GET /hold"):
                await peer.send(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n01234")
                await peer.wait_closed_by_client()
                return
            await peer.send(ok())

    async with scripted(handler) as srv, pool_for(srv.url) as pool:
        held = await pool.request("GET", "/hold", [], None)
        assert await get(pool) == b"ok"
        assert pool.open_connections == 2
        assert pool.idle_connections == 1
        await pool.aclose()
        assert pool.open_connections == 0
        assert pool.idle_connections == 0
        with pytest.raises(ResponseBroken):
            await read_all(held)
        with pytest.raises(ConnectFailed):
            await pool.request("GET", "/x", [], None)
        await eventually(lambda: srv.open_now == 0)  # the upstream saw both closed


async def test_aclose_fails_requests_waiting_for_a_slot() -> None:
    async with (
        scripted(keep_alive) as srv,
        pool_for(srv.url, max_connections=1) as pool,
    ):
        held = await pool.request("GET", "/x", [], None)
        waiting = asyncio.create_task(pool.request("GET", "/x", [], None))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        await pool.aclose()
        with pytest.raises(ConnectFailed):
            await waiting
        held.release()
        assert srv.accepts == 1


# ------------------------------------------------------------------------------ 12. request line


@pytest.mark.parametrize(
    ("base", "expected"),
    [
        ("/base", b"GET /base/v1/models?a=1 HTTP/1.1"),
        ("/base/", b"GET /base/v1/models?a=1 HTTP/1.1"),
        ("", b"GET /v1/models?a=1 HTTP/1.1"),
    ],
)
async def test_request_line_and_host_header(base: str, expected: bytes) -> None:
    async with scripted(keep_alive) as srv, pool_for(srv.url + base) as pool:
        resp = await pool.request("GET", "/v1/models?a=1", [(b"x-trace", b"t1")], None)
        assert await read_all(resp) == b"ok"
        resp.release()
        (req,) = srv.requests
        assert req.request_line == expected
        host = [v for n, v in req.headers if n == b"host"]
        assert host == [b"127.0.0.1:%d" % srv.port]
        assert (b"x-trace", b"t1") in req.headers
        assert not [n for n, _ in req.headers if n in (b"content-length", b"transfer-encoding")]


@pytest.mark.parametrize(
    "body",
    [b'{"a":1}', b"", random.Random(3).randbytes(300_000)],
    ids=["small", "empty", "300KB"],
)
async def test_post_body_is_sent_with_its_content_length(body: bytes) -> None:
    async with scripted(keep_alive) as srv, pool_for(srv.url + "/base") as pool:
        resp = await pool.request("POST", "/v1/chat/completions", [], body)
        assert await read_all(resp) == b"ok"
        resp.release()
        (req,) = srv.requests
        assert req.request_line == b"POST /base/v1/chat/completions HTTP/1.1"
        assert [v for n, v in req.headers if n == b"content-length"] == [b"%d" % len(body)]
        assert req.body == body


# ------------------------------------------------------------------------------ bugs found


async def test_bytes_after_a_complete_response_do_not_leak_into_it() -> None:
    async def handler(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(ok(b"hello") + b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\nEVIL")
        await peer.wait_closed_by_client()

    async with scripted(handler) as srv, pool_for(srv.url) as pool:
        resp = await pool.request("GET", "/x", [], None)
        await asyncio.sleep(0.05)  # everything the upstream sent is in
        assert await read_all(resp) == b"hello"
        assert resp.raw_headers == [(b"content-length", b"5")]


async def test_unsolicited_bytes_on_an_idle_connection_retire_it() -> None:
    async def handler(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(ok(b"one"))
        await asyncio.sleep(0.02)
        await peer.send(b"HTTP/1.1 200 OK\r\ncontent-length: 20\r\n\r\nsmug")  # nobody asked
        while True:
            await peer.read_request()
            await peer.send(ok(b"world"))

    async with scripted(handler) as srv, pool_for(srv.url, read_timeout_s=1.0) as pool:
        assert await get(pool) == b"one"
        await asyncio.sleep(0.1)
        # Not the smuggled answer: a new connection (whose script starts over) answers.
        assert await get(pool) == b"one"
        assert srv.accepts == 2


async def test_endless_header_line_fails_at_the_cap() -> None:
    async def handler(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(b"HTTP/1.1 200 OK\r\nx-big: " + b"a" * (1 << 20))  # no end of line
        await peer.wait_closed_by_client()

    async with scripted(handler) as srv, pool_for(srv.url, read_timeout_s=0.4) as pool:
        with pytest.raises(ResponseBroken):
            await pool.request("GET", "/x", [], None)


async def test_reset_during_a_close_delimited_body_is_broken() -> None:
    async def handler(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(b"HTTP/1.1 200 OK\r\n\r\nabc")
        await asyncio.sleep(0.1)
        sock = peer.writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        peer.writer.transport.abort()  # RST, not FIN

    async with scripted(handler) as srv, pool_for(srv.url) as pool:
        resp = await pool.request("GET", "/x", [], None)
        with pytest.raises(ResponseBroken):
            await read_all(resp)
