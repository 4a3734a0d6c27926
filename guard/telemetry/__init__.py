"""Telemetry: Prometheus metrics built at scrape time, the access log and one format for every
log line (JSON or text), OpenTelemetry spans."""

from __future__ import annotations

from guard.telemetry._access_log import (
    LOGGER_NAME,
    AccessLog,
    RequestFields,
)
from guard.telemetry._log_format import (
    LOG_FORMATS,
    START_LOGGER,
    JsonFormatter,
    LogFormat,
    TextFormatter,
    configure_logging,
    logging_config,
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
    "LOG_FORMATS",
    "METRICS_DIR_ENV",
    "START_LOGGER",
    "SYNC_INTERVAL_S",
    "AccessLog",
    "GuardMetrics",
    "JsonFormatter",
    "LogFormat",
    "RequestFields",
    "RequestSpan",
    "TextFormatter",
    "Tracing",
    "configure_logging",
    "logging_config",
    "make_tracing",
    "otel_requested",
    "wipe_metrics_dir",
]
