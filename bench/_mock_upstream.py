"""A fast mock OpenAI upstream for bench/gateway.py: canned answers, no work per request.

``python bench/_mock_upstream.py --port P`` serves, on 127.0.0.1 with uvloop and the httptools
parser straight on an asyncio protocol (no framework), HTTP/1.1 keep-alive:

- ``POST /v1/chat/completions`` and ``POST /v1/completions``: a canned completion JSON with
  ``usage`` (Content-Length), or, when the body contains ``"stream":true`` (or ``"stream": true``),
  a short SSE stream (four events, chunked) ending in ``data: [DONE]``;
- ``POST /v1/embeddings``: a canned embedding list;
- ``GET /health``, ``GET /v1/models``: small JSON answers;
- anything else: 404.

The body is not parsed (a substring test picks streaming), so the mock costs a few tens of
microseconds per request and stays far from being the bottleneck of the proxies it serves.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from typing import Any

import httptools

__all__ = ["main", "serve"]


def _json(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


_USAGE = {"prompt_tokens": 12, "completion_tokens": 4, "total_tokens": 16}
_CHAT = _json(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "bench",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hello there, friend."},
                "finish_reason": "stop",
            }
        ],
        "usage": _USAGE,
    }
)
_COMPLETION = _json(
    {
        "id": "cmpl-bench",
        "object": "text_completion",
        "created": 1700000000,
        "model": "bench",
        "choices": [{"index": 0, "text": "Hello there, friend.", "finish_reason": "stop"}],
        "usage": _USAGE,
    }
)
_EMBEDDINGS = _json(
    {
        "object": "list",
        "data": [{"object": "embedding", "index": 0, "embedding": [0.0, 0.5, 1.0]}],
        "model": "bench",
        "usage": {"prompt_tokens": 3, "total_tokens": 3},
    }
)
_MODELS = _json({"object": "list", "data": [{"id": "bench", "object": "model"}]})
_HEALTH = b'{"status":"ok"}'
_NOT_FOUND = b'{"error":{"message":"not found","type":"invalid_request_error","code":"not_found"}}'


def _event(chat: bool, text: str, finish: str | None) -> bytes:
    choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
    if chat:
        choice["delta"] = {"content": text}
    else:
        choice["text"] = text
    obj = "chat.completion.chunk" if chat else "text_completion"
    payload = {"id": "bench-s", "object": obj, "created": 1700000000, "model": "bench"}
    payload["choices"] = [choice]
    return b"data: " + _json(payload) + b"\n\n"


def _stream(chat: bool) -> bytes:
    """The whole chunked SSE body: three deltas, a usage event, ``[DONE]``, the last chunk."""
    events = [_event(chat, t, "stop" if i == 2 else None) for i, t in enumerate(("He", "ll", "o"))]
    obj = "chat.completion.chunk" if chat else "text_completion"
    usage = {"id": "bench-s", "object": obj, "created": 1700000000, "model": "bench"}
    usage.update(
        choices=[], usage={"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}
    )
    events.append(b"data: " + _json(usage) + b"\n\n")
    events.append(b"data: [DONE]\n\n")
    return b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events) + b"0\r\n\r\n"


def _response(status: str, body: bytes, ctype: bytes = b"application/json") -> bytes:
    return (
        b"HTTP/1.1 " + status.encode() + b"\r\ncontent-type: " + ctype
        + b"\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )  # fmt: skip


_SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
    b"transfer-encoding: chunked\r\n\r\n"
)
RESPONSES: dict[tuple[bytes, bytes], bytes] = {
    (b"POST", b"/v1/chat/completions"): _response("200 OK", _CHAT),
    (b"POST", b"/v1/completions"): _response("200 OK", _COMPLETION),
    (b"POST", b"/v1/embeddings"): _response("200 OK", _EMBEDDINGS),
    (b"GET", b"/v1/models"): _response("200 OK", _MODELS),
    (b"GET", b"/health"): _response("200 OK", _HEALTH),
}
STREAMS: dict[bytes, bytes] = {
    b"/v1/chat/completions": _SSE_HEAD + _stream(True),
    b"/v1/completions": _SSE_HEAD + _stream(False),
}
_MISSING = _response("404 Not Found", _NOT_FOUND)


class _Http(asyncio.Protocol):
    __slots__ = ("body", "parser", "transport", "url")

    def __init__(self) -> None:
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if self.transport is not None:
                self.transport.close()

    # httptools callbacks
    def on_message_begin(self) -> None:
        self.url = b""
        self.body = []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        method = self.parser.get_method()
        path = self.url.split(b"?", 1)[0]
        answer = RESPONSES.get((method, path), _MISSING)
        if method == b"POST" and path in STREAMS:
            body = b"".join(self.body)
            if b'"stream":true' in body or b'"stream": true' in body:
                answer = STREAMS[path]
        transport.write(answer)
        if not self.parser.should_keep_alive():
            transport.close()


async def serve(host: str, port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(_Http, host, port, backlog=1024, reuse_address=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"mock upstream on http://{host}:{port}", file=sys.stderr, flush=True)
    async with server:
        await stop.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    try:
        import uvloop

        uvloop.run(serve(args.host, args.port))
    except ImportError:  # pragma: no cover - uvloop comes with uvicorn[standard]
        asyncio.run(serve(args.host, args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
