"""One structured line per request: a JSON object, or in the ``text`` log format the same
fields as ``key=value`` pairs (:mod:`guard.telemetry._log_format`, the format of every other
line the guard writes).

The line holds what an operator needs to find and explain a request (id, route, status, error
code, tenant, timings, token counts, sizes) and nothing of its content: no prompt text, no
headers, no keys. A refusal's ``bytes_out`` is its error body and its ``guard_ms`` the guard's
time until it refused. The path is logged only for known routes (an unknown path is attacker text);
the client's ``x-request-id`` is logged only if it is short printable ASCII (see
:mod:`guard.http._framing`).

Two sinks: the ``schedguard.access`` logger (the default, for hosts and tests that configure
logging), or a stream written directly (``schedguard serve``: stderr), where lines are batched
and written every ``flush_interval_s`` or 64 lines, whichever comes first, from the event loop,
because a logging call and a write system call per request cost a good share of the guard's own
time per request (and a bigger batch pauses the loop longer).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any, NamedTuple, TextIO

__all__ = ["LOGGER_NAME", "AccessLog", "RequestFields", "timestamp"]

LOGGER_NAME = "schedguard.access"
# Lines written at once beyond this: a flush holds the event loop while it formats (~6 us a
# line), so a batch of 64 pauses other requests ~0.4 ms where 512 paused them ~3 ms.
_MAX_BUFFERED = 64


class AccessLog:
    """Writes access lines when enabled (to ``stream`` if given, else to the logger at INFO)."""

    def __init__(
        self,
        enabled: bool = True,
        logger: logging.Logger | None = None,
        *,
        stream: TextIO | None = None,
        flush_interval_s: float = 0.1,
        log_format: str = "json",
    ) -> None:
        self.enabled = enabled
        # "json", or "text": the same fields as key=value pairs (guard.telemetry._log_format)
        self._render = _render if log_format == "json" else _render_text
        self.logger = logger or logging.getLogger(LOGGER_NAME)
        self._stream = stream
        self._interval = flush_interval_s
        # (time, fields) not yet written: lines are formatted at flush, many at once, which
        # costs far less per line than formatting each amid a request's other work.
        self._pending: list[tuple[float, dict[str, Any] | RequestFields]] = []
        self._scheduled = False

    def emit(self, fields: dict[str, Any] | RequestFields) -> None:
        """Log one request: a dict (None values left out) or, for a proxied request, its
        :class:`RequestFields`; either is the caller's to give away."""
        if not self.enabled:
            return
        if self._stream is None:
            if self.logger.isEnabledFor(logging.INFO):
                self.logger.info(self._render(time.time(), fields))
            return
        self._pending.append((time.time(), fields))
        if len(self._pending) >= _MAX_BUFFERED:
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
        if not self._pending or self._stream is None:
            return
        pending, self._pending = self._pending, []
        render = self._render
        lines = [render(at, fields) for at, fields in pending]
        text = "\n".join(lines) + "\n"
        try:
            self._stream.write(text)
            self._stream.flush()
        except (OSError, ValueError):  # a closed or broken stream must not fail requests
            pass


class RequestFields(NamedTuple):
    """What a proxied request's line holds, in its order (None: left out)."""

    request_id: str
    method: str
    route: str
    status: int
    code: str | None
    upstream_code: str | None
    truncated: str | None  # upstream_stream_truncated: how the upstream's stream ended early
    tenant: str | None
    stream: bool
    duration_s: float
    guard_s: float
    queue_s: float | None
    upstream_s: float | None
    prompt_tokens: int
    completion_tokens: int
    bytes_in: int
    bytes_out: int


_quote = json.encoder.encode_basestring_ascii  # what the encoder does to strings


def _ms(seconds: float) -> str:
    return "%.3f" % (seconds * 1000)


def _request_line(at: float, f: RequestFields) -> str:
    """The same JSON as :func:`_line` would give, the ``_s`` fields as ``_ms``, without a
    dictionary per line (the guard writes one per request)."""
    parts = [
        '{"ts":"',
        timestamp(at),
        '","event":"access","request_id":',
        _quote(f.request_id),
        ',"method":',
        _quote(f.method),
        ',"route":',
        _quote(f.route),
        ',"status":',
        str(int(f.status)),
    ]
    if f.code is not None:
        parts += (',"code":', _quote(f.code))
    if f.upstream_code is not None:
        parts += (',"upstream_code":', _quote(f.upstream_code))
    if f.truncated is not None:
        parts += (',"upstream_stream_truncated":', _quote(f.truncated))
    if f.tenant is not None:
        parts += (',"tenant":', _quote(f.tenant))
    parts += (
        ',"stream":',
        "true" if f.stream else "false",
        ',"duration_ms":',
        _ms(f.duration_s),
        ',"guard_ms":',
        _ms(f.guard_s),
    )
    if f.queue_s is not None:
        parts += (',"queue_ms":', _ms(f.queue_s))
    if f.upstream_s is not None:
        parts += (',"upstream_ms":', _ms(f.upstream_s))
    parts += (
        ',"prompt_tokens":',
        str(int(f.prompt_tokens)),
        ',"completion_tokens":',
        str(int(f.completion_tokens)),
        ',"bytes_in":',
        str(int(f.bytes_in)),
        ',"bytes_out":',
        str(int(f.bytes_out)),
        "}",
    )
    return "".join(parts)


def _render(at: float, fields: dict[str, Any] | RequestFields) -> str:
    return _request_line(at, fields) if isinstance(fields, RequestFields) else _line(at, fields)


def _render_text(at: float, fields: dict[str, Any] | RequestFields) -> str:
    """``<ts> INFO schedguard.access: key=value ...``, the fields of the JSON line in its order
    (strings quoted when they hold a space, a quote or ``=``)."""
    if isinstance(fields, RequestFields):
        pairs: dict[str, Any] = {}
        for key, value in fields._asdict().items():
            if key == "truncated":
                key = "upstream_stream_truncated"  # the JSON line's name
            elif key.endswith("_s"):
                key, value = key[:-2] + "_ms", None if value is None else _ms(value)
            pairs[key] = value
    else:
        pairs = fields
    text = " ".join(
        f"{key}={_text_value(value)}" for key, value in pairs.items() if value is not None
    )
    return f"{timestamp(at)} INFO {LOGGER_NAME}: {text}"


def _text_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    text = str(value)
    if not text or any(c in text for c in ' "=\\') or not text.isprintable():
        return _quote(text)
    return text


def _line(at: float, fields: dict[str, Any]) -> str:
    record = {"ts": timestamp(at), "event": "access"}
    for key, value in fields.items():
        if value is not None:
            record[key] = value
    return _ENCODER.encode(record)


_ENCODER = json.JSONEncoder(separators=(",", ":"), default=str)  # one encoder, reused
_second: list[Any] = [-1, ""]  # the formatted current second, reformatted once a second


def timestamp(now: float) -> str:
    """``now`` (``time.time()``) as ``2026-01-02T03:04:05.678Z``."""
    whole = int(now)
    if whole != _second[0]:
        _second[0], _second[1] = whole, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole))
    return f"{_second[1]}.{int((now - whole) * 1000):03d}Z"
