"""A small HTTP/1.1 client for the load tests, on the standard library's ``http.client``.

Under locust, gevent has patched ``socket``, ``select`` and ``time.sleep``, so these blocking
calls yield to other users. Why not locust's own clients: attacks need control over framing
(exact, chunked, declared-but-missing ``Content-Length``, slow pieces, megabyte headers) and
streams need the arrival time of each server-sent event, which a buffered client hides.

- :class:`KeepAlive`: one persistent connection per user for benign traffic; plain requests and
  SSE streams with time to first token and inter-token gaps;
- :func:`send_raw`: one request on a fresh connection, framed as a corpus payload says, that
  stops sending as soon as the server answers early (413 after 4 MiB, 408 on a slow body);
- :func:`hold_stream`: one streaming request on a fresh connection, read to its end or never
  read at all and held open (the fair share phase's flood).
"""

from __future__ import annotations

import http.client
import json
import select
import socket
import ssl
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from payloads.loader import Transport

__all__ = [
    "HeldStream",
    "KeepAlive",
    "Response",
    "StreamResult",
    "error_code",
    "hold_stream",
    "send_raw",
]

_PIECE = 64 << 10
_MAX_BODY = 4 << 20
_ATTACK_MAX_BODY = 64 << 10


@dataclass(frozen=True)
class Response:
    """``status`` 0 means no response: ``error`` says why (``timeout``, ``refused``, ...)."""

    status: int
    body: bytes = b""
    error: str | None = None
    elapsed_s: float = 0.0

    @property
    def code(self) -> str | None:
        return error_code(self.body) if self.status >= 400 else None


@dataclass
class StreamResult:
    """One SSE response: when its first token came and the gaps between the next ones."""

    status: int
    elapsed_s: float = 0.0
    ttft_s: float | None = None
    gaps_s: list[float] = field(default_factory=list)
    events: int = 0
    done: bool = False
    error: str | None = None
    body: bytes = b""

    @property
    def itl_mean_s(self) -> float | None:
        return sum(self.gaps_s) / len(self.gaps_s) if self.gaps_s else None


def error_code(body: bytes) -> str | None:
    """The ``code`` of an OpenAI error body, if ``body`` is one."""
    try:
        obj = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    if isinstance(obj, dict) and isinstance(obj.get("error"), dict):
        code = obj["error"].get("code")
        return code if isinstance(code, str) else None
    return None


def _describe(exc: BaseException) -> str:
    if isinstance(exc, socket.timeout | TimeoutError):
        return "timeout"
    if isinstance(exc, ConnectionRefusedError):
        return "refused"
    if isinstance(exc, ConnectionResetError | BrokenPipeError):
        return "reset"
    if isinstance(exc, http.client.RemoteDisconnected):
        return "closed without response"
    return f"{type(exc).__name__}: {exc}"[:200]


def _connect(base_url: str, timeout_s: float) -> http.client.HTTPConnection:
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {base_url!r}")
    if parts.scheme == "https":
        return http.client.HTTPSConnection(parts.hostname, parts.port, timeout=timeout_s)
    return http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout_s)


def _is_content(event: Any) -> bool:
    """An SSE chunk carrying generated text (the first chat chunk holds only the role)."""
    if not isinstance(event, dict):
        return False
    for choice in event.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta")
        if isinstance(delta, dict) and delta.get("content"):
            return True
        if choice.get("text"):
            return True
    return False


def _content_pieces(event: Any) -> int:
    """How many choices of an SSE chunk carry generated text (about a token each)."""
    if not isinstance(event, dict):
        return 0
    return sum(1 for choice in event.get("choices") or () if _is_content({"choices": [choice]}))


def _sse_data(buffer: bytearray) -> Iterator[bytes]:
    """Pop complete events off ``buffer``; yield each ``data:`` payload."""
    while True:
        end = buffer.find(b"\n\n")
        if end < 0:
            return
        event = bytes(buffer[:end])
        del buffer[: end + 2]
        for line in event.split(b"\n"):
            line = line.rstrip(b"\r")
            if line.startswith(b"data:"):
                yield line[5:].strip()


class KeepAlive:
    """One keep-alive connection to ``base_url``; reconnects after any error."""

    def __init__(self, base_url: str, timeout_s: float = 60.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self._conn: http.client.HTTPConnection | None = None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _send(
        self, method: str, path: str, body: bytes, headers: Sequence[tuple[str, str]]
    ) -> http.client.HTTPResponse:
        if self._conn is None:
            self._conn = _connect(self.base_url, self.timeout_s)
        self._conn.request(method, path, body=body, headers=dict(headers))
        return self._conn.getresponse()

    def request(
        self, method: str, path: str, body: bytes, headers: Sequence[tuple[str, str]]
    ) -> Response:
        start = time.perf_counter()
        try:
            resp = self._send(method, path, body, headers)
            data = resp.read(_MAX_BODY + 1)
            if len(data) > _MAX_BODY or resp.will_close:
                self.close()
            return Response(resp.status, data[:_MAX_BODY], None, time.perf_counter() - start)
        except (OSError, http.client.HTTPException) as exc:
            self.close()
            return Response(0, b"", _describe(exc), time.perf_counter() - start)

    def stream(
        self, method: str, path: str, body: bytes, headers: Sequence[tuple[str, str]]
    ) -> StreamResult:
        """Send a streaming request and read the SSE response to its end (``[DONE]``)."""
        start = time.perf_counter()
        deadline = start + self.timeout_s
        result = StreamResult(0)
        try:
            resp = self._send(method, path, body, headers)
            result.status = resp.status
            if resp.status != 200 or "text/event-stream" not in (
                resp.getheader("content-type") or ""
            ):
                result.body = resp.read(_MAX_BODY)
                if resp.will_close:
                    self.close()
                if resp.status == 200:
                    result.error = "not an event stream"
                return result
            buffer = bytearray()
            last: float | None = None
            while not result.done:
                chunk = resp.read1(_PIECE)
                now = time.perf_counter()
                if not chunk:
                    break
                if now > deadline:
                    raise TimeoutError("stream took longer than the timeout")
                buffer += chunk
                for data in _sse_data(buffer):
                    result.events += 1
                    if data == b"[DONE]":
                        result.done = True
                        break
                    event = json.loads(data)
                    if isinstance(event, dict) and "error" in event:
                        result.error = f"error event: {error_code(data) or 'unknown'}"
                        continue
                    if _is_content(event):
                        if last is None:
                            result.ttft_s = now - start
                        else:
                            result.gaps_s.append(now - last)
                        last = now
            if not result.done:
                result.error = result.error or "stream ended without [DONE]"
            if not result.done or resp.will_close:
                self.close()
            else:
                resp.read()  # the terminating chunk, so the connection can be reused
        except (OSError, http.client.HTTPException, ValueError) as exc:
            self.close()
            result.error = _describe(exc)
        result.elapsed_s = time.perf_counter() - start
        return result


def _split(data: bytes, step: int) -> list[bytes]:
    return [data[i : i + step] for i in range(0, len(data), step)] or [b""]


def _pieces(body: bytes, transport: Transport | None) -> tuple[list[bytes], float, str]:
    """(pieces to send, delay between them, ``Content-Length`` to declare or ``omit``)."""
    size = transport.chunk_size if transport and transport.chunk_size else None
    delay = transport.chunk_delay_s if transport and transport.chunk_delay_s else 0.0
    mode = transport.content_length if transport else "exact"
    if mode == "omit":
        framed = [b"%x\r\n%s\r\n" % (len(p), p) for p in _split(body, size or _PIECE) if p]
        framed.append(b"0\r\n\r\n")
        if delay:
            return framed, delay, "omit"
        # Many tiny chunks in few writes: the server still parses every chunk.
        return _split(b"".join(framed), _PIECE), 0.0, "omit"
    declared = str(len(body)) if mode == "exact" else str(mode)
    if delay and size:
        return _split(body, size), delay, declared
    return _split(body, _PIECE), 0.0, declared


def _answered(sock: socket.socket | None) -> bool:
    """The server has answered (or closed): stop sending the body."""
    if sock is None:
        return True
    readable, _, _ = select.select([sock], [], [], 0)
    return bool(readable)


def _head(
    method: str, path: str, host: str, headers: Sequence[tuple[str, str]], framing: str
) -> bytes:
    """The request line and headers, serialised as given (Latin-1, like the corpus)."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}"]
    given = {k.lower() for k, _ in headers}
    if framing == "omit":
        lines.append("Transfer-Encoding: chunked")
    elif "content-length" not in given:
        lines.append(f"Content-Length: {framing}")
    lines += [f"{name}: {value}" for name, value in headers]
    lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _open(base_url: str, timeout_s: float) -> tuple[socket.socket, str]:
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {base_url!r}")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    sock = socket.create_connection((parts.hostname, port), timeout=timeout_s)
    if parts.scheme == "https":
        sock = ssl.create_default_context().wrap_socket(sock, server_hostname=parts.hostname)
    return sock, parts.netloc


def send_raw(
    base_url: str,
    method: str,
    path: str,
    headers: Sequence[tuple[str, str]],
    body: bytes,
    transport: Transport | None = None,
    *,
    timeout_s: float = 15.0,
    hold_s: float | None = None,
) -> Response:
    """Send one request on a fresh connection exactly as framed by ``transport``.

    The head and the body go out in pieces; before each piece the socket is polled, and sending
    stops as soon as the server has answered (a 431 after 16 KiB of an 8 MB header, a 413
    after 4 MiB), so the answer is read instead of lost to a reset. ``hold_s``: for a 2xx
    answer, read at most this long, then hang up (a flood's streams stay open a while, not to
    their end).
    """
    start = time.perf_counter()
    deadline = start + timeout_s
    sock: socket.socket | None = None
    try:
        sock, netloc = _open(base_url, timeout_s)
        pieces, delay, framing = _pieces(body, transport)
        head = _head(method, path, netloc, headers, framing)
        plan = [(p, 0.0) for p in _split(head, _PIECE)]
        plan += [(p, delay if i else 0.0) for i, p in enumerate(pieces)]
        for piece, wait in plan:
            if wait:
                time.sleep(wait)
            if _answered(sock) or time.perf_counter() > deadline:
                break
            try:
                sock.sendall(piece)
            except (BrokenPipeError, ConnectionResetError):
                break  # answered early and closed; the answer may still be readable
        sock.settimeout(max(0.05, deadline - time.perf_counter()))
        resp = http.client.HTTPResponse(sock, method=method)
        resp.begin()
        if resp.status < 300 and hold_s is not None:
            data = _read_for(resp, min(hold_s, max(0.05, deadline - time.perf_counter())))
        else:
            data = resp.read(_ATTACK_MAX_BODY)
        return Response(resp.status, data, None, time.perf_counter() - start)
    except (OSError, http.client.HTTPException) as exc:
        return Response(0, b"", _describe(exc), time.perf_counter() - start)
    finally:
        if sock is not None:
            sock.close()


def _read_for(resp: http.client.HTTPResponse, seconds: float) -> bytes:
    end = time.perf_counter() + seconds
    head = bytearray()
    try:
        while time.perf_counter() < end:
            chunk = resp.read1(_PIECE)
            if not chunk:
                break
            if len(head) < _ATTACK_MAX_BODY:
                head += chunk[: _ATTACK_MAX_BODY - len(head)]
    except (OSError, http.client.HTTPException):
        pass
    return bytes(head)


@dataclass(frozen=True)
class HeldStream:
    """One stream of :func:`hold_stream`: ``status`` 0 means no answer (``error`` says why)."""

    status: int
    head_s: float | None = None  # until the status line and headers came
    elapsed_s: float = 0.0
    tokens: int = 0  # content pieces read (none for a stream never read)
    body: bytes = b""  # a refusal's body
    error: str | None = None

    @property
    def code(self) -> str | None:
        return error_code(self.body) if self.status >= 400 else None


def hold_stream(
    base_url: str,
    path: str,
    headers: Sequence[tuple[str, str]],
    body: bytes,
    *,
    read: bool,
    hold_s: float,
    timeout_s: float,
    on_head: Callable[[int, float], None] | None = None,
    on_tokens: Callable[[int], None] | None = None,
) -> HeldStream:
    """Send a streaming request on a fresh connection; when the answer begins (2xx), read it to
    its end (``[DONE]``, at most ``timeout_s`` in all) or, with ``read`` False, read not a byte
    more and hold the connection ``hold_s`` seconds before hanging up: the answer piles up in
    the socket buffers and whatever the server does about it is what a slow client costs.
    ``on_head(status, seconds)`` is called as the answer begins and ``on_tokens(n)`` as content
    arrives, so that a stream cut short by the end of the run still counts."""
    start = time.perf_counter()
    deadline = start + timeout_s
    conn: http.client.HTTPConnection | None = None
    status, head_s, tokens = 0, None, 0
    try:
        conn = _connect(base_url, timeout_s)
        conn.request("POST", path, body=body, headers=dict(headers))
        resp = conn.getresponse()
        status, head_s = resp.status, time.perf_counter() - start
        if on_head is not None:
            on_head(status, head_s)
        if not 200 <= status < 300:
            return HeldStream(status, head_s, head_s, 0, resp.read(_ATTACK_MAX_BODY))
        if not read:
            time.sleep(max(0.0, min(hold_s, deadline - time.perf_counter())))
            return HeldStream(status, head_s, time.perf_counter() - start)
        buffer = bytearray()
        while time.perf_counter() < deadline:
            chunk = resp.read1(_PIECE)
            if not chunk:
                break
            buffer += chunk
            for data in _sse_data(buffer):
                if data == b"[DONE]":
                    return HeldStream(status, head_s, time.perf_counter() - start, tokens)
                pieces = _content_pieces(json.loads(data))
                tokens += pieces
                if pieces and on_tokens is not None:
                    on_tokens(pieces)
        error = "timeout" if time.perf_counter() >= deadline else "stream ended without [DONE]"
        return HeldStream(status, head_s, time.perf_counter() - start, tokens, b"", error)
    except (OSError, http.client.HTTPException, ValueError) as exc:
        return HeldStream(status, head_s, time.perf_counter() - start, tokens, b"", _describe(exc))
    finally:
        if conn is not None:
            conn.close()
