"""``schedguard extproc``: the guard as Envoy's external processor (a gRPC server).

Flags become the same environment overrides as ``schedguard serve``'s
(``SCHEDGUARD_RATE__REDIS_URL``, ``SCHEDGUARD_ADMIN__LISTEN``, ``SCHEDGUARD_POLICY``) so that every
worker process loads the same effective policy; the policy is validated first and a flag's
invalid value is reported as the flag's. ``--upstream`` is not an override: Envoy forwards, and
the upstream is only asked what it says of itself (``GET /v1/models``).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
from urllib.parse import urlsplit

from guard.presets import PRESET_NAMES
from schedguard._argtypes import add_log_format, port, positive_int

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "extproc",
        help="run the guard as Envoy's external processor (ext_proc gRPC server)",
        description=(
            "Serve envoy.service.ext_proc.v3.ExternalProcessor: Envoy's ext_proc filter hands "
            "each request's headers and buffered body to the guard, which refuses it (an "
            "immediate response, as the proxy's error), or admits it with the proxy's mutations, "
            "and observes the streamed response (usage, output cap, rate-limit settlement, "
            "concurrency slots, metrics, access log). Configure Envoy with request headers SEND, "
            "request body BUFFERED, response headers SEND, response body STREAMED and "
            "failure_mode_allow: false (docs/deploy/envoy/envoy.yaml). Needs the extproc extra."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--host", default="127.0.0.1", help="interface the gRPC server binds")
    p.add_argument("--port", type=port, default=50051, help="TCP port of the gRPC server")
    p.add_argument(
        "--policy",
        metavar="FILE",
        default=None,
        help="policy YAML file; without it $SCHEDGUARD_POLICY, else the built-in policy",
    )
    p.add_argument(
        "--upstream",
        metavar="URL",
        default=None,
        help="the LLM server behind Envoy, only asked GET /v1/models (its context window and "
        "kind), as the proxy does; without it (and without upstream.url) the policy's values",
    )
    p.add_argument(
        "--workers",
        type=positive_int,
        default=1,
        help="processes serving the port (SO_REUSEPORT); without --redis each keeps its own "
        "rate-limit buckets",
    )
    p.add_argument(
        "--admin-port",
        type=port,
        default=None,
        help="serve /healthz, /readyz and /metrics on this HTTP port (overrides admin.listen)",
    )
    p.add_argument(
        "--admin-host", default="127.0.0.1", help="interface of the admin port (--admin-port)"
    )
    p.add_argument(
        "--redis",
        metavar="URL",
        help="share rate limits between replicas through Redis (overrides rate.redis_url)",
    )
    p.add_argument(
        "--preset",
        choices=PRESET_NAMES,
        default=None,
        help="a named set of limits beneath the policy's own (overrides preset): default, or "
        "seed for the seed's 2048-token budgets",
    )
    p.add_argument(
        "--log-level",
        choices=("critical", "error", "warning", "info", "debug"),
        default="info",
        help="log level of the processor's own messages (the access log is always written)",
    )
    add_log_format(p)


def run(args: argparse.Namespace) -> int:
    import logging

    from guard.server import POLICY_ENV
    from guard.telemetry import START_LOGGER, configure_logging
    from schedguard._serve import (
        ADMIN_ENV,
        LOG_FORMAT_ENV,
        PRESET_ENV,
        REDIS_ENV,
        _err,
        effective_policy,
        policy_line,
    )

    if args.upstream is not None and urlsplit(args.upstream).scheme not in ("http", "https"):
        _err("--upstream: must be an http:// or https:// URL", "extproc")
        return 2
    admin = None
    if args.admin_port is not None:
        host = args.admin_host
        admin = f"[{host}]:{args.admin_port}" if ":" in host else f"{host}:{args.admin_port}"
    flagged = (
        (REDIS_ENV, "--redis", args.redis),
        (ADMIN_ENV, "--admin-port", admin),
        (PRESET_ENV, "--preset", args.preset),
        (LOG_FORMAT_ENV, "--log-format", args.log_format),
    )
    policy = effective_policy(args.policy, flagged, "extproc")
    if policy is None:
        return 2
    configure_logging(policy.observability.log_format, args.log_level)
    for module in ("grpc", "grpc_health", "envoy"):
        if importlib.util.find_spec(module) is None:
            # Said as grpc's: the extproc extra brings all three (grpcio-health-checking and
            # xds-protos with it), and the CLI names that extra.
            raise ModuleNotFoundError(f"No module named {module!r}", name="grpc")
    from guard.extproc import ExtProcOptions
    from guard.extproc import run as run_extproc

    opts = ExtProcOptions(
        host=args.host,
        port=args.port,
        workers=args.workers,
        upstream=args.upstream,
        log_level=args.log_level,
    )
    where = args.upstream or policy.upstream.url or "the policy's context window"
    admin_note = (
        f"; /healthz, /readyz, /metrics on http://{policy.admin.listen}"
        if (policy.admin.listen is not None)
        else ""
    )
    start = logging.getLogger(START_LOGGER)
    start.info(
        "schedguard extproc on %s:%s (gRPC), upstream facts from %s; %s worker(s)%s",
        args.host,
        args.port,
        where,
        args.workers,
        admin_note,
    )
    upstream = args.upstream or policy.upstream.url
    start.info("%s", policy_line(policy, upstream, "extproc"))
    run_extproc(policy, opts, os.environ.get(POLICY_ENV) or None)
    return 0
