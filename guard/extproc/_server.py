"""``schedguard extproc``: the guard as Envoy's external processor, a gRPC server (grpc.aio).

One process serves ``envoy.service.ext_proc.v3.ExternalProcessor`` and the standard gRPC health
service (``grpc.health.v1.Health``: ``SERVING`` once started, ``NOT_SERVING`` while it stops), on
one port; with ``--workers N`` N processes bind it (``SO_REUSEPORT``: the kernel spreads Envoy's
connections), each with its own gateway (rate-limit buckets shared only through Redis), and
their metrics meet in one directory as the proxy's workers' do. The admin listener
(``admin.listen`` or ``--admin-port``) serves ``/healthz``, ``/readyz`` (the processor is serving
and, with Redis limits that fail closed, Redis answers) and ``/metrics``.

The upstream (``--upstream``, optional) is only asked what it says of itself
(``GET /v1/models``: its context window, its kind), as the proxy does; Envoy forwards.

It fails closed with Envoy's ``failure_mode_allow: false`` (the default): a processor that is
down, too slow (``message_timeout``) or ends a stream with an error gets the client a 5xx from
Envoy, and nothing reaches the upstream.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import multiprocessing
import os
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from fastapi.responses import JSONResponse, Response
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from guard.admin import AdminListener, admin_app
from guard.admission import RedisRateLimiter
from guard.context_window import ContextWindow
from guard.extproc._processor import ExtProcStream, ProtocolError
from guard.gateway import Gateway, build_gateway
from guard.http import Upstream, dropped_headers
from guard.policy import Policy, load_policy
from guard.telemetry import CONTENT_TYPE, AccessLog, configure_logging
from guard.upstream_capacity import UpstreamCapacity

__all__ = ["ExtProcOptions", "ExternalProcessor", "run", "serve"]

_log = logging.getLogger("schedguard.guard")

SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
# Envoy sends a buffered body in one message, up to its own buffer limit. The gRPC message cap
# is a few times the policy's largest body, so that a body somewhat over the cap (an Envoy whose
# buffer is larger than the policy's cap) is still refused by the policy with its 413 and code;
# past that, gRPC refuses the message and Envoy, failing closed, answers 500.
_BODY_MESSAGES = 4
_MESSAGE_SLACK = 64 << 10
_GRACE_S = 5.0


class ExternalProcessor(pb_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    """The ``Process`` stream of each request, answered by a :class:`Gateway`."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.dropped = dropped_headers(gateway.policy.upstream)

    async def Process(self, requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
        exchange = ExtProcStream(self.gateway, self.dropped)
        try:
            async for answer in exchange.run(requests):
                yield answer
        except ProtocolError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except (asyncio.CancelledError, grpc.aio.AbortError):
            raise
        except Exception:
            _log.exception("unexpected error in an ext_proc stream")
            await context.abort(grpc.StatusCode.INTERNAL, "the guard failed; the error was logged")


@dataclass(frozen=True)
class ExtProcOptions:
    host: str = "127.0.0.1"
    port: int = 50051
    workers: int = 1
    upstream: str | None = None
    admin: tuple[str, int] | None = None
    metrics_dir: str | None = None
    log_level: str = "info"  # a spawned worker's (its log format is the policy's)


def _upstream(policy: Policy, opts: ExtProcOptions) -> Upstream | None:
    """The client that asks the upstream about itself, if there is an upstream to ask."""
    if opts.upstream:
        return Upstream(replace(policy.upstream, url=opts.upstream))
    if policy.upstream.url:
        return Upstream(policy.upstream)
    return None


async def serve(
    policy: Policy,
    opts: ExtProcOptions,
    started: asyncio.Event | None = None,
    gateway: Gateway | None = None,
) -> None:
    """Serve in this process until cancelled (or SIGINT/SIGTERM under :func:`run`); ``started``
    is set once serving. ``gateway``: one built by the caller (tests look into it)."""
    upstream = _upstream(policy, opts)
    if gateway is None:
        gateway = build_gateway(
            policy,
            upstream=None,  # Envoy forwards: the upstream is only asked about /v1/models
            access_log=AccessLog(
                policy.observability.access_log,
                stream=sys.stderr,
                log_format=policy.observability.log_format,
            ),
            metrics_dir=opts.metrics_dir,
        )
    gateway.warm_up()
    largest = _BODY_MESSAGES * policy.limits.body.largest_body + _MESSAGE_SLACK
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", largest),
            ("grpc.max_send_message_length", largest),
            ("grpc.so_reuseport", 1 if opts.workers > 1 else 0),
        ]
    )
    pb_grpc.add_ExternalProcessorServicer_to_server(ExternalProcessor(gateway), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    bound = server.add_insecure_port(f"{opts.host}:{opts.port}")
    if bound == 0:
        raise OSError(f"cannot bind {opts.host}:{opts.port}")
    context = ContextWindow(gateway, upstream) if upstream is not None else None
    capacity = UpstreamCapacity(gateway, upstream) if upstream is not None else None
    serving = asyncio.Event()

    async def healthz() -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz() -> Response:
        return await _readiness(gateway, context, capacity, serving)

    async def prometheus() -> Response:
        return Response(gateway.metrics.render(), media_type=CONTENT_TYPE)

    admin = None
    listen = opts.admin or gateway.policy.admin.listen_address
    if listen is not None:
        admin = AdminListener(admin_app(healthz, readyz, prometheus), *listen)
    try:
        if context is not None:
            await context.start()
        if capacity is not None:
            await capacity.start()
        if admin is not None:
            await admin.start()
        async with gateway.running():
            await _serve(server, health_servicer, opts, serving, started)
    finally:
        if admin is not None:
            await admin.stop()
        if capacity is not None:
            await capacity.stop()
        if context is not None:
            await context.stop()
        if upstream is not None:
            await upstream.aclose()


async def _serve(
    server: Any,
    health_servicer: Any,
    opts: ExtProcOptions,
    serving: asyncio.Event,
    started: asyncio.Event | None,
) -> None:
    """Run the gRPC server until cancelled; ``serving`` while it does (``/readyz``)."""
    try:
        await server.start()
        # What lives as long as the process (the policy, patterns, the tokenizer's tables) out
        # of the cyclic collector's reach, as the proxy does at its first request.
        gc.freeze()
        serving.set()
        for name in ("", SERVICE):
            await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
        _log.info("schedguard extproc: serving %s on %s:%d", SERVICE, opts.host, opts.port)
        if started is not None:
            started.set()
        await server.wait_for_termination()
    finally:
        serving.clear()
        with contextlib.suppress(Exception):
            await health_servicer.enter_graceful_shutdown()
        await server.stop(_GRACE_S)


async def _readiness(
    gateway: Gateway,
    context: ContextWindow | None,
    capacity: UpstreamCapacity | None,
    serving: asyncio.Event,
) -> Response:
    """200 when the processor serves and its rate limiter can decide (a Redis that fails
    closed answers); the context window in force, as the proxy's ``/readyz`` says it."""
    if not serving.is_set():
        return JSONResponse({"status": "starting"}, status_code=503)
    limiter = gateway.limiter
    body: dict[str, Any] = {"status": "ready"}
    if isinstance(limiter, RedisRateLimiter) and not await limiter.healthy():
        if limiter.on_error == "closed":
            return JSONResponse({"status": "rate_limiter_unavailable"}, status_code=503)
        body["rate_limiter"] = "failing_open"
    if context is not None:
        await context.refresh()
        body.update(context.describe())
    if capacity is not None:
        body.update(capacity.describe())
    return JSONResponse(body)


def _worker(policy_path: str | None, opts: ExtProcOptions) -> None:
    """One worker process: load the policy as the parent did (file and environment), serve."""
    policy = load_policy(policy_path, os.environ)
    configure_logging(policy.observability.log_format, opts.log_level)
    _run_loop(policy, opts)


def _run_loop(policy: Policy, opts: ExtProcOptions) -> None:
    import uvloop

    async def main() -> None:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await serve(policy, opts)

    uvloop.run(main())


def run(policy: Policy, opts: ExtProcOptions, policy_path: str | None = None) -> None:
    """Serve until SIGINT/SIGTERM: in this process, or in ``opts.workers`` processes."""
    if opts.workers <= 1:
        _run_loop(policy, opts)
        return
    if policy.rate.redis_url is None:
        _log.warning(
            "%d workers without Redis: each worker keeps its own rate-limit buckets",
            opts.workers,
        )
    import shutil
    import tempfile

    from guard.telemetry import METRICS_DIR_ENV

    made = None
    metrics_dir = os.environ.get(METRICS_DIR_ENV)
    if not metrics_dir:
        metrics_dir = made = tempfile.mkdtemp(prefix="schedguard-metrics-")
    opts = replace(opts, metrics_dir=metrics_dir)
    spawn = multiprocessing.get_context("spawn")  # gRPC does not survive fork
    children = [
        spawn.Process(target=_worker, args=(policy_path, opts), name=f"extproc-{i}")
        for i in range(opts.workers)
    ]
    for child in children:
        child.start()

    def stop(*_: Any) -> None:
        for child in children:
            if child.pid is not None and child.is_alive():
                os.kill(child.pid, signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        for child in children:
            child.join()
    finally:
        stop()
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)
