"""The upstream client: pooled keep-alive connections, timeouts, failures mapped to 502/504.

The client is :mod:`guard.http._client` (asyncio transports and the httptools parser), chosen
by measurement: a minimal uvicorn pass-through proxy on this machine (2 cores, 32 connections,
a trivial upstream) spent about 48 us of CPU per request with it, 138 us with an aiohttp
``ClientSession`` and several times that with httpx (the issue measured aiohttp at 5,600 req/s
and httpx at 330).

:class:`Upstream` owns one connection pool per process, created lazily inside the running
event loop. :meth:`Upstream.send` returns an :class:`UpstreamResponse` as soon as the headers
are in; its body is read whole (:meth:`~UpstreamResponse.read`) or relayed in chunks
(:meth:`~UpstreamResponse.chunks`). Every transport failure becomes an :class:`UpstreamError`:

- ``upstream_unavailable`` (502): the connection was refused or could not be made;
- ``upstream_error`` (502): the connection was reset, closed early or the response was broken;
- ``upstream_timeout`` (504): connect, read (between bytes) or total time ran out;
- ``upstream_response_too_large`` (502): a buffered response exceeded its cap.

Request bodies are sent decoded and responses are asked for uncompressed (``Accept-Encoding:
identity``) so the guard sees what the upstream sees and can count streamed tokens.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any

from guard.errors import ConnectFailed, GuardError, TransportError, UpstreamError
from guard.http._client import (
    KEEPALIVE_S,
    PRIORITY_HEADER,
    ConnectionPool,
    PooledResponse,
    UpstreamConfig,
    UpstreamKind,
)

__all__ = [
    "HOP_BY_HOP",
    "PROBE_HEADER",
    "Upstream",
    "UpstreamResponse",
    "dropped_headers",
    "max_model_len_of",
    "response_headers",
    "serves_vllm",
    "upstream_kind_of",
]

# RFC 9110 7.6.1 hop-by-hop headers, plus those the proxy recomputes or must not forward.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
_NOT_FORWARDED = HOP_BY_HOP | {
    "host",
    "content-length",
    "content-encoding",  # the body is forwarded decoded
    "accept-encoding",  # replaced by identity
    "expect",
    "authorization",  # decided by the caller (see Upstream.send)
    "x-request-id",  # set by the caller
}
# Set by the guard itself or its server; the upstream's copies would be duplicates.
_NOT_RETURNED = HOP_BY_HOP | {"content-length", "date", "server", "x-request-id"}
# The same as raw header names (ASGI request header names are lowercase already).
_NOT_FORWARDED_RAW = frozenset(name.encode("latin-1") for name in _NOT_FORWARDED)
_IDENTITY = (b"accept-encoding", b"identity")
_NOT_RETURNED_RAW = frozenset(name.encode("latin-1") for name in _NOT_RETURNED)
# Marks the guard's own requests to the upstream (health, the model list).
PROBE_HEADER = (b"x-schedguard-probe", b"1")
_MODELS_MAX = 1 << 20


def _map_error(exc: BaseException) -> UpstreamError:
    """The client-facing error for a transport failure (the cause stays in our logs only)."""
    if isinstance(exc, ConnectFailed):
        return UpstreamError("upstream_unavailable", "the upstream server is not reachable")
    if isinstance(exc, TimeoutError):
        return UpstreamError(
            "upstream_timeout", "the upstream server did not answer in time", status=504
        )
    return UpstreamError("upstream_error", "the upstream server failed while answering")


_TRANSPORT_ERRORS = (TransportError, TimeoutError, OSError)


class UpstreamResponse:
    """An upstream response whose headers are in; the body is read or relayed, then closed."""

    __slots__ = ("_resp", "content_type", "status")

    def __init__(self, resp: PooledResponse) -> None:
        self._resp = resp
        self.status: int = resp.status
        content_type = ""
        for name, value in resp.raw_headers:
            if name.lower() == b"content-type":
                content_type = value.decode("latin-1")
                break
        self.content_type = content_type

    @property
    def content_length(self) -> int | None:
        return self._resp.content_length

    @property
    def raw_headers(self) -> list[tuple[bytes, bytes]]:
        return self._resp.raw_headers

    @property
    def is_event_stream(self) -> bool:
        return self.content_type.lower().startswith("text/event-stream")

    async def read(self, max_bytes: int) -> bytes:
        """The whole body, at most ``max_bytes`` (``upstream_response_too_large`` beyond)."""
        parts: list[bytes] = []
        size = 0
        async for chunk in self.chunks():
            size += len(chunk)
            if size > max_bytes:
                self.abort()
                raise UpstreamError(
                    "upstream_response_too_large",
                    f"the upstream response exceeds {max_bytes} bytes",
                )
            parts.append(chunk)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives (at most the client's read-ahead buffered)."""
        resp = self._resp
        try:
            while True:
                chunk = await resp.read_chunk()
                if not chunk:
                    break
                yield chunk
        except _TRANSPORT_ERRORS as exc:
            self.abort()
            raise _map_error(exc) from exc

    async def drain(self, timeout_s: float) -> bool:
        """Read and drop the rest of the body for at most ``timeout_s``, so that the connection
        can go back to the pool; on a failure or when time runs out the connection is dropped.
        True when the body was read to its end."""
        resp = self._resp
        try:
            async with asyncio.timeout(timeout_s):
                while await resp.read_chunk():
                    pass
        except (*_TRANSPORT_ERRORS, TimeoutError):
            self.abort()
            return False
        return True

    def abort(self) -> None:
        """Drop the connection (the upstream sees a disconnect and can stop working)."""
        self._resp.close()

    def release(self) -> None:
        """Return the connection to the pool if the body was read, close it otherwise."""
        self._resp.release()


def response_headers(resp: UpstreamResponse) -> list[tuple[bytes, bytes]]:
    """The upstream's response headers that the client should see, as ASGI pairs."""
    return [
        (name, value)
        for name, value in ((n.lower(), v) for n, v in resp.raw_headers)
        if name not in _NOT_RETURNED_RAW
    ]


def dropped_headers(config: UpstreamConfig) -> frozenset[bytes]:
    """The request headers (lower-case names) never forwarded as the client sent them:
    hop-by-hop and framing headers, ``authorization`` and ``x-request-id`` (the caller's
    decision), ``accept-encoding`` (replaced), ``config.strip_headers`` and, under priority
    scheduling, ``X-Vllm-Priority`` whatever ``strip_headers`` says (the checks moved its value
    into the body, bounded by the key's priority; forwarded, it would override that)."""
    dropped = _NOT_FORWARDED_RAW | {h.encode("latin-1") for h in config.strip_headers}
    if config.priority_scheduling:
        dropped |= {PRIORITY_HEADER.encode("latin-1")}
    return dropped


class Upstream:
    """The pooled client of one upstream: ``config.url`` with ``config``'s timeouts.

    ``health_path`` is probed by :meth:`ready` (within ``health_timeout_s``); ``api_key``, when
    set, is sent upstream on every request instead of the client's; idle pooled connections are
    closed after ``keepalive_s``.
    """

    def __init__(
        self,
        config: UpstreamConfig,
        *,
        health_path: str = "/health",
        health_timeout_s: float = 2.0,
        api_key: str | None = None,
        keepalive_s: float = KEEPALIVE_S,
    ) -> None:
        if config.url is None:
            raise ValueError("the upstream config has no url")
        self.config = config
        self.health_path = health_path
        self.health_timeout_s = health_timeout_s
        self.api_key = api_key
        self.keepalive_s = keepalive_s
        self._pool: ConnectionPool | None = None
        self._dropped = dropped_headers(config)

    def _get_pool(self) -> ConnectionPool:
        pool = self._pool
        if pool is None:
            pool = self._pool = ConnectionPool(self.config, keepalive_s=self.keepalive_s)
        return pool

    async def aclose(self) -> None:
        if self._pool is not None:
            await self._pool.aclose()
        self._pool = None

    async def send(
        self,
        method: str,
        path: str,
        query: str,
        headers: Iterable[tuple[bytes, bytes]],
        body: bytes | None,
        *,
        request_id: str,
        authorization: str | None,
        extra_headers: Mapping[str, str] | None = None,
    ) -> UpstreamResponse:
        """Send one request; return once the response headers are in.

        ``headers`` are the client's raw ASGI headers; hop-by-hop and framing headers are
        dropped, and so are ``config.strip_headers`` (the upstream-control headers: vLLM's
        priority, session and rank headers); ``authorization`` replaces the client's (``None``
        sends none); the configured ``api_key`` wins over both. ``extra_headers`` replace the client's headers of the same
        name (trace context, say).
        """
        dropped = self._dropped
        if extra_headers:
            replaced = {name.lower().encode("latin-1") for name in extra_headers}
            out = [
                (name, value)
                for name, value in headers
                if name not in dropped and name not in replaced
            ]
            out.extend((k.encode("latin-1"), v.encode("latin-1")) for k, v in extra_headers.items())
        else:
            out = [(name, value) for name, value in headers if name not in dropped]
        out.append(_IDENTITY)
        out.append((b"x-request-id", request_id.encode("latin-1")))
        if self.api_key is not None:
            out.append((b"authorization", f"Bearer {self.api_key}".encode("latin-1")))
        elif authorization is not None:
            out.append((b"authorization", authorization.encode("latin-1")))
        target = path + "?" + query if query else path
        try:
            resp = await self._get_pool().request(method, target, out, body)
        except _TRANSPORT_ERRORS as exc:
            raise _map_error(exc) from exc
        except (ValueError, UnicodeEncodeError) as exc:
            # A header or path of the client's that cannot be sent (CR, LF or NUL, text outside
            # Latin-1): the client's doing, a 400, not the upstream's failure. The gateway
            # validates the path first; this is the backstop under any ASGI server.
            raise GuardError(
                "request_not_forwardable",
                "the request has a header or path that cannot be forwarded",
            ) from exc
        return UpstreamResponse(resp)

    async def ready(self) -> bool:
        """Whether the upstream answers 2xx within ``health_timeout_s`` on its health path, or,
        for an upstream without one (404), on ``/v1/models``."""
        for path in (self.health_path, "/v1/models"):
            status = await self._probe(path)
            if status != 404:
                return status is not None and 200 <= status < 300
        return False

    async def _probe(self, path: str) -> int | None:
        answer = await self._get(path, [])
        return None if answer is None else answer[0]

    async def models(self) -> Any:
        """The upstream's ``GET /v1/models`` document (parsed JSON), or None when it does not
        answer 200 with JSON of at most 1 MiB within ``health_timeout_s``. The request carries
        ``x-schedguard-probe`` so that recording fakes in tests can tell it apart."""
        answer = await self._get("/v1/models", [PROBE_HEADER], _MODELS_MAX)
        if answer is None or answer[0] != 200:
            return None
        try:
            return json.loads(answer[1])
        except ValueError:
            return None

    async def fetch(self, path: str, keep: int) -> bytes | None:
        """The body of ``GET path`` when the upstream answers 200 with at most ``keep`` bytes
        within ``health_timeout_s`` (its ``/metrics``, llama-server's ``/props``); else None."""
        answer = await self._get(path, [PROBE_HEADER], keep)
        return answer[1] if answer is not None and answer[0] == 200 else None

    async def _get(
        self, path: str, headers: list[tuple[bytes, bytes]], keep: int = 0
    ) -> tuple[int, bytes] | None:
        """(status, up to ``keep`` bytes of the body) of a GET within ``health_timeout_s``;
        None when it failed or the body was longer."""
        timeout = self.health_timeout_s
        try:
            async with asyncio.timeout(timeout):  # the connect included
                resp = await self._get_pool().request(
                    "GET", path, headers, None, total_timeout_s=timeout
                )
                body = bytearray()
                try:
                    while chunk := await resp.read_chunk():
                        if len(body) + len(chunk) > keep:
                            if keep:
                                return None
                            continue
                        body += chunk
                    return resp.status, bytes(body)
                finally:
                    resp.release()
        except (*_TRANSPORT_ERRORS, ValueError):
            return None


def max_model_len_of(models: Any) -> int | None:
    """The context window a ``/v1/models`` document reports: the smallest positive integer
    ``max_model_len`` of its entries (vLLM reports one per base model; LoRA adapters' cards
    have none). None when no entry has one (llama-cpp-python, most other servers)."""
    data = models.get("data") if isinstance(models, dict) else None
    if not isinstance(data, list):
        return None
    lengths = [
        entry["max_model_len"]
        for entry in data
        if isinstance(entry, dict)
        and type(entry.get("max_model_len")) is int
        and entry["max_model_len"] > 0
    ]
    return min(lengths) if lengths else None


def serves_vllm(models: Any) -> bool:
    """Whether a ``/v1/models`` document is vLLM's: every entry ``owned_by: vllm`` (its
    default; llama-cpp-python says ``me``)."""
    data = models.get("data") if isinstance(models, dict) else None
    if not isinstance(data, list) or not data:
        return False
    return all(isinstance(entry, dict) and entry.get("owned_by") == "vllm" for entry in data)


def upstream_kind_of(models: Any) -> UpstreamKind:
    """What served a ``/v1/models`` document: ``vllm`` (every entry ``owned_by: vllm``),
    ``llama_cpp`` (every entry ``owned_by: me``, llama-cpp-python's ``get_models``) or
    ``other``."""
    if serves_vllm(models):
        return "vllm"
    data = models.get("data") if isinstance(models, dict) else None
    if (
        isinstance(data, list)
        and data
        and all(isinstance(entry, dict) and entry.get("owned_by") == "me" for entry in data)
    ):
        return "llama_cpp"
    return "other"
