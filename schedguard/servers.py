"""Servers the commands, the benchmarks and the tests start as capped child processes.

A :class:`ServerSpec` says how to start one server given the ports of all servers of its target
(so a guard can point at its upstream); :class:`RunningServer` owns the process, its RSS sampler
and its log, and is always stopped, whatever happened to it. Only the standard library talks
HTTP here: ``schedguard serve`` and ``schedguard demo`` run from a plain install of the wheel.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import IO

from guard.isolation import PeakRssSampler, spawn_limited_server, stop_server

ArgvFactory = Callable[[Mapping[str, int], str], list[str]]

_OOM_EXIT_CODE = 137  # schedguard._oom and the kernel's OOM kill (128 + SIGKILL) agree


@dataclass(frozen=True)
class ServerSpec:
    """``argv(ports_by_server_name, host)`` builds the command line of server ``name``."""

    name: str
    argv: ArgvFactory
    health_path: str = "/health"


def schedguard_argv(*args: str) -> list[str]:
    """The ``schedguard`` command run by this interpreter (works without the script on PATH)."""
    return [sys.executable, "-m", "schedguard", *args]


def free_port(host: str) -> int:
    # Racy in principle (the port is released before the server binds it); fine for a demo.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


class ServerStartError(RuntimeError):
    pass


class RunningServer:
    def __init__(
        self,
        spec: ServerSpec,
        ports: Mapping[str, int],
        host: str,
        *,
        mem_limit_bytes: int,
        sample_interval_s: float = 0.01,
    ) -> None:
        self.spec = spec
        self.host = host
        self.port = ports[spec.name]
        self.url = f"http://{host}:{self.port}"
        # Lives as long as the server; closed in stop().
        self._log: IO[bytes] = tempfile.TemporaryFile(prefix=f"schedguard-{spec.name}-")  # noqa: SIM115
        self.proc = spawn_limited_server(
            spec.argv(ports, host),
            mem_limit_bytes=mem_limit_bytes,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            stdout=self._log.fileno(),
            stderr=self._log.fileno(),
        )
        self.sampler = PeakRssSampler(self.proc.pid, sample_interval_s).start()
        self._stopped = False

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_ready(self, timeout_s: float) -> None:
        """Poll the health endpoint until it answers 200; raise with the log tail otherwise."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                raise ServerStartError(
                    f"{self.spec.name} exited with {self.proc.returncode} while starting:\n"
                    f"{self.log_tail()}"
                )
            if self.answers(self.spec.health_path):
                return
            time.sleep(0.05)  # polling a child's startup, not timing a test
        raise ServerStartError(
            f"{self.spec.name} not ready after {timeout_s:g} s:\n{self.log_tail()}"
        )

    def answers(self, path: str, timeout_s: float = 1.0) -> bool:
        """Whether ``GET path`` answers 200 now."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout_s)
        try:
            conn.request("GET", path)
            return conn.getresponse().status == 200
        except (OSError, http.client.HTTPException):
            return False
        finally:
            with contextlib.suppress(OSError):
                conn.close()

    def died_of_memory(self) -> bool:
        rc = self.proc.returncode
        return rc is not None and (rc == _OOM_EXIT_CODE or rc < 0)

    def exit_description(self) -> str:
        rc = self.proc.returncode
        if rc is None:
            return "running"
        if rc == _OOM_EXIT_CODE:
            return "exited 137 on MemoryError (memory cap)"
        if rc < 0:
            return f"killed by signal {-rc}"
        return f"exited {rc}"

    def log_tail(self, max_bytes: int = 2000) -> str:
        try:
            size = self._log.seek(0, os.SEEK_END)
            self._log.seek(max(0, size - max_bytes))
            return self._log.read().decode("utf-8", "replace")
        except (OSError, ValueError):
            return ""

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        try:
            stop_server(self.proc, grace_s=2.0)
        finally:
            self.sampler.stop()
            self._log.close()
