"""A throwaway redis-server for tests: a free 127.0.0.1 port, a temp dir, no persistence.

Tests never rely on a system Redis service. When the binary is missing, :func:`require_binary`
fails under ``CI=true`` (CI forgot to install it: ``apt-get install -y redis-server``) and skips
otherwise, so a developer without Redis can still run the rest.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests._support import free_port

INSTALL_HINT = "apt-get update && apt-get install -y redis-server"


def find_binary() -> str | None:
    return os.environ.get("REDIS_SERVER_BIN") or shutil.which("redis-server")


def require_binary() -> str:
    binary = find_binary()
    if binary is not None:
        return binary
    message = f"redis-server not found on PATH; install it with `{INSTALL_HINT}`"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{message} (CI=true: the Redis tests must run in CI)", pytrace=False)
    pytest.skip(message)


def _pong(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """``start()`` / ``stop()`` / ``restart()`` a private redis-server; ``url`` to connect."""

    def __init__(self, binary: str | None = None, port: int | None = None) -> None:
        self.binary = binary or require_binary()
        self.port = port or free_port()
        self._dir = tempfile.TemporaryDirectory(prefix="schedguard-redis-")
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def start(self, timeout_s: float = 10.0) -> None:
        """Start and wait until it answers PING. A port taken meanwhile is retried elsewhere."""
        for _attempt in range(3):
            self._spawn()
            deadline = time.monotonic() + timeout_s
            assert self._proc is not None
            while time.monotonic() < deadline and self._proc.poll() is None:
                if _pong(self.port):
                    return
                time.sleep(0.02)
            self.stop()
            self.port = free_port()
        log = Path(self._dir.name, "redis.log")
        tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
        raise RuntimeError(f"redis-server did not start:\n{tail}")

    def _spawn(self) -> None:
        args = [
            self.binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", self._dir.name,
            "--logfile", str(Path(self._dir.name, "redis.log")),
            "--save", "",
            "--appendonly", "no",
            "--daemonize", "no",
            "--maxmemory", "64mb",
            "--io-threads", "1",
        ]  # fmt: skip
        self._proc = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
        )

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        self.resume()
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)

    def restart(self) -> None:
        """Stop and start again on the same port (state is lost: nothing is persisted)."""
        self.stop()
        self.start()

    def pause(self) -> None:
        """SIGSTOP: the server keeps its sockets but answers nothing (a hung Redis)."""
        if self._proc is not None:
            os.kill(self._proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            os.kill(self._proc.pid, signal.SIGCONT)

    def close(self) -> None:
        self.stop()
        self._dir.cleanup()

    def __enter__(self) -> RedisServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
