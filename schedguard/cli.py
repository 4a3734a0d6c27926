"""The ``schedguard`` command: a thin composition layer over the packages (nothing imports it).

schedguard -V | --version | COMMAND --version
schedguard ref --profile {vulnerable,hardened} [--host H] [--port P] [--log-level L]
schedguard demo [--mem-limit-mb N] [--timeout-s S] [--steady-requests N] [--json PATH]
                [--port-base P]
schedguard serve [--upstream URL] [--policy FILE] [--host H] [--port P] [--workers N] [--redis URL]
                 [--admin-port P [--admin-host H]] [--log-format {json,text}]
schedguard extproc [--host H] [--port P] [--policy FILE] [--upstream URL] [--workers N]
                   [--admin-port P [--admin-host H]] [--redis URL] [--log-format {json,text}]
schedguard policy show [--policy FILE] [--json]
schedguard load [--duration S] [--users N] [--attack-share F] [--upstream-profile P] [--out DIR]
                [--host URL] [--no-guard] [--ui] [--json] [--scenario guided-compile] ...
schedguard fuzz list [--json] | run --target NAME [--engine E] [--duration S] [--out DIR] ...
                | replay PATH... [--target NAME]

An unknown option is refused by its command's parser, naming the closest option it has
(``serve --upstrem`` -> ``did you mean --upstream?``), exit 2. Every option has help text; a
default is shown once (by the formatter, or in the help's own
words). A command that needs an optional dependency which is not installed says in one line
which extra installs it (``pip install 'schedguard[load]'``) and exits 2.
Output into a pipe whose reader has gone (``schedguard fuzz list | head -1``) ends the command
quietly, with status 141 as for SIGPIPE.
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import sys
from collections.abc import Iterator, Sequence
from typing import cast

from guard.presets import PRESET_NAMES
from schedguard import __version__, _extproc_cli, _fuzz_cli, _load_cli
from schedguard._argtypes import (
    add_log_format,
    non_negative_int,
    port,
    positive_float,
    positive_int,
)
from schedguard._parser import Parser

LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")

# Optional dependencies -> the extra that installs each (pyproject.toml).
EXTRAS = {
    "locust": "load",
    "gevent": "load",
    "hypothesis": "fuzz",
    "atheris": "fuzz",
    "redis": "redis",
    "grpc": "extproc",  # with grpcio-health-checking and xds-protos
    "opentelemetry": "otel",
    "outlines_core": "backends",
    "llguidance": "backends",
    "xgrammar": "backends-xgrammar",
}
# The project's own packages, which a trimmed install could leave out.
_OWN_PACKAGES = ("guard", "scheduler_ref", "schedguard", "payloads", "fuzz", "loadtests")


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows an option's default unless there is none to show (``None``, a flag's ``False``)
    or its help already speaks of it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if action.default in (None, False, argparse.SUPPRESS) or "default" in text.lower():
            return text
        return super()._get_help_string(action)


def iter_parsers(
    parser: argparse.ArgumentParser,
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """``(prog, parser)`` for ``parser`` and every subcommand's parser under it."""
    yield parser.prog, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):  # aliases share a parser
                yield from iter_parsers(sub)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="schedguard",
        description="Security fuzzing and hardening for LLM schedulers.",
    )
    # Parsers of the Parser class (add_subparsers makes its own class's); typed as argparse's.
    sub = cast(
        "argparse._SubParsersAction[argparse.ArgumentParser]",
        parser.add_subparsers(dest="command", metavar="COMMAND", required=True),
    )

    ref = sub.add_parser(
        "ref",
        help="run the reference scheduler's OpenAI-compatible server",
        description="Run the reference scheduler (scheduler_ref) with uvicorn (uvloop, httptools).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    ref.add_argument(
        "--profile",
        choices=("vulnerable", "hardened"),
        default="hardened",
        help="limits profile: 'vulnerable' has none (the seed's engine), 'hardened' the patch",
    )
    ref.add_argument("--host", default="127.0.0.1", help="interface to bind")
    ref.add_argument("--port", type=port, default=8000, help="TCP port to bind")
    ref.add_argument("--log-level", choices=LOG_LEVELS, default="info", help="uvicorn log level")
    ref.add_argument(
        "--log-format",
        choices=("json", "text"),
        default="json",
        help="format of every line written to stderr (uvicorn's and the server's messages): "
        "json, one object a line, as `schedguard serve` writes them, or text, for a terminal",
    )
    ref.add_argument(
        "--keep-running-on-memory-error",
        action="store_true",
        help=(
            "on MemoryError keep the app's 500 out_of_memory answer instead of exiting with 137 "
            "as an OOM-killed process would"
        ),
    )

    demo = sub.add_parser(
        "demo",
        help="reproduce the seed attack against both profiles and print the results",
        description=(
            "Start the reference scheduler in each profile as a child process under a memory "
            "cap, send it a benign request and the seed payload, and print the outcome, latency "
            "and peak server RSS beside the seed write-up's numbers."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    demo.add_argument(
        "--mem-limit-mb", type=positive_int, default=1024, help="RLIMIT_AS of each server (MiB)"
    )
    demo.add_argument(
        "--timeout-s", type=positive_float, default=20.0, help="wall-clock limit per request"
    )
    demo.add_argument(
        "--steady-requests",
        type=non_negative_int,
        default=50,
        help=(
            "after a refusal, this many more requests on the same kept-alive connection: their "
            "median is the steady-state latency beside the first request's (0: none)"
        ),
    )
    demo.add_argument("--json", metavar="PATH", help="also write the rows as JSON to PATH")
    demo.add_argument(
        "--port-base",
        type=port,
        default=0,
        help="first TCP port for the servers (one per server); 0 picks free ports",
    )
    demo.add_argument("--host", default="127.0.0.1", help="interface the servers bind")
    _add_serve(sub)
    _add_policy(sub)
    _extproc_cli.add_parser(sub)
    _load_cli.add_parser(sub)
    _fuzz_cli.add_parser(sub)
    version = f"schedguard {__version__}"
    for _, p in iter_parsers(parser):
        p.formatter_class = HelpFormatter
        p.add_argument(
            "-V",
            "--version",
            action="version",
            version=version,
            help="print the version and exit",
        )
    return parser


def _add_serve(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve = sub.add_parser(
        "serve",
        help="run the guard: an OpenAI-compatible gateway in front of an LLM server",
        description=(
            "Run the guard in front of the LLM server --upstream names (or upstream.url in the "
            "policy); without one it exits 2, unless --embedded-reference asks for the "
            "reference scheduler (hardened profile, a test model) as an embedded upstream on a "
            "free port, stopped with the guard. The policy is a YAML file overridable by "
            "SCHEDGUARD_<SECTION>__<FIELD> environment variables (an unknown SCHEDGUARD_* name "
            "exits 2); see `schedguard policy show`. The policy in force is said at start, in the "
            "log format (--log-format)."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    serve.add_argument(
        "--upstream",
        metavar="URL",
        help="base URL of the LLM server (overrides upstream.url)",
    )
    serve.add_argument(
        "--preset",
        choices=PRESET_NAMES,
        default=None,
        help="a named set of limits beneath the policy's own (overrides preset): default, or "
        "seed for the seed's 2048-token budgets",
    )
    serve.add_argument(
        "--embedded-reference",
        action="store_true",
        help="without an upstream, start the reference scheduler (hardened profile, a test "
        "model) as the upstream, for demos and tests",
    )
    serve.add_argument(
        "--policy",
        metavar="FILE",
        default=None,
        help="policy YAML file; without it $SCHEDGUARD_POLICY, else the built-in policy",
    )
    serve.add_argument("--host", default="127.0.0.1", help="interface to bind")
    serve.add_argument("--port", type=port, default=8080, help="TCP port to bind")
    serve.add_argument("--workers", type=positive_int, default=1, help="worker processes (uvicorn)")
    serve.add_argument(
        "--admin-port",
        type=port,
        default=None,
        help="serve /healthz, /readyz and /metrics on this port too, and /metrics only there "
        "(overrides admin.listen)",
    )
    serve.add_argument(
        "--admin-host", default="127.0.0.1", help="interface of the admin port (--admin-port)"
    )
    serve.add_argument(
        "--redis",
        metavar="URL",
        help="share rate limits between replicas through Redis (overrides rate.redis_url)",
    )
    serve.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        default="info",
        help="level of uvicorn's and the guard's messages (the access log is always written)",
    )
    add_log_format(serve)
    serve.add_argument(
        "--upstream-mem-limit-mb",
        type=positive_int,
        default=2048,
        help="RLIMIT_AS of the embedded reference scheduler (MiB)",
    )


def _add_policy(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    policy = sub.add_parser(
        "policy",
        help="inspect the guard's policy",
        description="Inspect the guard's policy.",
    )
    psub = policy.add_subparsers(dest="policy_command", metavar="ACTION", required=True)
    show = psub.add_parser(
        "show",
        help="print the effective policy (file + SCHEDGUARD_* environment), validated",
        description=(
            "Print the effective policy: the file's values, then the SCHEDGUARD_* environment "
            "overrides, every field present. API keys are shown as SHA-256 digests. Exits 2 "
            "naming every invalid field."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    show.add_argument(
        "--policy",
        metavar="FILE",
        default=None,
        help="policy YAML file; without it $SCHEDGUARD_POLICY, else the built-in policy",
    )
    show.add_argument("--json", action="store_true", help="print JSON instead of YAML")
    show.add_argument(
        "--preset",
        choices=PRESET_NAMES,
        default=None,
        help="show the policy with this preset (overrides preset)",
    )
    key = psub.add_parser(
        "key",
        help="make a new API key and the policy entry that admits it",
        description=(
            "Make a new random API key for a tenant: print the key (give it to the client, "
            "once; it is not stored) and the `keys` entry to paste into the policy, which holds "
            "only its SHA-256 digest."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    key.add_argument(
        "--tenant",
        required=True,
        help="the tenant the key belongs to (letters, digits, _.:@-, at most 64)",
    )
    key.add_argument("--json", action="store_true", help="print {key, key_sha256, tenant} as JSON")
    show.add_argument(
        "--upstream",
        metavar="URL",
        default=None,
        help="ask this upstream's /v1/models for its max_model_len and show the context window "
        "the guard would put in force (without it: the policy's)",
    )


def _run_ref(args: argparse.Namespace) -> int:
    try:
        from scheduler_ref.profiles import get_profile
        from scheduler_ref.server import create_app
    except ImportError as exc:
        print(f"schedguard ref: the reference server is not available: {exc}", file=sys.stderr)
        return 2
    import uvicorn

    from guard.telemetry import logging_config

    app = create_app(get_profile(args.profile))
    if not args.keep_running_on_memory_error:
        from schedguard._oom import exit_on_memory_error

        exit_on_memory_error(app)
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        loop="uvloop",
        http="httptools",
        log_level=args.log_level,
        log_config=logging_config(args.log_format, args.log_level),
        access_log=args.log_level in ("debug", "trace"),
    )
    return 0


def _run_demo(args: argparse.Namespace) -> int:
    from schedguard.demo import DemoConfig, run_demo_cli

    config = DemoConfig(
        mem_limit_bytes=args.mem_limit_mb << 20,
        timeout_s=args.timeout_s,
        port_base=args.port_base,
        host=args.host,
        steady_requests=args.steady_requests,
    )
    return run_demo_cli(config, json_path=args.json)


def _listen(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _run_serve(args: argparse.Namespace) -> int:
    from schedguard._serve import ServeOptions, serve

    return serve(
        ServeOptions(
            upstream=args.upstream,
            policy_path=args.policy,
            host=args.host,
            port=args.port,
            workers=args.workers,
            redis_url=args.redis,
            log_level=args.log_level,
            admin_listen=(
                None if args.admin_port is None else _listen(args.admin_host, args.admin_port)
            ),
            upstream_mem_limit_bytes=args.upstream_mem_limit_mb << 20,
            embedded_reference=args.embedded_reference,
            preset=args.preset,
            log_format=args.log_format,
        )
    )


def _run_policy(args: argparse.Namespace) -> int:
    from schedguard._serve import new_key, show_policy

    if args.policy_command == "key":
        return new_key(args.tenant, as_json=args.json)
    return show_policy(args.policy, as_json=args.json, upstream=args.upstream, preset=args.preset)


def missing_extra(exc: ModuleNotFoundError) -> str | None:
    """One line saying what to install for a module that is not installed, or None when the
    module is neither an optional dependency nor one of the project's packages."""
    top = (exc.name or "").partition(".")[0]
    extra = EXTRAS.get(top)
    if extra is not None:
        return f"needs {top}, which is not installed: pip install 'schedguard[{extra}]'"
    if top in _OWN_PACKAGES:
        return f"the {top} package is not installed here (this install leaves it out)"
    return None


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "ref":
        return _run_ref(args)
    if args.command == "demo":
        return _run_demo(args)
    if args.command == "serve":
        return _run_serve(args)
    if args.command == "policy":
        return _run_policy(args)
    if args.command == "extproc":
        return _extproc_cli.run(args)
    if args.command == "load":
        return _load_cli.run(args)
    if args.command == "fuzz":
        return _fuzz_cli.run(args)
    raise AssertionError(f"unhandled command {args.command!r}")  # argparse enforces choices


# The exit status of a command whose output pipe was closed, as the shell reports SIGPIPE.
EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        try:
            return _dispatch(args)
        except ModuleNotFoundError as exc:
            message = missing_extra(exc)
            if message is None:
                raise
            print(f"schedguard {args.command}: {message}", file=sys.stderr)
            return 2
    except BrokenPipeError:
        if not _stdout_gone():
            raise  # a socket's, not the output's
        return _quiet_broken_pipe()


def _stdout_gone() -> bool:
    """Whether standard output is a pipe nobody reads any more (``schedguard ... | head -1``)."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return False
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))


def _quiet_broken_pipe() -> int:
    """Exit as CLIs do when their reader has gone: no traceback, status 141. Standard output is
    pointed at /dev/null so that flushing it at exit does not fail again (Python's own advice,
    the "Note on SIGPIPE" of the signal module's documentation)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)
    return EXIT_BROKEN_PIPE


if __name__ == "__main__":
    sys.exit(main())
