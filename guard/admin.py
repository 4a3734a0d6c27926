"""Who may read ``/metrics``, and the separate admin listener (the policy's ``admin`` section).

``/metrics`` names tenants and counts their tokens. On the public port it is open only while
the policy lists no keys and asks for nothing else (:func:`metrics_refusal`); once keys exist a
scrape needs the admin token (``admin.metrics_key_sha256``) or an address in
``admin.metrics_allow``. With ``admin.listen`` the guard also serves ``/healthz``, ``/readyz``
and ``/metrics`` on a listener of their own (:class:`AdminListener`, started by the app's
lifespan in each worker; ``SO_REUSEPORT`` lets every worker bind it), and the public port no
longer serves ``/metrics``.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import uvicorn
from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from starlette.types import Scope
from uvicorn.server import ServerState

from guard.errors import GuardError, NotFound
from guard.http import GuardHttpToolsProtocol
from guard.policy import AdminPolicy, Policy, key_digest

__all__ = ["AdminListener", "admin_app", "metrics_open", "metrics_refusal"]


def metrics_open(policy: Policy) -> bool:
    """Whether ``/metrics`` on the public port needs nothing (see ``admin.metrics_open``)."""
    admin = policy.admin
    if admin.metrics_open is not None:
        return admin.metrics_open
    return not policy.keys and admin.metrics_key_sha256 is None and not admin.metrics_allow


def metrics_refusal(policy: Policy, scope: Scope) -> GuardError | None:
    """Why this scrape of ``/metrics`` on the public port is refused, or None when it may read."""
    admin = policy.admin
    if admin.listen is not None:
        return NotFound("not_found", f"/metrics is served on the admin listener ({admin.listen})")
    if metrics_open(policy):
        return None
    if _allowed_address(admin, scope.get("client")):
        return None
    if admin.metrics_key_sha256 is not None:
        token = _bearer(scope)
        if token is not None and hmac.compare_digest(key_digest(token), admin.metrics_key_sha256):
            return None
        return GuardError(
            "admin_key_required",
            "/metrics needs the admin token: send 'Authorization: Bearer <token>'",
            status=401,
        )
    return GuardError(
        "metrics_forbidden",
        "/metrics is not served to this address (the policy's admin.metrics_allow)",
        status=403,
    )


def _allowed_address(admin: AdminPolicy, client: Any) -> bool:
    if not admin.metrics_allow or not client:
        return False
    try:
        address = ipaddress.ip_address(str(client[0]))
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return any(address in network for network in admin.allowed_networks)


def _bearer(scope: Scope) -> str | None:
    values = [v for k, v in scope.get("headers", ()) if k == b"authorization"]
    if len(values) != 1:
        return None
    raw: bytes = values[0]
    scheme, _, token = raw.decode("latin-1").partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or len(token) > 256:
        return None
    return token


def admin_app(
    healthz: Callable[[], Awaitable[Response]],
    readyz: Callable[[], Awaitable[Response]],
    metrics: Callable[[], Awaitable[Response]],
) -> FastAPI:
    """The admin listener's app: ``/healthz``, ``/readyz``, ``/metrics``; 404 for the rest."""
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
    app.add_api_route("/healthz", healthz, methods=["GET"])
    app.add_api_route("/readyz", readyz, methods=["GET"])
    app.add_api_route("/metrics", metrics, methods=["GET"])

    async def not_found(request: Any, exc: Exception) -> Response:
        err = NotFound("not_found", "the admin listener serves /healthz, /readyz and /metrics")
        return JSONResponse(err.to_body(), status_code=404)

    app.add_exception_handler(404, not_found)
    return app


class AdminListener:
    """``app`` served on ``host:port`` on the running loop, with the guard's HTTP protocol
    (its head cap and connection limits), until :meth:`stop`."""

    def __init__(self, app: FastAPI, host: str, port: int) -> None:
        self.app = app
        self.host = host
        self.port = port
        self._server: asyncio.base_events.Server | None = None
        self._state = ServerState()

    async def start(self) -> None:
        config = uvicorn.Config(
            self.app,
            http=GuardHttpToolsProtocol,
            lifespan="off",
            log_config=None,
            access_log=False,
            server_header=False,
            proxy_headers=False,
        )
        config.load()
        state = self._state
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if hasattr(socket, "SO_REUSEPORT"):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)  # one per worker
        try:
            sock.bind((self.host, self.port))
        except OSError:
            sock.close()
            raise
        sock.setblocking(False)
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: GuardHttpToolsProtocol(config=config, server_state=state, app_state={}),
            sock=sock,
            backlog=128,
        )

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        for connection in list(self._state.connections):
            connection.shutdown()
        for task in list(self._state.tasks):
            task.cancel()
