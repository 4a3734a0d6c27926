"""The reference scheduler's OpenAI-compatible HTTP API (FastAPI).

Routes: ``GET /v1/models``, ``POST /v1/completions``, ``POST /v1/chat/completions`` (with and
without ``"stream": true``; ``stream_options.include_usage`` adds a final usage chunk),
``GET /health`` and ``GET /metrics`` (Prometheus text, this app's own registry). A chat request
whose ``tool_choice`` forces a call (``"required"`` or a named function) is answered with a call
whose arguments satisfy the function's parameters (:mod:`scheduler_ref._tool_calls`).

Request flow: read and parse the body (hardened: capped at :data:`HARDENED_MAX_BODY_BYTES`) ->
validate (pydantic; unknown OpenAI fields are ignored) -> check the model name and the fan-out
parameters -> render templates under the profile's budget -> count and encode prompt tokens ->
``Engine.add_request`` (per-request caps, the tenant's token bucket, the bounded inbox) ->
respond, or stream server-sent events. The tenant is the bearer token (hashed) or
``"anonymous"``. ``priority`` (an extra body field, int, default 0) follows vLLM: lower is more
urgent. A client that disconnects -- streaming or not -- has its engine requests aborted, which
frees their KV blocks.

Every failure is an OpenAI error body with a stable ``code`` (see :mod:`guard.errors`):
``invalid_json``, ``invalid_request`` (the ``param`` names the field, e.g.
``messages[0].content``), ``request_too_large`` (413), ``model_not_found`` / ``not_found`` (404),
``method_not_allowed`` (405), ``unsupported_content``, ``tool_arguments_too_large`` (a forced
call's parameters whose smallest instance is over the budget of
:mod:`scheduler_ref.schema_instance`, in both profiles), and in the hardened profile
``n_exceeded``, ``prompts_exceeded``, ``max_tokens_exceeded``, ``stop_exceeded``; the template
and token codes of :mod:`scheduler_ref.prompt_template`, :mod:`scheduler_ref.chat_template`,
:mod:`guard.tokens._counter` and :mod:`scheduler_ref.engine` (``prompt_tokens_exceeded``,
``tenant_tokens_exhausted`` 429 with ``Retry-After``, ``queue_full`` / ``queue_timeout`` 503,
...); ``engine_unavailable`` (503, ``/health``); ``out_of_memory`` and ``internal_error`` (500,
never for bad input in the hardened profile). After a stream has started, an error is sent as a
``data: {"error": ...}`` event followed by ``[DONE]``. A client that left before its response is
counted as ``client_disconnected``.

The hardened profile caps ``n`` at 8, the number of prompts at 8, ``max_tokens`` at the
profile's output cap and ``stop`` at 4 strings of at most 256 characters; the vulnerable
profile accepts anything, and renders templates and tokenizes inline on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from guard.errors import GuardError, NotFound, Overloaded
from scheduler_ref import api_models as api
from scheduler_ref._body import read_model
from scheduler_ref._generation import (
    Generation,
    chat_response,
    completion_response,
    stream_events,
)
from scheduler_ref._http_errors import install_error_handlers
from scheduler_ref._prompts import Prompt, PromptBuilder, Tokenizer, default_max_tokens
from scheduler_ref._sse import EventStreamResponse
from scheduler_ref._tool_calls import ForcedCall, forced_call
from scheduler_ref.config import SchedulerConfig
from scheduler_ref.engine import Engine
from scheduler_ref.errors import ClientGone
from scheduler_ref.executor import SimulatedExecutor
from scheduler_ref.metrics import CONTENT_TYPE, ServerMetrics
from scheduler_ref.profiles import Profile
from scheduler_ref.request import SamplingParams

__all__ = ["HARDENED_MAX_BODY_BYTES", "create_app"]

# Hardened profile: bodies above this are refused before being read whole.
HARDENED_MAX_BODY_BYTES = 1 << 20
ANONYMOUS = "anonymous"

T = TypeVar("T")

_ENDPOINTS = frozenset(
    {"/v1/models", "/v1/completions", "/v1/chat/completions", "/health", "/metrics"}
)


class _Server:
    """Everything one app instance owns; reachable as ``app.state.server`` (tests, metrics)."""

    def __init__(self, profile: Profile, config: SchedulerConfig, model_name: str) -> None:
        self.profile = profile
        self.config = config
        self.model_name = model_name
        self.created = api.now()
        self.engine = Engine(config, SimulatedExecutor(config.cost))
        self.metrics = ServerMetrics(self._stats)
        self.prompts = PromptBuilder(profile, Tokenizer())
        self.max_body = HARDENED_MAX_BODY_BYTES if profile.hardened else None

    def _stats(self) -> Any:
        return self.engine.stats()

    def check_model(self, model: str) -> None:
        if model != self.model_name:
            raise NotFound(
                "model_not_found",
                f"the model {model[:128]!r} does not exist; this server serves {self.model_name!r}",
                param="model",
            )

    def finished(self, completion_tokens: int, aborted: int) -> None:
        self.metrics.generation_tokens.inc(completion_tokens)
        if aborted:
            self.metrics.aborted.inc(aborted)


def create_app(
    profile: Profile,
    config: SchedulerConfig | None = None,
    *,
    model_name: str = "schedguard-ref",
) -> FastAPI:
    """The API of one reference scheduler; the engine starts and stops with the app's lifespan.

    ``config`` defaults to :meth:`SchedulerConfig.for_profile` (the profile's token caps).
    """
    server = _Server(profile, config or SchedulerConfig.for_profile(profile), model_name)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await asyncio.to_thread(server.prompts.warm_up)
        await server.engine.start()
        try:
            yield
        finally:
            await server.engine.stop()

    app = FastAPI(
        title="schedguard reference scheduler",
        summary=f"OpenAI-compatible API, profile {profile.name!r}",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )
    app.state.server = server
    install_error_handlers(app, server.metrics.reject)
    app.add_middleware(_RequestMetrics, metrics=server.metrics)

    @app.get("/health")
    async def health() -> JSONResponse:
        if not server.engine.is_running:
            err = Overloaded("engine_unavailable", "the engine is not running")
            return JSONResponse(err.to_body(), status_code=err.status)
        return JSONResponse({"status": "ok", "profile": profile.name})

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(server.metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        return JSONResponse(api.model_list(server.model_name, server.created))

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> JSONResponse:
        server.check_model(model_id)
        return JSONResponse(api.model_list(server.model_name, server.created)["data"][0])

    @app.post("/v1/completions", openapi_extra=_body_schema(api.CompletionRequest))
    async def completions(request: Request) -> Response:
        req = await read_model(request, api.CompletionRequest, server.max_body)
        server.check_model(req.model)
        stop = server.prompts.stop_strings(req.stop)
        prompts = await server.prompts.completion_prompts(req)
        echo = [p.text for p in prompts for _ in range(req.n)] if req.echo else None
        rid = api.new_id("cmpl")
        return await _generate(
            server, request, req, prompts, chat=False, rid=rid, stop=stop, echo=echo
        )

    @app.post("/v1/chat/completions", openapi_extra=_body_schema(api.ChatCompletionRequest))
    async def chat_completions(request: Request) -> Response:
        req = await read_model(request, api.ChatCompletionRequest, server.max_body)
        server.check_model(req.model)
        call = forced_call(req.tools, req.tool_choice, server.prompts.tokenizer.token_bytes)
        stop = server.prompts.stop_strings(req.stop)
        prompt = await server.prompts.chat_prompt(req)
        rid = api.new_id("chatcmpl")
        return await _generate(
            server, request, req, [prompt], chat=True, rid=rid, stop=stop, echo=None, call=call
        )

    return app


async def _generate(
    server: _Server,
    request: Request,
    req: api.CompletionRequest | api.ChatCompletionRequest,
    prompts: list[Prompt],
    *,
    chat: bool,
    rid: str,
    stop: list[str],
    echo: list[str] | None,
    call: ForcedCall | None = None,
) -> Response:
    max_tokens = default_max_tokens(req)
    if call is not None:
        # A forced call is as long as its arguments (vLLM's default lets the grammar end it),
        # or cut at max_tokens when the client set one.
        requested = req.requested_max_tokens if isinstance(req, api.ChatCompletionRequest) else None
        max_tokens = min(call.num_tokens, requested or call.num_tokens)
    sampling = SamplingParams(max_tokens=max_tokens, priority=req.priority)
    gen = await _until_disconnect(
        request,
        Generation.start(
            server.engine, rid, prompts, req.n, sampling, tenant_of(request), stop, call
        ),
    )
    server.metrics.prompt_tokens.inc(gen.prompt_tokens)
    created = api.now()
    if req.stream:
        events = stream_events(
            gen,
            chat=chat,
            model=req.model,
            created=created,
            include_usage=req.include_usage,
            echo=echo,
            on_error=server.metrics.reject,
        )
        return EventStreamResponse(
            events, on_close=lambda: server.finished(gen.completion_tokens, gen.abort())
        )
    try:
        choices = await _until_disconnect(request, gen.collect())
    finally:
        server.finished(gen.completion_tokens, gen.abort())
    if chat:
        return JSONResponse(chat_response(gen, choices, req.model, created))
    return JSONResponse(completion_response(gen, choices, req.model, created, echo))


async def _until_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Run ``work``; cancel it (and raise ``client_disconnected``) if the client goes away."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_disconnect(request))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            return task.result()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, GuardError):
            await task
        raise ClientGone("client_disconnected", "the client disconnected")
    finally:
        for t in (task, watcher):
            if not t.done():
                t.cancel()
        with contextlib.suppress(asyncio.CancelledError, GuardError):
            await watcher


async def _wait_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def tenant_of(request: Request) -> str:
    """The bearer token, hashed (tokens never sit in memory or metrics), or ``"anonymous"``."""
    auth = request.headers.get("authorization", "")
    scheme, _, token = auth.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return ANONYMOUS
    return "key-" + hashlib.sha256(token.encode()).hexdigest()[:16]


def _body_schema(model: type[BaseModel]) -> dict[str, Any]:
    # Bodies are parsed by hand (see scheduler_ref._body); this keeps them in the OpenAPI docs.
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": model.model_json_schema()}},
        }
    }


class _RequestMetrics:
    """Counts responses by endpoint and status and times them to the last byte (pure ASGI)."""

    def __init__(self, app: ASGIApp, metrics: ServerMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        endpoint = path if path in _ENDPOINTS else "other"
        start = time.perf_counter()
        status = [500]

        async def send_wrapper(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            self.metrics.requests.labels(endpoint=endpoint, status=str(status[0])).inc()
            self.metrics.latency.labels(endpoint=endpoint).observe(time.perf_counter() - start)
