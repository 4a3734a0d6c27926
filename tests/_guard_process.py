"""``schedguard serve`` as a capped child process for end-to-end tests.

The guard runs exactly as deployed (its own process, uvicorn, the policy file) under
``RLIMIT_AS`` through :class:`schedguard.servers.RunningServer`, which also samples its RSS and
keeps its log for failure messages.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from schedguard.servers import RunningServer, ServerSpec, free_port, schedguard_argv

HOST = "127.0.0.1"
MEM_LIMIT = 1 << 30


def guard_spec(
    name: str,
    upstream_url: str,
    policy: Path,
    *,
    redis_url: str | None = None,
    workers: int = 1,
) -> ServerSpec:
    """``schedguard serve --upstream URL --policy FILE [--redis URL] [--workers N]``; ready on
    ``/readyz`` (the upstream answers through it)."""

    def argv(ports: Mapping[str, int], host: str) -> list[str]:
        args = ["serve", "--upstream", upstream_url, "--policy", str(policy), "--host", host,
                "--port", str(ports[name]), "--log-level", "warning"]  # fmt: skip
        if redis_url is not None:
            args += ["--redis", redis_url]
        if workers != 1:
            args += ["--workers", str(workers)]
        return schedguard_argv(*args)

    return ServerSpec(name, argv, health_path="/readyz")


def start(spec: ServerSpec, *, mem_limit_bytes: int = MEM_LIMIT) -> RunningServer:
    """Start ``spec`` on a free port (not waiting for it: call ``wait_ready``)."""
    return RunningServer(spec, {spec.name: free_port(HOST)}, HOST, mem_limit_bytes=mem_limit_bytes)
