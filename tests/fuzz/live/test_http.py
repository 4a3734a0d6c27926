"""fuzz.live._http: loopback only unless told otherwise, and one request rate across threads."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from fuzz.live import HttpClient, RemoteTargetRefused, RequestPacer, require_loopback


def test_loopback_only() -> None:
    for url in (
        "http://127.0.0.1:8000",
        "http://localhost:1",
        "http://[::1]:80",
        "https://127.5.5.5",
    ):
        require_loopback(url, allow_remote=False)
    for url in ("http://10.0.0.1:8000", "http://example.com", "http://8.8.8.8"):
        with pytest.raises(RemoteTargetRefused, match="loopback"):
            require_loopback(url, allow_remote=False)
        require_loopback(url, allow_remote=True)


def test_rate_limiter_spaces_requests_across_threads() -> None:
    limiter = RequestPacer(100.0)
    start = time.monotonic()

    def take() -> None:
        for _ in range(10):
            limiter.acquire()

    threads = [threading.Thread(target=take) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert limiter.sent == 40
    assert time.monotonic() - start >= 0.38  # 40 at 100/s: the first at once, then 10 ms apart


def test_each_request_on_a_kept_alive_connection_is_delivered_once(tmp_path: Path) -> None:
    # A body with Content-Length read to its end must leave the connection ready: the next
    # request was sent, failed with ResponseNotReady and was sent again by the retry.
    seen: list[str] = []

    class Counting(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def do_POST(self) -> None:
            seen.append(self.rfile.read(int(self.headers["content-length"])).decode())
            data = b'{"ok": true}'
            self.send_response(200)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Counting)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client = HttpClient(f"http://127.0.0.1:{server.server_port}", limiter=RequestPacer(100))
        for i in range(3):
            assert client.post_json("/v1/completions", f'{{"n": {i}}}'.encode()).status == 200
        client.close()
    finally:
        server.shutdown()
    assert seen == ['{"n": 0}', '{"n": 1}', '{"n": 2}']
