"""The guard as Envoy's external processor (``envoy.filters.http.ext_proc``): the same checks,
rate limits and concurrency as the proxy, over gRPC, with Envoy carrying the bytes.

Needs the ``extproc`` extra (grpcio, grpcio-health-checking, xds-protos). See
docs/deploy/envoy/ for Envoy's configuration.
"""

from __future__ import annotations

from guard.extproc._processor import BODY_NOT_BUFFERED, ExtProcStream, ProtocolError
from guard.extproc._server import SERVICE, ExternalProcessor, ExtProcOptions, run, serve

__all__ = [
    "BODY_NOT_BUFFERED",
    "SERVICE",
    "ExtProcOptions",
    "ExtProcStream",
    "ExternalProcessor",
    "ProtocolError",
    "run",
    "serve",
]
