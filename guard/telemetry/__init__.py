"""Telemetry: Prometheus metrics built at scrape time, the JSON access log, OpenTelemetry spans."""

from __future__ import annotations

from guard.telemetry._access_log import (
    LOGGER_NAME,
    AccessLog,
    RequestFields,
)
from guard.telemetry._metrics import (
    CONTENT_TYPE,
    GuardMetrics,
)
from guard.telemetry._tracing import (
    RequestSpan,
    Tracing,
    make_tracing,
    otel_requested,
)

__all__ = [
    "CONTENT_TYPE",
    "LOGGER_NAME",
    "AccessLog",
    "GuardMetrics",
    "RequestFields",
    "RequestSpan",
    "Tracing",
    "make_tracing",
    "otel_requested",
]
