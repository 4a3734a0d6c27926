"""guard.telemetry's log formats: a record as one JSON line or one text line, uvicorn's loggers
through the same handler, the access log in either format with the same fields."""

from __future__ import annotations

import io
import json
import logging
import logging.config
import re
from collections.abc import Iterator

import pytest

from guard.telemetry import (
    START_LOGGER,
    AccessLog,
    JsonFormatter,
    RequestFields,
    TextFormatter,
    logging_config,
)


def _record(message: str, *args: object, exc: bool = False) -> logging.LogRecord:
    info = None
    if exc:
        try:
            raise ValueError("boom")
        except ValueError:
            import sys

            info = sys.exc_info()
    return logging.LogRecord("uvicorn.error", logging.ERROR, __file__, 1, message, args, info)


def test_json_formatter_one_line_per_record_traceback_included() -> None:
    line = JsonFormatter().format(_record("a %s\nb", "x", exc=True))
    assert "\n" not in line
    doc = json.loads(line)
    assert doc["level"] == "error" and doc["logger"] == "uvicorn.error"
    assert doc["message"] == "a x\nb" and "ValueError: boom" in doc["exc"]
    assert doc["ts"].endswith("Z")


def test_text_formatter() -> None:
    line = TextFormatter().format(_record("started %d", 7))
    assert line.endswith(" ERROR uvicorn.error: started 7")


@pytest.fixture
def configured() -> Iterator[io.StringIO]:
    """The guard's logging config (json, level warning) with its handler on a buffer."""
    stream = io.StringIO()
    config = logging_config("json", "warning")
    config["handlers"]["stderr"]["stream"] = stream
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    logging.config.dictConfig(config)
    try:
        yield stream
    finally:
        root.handlers, root.level = saved[0], saved[1]
        for name in ("uvicorn", "uvicorn.error", "uvicorn.access", START_LOGGER):
            logging.getLogger(name).setLevel(logging.NOTSET)


def test_uvicorns_loggers_and_the_start_lines_go_through_the_one_handler(
    configured: io.StringIO,
) -> None:
    logging.getLogger("uvicorn.error").warning("Uvicorn running on %s", "http://x")
    logging.getLogger("uvicorn.error").info("below the level")
    logging.getLogger(START_LOGGER).info("policy in force: ...")  # said whatever the level
    logging.getLogger("schedguard.guard").warning("open files")
    docs = [json.loads(line) for line in configured.getvalue().splitlines()]
    assert [(d["logger"], d["message"]) for d in docs] == [
        ("uvicorn.error", "Uvicorn running on http://x"),
        (START_LOGGER, "policy in force: ..."),
        ("schedguard.guard", "open files"),
    ]


_FIELDS = RequestFields(
    request_id="r1",
    method="POST",
    route="/v1/completions",
    status=400,
    code="n_exceeded",
    upstream_code=None,
    truncated=None,
    tenant="team a",
    stream=False,
    duration_s=0.002,
    guard_s=0.0015,
    queue_s=None,
    upstream_s=None,
    prompt_tokens=0,
    completion_tokens=0,
    bytes_in=38,
    bytes_out=117,
)


@pytest.mark.parametrize("fields", [_FIELDS, {"method": "GET", "route": "/v1/models", "x": None}])
def test_the_access_log_in_text_has_the_json_lines_fields(
    fields: RequestFields | dict[str, object],
) -> None:
    as_json, as_text = io.StringIO(), io.StringIO()
    AccessLog(stream=as_json).emit(fields)
    AccessLog(stream=as_text, log_format="text").emit(fields)
    doc = json.loads(as_json.getvalue())
    text = as_text.getvalue().strip()
    head, _, pairs = text.partition(" INFO schedguard.access: ")
    # Each line has its own time (two emits, maybe a millisecond apart): the same format.
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", head), head
    assert len(head) == len(doc["ts"])
    expected = {k: v for k, v in doc.items() if k not in ("ts", "event")}
    said = {}
    for key, value in (pair.split("=", 1) for pair in _split(pairs)):
        said[key] = json.loads(value) if value.startswith('"') else value
    assert said.keys() == expected.keys()
    for key, value in expected.items():
        shown = ("true" if value else "false") if isinstance(value, bool) else value
        assert str(said[key]) == (f"{shown:.3f}" if isinstance(shown, float) else str(shown))


def _split(pairs: str) -> list[str]:
    """key=value pairs separated by spaces, quoted values kept whole."""
    out, current, quoted = [], "", False
    for char in pairs:
        if char == '"':
            quoted = not quoted
        if char == " " and not quoted:
            out.append(current)
            current = ""
        else:
            current += char
    return [*out, current]
