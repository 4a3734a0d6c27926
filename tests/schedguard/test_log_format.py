"""``schedguard serve --log-format json|text`` (issue 26): every line the guard writes to stderr
in one format -- its start-up lines, uvicorn's own messages and the access log -- and the access
line of a refusal with the bytes sent and the guard's time."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator

import pytest

from schedguard.servers import schedguard_argv
from tests._support import free_port

pytestmark = pytest.mark.timeout(120)

_TEXT = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (INFO|WARNING|ERROR) [\w.]+: ")


def _post(port: int, path: str, body: bytes) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("POST", path, body, {"content-type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def _wait_ready(port: int, proc: subprocess.Popen[bytes], path: str = "/healthz") -> None:
    deadline = time.monotonic() + 60  # an outer bound on the child's start, not a timing
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the server exited"
        with contextlib.suppress(OSError):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", path)
            if conn.getresponse().status == 200:
                return
        time.sleep(0.1)  # polling a child's start
    raise AssertionError("the guard did not start")


@contextlib.contextmanager
def _guard(*flags: str, **variables: str) -> Iterator[tuple[int, list[str]]]:
    """``schedguard serve`` in front of an upstream nobody listens on (``variables``: more
    environment); yields its port and, once stopped (SIGTERM), the lines it wrote to stderr."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDGUARD_")}
    env.update(variables)
    argv = schedguard_argv(
        "serve", "--upstream", f"http://127.0.0.1:{free_port()}", "--port", str(port), *flags
    )
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    lines: list[str] = []
    try:
        _wait_ready(port, proc)
        yield port, lines
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        lines.extend(line for line in err.decode().splitlines() if line.strip())


_REFUSED = b'{"model":"m","prompt":"hi","n":1000000}'


def test_json_every_line_is_one_object() -> None:
    with _guard("--log-format", "json") as (port, lines):
        status, body = _post(port, "/v1/completions", _REFUSED)
        assert status == 400
    docs = [json.loads(line) for line in lines]  # every line: a JSON object, or this fails
    messages = [d for d in docs if "event" not in d]
    access = [d for d in docs if d.get("event") == "access"]
    assert all({"ts", "level", "logger", "message"} <= set(d) for d in messages)
    by_logger = {d["logger"] for d in messages}
    assert {"uvicorn.error", "schedguard.start"} <= by_logger, by_logger
    assert any(d["message"].startswith("Uvicorn running on") for d in messages)
    assert any("policy in force" in d["message"] for d in messages)
    (refused,) = access
    assert (refused["status"], refused["code"]) == (400, "n_exceeded")
    assert refused["bytes_out"] == len(body) and refused["guard_ms"] > 0


@pytest.mark.parametrize(
    ("flags", "variables"),
    [
        (("--log-format", "text"), {}),
        ((), {"SCHEDGUARD_OBSERVABILITY__LOG_FORMAT": "text"}),  # the policy's field
    ],
    ids=["flag", "policy"],
)
def test_text_every_line_is_a_message_line(
    flags: tuple[str, ...], variables: dict[str, str]
) -> None:
    with _guard(*flags, **variables) as (port, lines):
        status, body = _post(port, "/v1/completions", _REFUSED)
        assert status == 400
    assert lines and all(_TEXT.match(line) for line in lines), lines
    assert not any(line.lstrip().startswith("{") for line in lines)
    assert any(" INFO uvicorn.error: Uvicorn running on" in line for line in lines)
    (refused,) = (line for line in lines if " schedguard.access: " in line)
    assert "status=400 code=n_exceeded" in refused
    assert f"bytes_out={len(body)}" in refused and "guard_ms=0.000" not in refused


def test_the_flag_is_json_or_text() -> None:
    from schedguard.cli import build_parser

    assert build_parser().parse_args(["serve", "--log-format", "text"]).log_format == "text"
    assert build_parser().parse_args(["extproc"]).log_format is None  # the policy's: json
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["extproc", "--log-format", "xml"])
    assert exc.value.code == 2


@pytest.mark.parametrize("log_format", ["json", "text"])
def test_the_reference_server_writes_the_same_formats(log_format: str) -> None:
    """``schedguard ref --log-format``: uvicorn's lines of the reference scheduler too."""
    port = free_port()
    argv = schedguard_argv("ref", "--port", str(port), "--log-format", log_format)
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _wait_ready(port, proc, "/health")
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    lines = [line for line in err.decode().splitlines() if line.strip()]
    assert any("Uvicorn running on" in line for line in lines), lines
    if log_format == "json":
        assert all(json.loads(line)["logger"] for line in lines)
    else:
        assert all(_TEXT.match(line) for line in lines), lines
