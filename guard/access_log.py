"""One structured JSON line per request.

The line holds what an operator needs to find and explain a request (id, route, status, error
code, tenant, timings, token counts, sizes) and nothing of its content: no prompt text, no
headers, no keys. The path is logged only for known routes (an unknown path is attacker text);
the client's ``x-request-id`` is logged only if it is short printable ASCII (see
:mod:`guard.framing`).

Two sinks: the ``schedguard.access`` logger (the default, for hosts and tests that configure
logging), or a stream written directly (``schedguard serve``: stderr), where lines are batched
and written at most every ``flush_interval_s`` from the event loop, because a logging call and a
write system call per request cost a good share of the guard's own time per request.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any, TextIO

__all__ = ["LOGGER_NAME", "AccessLog"]

LOGGER_NAME = "schedguard.access"
_MAX_BUFFERED = 512  # lines; written at once beyond this


class AccessLog:
    """Writes access lines when enabled (to ``stream`` if given, else to the logger at INFO)."""

    def __init__(
        self,
        enabled: bool = True,
        logger: logging.Logger | None = None,
        *,
        stream: TextIO | None = None,
        flush_interval_s: float = 0.1,
    ) -> None:
        self.enabled = enabled
        self.logger = logger or logging.getLogger(LOGGER_NAME)
        self._stream = stream
        self._interval = flush_interval_s
        self._lines: list[str] = []
        self._scheduled = False

    def emit(self, fields: dict[str, Any]) -> None:
        if not self.enabled:
            return
        if self._stream is None and not self.logger.isEnabledFor(logging.INFO):
            return
        record = {"ts": _timestamp(), "event": "access"}
        for key, value in fields.items():
            if value is not None:
                record[key] = value
        line = _ENCODER.encode(record)
        if self._stream is None:
            self.logger.info(line)
            return
        self._lines.append(line)
        if len(self._lines) >= _MAX_BUFFERED:
            self.flush()
        elif not self._scheduled:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                self.flush()
                return
            self._scheduled = True
            loop.call_later(self._interval, self.flush)

    def flush(self) -> None:
        self._scheduled = False
        if not self._lines or self._stream is None:
            return
        lines, self._lines = self._lines, []
        try:
            self._stream.write("\n".join(lines) + "\n")
            self._stream.flush()
        except (OSError, ValueError):  # a closed or broken stream must not fail requests
            pass


_ENCODER = json.JSONEncoder(separators=(",", ":"), default=str)  # one encoder, reused
_second: list[Any] = [-1, ""]  # the formatted current second, reformatted once a second


def _timestamp() -> str:
    now = time.time()
    whole = int(now)
    if whole != _second[0]:
        _second[0], _second[1] = whole, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole))
    return f"{_second[1]}.{int((now - whole) * 1000):03d}Z"
