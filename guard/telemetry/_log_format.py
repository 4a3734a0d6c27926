"""One format for everything the guard writes to stderr: its own messages, uvicorn's, and the
access log (:mod:`guard.telemetry._access_log` renders its lines in the same format).

``json`` (the default): one JSON object a line, ``{"ts", "level", "logger", "message"}`` (and
``"exc"``, a traceback as one string) beside the access lines' ``{"ts", "event": "access", ...}``,
so that a log pipeline parses every line the same way. ``text``: for a terminal,
``<ts> <LEVEL> <logger>: <message>``, the access lines as ``key=value`` pairs after
``INFO schedguard.access:``.

:func:`logging_config` is a :func:`logging.config.dictConfig` dictionary: uvicorn takes it as its
``log_config`` (and applies it in every worker process), the commands apply it before they
start. uvicorn's loggers get no handler of their own and propagate to the root's, the one
handler, on stderr.
"""

from __future__ import annotations

import json
import logging
import logging.config
from typing import Any, Literal

from guard.telemetry._access_log import timestamp

__all__ = [
    "LOG_FORMATS",
    "START_LOGGER",
    "JsonFormatter",
    "LogFormat",
    "TextFormatter",
    "configure_logging",
    "logging_config",
]

LogFormat = Literal["json", "text"]
LOG_FORMATS: tuple[LogFormat, ...] = ("json", "text")
# The commands' start-up lines (where the guard listens, the policy in force): said at INFO
# whatever the level, which is uvicorn's and the guard's other messages'.
START_LOGGER = "schedguard.start"
# uvicorn's "trace" (its TRACE_LOG_LEVEL), below DEBUG.
_LEVELS = {"trace": 5, "debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50}
_ENCODER = json.JSONEncoder(separators=(",", ":"), default=str, ensure_ascii=True)


class JsonFormatter(logging.Formatter):
    """A record as one JSON line: ``ts`` (UTC, milliseconds, as the access log's), ``level``,
    ``logger``, ``message`` and, for an exception, ``exc``."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": timestamp(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            doc["exc"] = record.exc_text
        if record.stack_info:
            doc["stack"] = self.formatStack(record.stack_info)
        return _ENCODER.encode(doc)


class TextFormatter(logging.Formatter):
    """``<ts> <LEVEL> <logger>: <message>`` (the traceback on the lines after)."""

    def format(self, record: logging.LogRecord) -> str:
        line = (
            f"{timestamp(record.created)} {record.levelname} {record.name}: {record.getMessage()}"
        )
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def level_number(level: str | int) -> int:
    """``"info"`` (or uvicorn's ``"trace"``) as logging's number."""
    if isinstance(level, int):
        return level
    return _LEVELS.get(level.lower(), logging.INFO)


def logging_config(log_format: LogFormat, level: str | int = "info") -> dict[str, Any]:
    """The :func:`logging.config.dictConfig` for ``log_format`` at ``level``."""
    formatter = JsonFormatter if log_format == "json" else TextFormatter
    number = level_number(level)
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"schedguard": {"()": f"guard.telemetry.{formatter.__name__}"}},
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "formatter": "schedguard",
                "stream": "ext://sys.stderr",
            }
        },
        "loggers": {
            # uvicorn's own handlers (its default config) would print plain lines: none here.
            name: {"handlers": [], "level": number, "propagate": True}
            for name in ("uvicorn", "uvicorn.error", "uvicorn.access", "uvicorn.asgi")
        }
        | {START_LOGGER: {"level": min(number, logging.INFO)}},
        "root": {"handlers": ["stderr"], "level": number},
    }


def configure_logging(log_format: LogFormat, level: str | int = "info") -> None:
    """Apply :func:`logging_config` to this process."""
    logging.config.dictConfig(logging_config(log_format, level))
