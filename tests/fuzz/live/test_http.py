"""fuzz.live._http: loopback only unless told otherwise, and one request rate across threads."""

from __future__ import annotations

import threading
import time

import pytest

from fuzz.live import RemoteTargetRefused, RequestPacer, require_loopback


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
