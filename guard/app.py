"""The guard's HTTP app: an OpenAI-compatible gateway that checks every request before the
upstream sees it.

Routes:

- proxied (:mod:`guard.proxy`, pure ASGI, around :mod:`guard.gateway`): ``POST /v1/chat/completions``,
  ``POST /v1/completions``, ``POST /v1/embeddings``, ``GET /v1/models`` (and
  ``/v1/models/{model}``), plus the policy's ``routes`` (POST); any other path gets 404
  ``route_not_allowed``;
- ``POST /guard/v1/check?path=/v1/chat/completions``: the dry-run verdict for a body, always
  200 when the body could be judged (``allowed``, ``status``, ``code``, ``message``, ``param``,
  ``costs``, ``mutations``, ``durations_ms``, ``checks``), from the proxied path's own front
  half (:func:`~guard.proxy.admit`): the same framing, route, API-key and checks;
- ``GET /healthz`` (the process is up), ``GET /readyz`` (the next request can be served: the
  upstream answers its health check, else 503 ``upstream_unavailable``; with Redis rate limits
  that fail closed, Redis answers a PING, else 503 ``rate_limiter_unavailable``, the answer
  every request would get; failing open, a Redis that does not answer leaves the guard ready,
  serving without rate limits, and the body says ``"rate_limiter": "failing_open"``),
  ``GET /metrics`` (Prometheus, this app's registry: open while the policy lists no keys, else
  to the admin token or allowed addresses only; on the admin listener instead when
  ``admin.listen`` is set, see :mod:`guard.admin`), ``GET /openapi.json``.

Every error, for any input, is an OpenAI error body with a stable ``code``.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from guard.admin import AdminListener, admin_app, metrics_refusal
from guard.admission import (
    ConcurrencyLimiter,
    RateLimiter,
    RedisRateLimiter,
)
from guard.context_window import ContextWindow
from guard.errors import (
    ClientDisconnected,
    GuardError,
    InternalError,
    Overloaded,
    UpstreamError,
)
from guard.exchange import check_outcomes
from guard.gateway import Gateway, build_gateway
from guard.http import (
    Upstream,
)
from guard.policy import Policy
from guard.proxy import AsgiProxy, admit, peer_of
from guard.telemetry import CONTENT_TYPE, AccessLog
from guard.upstream_capacity import UpstreamCapacity

__all__ = ["GUARD_PATHS", "create_app"]

CHECK_PATH = "/guard/v1/check"
GUARD_PATHS = frozenset({CHECK_PATH, "/healthz", "/readyz", "/metrics", "/openapi.json"})
_MAX_TOKENIZED_DELTA = 1024
_PROBES = frozenset({"/healthz", "/readyz", "/metrics", "/openapi.json"})


def create_app(
    policy: Policy,
    *,
    limiter: RateLimiter | None = None,
    concurrency: ConcurrencyLimiter | None = None,
    upstream_url: str | None = None,
    tracer_provider: Any = None,
    access_log: AccessLog | None = None,
    client_timeout_s: float | None = None,
    health_path: str = "/health",
    metrics_dir: str | None = None,
) -> FastAPI:
    """The guard in front of ``upstream_url`` (default: ``policy.upstream.url``).

    ``limiter`` defaults to the policy's (Redis when ``rate.redis_url`` is set, else in memory);
    ``concurrency`` to the policy's per-key and global limits. ``tracer_provider`` forces
    OpenTelemetry spans on (tests); otherwise they follow the ``OTEL_*`` environment.
    ``client_timeout_s``: a client that stops reading a response for this long is cut (default:
    ``limits.connections.send_timeout_s``). ``metrics_dir``: the directory the worker processes of one
    server share, so that ``/metrics`` answers for all of them (``--workers N``).
    """
    up = replace(policy.upstream, url=upstream_url) if upstream_url else policy.upstream
    if up.url is None:
        raise ValueError("no upstream: set upstream.url in the policy or pass upstream_url")
    upstream = Upstream(up, health_path=health_path)
    gateway = build_gateway(
        policy,
        upstream=upstream,
        limiter=limiter,
        concurrency=concurrency,
        tracer_provider=tracer_provider,
        access_log=access_log,
        client_timeout_s=client_timeout_s,
        metrics_dir=metrics_dir,
    )
    app = _new_app(gateway, upstream)
    _add_own_routes(app, gateway)
    app.openapi = _openapi_with_proxied_routes(app, policy)  # type: ignore[method-assign]
    app.add_middleware(_Dispatch, gateway=gateway)
    return app


def _new_app(gateway: Gateway, upstream: Upstream) -> _GuardApp:
    """The FastAPI app in front of ``gateway``; while it runs, a Redis rate limiter's store is
    watched (a failure logged at start and whenever it changes) and, with workers, the metrics
    are copied where the other workers read them; its shutdown flushes the access log, takes
    this worker out of the metrics' live gauges and closes the upstream pool and the rate
    limiter."""
    metrics = gateway.metrics
    context = ContextWindow(gateway, upstream)
    capacity = UpstreamCapacity(gateway, upstream)

    admin: AdminListener | None = None
    listen = gateway.policy.admin.listen_address
    if listen is not None:

        async def healthz() -> Response:
            return JSONResponse({"status": "ok"})

        async def readyz() -> Response:
            return await _readiness(gateway, upstream, context, capacity)

        async def prometheus() -> Response:
            return Response(metrics.render(), media_type=CONTENT_TYPE)

        admin = AdminListener(admin_app(healthz, readyz, prometheus), *listen)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await context.start()  # the upstream's max_model_len, when it reports one
        await capacity.start()  # after the kind is known
        if admin is not None:
            await admin.start()
        try:
            async with gateway.running():
                yield
        finally:
            if admin is not None:
                await admin.stop()
            await capacity.stop()
            await context.stop()
            await upstream.aclose()

    kwargs: dict[str, Any] = {}
    if "telemetry" in inspect.signature(FastAPI.__init__).parameters:
        # FastAPI's own OpenTelemetry would add a second span per request: the guard has one.
        kwargs["telemetry"] = {"tracing": False, "metrics": False, "logs": False}
    app = _GuardApp(
        title="schedguard guard",
        summary="A gateway that stops resource-exhaustion requests before the LLM server",
        version="0.1.0",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        **kwargs,
    )
    app.gateway = gateway
    app.proxy = AsgiProxy(gateway)
    app.state.gateway = gateway
    app.state.metrics = gateway.metrics
    app.state.context_window = context
    app.state.capacity = capacity
    app.state.upstream = upstream
    _install_error_handlers(app)
    return app


def _add_own_routes(app: FastAPI, gateway: Gateway) -> None:
    """``/healthz``, ``/readyz``, ``/metrics`` and the dry run."""
    metrics = gateway.metrics

    @app.get("/healthz", summary="The guard process is up")
    async def healthz() -> JSONResponse:
        return JSONResponse({"status": "ok"})

    @app.get("/readyz", summary="The next request can be served (upstream, rate limiter)")
    async def readyz() -> JSONResponse:
        state = app.state
        return await _readiness(gateway, state.upstream, state.context_window, state.capacity)

    @app.get("/metrics", summary="Prometheus metrics")
    async def prometheus(request: Request) -> Response:
        refusal = metrics_refusal(gateway.policy, request.scope)
        if refusal is not None:
            return _error_response(refusal)
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    @app.post(
        CHECK_PATH,
        summary="Dry-run verdict for a request body",
        openapi_extra=_check_schema(gateway.policy),
    )
    async def check(request: Request, path: str = "/v1/chat/completions") -> Response:
        return await _dry_run(gateway, request, path, app.state.context_window)


async def _readiness(
    gateway: Gateway, upstream: Upstream, context: ContextWindow, capacity: UpstreamCapacity
) -> JSONResponse:
    """``/readyz``: 200 when the next request can be served. The upstream's health check and,
    for Redis rate limits, a PING, at once. Redis not answering makes the guard unready only
    when the policy fails closed (every request would get 503 ``rate_limiter_unavailable``);
    failing open, requests are served without limits, so it stays ready and says so. A ready
    upstream's context window is read again, and the answer says which one is in force, and
    the upstream's capacity in force (the guard's global slots) and where it came from."""
    limiter = gateway.limiter
    redis = limiter if isinstance(limiter, RedisRateLimiter) else None
    if redis is None:
        upstream_ok, redis_ok = await upstream.ready(), True
    else:
        upstream_ok, redis_ok = await asyncio.gather(upstream.ready(), redis.healthy())
    err: GuardError | None = None
    if not upstream_ok:
        err = UpstreamError("upstream_unavailable", "the upstream server is not ready", status=503)
    elif redis is not None and not redis_ok and redis.on_error == "closed":
        err = Overloaded(
            "rate_limiter_unavailable",
            "the rate limiter's Redis does not answer and the policy fails closed: every "
            "request would be refused",
        )
    if err is not None:
        return JSONResponse(err.to_body(), status_code=503)
    await context.refresh()
    body: dict[str, Any] = {"status": "ready", **context.describe(), **capacity.describe()}
    if not redis_ok:
        body["rate_limiter"] = "failing_open"
    return JSONResponse(body)


async def _dry_run(
    gateway: Gateway, request: Request, path: str, context: ContextWindow
) -> Response:
    """The verdict the proxied route ``path`` would give ``request``'s body, without forwarding
    it: the proxied path's own front half (:func:`~guard.proxy.admit`), so it cannot differ. A caller the
    route would refuse (404, 401) gets that error; a refused request is a verdict (200), with
    the context window it was judged against and where that came from."""
    ex = gateway.exchange(path)
    try:
        admission = await admit(
            gateway, ex, request.scope["headers"], request.receive, peer_of(request.scope)
        )
    except ClientDisconnected:
        raise
    except GuardError as err:
        headers = {"x-request-id": ex.request_id or os.urandom(16).hex(), **err.headers}
        return JSONResponse(err.to_body(), status_code=err.status, headers=headers)
    verdict = admission.verdict
    result = verdict.to_dict()
    result["checks"] = [{"name": n, "outcome": o} for n, o in check_outcomes(verdict)]
    result.update(context.describe())
    headers = {"x-request-id": ex.request_id or os.urandom(16).hex()}
    if verdict.rejection is not None and not admission.checked:
        headers.update(verdict.rejection.headers)  # framing's (connection: close)
    return JSONResponse(result, headers=headers)


class _GuardApp(FastAPI):
    """FastAPI for the guard's own routes; proxied paths go straight to the gateway, which
    handles every error itself, without FastAPI's middleware stack (it is the hot path)."""

    gateway: Gateway | None = None
    proxy: AsgiProxy | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        proxy = self.proxy
        if proxy is not None and scope["type"] == "http" and scope["path"] not in GUARD_PATHS:
            await proxy(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


class _Dispatch:
    """Counts and logs the guard's own routes (the gateway does its own)."""

    def __init__(self, app: ASGIApp, gateway: Gateway) -> None:
        self.app = app
        self.gateway = gateway
        self.proxy = AsgiProxy(gateway)
        self.metrics = gateway.metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        if path not in GUARD_PATHS:  # only if called without _GuardApp in front
            await self.proxy(scope, receive, send)
            return
        start = time.perf_counter()
        status = [500]

        async def send_wrapper(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            duration = time.perf_counter() - start
            self.metrics.request_done(path, status[0], duration)
            if path not in _PROBES:
                self.gateway.access_log.emit(
                    {
                        "method": scope["method"],
                        "route": path,
                        "status": status[0],
                        "duration_ms": round(duration * 1000, 3),
                    }
                )


def _install_error_handlers(app: FastAPI) -> None:
    async def guard_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, GuardError)
        if isinstance(exc, ClientDisconnected):
            return Response(status_code=499)
        return _error_response(exc)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        err = GuardError(
            code, str(exc.detail), status=exc.status_code, headers=dict(exc.headers or {})
        )
        return _error_response(err)

    async def validation_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        first = exc.errors()[0] if exc.errors() else {}
        loc = ".".join(str(p) for p in first.get("loc", ()))
        err = GuardError("invalid_request", f"invalid {loc or 'request'}: {first.get('msg', '')}")
        return _error_response(err)

    async def internal_error(request: Request, exc: Exception) -> Response:
        return _error_response(InternalError())

    app.add_exception_handler(GuardError, guard_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(Exception, internal_error)


def _error_response(err: GuardError) -> JSONResponse:
    headers = {"x-request-id": os.urandom(16).hex(), **err.headers}
    return JSONResponse(err.to_body(), status_code=err.status, headers=headers)


_ERROR_SCHEMA = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": "string"},
            },
        }
    },
}


def _check_schema(policy: Policy) -> dict[str, Any]:
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"type": "object"}}},
        },
        "parameters": [
            {
                "name": "path",
                "in": "query",
                "required": False,
                "schema": {"type": "string", "enum": sorted(policy.allowed_routes)},
            }
        ],
    }


def _openapi_with_proxied_routes(app: FastAPI, policy: Policy) -> Callable[[], dict[str, Any]]:
    """The schema of the guard's own routes plus the proxied ones (served by the gateway)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = get_openapi(
            title=app.title, version=app.version, summary=app.summary, routes=app.routes
        )
        errors = {
            "description": "An OpenAI error body with a stable code",
            "content": {"application/json": {"schema": _ERROR_SCHEMA}},
        }
        paths = schema.setdefault("paths", {})
        for route in sorted(policy.allowed_routes):
            if route == "/v1/models":
                paths[route] = {
                    "get": {
                        "summary": "Proxied to the upstream",
                        "responses": {
                            "200": {"description": "The upstream's answer"},
                            "default": errors,
                        },
                    }
                }
                continue
            paths[route] = {
                "post": {
                    "summary": "Checked, then proxied to the upstream",
                    "requestBody": {
                        "required": True,
                        "content": {"application/json": {"schema": {"type": "object"}}},
                    },
                    "responses": {
                        "200": {"description": "The upstream's answer (JSON or SSE)"},
                        "default": errors,
                    },
                }
            }
        app.openapi_schema = schema
        return schema

    return openapi
