"""HTTP to a live server: loopback check, a global request-rate bound, a keep-alive client.

Everything a live campaign sends (fuzzed requests, dry runs, health checks, minimisation
tests) goes through one :class:`RequestPacer`, so ``--max-rps`` bounds the campaign's own load
on the server whatever it is doing. :class:`HttpClient` keeps one connection per thread and
reports every exchange as a :class:`Reply`: an HTTP status and body, or why there is none
(``refused``: nothing listens; ``dropped``: the connection closed or reset before an answer;
``timeout``: no answer within the read timeout, a hang).
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import socket
import threading
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fuzz._exceptions import RemoteTargetRefused

__all__ = ["HttpClient", "Reply", "RequestPacer", "discover_model", "require_loopback", "split_url"]

_LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})
_READ_CHUNK = 1 << 16


def split_url(url: str) -> tuple[str, str, int, str]:
    """``(scheme, host, port, base path)`` of an ``http://`` or ``https://`` URL."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {url!r}")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return parts.scheme, parts.hostname, port, parts.path.rstrip("/")


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    if host.lower() not in _LOOPBACK_NAMES:
        return False
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(i[4][0]).is_loopback for i in infos)


def require_loopback(url: str, *, allow_remote: bool) -> None:
    """Raise :class:`RemoteTargetRefused` unless ``url``'s host is a loopback address (or a
    name for one), or ``allow_remote``. Names other than ``localhost`` are not resolved: a
    name that resolves to 127.0.0.1 today may not tomorrow."""
    _, host, _, _ = split_url(url)
    if allow_remote or _is_loopback(host):
        return
    raise RemoteTargetRefused(
        f"{url}: {host} is not a loopback address; a live campaign sends thousands of hostile "
        "requests, so it fuzzes only servers on this machine unless --allow-remote is given"
    )


class RequestPacer:
    """At most ``max_rps`` acquisitions per second, spaced evenly (no bursts), shared by every
    thread of the campaign. ``sent`` counts them."""

    def __init__(self, max_rps: float) -> None:
        if not max_rps > 0:
            raise ValueError("max_rps must be > 0")
        self.interval = 1.0 / max_rps
        self._next = time.monotonic()
        self._lock = threading.Lock()
        self.sent = 0

    def acquire(self) -> None:
        with self._lock:
            now = time.monotonic()
            slot = max(now, self._next)
            self._next = slot + self.interval
            self.sent += 1
        delay = slot - time.monotonic()
        if delay > 0:
            time.sleep(delay)


@dataclass
class Reply:
    """One exchange. ``status`` None: no HTTP answer, ``error`` says why (``refused``,
    ``dropped``, ``timeout``). ``truncated``: the body was longer than the client reads."""

    status: int | None
    body: bytes = b""
    latency_s: float = 0.0
    error: str | None = None
    detail: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    truncated: bool = False

    def json(self) -> Any:
        """The body as JSON, or None when it is not."""
        try:
            return json.loads(self.body)
        except (ValueError, RecursionError):
            return None

    def error_message(self) -> str:
        """The OpenAI error body's message (or the body's start, or the transport error)."""
        if self.status is None:
            return f"{self.error}: {self.detail}"
        doc = self.json()
        if isinstance(doc, dict):
            err = doc.get("error", doc.get("detail"))
            if isinstance(err, dict):
                return str(err.get("message", ""))[:2000]
            if isinstance(err, str):
                return err[:2000]
            if isinstance(doc.get("message"), str):
                return str(doc["message"])[:2000]
        return self.body[:2000].decode("utf-8", "replace")

    def error_code(self) -> str | None:
        """The OpenAI error body's ``code`` (else its ``type``)."""
        doc = self.json()
        if isinstance(doc, dict) and isinstance(doc.get("error"), dict):
            err = doc["error"]
            for key in ("code", "type"):
                if isinstance(err.get(key), str) and err[key]:
                    return str(err[key])
        return None


class HttpClient:
    """Requests to one server, one keep-alive connection per thread.

    ``timeout_s``: how long to wait for the answer's bytes (then ``timeout``);
    ``max_response_bytes``: read at most this much of a body (the rest is dropped with the
    connection). A request that fails on a reused connection before any answer is sent again
    once on a fresh one (the server may have closed an idle keep-alive connection)."""

    def __init__(
        self,
        base_url: str,
        *,
        limiter: RequestPacer,
        timeout_s: float = 60.0,
        connect_timeout_s: float = 5.0,
        headers: Mapping[str, str] | None = None,
        max_response_bytes: int = 16 << 20,
    ) -> None:
        self.scheme, self.host, self.port, self.base_path = split_url(base_url)
        self.base_url = base_url.rstrip("/")
        self.limiter = limiter
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.headers = dict(headers or {})
        self.max_response_bytes = max_response_bytes
        self._local = threading.local()
        self._all: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    # ------------------------------------------------------------------------- connections

    def _connection(self) -> tuple[http.client.HTTPConnection, bool]:
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is not None:
            return conn, True
        cls = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
        conn = cls(self.host, self.port, timeout=self.connect_timeout_s)
        self._local.conn = conn
        with self._lock:
            self._all.append(conn)
        return conn, False

    def _drop(self) -> None:
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            conn.close()

    def close(self) -> None:
        with self._lock:
            conns, self._all = self._all, []
        for c in conns:
            c.close()

    # ---------------------------------------------------------------------------- requests

    def get(self, path: str, *, timeout_s: float | None = None) -> Reply:
        return self.request("GET", path, None, timeout_s=timeout_s)

    def post_json(
        self,
        path: str,
        body: bytes,
        *,
        timeout_s: float | None = None,
        headers: Sequence[tuple[str, str]] = (),
    ) -> Reply:
        return self.request(
            "POST",
            path,
            body,
            headers=[("content-type", "application/json"), *headers],
            timeout_s=timeout_s,
        )

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None,
        *,
        headers: Sequence[tuple[str, str]] = (),
        timeout_s: float | None = None,
    ) -> Reply:
        """One exchange (rate-limited); never raises for transport errors."""
        self.limiter.acquire()
        timeout = self.timeout_s if timeout_s is None else timeout_s
        for attempt in (0, 1):
            conn, reused = self._connection()
            start = time.perf_counter()
            reply = self._exchange(conn, method, path, body, headers, timeout, start)
            if reply.status is None:
                self._drop()
                if reused and attempt == 0 and reply.error == "dropped" and not reply.body:
                    continue
            return reply
        raise AssertionError("unreachable")  # pragma: no cover

    def _exchange(
        self,
        conn: http.client.HTTPConnection,
        method: str,
        path: str,
        body: bytes | None,
        headers: Sequence[tuple[str, str]],
        timeout: float,
        start: float,
    ) -> Reply:
        try:
            if conn.sock is None:
                conn.connect()
            assert conn.sock is not None
            conn.sock.settimeout(timeout)
            conn.putrequest(method, self.base_path + path, skip_accept_encoding=True)
            sent = {k.lower() for k, _ in headers}
            for k, v in headers:
                conn.putheader(k, v)
            for k, v in self.headers.items():
                if k.lower() not in sent:
                    conn.putheader(k, v)
            if body is not None:
                conn.putheader("content-length", str(len(body)))
            conn.endheaders(body)
            resp = conn.getresponse()
            data, truncated = self._read(resp, start + timeout)
            reply = Reply(
                resp.status,
                data,
                time.perf_counter() - start,
                headers={k.lower(): v for k, v in resp.getheaders()},
                truncated=truncated,
            )
            if truncated or resp.will_close:
                self._drop()
            return reply
        except TimeoutError as exc:
            return Reply(None, b"", time.perf_counter() - start, "timeout", str(exc))
        except ConnectionRefusedError as exc:
            return Reply(None, b"", time.perf_counter() - start, "refused", str(exc))
        except (http.client.HTTPException, OSError) as exc:
            what = "timeout" if isinstance(exc, socket.timeout) else "dropped"
            detail = f"{type(exc).__name__}: {exc}"
            return Reply(None, b"", time.perf_counter() - start, what, detail)

    def _read(self, resp: http.client.HTTPResponse, deadline: float) -> tuple[bytes, bool]:
        """The body, up to ``max_response_bytes``; a body still arriving at ``deadline`` is a
        hang (``TimeoutError``)."""
        parts: list[bytes] = []
        size = 0
        while True:
            if time.perf_counter() > deadline:
                raise TimeoutError("the answer did not end within the timeout")
            chunk = resp.read1(_READ_CHUNK) if hasattr(resp, "read1") else resp.read(_READ_CHUNK)
            if not chunk:
                # read1 leaves a response whose Content-Length is used up open: the next
                # request on this connection would be sent, then fail (ResponseNotReady) and be
                # sent again by the retry, a second delivery of every request.
                resp.close()
                return b"".join(parts), False
            parts.append(chunk)
            size += len(chunk)
            if size >= self.max_response_bytes:
                return b"".join(parts)[: self.max_response_bytes], True


def discover_model(client: HttpClient) -> str | None:
    """The first model the server lists at ``/v1/models`` (None when it lists none)."""
    reply = client.get("/v1/models", timeout_s=10.0)
    doc = reply.json() if reply.status == 200 else None
    if isinstance(doc, dict) and isinstance(doc.get("data"), list) and doc["data"]:
        first = doc["data"][0]
        if isinstance(first, dict) and isinstance(first.get("id"), str):
            return str(first["id"])
    return None
