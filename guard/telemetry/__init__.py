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
from guard.telemetry._multiprocess import METRICS_DIR_ENV, SYNC_INTERVAL_S, wipe_metrics_dir
from guard.telemetry._tracing import (
    RequestSpan,
    Tracing,
    make_tracing,
    otel_requested,
)

__all__ = [
    "CONTENT_TYPE",
    "LOGGER_NAME",
    "METRICS_DIR_ENV",
    "SYNC_INTERVAL_S",
    "AccessLog",
    "GuardMetrics",
    "RequestFields",
    "RequestSpan",
    "Tracing",
    "make_tracing",
    "otel_requested",
    "wipe_metrics_dir",
]
