"""loadtests.upstream_corpus judges what a payload did to an upstream: a fake upstream (a child
process) that answers, refuses, fails with a 500 or dies, as told by the request's path."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadtests.upstream_corpus import (
    LLAMACPP_REFUSAL,
    CorpusBudgets,
    healthy,
    prepare,
    process_tree,
    run_corpus,
    summarize,
    tree_memory,
)
from payloads.loader import Payload, parse_payload
from tests._support import free_port

SERVER = textwrap.dedent(
    """
    import http.server, json, os, sys

    class H(http.server.BaseHTTPRequestHandler):
        def _send(self, status, body):
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self._send(200, {"data": [{"id": "tiny-llama"}]})

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("content-length", 0)))
            if self.path == "/die":
                os._exit(3)
            if self.path == "/fail":
                return self._send(500, {"error": {"message": "boom", "type": "x"}})
            if self.path == "/invalid":
                return self._send(500, {"error": {"message": "1 validation error:\\n  {...}"}})
            if self.path == "/refuse":
                return self._send(400, {"error": {"message": "no", "code": "nope"}})
            self._send(200, {"model": json.loads(body)["model"]})

        def log_message(self, *a):
            pass

    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
    """
)


class FakeUpstream:
    name = "fake"

    def __init__(self, tmp: Path) -> None:
        self.script = tmp / "server.py"
        self.script.write_text(SERVER)
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self.start()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, str(self.script), str(self.port)])
        deadline = time.monotonic() + 30
        while not healthy(self.base_url, 1.0):
            assert time.monotonic() < deadline and self.proc.poll() is None
            time.sleep(0.05)  # waiting for the child to listen

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        if self.proc is not None:
            self.proc.wait()

    def restart(self) -> None:
        self.stop()
        self.restarts += 1
        self.start()


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeUpstream]:
    up = FakeUpstream(tmp_path)
    yield up
    up.stop()


def _payload(pid: str, endpoint: str, cls: str = "volume") -> Payload:
    return parse_payload(
        {
            "id": pid,
            "class": cls,
            "description": "d",
            "target_field": "messages",
            "endpoint": endpoint,
            "body": {"model": "schedguard-ref", "messages": []},
            "expect": {"status": 200} if cls == "benign" else {"status": 400, "code": "x"},
        },
        Path(f"{pid}.yaml"),
    )


def test_prepare_names_the_served_model() -> None:
    payload = _payload("a", "/ok")
    _, body = prepare(payload, "tiny-llama")
    assert b'"tiny-llama"' in body and b"schedguard-ref" not in body


def test_outcomes_are_judged_and_a_dead_upstream_restarted(fake: FakeUpstream) -> None:
    payloads = [
        _payload("ok", "/ok", "benign"),
        _payload("refused", "/refuse"),
        _payload("fails", "/fail"),
        _payload("invalid", "/invalid"),
        _payload("dies", "/die"),
        _payload("after", "/ok"),
    ]
    budgets = CorpusBudgets(timeout_s=10.0, recover_s=2.0)
    out = run_corpus(
        payloads,
        fake.base_url,
        fake,
        model="tiny-llama",
        budgets=budgets,
        refusal_5xx=LLAMACPP_REFUSAL,
    )
    got = {o.id: (o.status, o.harm, o.alive_after) for o in out}
    assert got == {
        "ok": (200, [], True),
        "refused": (400, [], True),
        "fails": (500, ["500"], True),
        "invalid": (500, [], True),  # the server's refusal of invalid input
        "dies": (0, ["crash"], False),
        "after": (200, [], True),
    }
    assert fake.restarts == 1
    assert out[1].code == "nope"
    summary = {s.class_: s for s in summarize(out)}
    assert summary["volume"].harmed == 2 and summary["volume"].payloads == 5
    assert summary["volume"].harms == {"500": 1, "crash": 1}
    assert summary["benign"].verdict == "contained"


def test_tree_memory_reads_proc(fake: FakeUpstream) -> None:
    assert fake.pid in process_tree(fake.pid)
    rss, hwm = tree_memory(fake.pid)
    assert 0 < rss <= hwm
