"""Run the guard with uvicorn (uvloop, httptools), in one process or several workers.

Workers are separate processes that each build their app from the environment
(:func:`app_from_env`): ``SCHEDGUARD_POLICY`` names the policy file and the usual
``SCHEDGUARD_<SECTION>__<FIELD>`` variables override it (``schedguard serve`` sets
``SCHEDGUARD_UPSTREAM__URL`` and ``SCHEDGUARD_RATE__REDIS_URL`` from its flags). Each worker has
its own connection pool and, without Redis, its own rate-limit buckets.

``/metrics`` answers for all the workers, whichever takes the scrape: with ``workers > 1`` they
share a directory (``PROMETHEUS_MULTIPROC_DIR``; a temporary one unless set) where each writes
its series and the answering worker merges them (prometheus_client's multiprocess mode,
:mod:`guard.telemetry._multiprocess`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator, Mapping

import uvicorn
from fastapi import FastAPI

from guard.app import create_app
from guard.http import configure as configure_head_limit
from guard.http import raise_nofile_limit
from guard.policy import Policy, load_policy
from guard.telemetry import (
    METRICS_DIR_ENV,
    AccessLog,
    LogFormat,
    configure_logging,
    logging_config,
    wipe_metrics_dir,
)

__all__ = ["POLICY_ENV", "app_from_env", "run", "uvicorn_config"]

POLICY_ENV = "SCHEDGUARD_POLICY"  # not a policy override: no "__" and not a section name

_log = logging.getLogger("schedguard.guard")


def app_from_env(env: Mapping[str, str] | None = None) -> FastAPI:
    """The app of one worker: the policy from ``SCHEDGUARD_POLICY`` and ``SCHEDGUARD_*``."""
    env = os.environ if env is None else env
    policy = load_policy(env.get(POLICY_ENV) or None, env)
    body = policy.limits.body
    raise_nofile_limit()  # before the connection cap is sized from it
    configure_head_limit(body.max_header_bytes, body.max_header_count, policy.limits.connections)
    return create_app(
        policy,
        access_log=AccessLog(
            policy.observability.access_log,
            stream=sys.stderr,
            log_format=policy.observability.log_format,
        ),
        metrics_dir=env.get(METRICS_DIR_ENV) or None,
    )


def uvicorn_config(
    *,
    host: str,
    port: int,
    workers: int = 1,
    log_level: str = "info",
    log_format: LogFormat = "json",
) -> dict[str, object]:
    """uvicorn's settings for the guard (also used by the benchmarks): its own log lines in
    the guard's format (``log_format``), as the access log's."""
    return {
        "host": host,
        "port": port,
        "workers": workers,
        "factory": True,
        "loop": "uvloop",
        # httptools with a cap on the request head (httptools has none of its own).
        "http": "guard.http._protocol:GuardHttpToolsProtocol",
        "lifespan": "on",
        "log_level": log_level,
        "log_config": logging_config(log_format, log_level),
        "access_log": False,  # the guard writes its own, structured
        # The protocol keeps its own keep-alive and head timers (limits.connections); this is
        # uvicorn's, for a protocol without them.
        "timeout_keep_alive": 5,
        # Streams in flight get this long to finish on shutdown, then are cut.
        "timeout_graceful_shutdown": 10,
        "server_header": False,
        # Nothing in the guard reads the client address, so X-Forwarded-* from a peer is not
        # trusted either (and the middleware that would apply it costs on every request).
        "proxy_headers": False,
    }


def run(
    policy: Policy,
    *,
    host: str,
    port: int,
    workers: int = 1,
    log_level: str = "info",
) -> None:
    """Serve until SIGINT/SIGTERM. ``policy`` was validated by the caller and describes what the
    workers will load from the environment (used here for warnings and the log format)."""
    configure_logging(policy.observability.log_format, log_level)
    if workers > 1 and policy.rate.redis_url is None:
        _log.warning(
            "%d workers without --redis: each worker keeps its own rate-limit buckets, so a "
            "tenant may get up to %d times its configured rate",
            workers,
            workers,
        )
    soft, hard = raise_nofile_limit()  # inherited by the workers
    _log.info("open files: %s (hard limit %s)", soft, hard)
    with _metrics_dir(workers):
        uvicorn.run(
            "guard.server:app_from_env",
            **uvicorn_config(  # type: ignore[arg-type]
                host=host,
                port=port,
                workers=workers,
                log_level=log_level,
                log_format=policy.observability.log_format,
            ),
        )


@contextlib.contextmanager
def _metrics_dir(workers: int) -> Iterator[None]:
    """The directory the workers' metrics meet in (``PROMETHEUS_MULTIPROC_DIR``, inherited by
    the workers): the one set in the environment, emptied of a previous run's files, or, with
    more than one worker, a temporary one removed at the end. One worker without it keeps its
    series in memory."""
    given = os.environ.get(METRICS_DIR_ENV)
    if given:
        os.makedirs(given, exist_ok=True)
        if wipe_metrics_dir(given):
            _log.info("%s: removed the series files of a previous run", given)
        yield
        return
    if workers <= 1:
        yield
        return
    made = tempfile.mkdtemp(prefix="schedguard-metrics-")
    os.environ[METRICS_DIR_ENV] = made
    try:
        yield
    finally:
        os.environ.pop(METRICS_DIR_ENV, None)
        shutil.rmtree(made, ignore_errors=True)
