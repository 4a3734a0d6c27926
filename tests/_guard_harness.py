"""Test harness for the guard: a scriptable fake upstream and in-process uvicorn servers.

Everything binds 127.0.0.1 on a free port and runs on the test's event loop.

The fake upstream (aiohttp.web) answers the OpenAI routes and records what it received. A
request picks a behaviour with the ``x-fake`` header:

- ``ok`` (default): a JSON completion with ``usage``, or an SSE stream of ``x-fake-tokens``
  one-token deltas (default 3) when ``"stream": true``;
- ``hang``: never answers (until cancelled; recorded in ``cancelled``);
- ``reset``: closes the connection without answering;
- ``reset-mid-stream``: streams two events, then drops the connection;
- ``endless``: streams deltas (of ``x-fake-pad`` bytes, default 4) every ``x-fake-interval``
  seconds (default 0) until the client goes away (recorded in ``cancelled``), ignoring
  ``max_tokens``;
- ``x-fake-linger``: a stream's response ends this many seconds after its ``[DONE]`` (default
  0; say, an SSE server still tearing down its tasks);
- ``big``: a JSON body of ``x-fake-bytes`` bytes without Content-Length (chunked);
- ``no-done``: streams its deltas (the last with ``finish_reason``) and ends without
  ``[DONE]``;
- ``done-unfinished``: streams its deltas, none with a ``finish_reason``, then ``[DONE]``
  (what llama-cpp-python sends for a stream a newer request cut off);
- ``status``: answers ``x-fake-status`` with an OpenAI error body.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from aiohttp import web
from starlette.types import ASGIApp


def bound_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


# vLLM's pooling and scoring routes: answered like a completion (the tests judge the guard).
POOLING_ROUTES = ("/score", "/v1/score", "/rerank", "/v1/rerank", "/v2/rerank", "/classify",
                  "/pooling")  # fmt: skip


@dataclass
class FakeUpstream:
    received: list[Received] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)  # request ids whose client went away
    probes: list[str] = field(default_factory=list)  # paths the guard asked for itself
    models: dict[str, Any] = field(default_factory=dict)  # extra fields of GET /v1/models' entry
    url: str = ""

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/v1/models/{model}", self._model)
        for path in ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/tokenize",
                     *POOLING_ROUTES):  # fmt: skip
            app.router.add_post(path, self._generate)
        return app

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _models(self, request: web.Request) -> web.Response:
        self._record(request, b"")
        entry = {"id": "fake", "object": "model", **self.models}
        return web.json_response({"object": "list", "data": [entry]})

    async def _model(self, request: web.Request) -> web.Response:
        self._record(request, b"")
        return web.json_response({"id": request.match_info["model"], "object": "model"})

    def _record(self, request: web.Request, body: bytes) -> None:
        if "x-schedguard-probe" in request.headers:
            # The guard's own requests (its model list at start-up and on readiness): not
            # what a test sent through it.
            self.probes.append(request.path)
            return
        self.received.append(Received(request.method, request.path, dict(request.headers), body))

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        self._record(request, raw)
        mode = request.headers.get("x-fake", "ok")
        rid = request.headers.get("x-request-id", "")
        body = json.loads(raw) if raw else {}
        if mode == "hang":
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                self.cancelled.append(rid)
                raise
        if mode == "reset":
            assert request.transport is not None
            request.transport.abort()
            return web.Response()
        if mode == "status":
            status = int(request.headers.get("x-fake-status", "500"))
            err = {"message": "fake", "type": "server_error", "param": None, "code": "fake"}
            return web.json_response({"error": err}, status=status)
        if mode == "big":
            size = int(request.headers.get("x-fake-bytes", "2000000"))
            resp = web.StreamResponse(headers={"content-type": "application/json"})
            resp.enable_chunked_encoding()
            await resp.prepare(request)
            pad = b'{"pad":"' + b"x" * (size - 100) + b'",'
            await resp.write(pad)
            usage = {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}
            await resp.write(b'"usage":' + json.dumps(usage).encode() + b"}")
            await resp.write_eof()
            return resp
        if request.path == "/v1/embeddings":
            return web.json_response(
                {
                    "object": "list",
                    "data": [{"object": "embedding", "index": 0, "embedding": [0.0, 1.0]}],
                    "model": body.get("model", "fake"),
                    "usage": {"prompt_tokens": 3, "total_tokens": 3},
                }
            )
        chat = request.path == "/v1/chat/completions"
        tokens = int(request.headers.get("x-fake-tokens", "3"))
        if body.get("stream") or mode in ("endless", "reset-mid-stream", "no-done"):
            return await self._stream(request, body, chat, tokens, mode, rid)
        text = "tok " * tokens
        choice: dict[str, Any] = {"index": 0, "finish_reason": "stop"}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        return web.json_response(
            {
                "id": "fake-1",
                "object": "chat.completion" if chat else "text_completion",
                "created": 1,
                "model": body.get("model", "fake"),
                "choices": [choice],
                "usage": {
                    "prompt_tokens": 5,
                    "completion_tokens": tokens,
                    "total_tokens": 5 + tokens,
                },
            }
        )

    async def _stream(
        self,
        request: web.Request,
        body: dict[str, Any],
        chat: bool,
        tokens: int,
        mode: str,
        rid: str,
    ) -> web.StreamResponse:
        # x-accel-buffering: as sse-starlette (llama-cpp-python) sends it.
        resp = web.StreamResponse(
            headers={"content-type": "text/event-stream", "x-accel-buffering": "no"}
        )
        await resp.prepare(request)
        interval = float(request.headers.get("x-fake-interval", "0"))
        obj = "chat.completion.chunk" if chat else "text_completion"

        def event(text: str, finish: str | None = None) -> bytes:
            choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
            if chat:
                choice["delta"] = {"content": text}
            else:
                choice["text"] = text
            payload = {"id": "fake-s", "object": obj, "created": 1, "model": "fake"}
            payload["choices"] = [choice]
            return b"data: " + json.dumps(payload).encode() + b"\n\n"

        try:
            if mode == "endless":
                text = "t" * int(request.headers.get("x-fake-pad", "4"))
                while True:
                    await resp.write(event(text))
                    await asyncio.sleep(interval)
            if mode == "reset-mid-stream":
                await resp.write(event("tok "))
                await resp.write(event("tok "))
                await asyncio.sleep(0.05)
                assert request.transport is not None
                request.transport.abort()
                return resp
            finish = "stop" if mode != "done-unfinished" else None
            for i in range(tokens):
                await resp.write(event("tok ", finish if i == tokens - 1 else None))
                if interval:
                    await asyncio.sleep(interval)
            if mode == "no-done":
                await resp.write_eof()
                return resp
            options = body.get("stream_options") or {}
            if options.get("include_usage"):
                usage = {
                    "prompt_tokens": 5,
                    "completion_tokens": tokens,
                    "total_tokens": 5 + tokens,
                }
                payload = {"id": "fake-s", "object": obj, "created": 1, "model": "fake"}
                payload.update(choices=[], usage=usage)
                await resp.write(b"data: " + json.dumps(payload).encode() + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            linger = float(request.headers.get("x-fake-linger", "0"))
            if linger:
                await asyncio.sleep(linger)
            await resp.write_eof()
        except (asyncio.CancelledError, ConnectionResetError, OSError):
            self.cancelled.append(rid)
            raise
        return resp


@contextlib.asynccontextmanager
async def fake_upstream() -> AsyncIterator[FakeUpstream]:
    fake = FakeUpstream()
    runner = web.AppRunner(
        fake.app(), handle_signals=False, shutdown_timeout=0.5, handler_cancellation=True
    )
    await runner.setup()
    sock = bound_socket()
    site = web.SockSite(runner, sock)
    await site.start()
    fake.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    try:
        yield fake
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def serve(app: ASGIApp, **config: Any) -> AsyncIterator[str]:
    """Serve ``app`` with uvicorn on a free port (httptools with the guard's head cap, as
    ``schedguard serve`` does); yield its base URL."""
    sock = bound_socket()
    config.setdefault("http", "guard.http._protocol:GuardHttpToolsProtocol")
    cfg = uvicorn.Config(
        app,
        loop="none",
        lifespan="on",
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=1,
        **config,
    )
    server = uvicorn.Server(cfg)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.005)  # polling the server's startup, not timing a test
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        await task
        sock.close()


async def admit_and_reserve(
    gw: Any, key: str, raw: bytes, path: str = "/v1/chat/completions"
) -> tuple[int, str | None]:
    """One request through ``gw``'s admission as the proxy drives it (open, judge, prepare,
    reserve), the reservation released at once: ``(200, None)``, or the refusal's status and
    code."""
    from guard.errors import GuardError

    ex = gw.exchange(path, "POST")
    opened = gw.open(ex, [(b"authorization", f"Bearer {key}".encode())])
    admission = gw.judge(ex, opened, raw)
    if admission.verdict.rejection is not None:
        return admission.verdict.status, admission.verdict.code
    forward = gw.prepare(ex, admission)
    try:
        reservation = await gw.reserve(ex, admission, forward.tokens)
    except GuardError as err:
        return err.status, err.code
    await gw.limiter.release(reservation)
    return 200, None
