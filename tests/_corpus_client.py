"""Sending corpus payloads to a server as the files describe them: pipeline-layer payloads with
httpx (their headers, their raw bytes), HTTP-layer ones over a raw socket (generated headers,
encodings, chunked or stalled bodies), the answer read while the body is still being sent."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from dataclasses import dataclass

import httpx

from payloads.loader import Payload, Transport

__all__ = ["FLOOD_KEYS", "MAIN_KEY", "Answer", "corpus_policy", "send", "send_raw"]

MAIN_KEY = "sk-corpus-main-000001"
# The key each flood payload is sent under: small limits of the kind its code names.
FLOOD_KEYS = {
    "rate_limited_requests": "sk-corpus-flood-requests",
    "rate_limited_tokens": "sk-corpus-flood-tokens",
    "concurrency_limited": "sk-corpus-flood-streams",
}


def corpus_policy(body_read_timeout_s: float, head: str = "") -> str:
    """The corpus runs' policy: one unlimited key for the single payloads, one small-limit key
    per flood, no queue (a request over its key's concurrency is refused at once), slow bodies
    timed out after ``body_read_timeout_s``; ``head``: more top-level sections first."""
    return f"""{head}
limits:
  body: {{body_read_timeout_s: {body_read_timeout_s}}}
rate:
  queue_size: 0
keys:
  - key: {MAIN_KEY}
    tenant: corpus
    rate: {{requests_per_minute: null, tokens_per_minute: null, burst: 100000}}
  - key: {FLOOD_KEYS["rate_limited_requests"]}
    tenant: flood-requests
    rate: {{requests_per_minute: 6, burst: 3, tokens_per_minute: null}}
  - key: {FLOOD_KEYS["rate_limited_tokens"]}
    tenant: flood-tokens
    rate: {{requests_per_minute: null, tokens_per_minute: 40000}}
  - key: {FLOOD_KEYS["concurrency_limited"]}
    tenant: flood-streams
    rate: {{requests_per_minute: null, tokens_per_minute: null, per_key_concurrency: 1}}
"""


@dataclass(frozen=True)
class Answer:
    status: int | None  # None: the connection ended without a status line
    headers: dict[str, str]
    body: bytes

    @property
    def code(self) -> str | None:
        if self.status is not None and 200 <= self.status < 300:
            return "ok"
        try:
            err = json.loads(self.body)["error"]
        except (ValueError, KeyError, TypeError):
            return None
        return str(err["code"]) if isinstance(err, dict) and "code" in err else None


def _from_httpx(resp: httpx.Response) -> Answer:
    return Answer(resp.status_code, {k.lower(): v for k, v in resp.headers.items()}, resp.content)


def _parse(data: bytes) -> Answer:
    head, sep, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if not sep or len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        return Answer(None, {}, data)
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = _dechunk(body)
    elif "content-length" in headers:
        body = body[: int(headers["content-length"])]
    return Answer(int(parts[1]), headers, body)


def _dechunk(data: bytes) -> bytes:
    out = bytearray()
    while True:
        size_line, sep, rest = data.partition(b"\r\n")
        if not sep:
            return bytes(out)
        size = int(size_line.split(b";")[0] or b"0", 16)
        if size == 0:
            return bytes(out)
        out += rest[:size]
        data = rest[size + 2 :]


def _complete(data: bytes | bytearray) -> bool:
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep:
        return False
    lowered = head.lower()
    if b"transfer-encoding: chunked" in lowered:
        return body.endswith(b"0\r\n\r\n")
    for line in lowered.split(b"\r\n"):
        if line.startswith(b"content-length:"):
            return len(body) >= int(line.split(b":", 1)[1])
    return False


def _body_parts(body: bytes, transport: Transport) -> tuple[list[bytes], str]:
    """The body as sent (pieces, chunk-framed when chunked) and its framing header."""
    size = transport.chunk_size or max(1, len(body))
    pieces = [body[i : i + size] for i in range(0, len(body), size)] or [b""]
    if transport.content_length == "omit":
        framed = [b"%x\r\n%s\r\n" % (len(p), p) for p in pieces if p]
        return [*framed, b"0\r\n\r\n"], "transfer-encoding: chunked"
    declared = len(body) if transport.content_length == "exact" else transport.content_length
    return pieces, f"content-length: {declared}"


def send_raw(url: str, payload: Payload, key: str, timeout_s: float = 15.0) -> Answer:
    """One HTTP-layer payload over its own connection, byte for byte as the file describes it.

    A writer thread sends (pausing ``chunk_delay_s`` between pieces) while this thread reads:
    the guard answers as soon as it can judge (413 mid-body, 431 mid-head, 408 on a slow body)
    and closes, and the answer must be read before the writer's next write is reset.
    """
    host, port = url.removeprefix("http://").split(":")
    transport = payload.transport or Transport()
    pieces, framing = _body_parts(payload.body_bytes(), transport)
    lines = [f"{payload.method} {payload.endpoint} HTTP/1.1", f"host: {host}:{port}",
             f"authorization: Bearer {key}", "connection: close", framing]  # fmt: skip
    lines += [f"{name}: {value}" for name, value in payload.header_items()]
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    delay = transport.chunk_delay_s or 0.0
    stop = threading.Event()
    sock = socket.create_connection((host, int(port)), timeout=timeout_s)

    def write() -> None:
        try:
            for i, piece in enumerate([head, *pieces]):
                if i > 1 and delay and stop.wait(delay):
                    return
                for at in range(0, len(piece), 1 << 16):
                    if stop.is_set():
                        return
                    sock.sendall(piece[at : at + (1 << 16)])
        except OSError:
            pass  # the guard hung up: its answer, if any, is being read

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    data = bytearray()
    deadline = time.monotonic() + timeout_s
    try:
        while not _complete(data) and time.monotonic() < deadline:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            chunk = sock.recv(1 << 16)
            if not chunk:
                break
            data += chunk
    except OSError:
        pass  # reset after the answer: what was received stands
    finally:
        stop.set()
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()
        writer.join(5)
    return _parse(bytes(data))


def send(client: httpx.Client, payload: Payload, key: str) -> Answer:
    headers = [*payload.header_items(), ("authorization", f"Bearer {key}")]
    resp = client.request(
        payload.method, payload.endpoint, content=payload.body_bytes(), headers=headers
    )
    return _from_httpx(resp)
