"""``schedguard serve`` and ``schedguard policy show``.

The guard itself imports nothing from scheduler_ref: when no upstream is configured, the
reference scheduler (hardened) is started here, as a child process ``schedguard ref`` under a
memory cap on a free port, and stopped when the guard stops.

Flags become environment overrides (``SCHEDGUARD_UPSTREAM__URL``, ``SCHEDGUARD_RATE__REDIS_URL``,
``SCHEDGUARD_POLICY``) so that every uvicorn worker process loads the same effective policy; the
policy is validated first, and a flag's invalid value is reported as the flag's
(``--upstream: must be an http:// or https:// URL ...``), not as the variable it became.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import signal
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import yaml

from schedguard.servers import RunningServer, ServerSpec, ServerStartError, free_port

if TYPE_CHECKING:
    from guard.policy import Policy, PolicyError

UPSTREAM_ENV = "SCHEDGUARD_UPSTREAM__URL"
REDIS_ENV = "SCHEDGUARD_RATE__REDIS_URL"
ADMIN_ENV = "SCHEDGUARD_ADMIN__LISTEN"
PRESET_ENV = "SCHEDGUARD_PRESET"
LOG_FORMAT_ENV = "SCHEDGUARD_OBSERVABILITY__LOG_FORMAT"
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
    admin_listen: str | None = None
    embedded_reference: bool = False
    preset: str | None = None
    log_format: str | None = None


def _err(message: str, command: str = "serve") -> None:
    """Each line of ``message`` that is not indented, prefixed with the command."""
    lines = message.splitlines() or [""]
    text = "\n".join(
        line if line[:1].isspace() else f"schedguard {command}: {line}" for line in lines
    )
    print(text, file=sys.stderr)


def policy_error_text(
    exc: PolicyError, flags: Mapping[str, str], policy_flag: str | None = None
) -> str:
    """The error's problems, those of a value a flag set named as the flag (``flags`` maps the
    environment variable a flag became to the flag), the others as the policy loader says them.
    ``policy_flag`` is the ``--policy`` argument, when given."""
    named: list[str] = []
    rest: list[str] = []
    for problem in exc.problems:
        for var, flag in flags.items():
            marker = f" (from {var})"
            if marker in problem:
                _, _, what = problem.replace(marker, "").partition(": ")
                named.append(f"{flag}: {what}")
                break
        else:
            unreadable = problem.startswith("cannot read the policy file")
            if unreadable and policy_flag is not None and exc.source == policy_flag:
                named.append(f"--policy: {problem}")
            else:
                rest.append(problem)
    if rest:
        where = f" ({exc.source})" if exc.source else ""
        named.append(f"invalid policy{where}:" + "".join(f"\n  {p}" for p in rest))
    return "\n".join(named)


def effective_policy(
    policy_path: str | None,
    flagged: Iterable[tuple[str, str, str | None]],
    command: str,
) -> Policy | None:
    """The policy a command's flags make: each ``(variable, flag, value)`` with a value becomes
    that ``SCHEDGUARD_*`` override, validated with the file's; a problem is printed naming the
    flag that caused it (None is returned). The overrides are then put in this process's
    environment, so that worker processes load the same policy."""
    from guard.policy import PolicyError, load_policy
    from guard.server import POLICY_ENV

    overrides: dict[str, str] = {}
    flags: dict[str, str] = {}  # variable -> the flag that set it
    if policy_path is not None:
        overrides[POLICY_ENV] = policy_path
    for var, flag, value in flagged:
        if value is not None:
            overrides[var], flags[var] = value, flag
    env = {**os.environ, **overrides}
    try:
        policy = load_policy(env.get(POLICY_ENV) or None, env)
    except PolicyError as exc:
        _err(policy_error_text(exc, flags, policy_path), command)
        return None
    if policy.rate.redis_url is not None and importlib.util.find_spec("redis") is None:
        # Said before anything starts (the CLI turns this into one line naming the extra).
        raise ModuleNotFoundError("No module named 'redis'", name="redis")
    os.environ.update(overrides)  # the workers load the same policy
    return policy


def start_embedded_upstream(mem_limit_bytes: int, host: str = "127.0.0.1") -> RunningServer:
    """The reference scheduler (hardened) as a child process on a free port, ready."""
    from schedguard.servers import schedguard_argv

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
    from guard.policy import load_policy
    from guard.server import POLICY_ENV, run
    from guard.telemetry import START_LOGGER, configure_logging

    flagged = ((UPSTREAM_ENV, "--upstream", opts.upstream),
               (REDIS_ENV, "--redis", opts.redis_url),
               (ADMIN_ENV, "--admin-port", opts.admin_listen),
               (PRESET_ENV, "--preset", opts.preset),
               (LOG_FORMAT_ENV, "--log-format", opts.log_format))  # fmt: skip
    policy = effective_policy(opts.policy_path, flagged, "serve")
    if policy is None:
        return 2
    if policy.upstream.url is None and not opts.embedded_reference:
        _err(
            "no upstream: pass --upstream URL (or set upstream.url in the policy, or "
            "SCHEDGUARD_UPSTREAM__URL); --embedded-reference serves the built-in reference "
            "scheduler instead, a test model, not for real clients"
        )
        return 2
    if policy.upstream.url is not None and opts.embedded_reference:
        _err(f"--embedded-reference and an upstream ({policy.upstream.url}) exclude each other")
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
            where = (
                f"{embedded.url} (the EMBEDDED REFERENCE SCHEDULER, hardened profile: a test "
                "model, not for real clients)"
            )
        else:
            where = policy.upstream.url
        admin_note = ""
        if policy.admin.listen is not None:
            admin_note = f"; /healthz, /readyz, /metrics on http://{policy.admin.listen}"
        configure_logging(policy.observability.log_format, opts.log_level)
        start = logging.getLogger(START_LOGGER)
        start.info(
            "schedguard guard on http://%s:%s -> %s; %s worker(s)%s",
            opts.host,
            opts.port,
            where,
            opts.workers,
            admin_note,
        )
        start.info("%s", policy_line(policy, policy.upstream.url, "serve"))
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


def policy_line(policy: Policy, upstream: str | None, command: str) -> str:
    """The policy in force, as the workers will start with it: the upstream's window and
    kind asked for once here (each worker asks again and follows changes)."""
    from guard.context_window import in_force, policy_summary

    models = None if upstream is None else _models_of(upstream)
    return f"schedguard {command}: " + policy_summary(*in_force(policy, models))


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def show_policy(
    path: str | None,
    *,
    as_json: bool = False,
    upstream: str | None = None,
    preset: str | None = None,
) -> int:
    """Print the effective policy. The context window in force is said at the end (a YAML
    comment; ``context_window`` beside ``policy`` in JSON): the policy's, or, with
    ``upstream``, the one that upstream's ``/v1/models`` reports, as the guard would use it."""
    from guard.context_window import in_force
    from guard.policy import PolicyError, load_policy, policy_to_yaml
    from guard.server import POLICY_ENV

    env = dict(os.environ)
    flags = {}
    if preset is not None:
        env[PRESET_ENV], flags[PRESET_ENV] = preset, "--preset"
    try:
        policy = load_policy(path or env.get(POLICY_ENV) or None, env)
    except PolicyError as exc:
        _err(policy_error_text(exc, flags, path), "policy show")
        return 2
    models = None if upstream is None else _models_of(upstream)
    if upstream is not None and models is None:
        _err(f"{upstream}/v1/models did not answer 200 with JSON", "policy show")
    policy, source = in_force(policy, models)
    window = {
        "context_length": policy.limits.tokens.context_length,
        "source": source,
        "upstream": upstream,
        "upstream_kind": policy.upstream_kind,
    }
    text = policy_to_yaml(policy)
    if as_json:
        doc = {"policy": yaml.safe_load(text), "context_window": window}
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return 0
    sys.stdout.write(text + _context_comment(window))
    return 0


def new_key(tenant: str, *, as_json: bool = False) -> int:
    """A new random API key for ``tenant``, with the policy entry holding its digest."""
    import secrets

    from pydantic import ValidationError

    from guard.policy import KeyEntry, key_digest

    key = "sk-sg-" + secrets.token_urlsafe(32)
    try:
        entry = KeyEntry(key_sha256=key_digest(key), tenant=tenant)
    except ValidationError as exc:
        problem = exc.errors(include_url=False)[0]["msg"].removeprefix("Value error, ")
        _err(f"--tenant: {problem}", "policy key")
        return 2
    if as_json:
        doc = {"key": key, "key_sha256": entry.digest, "tenant": entry.tenant}
        sys.stdout.write(json.dumps(doc) + "\n")
        return 0
    sys.stdout.write(
        f"# the key, for the client only (Authorization: Bearer <key>); it is not stored:\n"
        f"# {key}\n"
        f"keys:\n  - key_sha256: {entry.digest}\n    tenant: {entry.tenant}\n"
    )
    return 0


_SOURCES = {
    "policy": "set by the policy",
    "upstream": "the upstream's /v1/models max_model_len",
    "default": "the default; the guard reads the upstream's max_model_len when it reports one",
}


def _context_comment(window: Mapping[str, object]) -> str:
    source = str(window["source"])
    if source == "default" and window["upstream"] is not None:
        said = "the default: the upstream reports no max_model_len"
    else:
        said = _SOURCES[source]
    return (
        f"# context window in force: {window['context_length']} tokens ({said})\n"
        f"# upstream kind in force: {window['upstream_kind']}\n"
    )


def _models_of(upstream: str) -> object:
    """``GET upstream/v1/models`` as JSON (at most 1 MiB, 5 s), or None; marked as the guard's
    own request, as its readiness probes are."""
    import urllib.error
    import urllib.request

    from guard.http import PROBE_HEADER

    url = upstream.rstrip("/") + "/v1/models"
    name, value = (part.decode() for part in PROBE_HEADER)
    request = urllib.request.Request(url, headers={name: value})
    try:
        with urllib.request.urlopen(request, timeout=5.0) as resp:
            if resp.status != 200:
                return None
            return json.loads(resp.read(1 << 20))
    except (OSError, ValueError):
        return None
