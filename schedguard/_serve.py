"""``schedguard serve`` and ``schedguard policy show``.

The guard itself imports nothing from scheduler_ref: when no upstream is configured, the
reference scheduler (hardened) is started here, as a child process ``schedguard ref`` under a
memory cap on a free port, and stopped when the guard stops.

Flags become environment overrides (``SCHEDGUARD_UPSTREAM__URL``, ``SCHEDGUARD_RATE__REDIS_URL``,
``SCHEDGUARD_POLICY``) so that every uvicorn worker process loads the same effective policy.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from dataclasses import dataclass

import yaml

from schedguard._servers import RunningServer, ServerSpec, ServerStartError, free_port

UPSTREAM_ENV = "SCHEDGUARD_UPSTREAM__URL"
REDIS_ENV = "SCHEDGUARD_RATE__REDIS_URL"
_EMBEDDED_START_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class ServeOptions:
    upstream: str | None
    policy_path: str | None
    host: str
    port: int
    workers: int
    redis_url: str | None
    log_level: str
    upstream_mem_limit_bytes: int


def _err(message: str) -> None:
    print(f"schedguard: {message}", file=sys.stderr)


def start_embedded_upstream(mem_limit_bytes: int, host: str = "127.0.0.1") -> RunningServer:
    """The reference scheduler (hardened) as a child process on a free port, ready."""
    from schedguard._servers import schedguard_argv

    spec = ServerSpec(
        "scheduler_ref",
        lambda ports, h: schedguard_argv(
            "ref",
            "--profile",
            "hardened",
            "--host",
            h,
            "--port",
            str(ports["scheduler_ref"]),
            "--log-level",
            "warning",
        ),
    )
    server = RunningServer(
        spec, {"scheduler_ref": free_port(host)}, host, mem_limit_bytes=mem_limit_bytes
    )
    try:
        server.wait_ready(_EMBEDDED_START_TIMEOUT_S)
    except BaseException:
        server.stop()
        raise
    return server


def serve(opts: ServeOptions) -> int:
    from guard.policy import PolicyError, load_policy
    from guard.server import POLICY_ENV, run

    if opts.policy_path is not None:
        os.environ[POLICY_ENV] = opts.policy_path
    if opts.upstream is not None:
        os.environ[UPSTREAM_ENV] = opts.upstream
    if opts.redis_url is not None:
        os.environ[REDIS_ENV] = opts.redis_url
    try:
        policy = load_policy(os.environ.get(POLICY_ENV) or None, os.environ)
    except PolicyError as exc:
        _err(str(exc))
        return 2
    embedded: RunningServer | None = None
    try:
        if policy.upstream.url is None:
            try:
                embedded = start_embedded_upstream(opts.upstream_mem_limit_bytes)
            except (ServerStartError, OSError) as exc:
                _err(f"could not start the embedded reference scheduler: {exc}")
                return 1
            os.environ[UPSTREAM_ENV] = embedded.url
            policy = load_policy(os.environ.get(POLICY_ENV) or None, os.environ)
            where = f"{embedded.url} (embedded reference scheduler, hardened profile)"
        else:
            where = policy.upstream.url
        print(
            f"schedguard guard on http://{opts.host}:{opts.port} -> {where}; "
            f"{opts.workers} worker(s)",
            file=sys.stderr,
            flush=True,
        )
        # uvicorn re-raises SIGTERM once it has shut down; with the default handler that kills
        # this process before the embedded upstream is stopped. Exit through `finally` instead.
        previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
        try:
            run(
                policy,
                host=opts.host,
                port=opts.port,
                workers=opts.workers,
                log_level=opts.log_level,
            )
        finally:
            signal.signal(signal.SIGTERM, previous)
    finally:
        if embedded is not None:
            embedded.stop()
    return 0


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def show_policy(path: str | None, *, as_json: bool = False) -> int:
    from guard.policy import PolicyError, load_policy, policy_to_yaml
    from guard.server import POLICY_ENV

    try:
        policy = load_policy(path or os.environ.get(POLICY_ENV) or None, os.environ)
    except PolicyError as exc:
        _err(str(exc))
        return 2
    text = policy_to_yaml(policy)
    if as_json:
        text = json.dumps(yaml.safe_load(text), indent=2) + "\n"
    sys.stdout.write(text)
    return 0
