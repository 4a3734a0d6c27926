"""Connection limits: how long a connection may take to send a request head or sit idle, and how
many connections one peer address, and the whole process, may hold open.

The server protocol (:class:`guard.http._protocol.GuardHttpToolsProtocol`) enforces them with a
:class:`ConnectionTable` per server:

- a connection is *waiting* while it is between requests: opened and not yet sent a whole head,
  idle after a response (keep-alive), or still sending the rest of a body its response did not
  need. It is *busy* from the end of a request head until its response is sent;
- a waiting connection that has not sent a whole head ``head_timeout_s`` after it opened (or
  after the first byte of a later request) is closed: with 408 ``head_timeout`` when some of a
  head came (a slowloris head, trickled byte by byte, gets no longer), silently when nothing did;
  one idle after a response for ``keep_alive_timeout_s`` is closed silently;
- a new connection over a cap (``max_connections_per_peer`` for its peer address,
  ``max_connections`` for the process) first closes the oldest *waiting* connection of the same
  peer (or, for the process cap, of any peer), so idle sockets cannot lock anyone out: a flood
  of them from one address costs that address its own oldest ones. Only when every connection
  in the way is busy is the new one refused at once, before its request is read: 429
  ``too_many_connections`` (its peer's cap) or 503 ``server_connection_limit`` (the process's),
  ``connection: close``. Other peers, ``/healthz`` included, are served meanwhile.

The process cap is at most the descriptors the process may open, less ``reserve_fds`` for the
upstream pool, Redis and files (:func:`effective_max_connections`; :func:`raise_nofile_limit`
lifts the soft ``RLIMIT_NOFILE`` to the hard one at start), so the guard refuses before
``accept`` fails for want of descriptors.
"""

from __future__ import annotations

import contextlib
import resource
from collections import OrderedDict
from typing import Literal, Protocol

import pydantic.dataclasses
from pydantic import Field

from guard._limits import LIMITS_CONFIG, PosFloat, PosInt

__all__ = [
    "ConnectionLimits",
    "ConnectionTable",
    "effective_max_connections",
    "raise_nofile_limit",
]


@pydantic.dataclasses.dataclass(frozen=True, config=LIMITS_CONFIG)
class ConnectionLimits:
    """Limits on client connections: the policy's ``limits.connections`` section (per process:
    with ``--workers N`` each worker has its own)."""

    head_timeout_s: PosFloat = Field(
        default=10.0,
        description="Seconds a connection has to send a whole request head (request line and "
        "headers), counted from its opening, or from the first byte of a later request on it. "
        "Then it is closed: 408 `head_timeout` if part of a head came (a slowloris head "
        "trickled byte by byte gets no more time), silently if nothing did (Go servers' "
        "`ReadHeaderTimeout`; nginx's `client_header_timeout` is 60 s). The body has its own "
        "`limits.body.body_read_timeout_s`.",
    )
    send_timeout_s: PosFloat = Field(
        default=15.0,
        description="Seconds a response may wait for the client to take more of it (its socket "
        "buffers full: it stopped reading, or left without closing) before the guard cuts the "
        "connection and ends the upstream request, so that the upstream stops generating for "
        "nobody and its slot goes to the next request (the access line says 499 "
        "`client_too_slow`). Megabytes sit in the socket buffers first, so a client that reads "
        "at all never comes near it.",
    )
    read_ahead_bytes: PosInt = Field(
        default=1 << 20,
        description="Bytes of a streamed answer read from the upstream ahead of a client that "
        "reads it slower (or not at all), per answer: the upstream finishes its work, and its "
        "concurrency slot goes to the next request, without waiting on the client. Past it the "
        "upstream waits for the client.",
    )
    read_ahead_total_bytes: PosInt = Field(
        default=64 << 20,
        description="Bytes read ahead for all answers of the process together, at most (a "
        "flood of unread answers costs no more than this).",
    )
    keep_alive_timeout_s: PosFloat = Field(
        default=75.0,
        description="Seconds a connection may stay idle after a response before it is closed. "
        "Longer than clients keep an idle connection for reuse (httpx and the openai SDK: 5 s, "
        "aiohttp: 15 s): at uvicorn's 5 s a client could send on a connection the guard was "
        "closing at that moment and get no answer. Idle connections are the first closed "
        "past `max_connections` and `max_connections_per_peer`.",
    )
    max_connections: PosInt = Field(
        default=8192,
        description="Open client connections of this process, at most (lowered to the "
        "descriptors the process may open less `reserve_fds`; the soft `RLIMIT_NOFILE` is "
        "raised to the hard one at start). A new connection past it closes the oldest one "
        "that is between requests (idle, or still sending its head), else gets 503 "
        "`server_connection_limit` at once.",
    )
    max_connections_per_peer: PosInt = Field(
        default=512,
        description="Open connections from one peer address, at most: the requests one "
        "client can have in flight and queued (`rate.global_concurrency` plus "
        "`rate.queue_size`). A new connection past it closes that peer's oldest connection "
        "that is between requests, else gets 429 `too_many_connections` at once, so idle "
        "sockets from one address (20,000 of them took every descriptor before) cost only "
        "that address. Behind a proxy every client is the proxy's address: raise it there.",
    )
    reserve_fds: PosInt = Field(
        default=512,
        description="Descriptors kept out of `max_connections` for everything else the process "
        "opens: the upstream pool (`upstream.max_connections`), Redis, tokenizer files.",
    )


def nofile_limits() -> tuple[int, int]:
    """This process's ``RLIMIT_NOFILE`` (soft, hard)."""
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def raise_nofile_limit() -> tuple[int, int]:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard one (a no-op when it is already there, or
    when the system refuses); return the limits in force."""
    soft, hard = nofile_limits()
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return nofile_limits()


def effective_max_connections(limits: ConnectionLimits, soft_nofile: int | None = None) -> int:
    """``max_connections``, lowered to the descriptors left after ``reserve_fds`` (at least 1)."""
    if soft_nofile is None:
        soft_nofile = nofile_limits()[0]
    if soft_nofile == resource.RLIM_INFINITY or soft_nofile < 0:
        return limits.max_connections
    return max(1, min(limits.max_connections, soft_nofile - limits.reserve_fds))


class Connection(Protocol):
    """What the table needs of a connection: a peer key and a way to close it."""

    peer: str

    def evict(self) -> None: ...


class ConnectionTable:
    """The open connections of one server, counted per peer, with the waiting ones (between
    requests) in the order they started waiting, oldest first."""

    __slots__ = ("_per_peer", "_waiting", "_waiting_by_peer", "evicted", "refused", "total")

    def __init__(self) -> None:
        self.total = 0
        self._per_peer: dict[str, int] = {}
        self._waiting: OrderedDict[Connection, None] = OrderedDict()
        self._waiting_by_peer: dict[str, OrderedDict[Connection, None]] = {}
        self.refused: dict[str, int] = {}  # by code
        self.evicted = 0

    def count(self, peer: str) -> int:
        return self._per_peer.get(peer, 0)

    def add(self, conn: Connection) -> None:
        self.total += 1
        self._per_peer[conn.peer] = self._per_peer.get(conn.peer, 0) + 1

    def remove(self, conn: Connection) -> None:
        self.busy(conn)
        self.total -= 1
        left = self._per_peer[conn.peer] - 1
        if left:
            self._per_peer[conn.peer] = left
        else:
            del self._per_peer[conn.peer]

    def waiting(self, conn: Connection) -> None:
        """``conn`` is between requests (newest waiting)."""
        self._waiting[conn] = None
        self._waiting_by_peer.setdefault(conn.peer, OrderedDict())[conn] = None

    def busy(self, conn: Connection) -> None:
        """``conn`` is in a request (not evictable)."""
        if self._waiting.pop(conn, 1) is None:
            mine = self._waiting_by_peer[conn.peer]
            del mine[conn]
            if not mine:
                del self._waiting_by_peer[conn.peer]

    def evict_oldest(self, peer: str | None = None) -> bool:
        """Close the oldest waiting connection (of ``peer``, or of any); False when none."""
        pool = self._waiting if peer is None else self._waiting_by_peer.get(peer)
        if not pool:
            return False
        victim = next(iter(pool))
        self.remove(victim)
        self.evicted += 1
        victim.evict()
        return True

    def admit(self, peer: str, per_peer: int, total: int) -> Literal["peer", "server"] | None:
        """Make room for a new connection from ``peer``: None when it may open (an old waiting
        connection closed if needed), else the cap that refuses it."""
        if self.count(peer) >= per_peer and not self.evict_oldest(peer):
            return "peer"
        if self.total >= total and not self.evict_oldest():
            return "server"
        return None
