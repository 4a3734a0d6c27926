"""Connection limits over real sockets (issue 14, item 1): head and keep-alive timeouts, slow
bodies, and the open-connection caps per peer address and per process.

The guard runs in uvicorn on the test's loop with the protocol ``schedguard serve`` uses
(:func:`guard.http.protocol_with` the test's limits); clients are plain sockets bound to
127.0.0.1 or 127.0.0.2 (both loopback on Linux), so the guard sees two peers. Timeouts are
short so the tests are quick; assertions are on what the guard decided (status, code, which
connections it closed, its connection table), wall clocks only as generous outer bounds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
import uvicorn

from guard.app import create_app
from guard.http import ConnectionLimits, protocol_with
from guard.http._connections import ConnectionTable, effective_max_connections
from guard.http._protocol import connection_table
from guard.policy import policy_from_yaml
from tests._guard_harness import bound_socket, fake_upstream

# An outer bound for anything the guard should do "at once" or after a short timeout.
PATIENCE_S = 20.0
OTHER_PEER = "127.0.0.2"


@dataclass
class Running:
    host: str
    port: int
    server: uvicorn.Server

    @property
    def table(self) -> ConnectionTable:
        return connection_table(self.server.server_state)


@contextlib.asynccontextmanager
async def guard_server(policy_yaml: str = "", **limits: Any) -> AsyncIterator[Running]:
    """The guard (in front of a fake upstream) with ``limits.connections`` set to ``limits``."""
    connections = ConnectionLimits(**{"reserve_fds": 16, **limits})
    async with fake_upstream() as fake:
        app = create_app(policy_from_yaml(policy_yaml), upstream_url=fake.url)
        sock = bound_socket()
        config = uvicorn.Config(
            app,
            loop="none",
            lifespan="on",
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=1,
            http=protocol_with(connections),
        )
        server = uvicorn.Server(config)
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started:
            if task.done():
                task.result()
            await asyncio.sleep(0.005)  # polling the server's startup
        try:
            yield Running("127.0.0.1", sock.getsockname()[1], server)
        finally:
            server.should_exit = True
            await task
            sock.close()


class Client:
    """One raw client connection from a chosen source address."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, g: Running, source: str = "127.0.0.1") -> Client:
        reader, writer = await asyncio.open_connection(g.host, g.port, local_addr=(source, 0))
        return cls(reader, writer)

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def response(self) -> tuple[int, dict[str, str], bytes]:
        """One response: status, headers, body (by Content-Length)."""
        async with asyncio.timeout(PATIENCE_S):
            head = await self.reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            status = int(lines[0].split()[1])
            headers = {}
            for line in lines[1:]:
                if line:
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
            body = await self.reader.readexactly(int(headers.get("content-length", "0")))
        return status, headers, body

    async def closed_by_server(self) -> bytes:
        """Wait for the server to close; return whatever it sent first."""
        got = b""
        async with asyncio.timeout(PATIENCE_S):
            with contextlib.suppress(ConnectionResetError):
                while chunk := await self.reader.read(65536):
                    got += chunk
        return got

    def close(self) -> None:
        self.writer.transport.abort()


def code_of(body: bytes) -> str:
    err = json.loads(body)["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return str(err["code"])


async def healthz(g: Running, source: str = "127.0.0.1") -> int:
    client = await Client.open(g, source)
    try:
        await client.send(b"GET /healthz HTTP/1.1\r\nhost: guard\r\n\r\n")
        status, _, _ = await client.response()
        return status
    finally:
        client.close()


async def settle(predicate: Any) -> None:
    """Let the loop run until ``predicate()`` holds (closes take an iteration or two)."""
    async with asyncio.timeout(PATIENCE_S):
        while not predicate():
            await asyncio.sleep(0.01)


# -- caps ---------------------------------------------------------------------------------------


async def test_idle_sockets_past_the_per_peer_cap_cost_their_peer_its_oldest() -> None:
    cap = 40
    async with guard_server(max_connections_per_peer=cap, head_timeout_s=60) as g:
        idle = [await Client.open(g) for _ in range(300)]
        try:
            await settle(lambda: g.table.total == cap)
            assert g.table.count("127.0.0.1") == cap
            assert g.table.evicted == 300 - cap
            # The oldest were closed (silently: they had sent nothing); the newest stay open.
            for client in idle[: 300 - cap]:
                assert await client.closed_by_server() == b""
            # Another peer is served at once, and so is a new request from the flooding peer
            # (it closes one more of that peer's idle sockets).
            assert await healthz(g, OTHER_PEER) == 200
            assert await healthz(g) == 200
            assert g.table.count("127.0.0.1") <= cap
        finally:
            for client in idle:
                client.close()


async def test_a_peer_whose_connections_are_all_in_requests_is_refused_429() -> None:
    cap = 5
    async with guard_server(max_connections_per_peer=cap, head_timeout_s=60) as g:
        # Requests with a body still to come: busy, not evictable.
        busy = [await Client.open(g) for _ in range(cap)]
        head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: g\r\ncontent-length: 100\r\n\r\n{"
        for client in busy:
            await client.send(head)
        await settle(lambda: g.table.count("127.0.0.1") == cap)
        try:
            extra = await Client.open(g)
            status, headers, body = await extra.response()
            assert status == 429
            assert code_of(body) == "too_many_connections"
            assert headers["connection"] == "close" and headers["retry-after"] == "1"
            assert await extra.closed_by_server() == b""
            assert g.table.count("127.0.0.1") == cap
            assert await healthz(g, OTHER_PEER) == 200
        finally:
            for client in busy:
                client.close()


async def test_the_process_cap_closes_idle_connections_of_any_peer_then_refuses_503() -> None:
    async with guard_server(max_connections=20, head_timeout_s=60) as g:
        idle = [await Client.open(g) for _ in range(20)]
        try:
            await settle(lambda: g.table.total == 20)
            # Full of idle sockets from 127.0.0.1: another peer still gets in.
            assert await healthz(g, OTHER_PEER) == 200
            assert await idle[0].closed_by_server() == b""
            # Full of requests in progress: refused at once, 503.
            head = b"POST /v1/completions HTTP/1.1\r\nhost: g\r\ncontent-length: 10\r\n\r\n{"
            for client in idle[1:]:
                await client.send(head)
            busy = [await Client.open(g, OTHER_PEER) for _ in range(2)]
            for client in busy:
                await client.send(head)
            await settle(lambda: g.table.total == 20)
            extra = await Client.open(g, OTHER_PEER)
            status, _, body = await extra.response()
            assert status == 503 and code_of(body) == "server_connection_limit"
        finally:
            for client in idle:
                client.close()


def test_the_process_cap_leaves_room_for_other_descriptors() -> None:
    limits = ConnectionLimits(max_connections=100_000, reserve_fds=512)
    assert effective_max_connections(limits, soft_nofile=4096) == 4096 - 512
    assert effective_max_connections(limits, soft_nofile=1 << 20) == 100_000


# -- timeouts -----------------------------------------------------------------------------------


async def test_a_connection_that_sends_nothing_is_closed_after_the_head_timeout() -> None:
    async with guard_server(head_timeout_s=0.3) as g:
        client = await Client.open(g)
        assert await client.closed_by_server() == b""
        await settle(lambda: g.table.total == 0)


async def test_a_slowloris_head_trickled_byte_by_byte_gets_408_head_timeout() -> None:
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: guard\r\nx-pad: " + b"a" * 200 + b"\r\n\r\n"
    )
    async with guard_server(head_timeout_s=0.5) as g:
        client = await Client.open(g)
        answered = asyncio.create_task(client.closed_by_server())
        sent = 0
        with contextlib.suppress(ConnectionError):
            for byte in head:
                if answered.done():
                    break
                await client.send(bytes([byte]))
                sent += 1
                await asyncio.sleep(0.02)  # each byte well within any per-read timeout
        # The guard answered before the head was complete: every byte did not buy more time.
        assert sent < len(head)
        data = await answered
        status_line, _, rest = data.partition(b"\r\n")
        assert status_line.startswith(b"HTTP/1.1 408")
        assert code_of(rest.partition(b"\r\n\r\n")[2]) == "head_timeout"


async def test_an_idle_keep_alive_connection_is_closed() -> None:
    async with guard_server(keep_alive_timeout_s=0.3, head_timeout_s=60) as g:
        client = await Client.open(g)
        await client.send(b"GET /healthz HTTP/1.1\r\nhost: guard\r\n\r\n")
        status, headers, _ = await client.response()
        assert status == 200 and headers.get("connection") != "close"
        assert await client.closed_by_server() == b""
        await settle(lambda: g.table.total == 0)


async def test_a_keep_alive_connection_serves_several_requests() -> None:
    async with guard_server(keep_alive_timeout_s=5) as g:
        client = await Client.open(g)
        for _ in range(3):
            await client.send(b"GET /healthz HTTP/1.1\r\nhost: guard\r\n\r\n")
            status, _, _ = await client.response()
            assert status == 200
        client.close()


async def test_a_slow_body_is_cut_with_408_body_timeout() -> None:
    policy = "limits: {body: {body_read_timeout_s: 0.5}}"
    async with guard_server(policy, head_timeout_s=60) as g:
        client = await Client.open(g)
        await client.send(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: guard\r\n"
            b"content-type: application/json\r\ncontent-length: 500\r\n\r\n{"
        )
        answered = asyncio.create_task(client.response())
        with contextlib.suppress(ConnectionError):
            for _ in range(400):  # 400 x 20 ms: far past the body timeout
                if answered.done():
                    break
                await client.send(b" ")
                await asyncio.sleep(0.02)
        status, headers, body = await answered
        assert status == 408 and code_of(body) == "body_timeout"
        assert headers["connection"] == "close"
        client.close()


async def test_a_body_the_answer_did_not_need_gets_only_the_head_timeout_to_end() -> None:
    async with guard_server(head_timeout_s=0.5, keep_alive_timeout_s=60) as g:
        client = await Client.open(g)
        await client.send(b"GET /healthz HTTP/1.1\r\nhost: guard\r\ncontent-length: 100000\r\n\r\n")
        status, _, _ = await client.response()
        assert status == 200
        # The rest of that body, trickled: the connection is closed, not kept by each byte.
        with contextlib.suppress(ConnectionError):
            for _ in range(1000):
                if client.reader.at_eof():
                    break
                await client.send(b"x")
                await asyncio.sleep(0.02)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0.001):
                        if await client.reader.read(1) == b"":
                            break
        assert client.reader.at_eof() or await client.closed_by_server() == b""
        await settle(lambda: g.table.total == 0)


@pytest.mark.parametrize("source", ["127.0.0.1", OTHER_PEER])
async def test_healthz_answers_from_either_peer(source: str) -> None:
    async with guard_server() as g:
        assert await healthz(g, source) == 200


def test_loopback_has_a_second_address() -> None:
    with socket.socket() as sock:
        sock.bind((OTHER_PEER, 0))
