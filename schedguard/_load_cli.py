"""``schedguard load``: benign and attack traffic through the guard with locust, gated by SLOs.

Starts the reference scheduler (``--upstream-profile``, under a memory cap, with a simulated GPU
cost model so that latencies, time to first token and inter-token gaps look like a real
server's) and the guard in front of it (``loadtests/policy.yaml``), or targets ``--host``; runs
``loadtests/locustfile.py`` in a locust subprocess (gevent's monkey-patching stays there),
showing its progress on stderr meanwhile (``--quiet``, ``--progress-interval``);
writes locust's CSV, HTML and JSON reports, the SLO report, the run over time
(``timeline.json``) and ``report.html`` (:mod:`loadtests.report`: SLO verdicts, latency, attack
share, rejections by code and memory over time) to ``--out``; prints the SLO table; exits 0 when
every SLO holds, 1 when one fails, 2 when the run could not happen. ``--no-guard`` sends the
same traffic straight at the upstream, for the contrast. Against ``--host`` the model and the
upstream's kind are read from its ``/v1/models`` (``--model``, ``--upstream-kind``; the benign
mix is fitted to the kind, :mod:`loadtests.fit`) and the servers' memory from ``--guard-pid`` /
``--upstream-pid`` or their Prometheus ``/metrics``; ``--compare DIR`` puts such a run's
results beside this one's in ``report.html``; ``--report-only`` rewrites ``report.html`` from
``--out`` without running. ``--scenario guided-compile`` runs issue 23's guided compile budget
phase instead (``loadtests/guided_policy.yaml``, :mod:`loadtests.guided`): one tenant warming
benign schemas then repeating them, another flooding unique ones; its per-tenant figures go to
``guided.json`` and are printed under the SLO table. ``--scenario fair-share`` runs issue 25's
fair share phase (:mod:`loadtests.fairshare`): ``--users`` chat users alone for ``--solo``
seconds, then beside ``--flood-streams`` long streams of another tenant (``--flood-unread`` of
them never read); the gate adds the chat tenant's p99 ratio and unanswered requests, the report
its latency per tenant over time and each tenant's share.

``python -m schedguard._load_cli upstream ...`` is the upstream it starts: ``schedguard ref``
plus the cost model (the engine sleeps the simulated step time, as a GPU would take it).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadtests import progress
from loadtests.target import BENIGN_KEY, FLOOD_KEY, KINDS, REFERENCE_MODEL
from schedguard._argtypes import fraction, non_negative_float, positive_float, positive_int

__all__ = [
    "COSTS",
    "add_parser",
    "locust_argv",
    "progress_interval",
    "run",
    "split_users",
    "upstream_main",
]

# Simulated step times (seconds): a decode step of a mid-size model on one GPU takes ~12 ms plus
# a little per sequence in the batch; prefill runs at ~20k tokens/s.
COSTS: dict[str, dict[str, float]] = {
    "gpu": {"step_overhead_s": 0.012, "decode_s_per_seq": 0.0002, "prefill_s_per_token": 0.00005},
    "none": {},
}
_START_TIMEOUT_S = 60.0
_LOCUST_GRACE_S = 90.0
# Progress every 2 s on a terminal (a line rewritten in place costs nothing to read), every
# 10 s into a log (a line each time).
PROGRESS_TTY_S = 2.0
PROGRESS_PLAIN_S = 10.0
MB = 1 << 20
PROGRESS_FILE = "progress.json"


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "load",
        help="load-test the guard with benign and attack traffic (locust) and gate on SLOs",
        description=(
            "Start the reference scheduler and the guard in front of it (or target --host), run "
            "locust with benign users and attackers replaying payloads/, write CSV, HTML and "
            "JSON reports to --out, print the SLO table and exit 1 when an SLO fails. "
            "Needs the `load` extra (locust)."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    _add_traffic(p)
    _add_servers(p)
    _add_slos(p)
    _add_reports(p)
    _add_progress(p)
    _add_ui(p)
    p.add_argument(
        "locust_args",
        nargs=argparse.REMAINDER,
        help="after --: more locust arguments (e.g. -- --flood-burst 40)",
    )


def _add_traffic(p: argparse.ArgumentParser) -> None:
    """What the users send, how many and how fast."""
    p.add_argument("--duration", type=positive_float, default=60.0, help="seconds of load")
    p.add_argument("--users", type=positive_int, default=10, help="benign users")
    p.add_argument(
        "--attack-share",
        type=fraction,
        default=0.3,
        help="share of the traffic that attacks: attackers are added beside the benign users",
    )
    p.add_argument(
        "--shape",
        choices=("steady", "ramp", "spike", "burst"),
        default="steady",
        help="how the user count changes over the run (loadtests/README.md)",
    )
    p.add_argument("--user-rps", type=positive_float, default=0.5, help="requests/s per user")
    p.add_argument("--processes", type=int, default=0, help="locust worker processes (0: one)")
    p.add_argument(
        "--scenario",
        choices=("mixed", "guided-compile", "fair-share"),
        default="mixed",
        help="mixed: benign users and attackers; guided-compile: one tenant warming benign "
        "structured-output schemas then repeating them, another sending unique schemas "
        "(--users and --attack-share ignored; loadtests/guided_policy.yaml by default); "
        "fair-share: --users chat users (the ordinary tenant, --user-rps each) alone for "
        "--solo seconds, then beside another tenant's --flood-streams long streams "
        "(--attack-share and --shape ignored)",
    )
    p.add_argument(
        "--flood-rps",
        type=positive_float,
        default=20.0,
        help="with --scenario guided-compile: the flood tenant's unique schemas per second",
    )
    p.add_argument(
        "--flood-after",
        type=non_negative_float,
        default=20.0,
        help="with --scenario guided-compile: seconds into the run the flood starts",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of the prompts and the attack order (reproducible runs)",
    )
    _add_fair_share(p)


def _add_fair_share(p: argparse.ArgumentParser) -> None:
    """The fair share phase's flood and its tenants' keys (--scenario fair-share)."""
    p.add_argument(
        "--solo",
        type=positive_float,
        metavar="S",
        help="with --scenario fair-share: seconds the chat tenant runs alone (its baseline) "
        "before the flood joins; default: a third of --duration",
    )
    p.add_argument(
        "--flood-streams",
        type=positive_int,
        default=8,
        help="with --scenario fair-share: the flood tenant's streams open at once",
    )
    p.add_argument(
        "--flood-unread",
        type=int,
        default=4,
        help="with --scenario fair-share: of the flood's streams, how many never read a byte of "
        "their answer and hold the connection --flood-hold seconds",
    )
    p.add_argument(
        "--flood-hold",
        type=positive_float,
        default=30.0,
        metavar="S",
        help="with --scenario fair-share: seconds an unread stream holds its connection",
    )
    p.add_argument(
        "--flood-tokens",
        type=positive_int,
        help="with --scenario fair-share: max_tokens of a flood stream; default by upstream "
        "kind: 2048 (reference), 1024 (vllm, other), 128 (llama_cpp: longer streams of the "
        "test model are superlinear, docs/FINDINGS.md)",
    )
    p.add_argument(
        "--flood-n",
        type=positive_int,
        help="with --scenario fair-share: n of a flood stream; default 4 where the upstream "
        "honours n (reference, vllm), else 1",
    )
    p.add_argument(
        "--chat-tokens",
        type=positive_int,
        default=16,
        help="with --scenario fair-share: max_tokens of the chat tenant's chats",
    )
    p.add_argument(
        "--chat-timeout",
        type=positive_float,
        default=20.0,
        metavar="S",
        help="with --scenario fair-share: seconds a chat may take before it counts as unanswered",
    )
    p.add_argument(
        "--tenant-key",
        default=BENIGN_KEY,
        help="with --scenario fair-share: the ordinary (chat) tenant's API key; with --host "
        "the target guard's policy must hold it (loadtests/policy.yaml does), and --host's "
        "/v1/models is asked with it",
    )
    p.add_argument(
        "--flood-key",
        default=FLOOD_KEY,
        help="with --scenario fair-share: the flood tenant's API key, another tenant than "
        "--tenant-key's in the guard's policy (loadtests/policy.yaml: tenant flood)",
    )


def _add_servers(p: argparse.ArgumentParser) -> None:
    """The upstream and the guard the run starts, or the --host it targets."""
    p.add_argument(
        "--upstream-profile",
        choices=("vulnerable", "hardened"),
        default="vulnerable",
        help="limits profile of the reference scheduler started as the upstream",
    )
    p.add_argument("--host", help="target this running guard (or server) instead")
    p.add_argument(
        "--model",
        help="with --host: the model benign requests (and the corpus's bodies) name; "
        "default: the first of the target's GET /v1/models",
    )
    p.add_argument(
        "--upstream-kind",
        choices=("auto", *KINDS),
        default="auto",
        help="with --host: what serves the model, which decides the benign look-alikes sent "
        "(loadtests/fit.py: the reference's own fields only to the reference); auto: from "
        "/v1/models owned_by",
    )
    p.add_argument(
        "--guard-pid",
        type=positive_int,
        help="with --host: the guard's pid on this machine, for its RSS (peak, over time)",
    )
    p.add_argument(
        "--upstream-pid",
        type=positive_int,
        help="with --host: the upstream's pid on this machine (its children counted), for its "
        "RSS and liveness",
    )
    p.add_argument(
        "--guard-metrics",
        metavar="URL",
        help="with --host, without --guard-pid: the guard's Prometheus metrics, for its RSS "
        "(process_resident_memory_bytes); default: --host's /metrics when --host is a guard",
    )
    p.add_argument(
        "--upstream-metrics",
        metavar="URL",
        help="with --host, without --upstream-pid: the upstream's Prometheus metrics (vLLM's "
        "/metrics), for its RSS (process_resident_memory_bytes)",
    )
    p.add_argument(
        "--no-guard", action="store_true", help="send the traffic straight at the upstream"
    )
    p.add_argument(
        "--policy",
        help="guard policy file; without it loadtests/policy.yaml (guided_policy.yaml with "
        "--scenario guided-compile); with --host, the policy whose verdicts say which attacks the "
        "guard admits in front of the upstream's kind by design (those are not sent)",
    )
    p.add_argument(
        "--upstream-cost",
        choices=sorted(COSTS),
        default="gpu",
        help="simulated step cost of the upstream: 'gpu' sleeps a GPU's step time, 'none' not",
    )
    p.add_argument("--upstream-mem-limit-mb", type=positive_int, default=1024, help="RLIMIT_AS")
    p.add_argument("--guard-mem-limit-mb", type=positive_int, default=2048, help="RLIMIT_AS")


def _add_slos(p: argparse.ArgumentParser) -> None:
    """The SLOs the run is gated on."""
    p.add_argument("--baseline", help="slo.json of an earlier run: gate the benign p99 ratio")
    p.add_argument("--p99-ms", type=positive_float, help="benign p99 latency SLO")
    p.add_argument("--max-p99-ratio", type=positive_float, help="p99 / baseline p99 SLO")
    p.add_argument(
        "--max-fair-ratio",
        type=positive_float,
        default=2.0,
        help="with --scenario fair-share: the chat tenant's p99 under flood / its solo p99 SLO",
    )
    p.add_argument("--max-guard-rss-mb", type=positive_float, help="guard peak RSS SLO")
    p.add_argument("--max-upstream-rss-mb", type=positive_float, help="upstream peak RSS SLO")
    p.add_argument("--max-rss-slope", type=positive_float, help="RSS slope SLO, MB/min (soaks)")


def _add_reports(p: argparse.ArgumentParser) -> None:
    """Where the reports go and what they are compared with."""
    p.add_argument("--out", default="out/load", help="directory for the reports")
    p.add_argument(
        "--compare",
        metavar="DIR",
        help=(
            "an earlier run's --out directory (or its report.json / slo.json), e.g. a "
            "--no-guard run: report.html shows it beside this run"
        ),
    )
    p.add_argument(
        "--report-only",
        action="store_true",
        help="do not run: rewrite report.html from the files in --out (with --compare)",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def _add_progress(p: argparse.ArgumentParser) -> None:
    """What the command shows while the run goes on."""
    p.add_argument(
        "--quiet",
        action="store_true",
        help="no progress while the run goes on (CI logs): only the final summary",
    )
    p.add_argument(
        "--progress-interval",
        type=positive_float,
        metavar="S",
        help=(
            "seconds between progress updates (elapsed/total, users, benign req/s, p50, p99 "
            "and errors, the gate's attack figures: content attacks refused of those judged, "
            "floods stopped): on a terminal (stderr a TTY) one line rewritten "
            f"in place every {PROGRESS_TTY_S:g} s unless given, otherwise a plain line every "
            f"{PROGRESS_PLAIN_S:g} s (none with --ui: the web UI shows the run)"
        ),
    )


def progress_interval(args: argparse.Namespace, tty: bool) -> float | None:
    """Seconds between progress updates; None with ``--quiet``."""
    if args.quiet:
        return None
    if args.progress_interval is not None:
        return float(args.progress_interval)
    return PROGRESS_TTY_S if tty else PROGRESS_PLAIN_S


def _add_ui(p: argparse.ArgumentParser) -> None:
    """Locust's web UI."""
    p.add_argument("--ui", action="store_true", help="locust's web UI with the schedguard tab")
    p.add_argument("--web-port", type=int, default=8089, help="web UI port with --ui")
    p.add_argument(
        "--ui-linger",
        type=float,
        default=-1.0,
        help="with --ui: seconds the UI stays after the run (-1: until Ctrl-C)",
    )


def split_users(benign: int, attack_share: float) -> tuple[int, int]:
    """(benign, attackers) so that attackers make ``attack_share`` of all users."""
    if attack_share <= 0:
        return benign, 0
    attackers = max(1, round(benign * attack_share / (1.0 - attack_share)))
    return benign, attackers


@dataclass(frozen=True)
class LoadEndpoints:
    """Where the load goes (``host``) and the servers behind it, for locust's samplers."""

    host: str
    guard_url: str | None
    upstream_url: str | None
    guard_pid: int | None
    upstream_pid: int | None
    model: str = REFERENCE_MODEL
    kind: str = "reference"
    guard_metrics_url: str | None = None
    upstream_metrics_url: str | None = None
    attacks_left_out: str | None = None  # a JSON file: {attack id: why} (loadtests.fit)


def locust_argv(
    args: argparse.Namespace, target: LoadEndpoints, out: Path, progress_s: float | None = None
) -> list[str]:
    """The locust command line for ``args`` against ``target``; the run's progress written to
    ``out/progress.json`` every ``progress_s`` seconds when given."""
    import loadtests

    guided = args.scenario == "guided-compile"
    fair = args.scenario == "fair-share"
    if guided:
        benign, attackers = 1, 1
    elif fair:
        benign, attackers = args.users, args.flood_streams
    else:
        benign, attackers = split_users(args.users, args.attack_share)
    total = benign + attackers
    cmd = [
        sys.executable,
        "-m",
        "locust",
        "-f",
        str(Path(loadtests.__file__).with_name("locustfile.py")),
        "--host",
        target.host,
        "-u",
        str(total),
        "-r",
        str(total),
        "-t",
        f"{math.ceil(args.duration)}s",
        "--csv",
        str(out / "locust"),
        "--html",
        str(out / "locust_report.html"),  # report.html is ours (loadtests.report)
        "--json-file",
        str(out / "locust"),  # locust adds .json
        "--only-summary",
        "--loglevel",
        "WARNING",
        "--attack-share",
        repr(attackers / total),
        "--shape",
        "fair" if fair else args.shape,
        "--user-rps",
        repr(args.user_rps),
        "--upstream-profile",
        args.upstream_profile if not args.host else "any",
        "--seed",
        str(args.seed),
        "--model",
        target.model,
        "--upstream-kind",
        target.kind,
        "--slo-json",
        str(out / "slo.json"),
        "--timeline-json",
        str(out / "timeline.json"),
    ]
    if guided:
        cmd += [
            "--scenario",
            args.scenario,
            "--guided-flood-rps",
            repr(args.flood_rps),
            "--guided-flood-after-s",
            repr(args.flood_after),
            "--guided-json",
            str(out / "guided.json"),
        ]
    if fair:
        cmd += _fair_argv(args)
    if progress_s is not None:
        cmd += [
            "--progress-json",
            str(out / PROGRESS_FILE),
            "--progress-interval-s",
            repr(progress_s),
        ]
    if args.ui:
        cmd += ["--autostart", "--web-host", "127.0.0.1", "--web-port", str(args.web_port)]
        if args.ui_linger >= 0:
            cmd += ["--autoquit", str(int(args.ui_linger))]
    else:
        cmd.append("--headless")
    if args.processes:
        cmd += ["--processes", str(args.processes)]
    for flag, value in (
        ("--guard-url", target.guard_url),
        ("--upstream-url", target.upstream_url),
        ("--guard-pid", target.guard_pid),
        ("--upstream-pid", target.upstream_pid),
        ("--guard-metrics-url", target.guard_metrics_url),
        ("--upstream-metrics-url", target.upstream_metrics_url),
        ("--attacks-left-out-json", target.attacks_left_out),
        ("--slo-baseline", args.baseline),
        ("--slo-p99-ms", args.p99_ms),
        ("--slo-max-p99-ratio", args.max_p99_ratio),
        ("--slo-max-guard-rss-mb", args.max_guard_rss_mb),
        ("--slo-max-upstream-rss-mb", args.max_upstream_rss_mb),
        ("--slo-max-rss-slope", args.max_rss_slope),
    ):
        if value:
            cmd += [flag, str(value)]
    extra = list(args.locust_args or [])
    if extra[:1] == ["--"]:
        extra = extra[1:]
    return cmd + extra


def _fair_argv(args: argparse.Namespace) -> list[str]:
    """The fair share phase's locust arguments (loadtests/locustfile.py's ``--fair-*``)."""
    cmd = [
        "--scenario",
        "fair-share",
        "--fair-streams",
        str(args.flood_streams),
        "--fair-unread",
        str(min(args.flood_unread, args.flood_streams)),
        "--fair-hold-s",
        repr(args.flood_hold),
        "--fair-chat-tokens",
        str(args.chat_tokens),
        "--fair-chat-timeout-s",
        repr(args.chat_timeout),
        "--benign-key",
        args.tenant_key,
        "--flood-key",
        args.flood_key,
        "--slo-fair-max-p99-ratio",
        repr(args.max_fair_ratio),
    ]
    for flag, value in (
        ("--fair-solo-s", args.solo),
        ("--fair-flood-tokens", args.flood_tokens),
        ("--fair-flood-n", args.flood_n),
    ):
        if value:
            cmd += [flag, str(value)]
    return cmd


def _err(message: str) -> None:
    print(f"schedguard load: {message}", file=sys.stderr, flush=True)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def run(args: argparse.Namespace) -> int:
    from loadtests.report import load_run, write_report

    out = Path(args.out)
    if args.compare:
        compare = Path(args.compare)
        if (compare if compare.is_dir() else compare.parent).resolve() == out.resolve():
            _err("--compare names --out itself: give the other run's directory")
            return 2
        try:
            load_run(compare)
        except (OSError, ValueError) as exc:
            _err(f"--compare: {exc}")
            return 2
    if args.report_only:
        try:
            path = write_report(out, args.compare)
        except (OSError, ValueError) as exc:
            _err(f"--report-only: {exc}")
            return 2
        print(path)
        return 0
    if importlib.util.find_spec("locust") is None:
        _err("locust is not installed: pip install 'schedguard[load]'")
        return 2
    if args.host and args.no_guard:
        _err("--no-guard starts its own upstream; it cannot be combined with --host")
        return 2
    if args.scenario == "fair-share" and args.solo is not None and args.solo >= args.duration:
        _err("--solo must end before --duration: the flood segment needs time")
        return 2
    from guard.errors import PolicyError
    from loadtests.target import TargetError
    from schedguard.servers import RunningServer, ServerStartError

    if not args.host and (args.guard_pid or args.upstream_pid or args.model):
        _err(
            "--guard-pid, --upstream-pid and --model go with --host (the servers started here are known)"
        )
        return 2
    out.mkdir(parents=True, exist_ok=True)
    for stale in (
        "slo.json",
        "report.json",
        "timeline.json",
        "report.html",
        "locust_report.html",
        "guided.json",
        PROGRESS_FILE,
        "attacks_left_out.json",
    ):
        with contextlib.suppress(FileNotFoundError):
            (out / stale).unlink()
    servers: list[RunningServer] = []
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        try:
            target = _start_servers(args, servers)
        except (ServerStartError, OSError) as exc:
            _err(f"could not start the servers: {exc}")
            return 2
        except TargetError as exc:
            _err(f"--host {args.host}: {exc}")
            return 2
        except PolicyError as exc:
            _err(f"--policy: {exc}")
            return 2
        tty = sys.stderr.isatty()
        interval = None if args.ui else progress_interval(args, tty)
        cmd = locust_argv(args, target, out, interval)
        (out / "command.txt").write_text(" ".join(cmd) + "\n")
        if args.ui:
            print(
                f"schedguard load: dashboard on http://127.0.0.1:{args.web_port}/ "
                f"(tab 'schedguard') and http://127.0.0.1:{args.web_port}/schedguard",
                file=sys.stderr,
                flush=True,
            )
        shown = None if interval is None else _ProgressView(out / PROGRESS_FILE, interval, tty)
        code = _run_locust(cmd, out, None if args.ui else args.duration + _LOCUST_GRACE_S, shown)
        return _finish(args, out, servers, code)
    finally:
        for server in reversed(servers):
            _save_log(server, out)
            server.stop()
        signal.signal(signal.SIGTERM, previous)


def _start_servers(args: argparse.Namespace, servers: list[Any]) -> LoadEndpoints:
    from schedguard.servers import RunningServer, ServerSpec, free_port, schedguard_argv

    if args.host:
        return _host_endpoints(args)
    bind = "127.0.0.1"
    ports = {"upstream": free_port(bind), "guard": free_port(bind)}
    upstream_spec = ServerSpec(
        "upstream",
        lambda p, h: [
            sys.executable,
            "-m",
            "schedguard._load_cli",
            "upstream",
            "--profile",
            args.upstream_profile,
            "--host",
            h,
            "--port",
            str(p["upstream"]),
            "--cost",
            args.upstream_cost,
        ],
    )
    upstream = RunningServer(
        upstream_spec,
        ports,
        bind,
        mem_limit_bytes=args.upstream_mem_limit_mb * MB,
        sample_interval_s=0.2,
    )
    servers.append(upstream)
    upstream.wait_ready(_START_TIMEOUT_S)
    if args.no_guard:
        return LoadEndpoints(upstream.url, None, upstream.url, None, upstream.proc.pid)
    import loadtests

    default = "guided_policy.yaml" if args.scenario == "guided-compile" else "policy.yaml"
    policy = args.policy or str(Path(loadtests.__file__).with_name(default))
    guard_spec = ServerSpec(
        "guard",
        lambda p, h: schedguard_argv(
            "serve",
            "--upstream",
            f"http://{h}:{p['upstream']}",
            "--policy",
            policy,
            "--host",
            h,
            "--port",
            str(p["guard"]),
            "--log-level",
            "warning",
        ),
        health_path="/readyz",
    )
    guard = RunningServer(
        guard_spec,
        ports,
        bind,
        mem_limit_bytes=args.guard_mem_limit_mb * MB,
        sample_interval_s=0.2,
    )
    servers.append(guard)
    guard.wait_ready(_START_TIMEOUT_S)
    return LoadEndpoints(guard.url, guard.url, upstream.url, guard.proc.pid, upstream.proc.pid)


class _ProgressView:
    """Shows ``progress.json`` (written by the locust master) on stderr every ``interval_s``:
    on a terminal one line rewritten in place, otherwise a line each time."""

    def __init__(self, path: Path, interval_s: float, tty: bool) -> None:
        self.path = path
        self.interval_s = interval_s
        self.tty = tty
        self.shown = ""
        self.closed = False
        self._next = time.monotonic() + interval_s

    def due(self) -> float:
        """Seconds until the next update."""
        return max(0.0, self._next - time.monotonic())

    def update(self, force: bool = False) -> None:
        if not force and self.due() > 0:
            return
        self._next = time.monotonic() + self.interval_s
        snapshot = progress.read(self.path)
        if snapshot is None:
            return
        line = progress.render(snapshot)
        if self.tty:
            # \r and erase-line: the same line, updated.
            sys.stderr.write(f"\r\x1b[2K{line}")
        elif line != self.shown or not snapshot.final:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()
        self.shown = line

    def close(self) -> None:
        """The last progress (the gate's own), and the line ended, once."""
        if self.closed:
            return
        self.closed = True
        self.update(force=True)
        if self.tty and self.shown:
            sys.stderr.write("\n")
            sys.stderr.flush()


def _wait(
    proc: subprocess.Popen[bytes], timeout_s: float | None, view: _ProgressView | None
) -> int:
    """``proc.wait(timeout_s)``, updating ``view`` meanwhile."""
    if view is None:
        return proc.wait(timeout=timeout_s)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        step = view.due()
        if deadline is not None:
            step = min(step, deadline - time.monotonic())
        try:
            code = proc.wait(timeout=max(0.05, step))
        except subprocess.TimeoutExpired:
            if deadline is not None and time.monotonic() >= deadline:
                raise
            view.update()
            continue
        view.close()
        return code


def _host_endpoints(args: argparse.Namespace) -> LoadEndpoints:
    """``--host`` and what the command line and the target itself say about it: the model and
    the upstream's kind (:func:`loadtests.target.discover`), and where the memory of the guard
    and the upstream can be read."""
    from loadtests.target import discover, is_guard

    host = args.host.rstrip("/")
    found = discover(host, model=args.model, kind=args.upstream_kind, api_key=args.tenant_key)
    guard_metrics = args.guard_metrics
    if guard_metrics is None and args.guard_pid is None and is_guard(host):
        guard_metrics = host + "/metrics"
    print(
        f"schedguard load: {host} serves {found.model!r} ({found.kind}; {found.source})",
        file=sys.stderr,
        flush=True,
    )
    return LoadEndpoints(
        host,
        host,
        None,
        args.guard_pid,
        args.upstream_pid,
        model=found.model,
        kind=found.kind,
        guard_metrics_url=None if args.guard_pid else guard_metrics,
        upstream_metrics_url=None if args.upstream_pid else args.upstream_metrics,
        attacks_left_out=_attacks_left_out(args, found.kind),
    )


def _attacks_left_out(args: argparse.Namespace, kind: str) -> str | None:
    """The attacks the guard admits in front of ``kind`` by design (another upstream's:
    :func:`loadtests.fit.attacks_left_out`, judged under ``--policy`` or the load tests'),
    written to ``--out``; None when none is."""
    import loadtests
    from guard.policy import load_policy
    from loadtests.fit import attacks_left_out
    from loadtests.replay import load_attacks
    from loadtests.target import ATTACK_KEY

    if kind in ("reference", "other") or args.scenario != "mixed":
        return None
    policy = load_policy(args.policy or str(Path(loadtests.__file__).with_name("policy.yaml")))
    attacks = [replay.payload for replay in load_attacks()]
    left = attacks_left_out(attacks, kind, policy, ATTACK_KEY)
    if not left:
        return None
    path = Path(args.out) / "attacks_left_out.json"
    path.write_text(json.dumps(left, indent=1, sort_keys=True) + "\n")
    print(
        f"schedguard load: {len(left)} attacks left out, the guard admits them in front of "
        f"{kind} by design: {', '.join(sorted(left))}",
        file=sys.stderr,
        flush=True,
    )
    return str(path)


def _run_locust(
    cmd: Sequence[str], out: Path, timeout_s: float | None, view: _ProgressView | None = None
) -> int:
    with open(out / "locust.log", "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            return _wait(proc, timeout_s, view)
        except subprocess.TimeoutExpired:
            _err(f"locust did not finish within {timeout_s:g} s; stopping it")
            return _stop(proc)
        except KeyboardInterrupt:
            # Ctrl-C: locust stops, runs the gate and writes its reports; then report as usual.
            return _stop(proc)
        except BaseException:
            _stop(proc)
            raise
        finally:
            if view is not None:
                view.close()  # the summary starts on a line of its own


def _stop(proc: subprocess.Popen[bytes]) -> int:
    # SIGINT first: locust then writes its reports and runs the SLO gate.
    with contextlib.suppress(OSError):
        proc.send_signal(signal.SIGINT)
    try:
        return proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def _save_log(server: Any, out: Path) -> None:
    with contextlib.suppress(OSError):
        (out / f"{server.spec.name}.log").write_text(server.log_tail(200_000))


def _servers_info(servers: Sequence[Any]) -> dict[str, Any]:
    info: dict[str, Any] = {}
    for s in servers:
        s.sampler.sample_now()
        info[s.spec.name] = {
            "url": s.url,
            "pid": s.proc.pid,
            "peak_rss_mb": round(s.sampler.peak_bytes / MB, 1),
            "peak_rss_sample_s": s.sampler.interval_s,  # the report states this sampler's period
            "exit": s.exit_description() if s.proc.poll() is not None else "running",
            "exit_code": s.proc.returncode,
            "died_of_memory": s.died_of_memory() if s.proc.poll() is not None else False,
        }
    return info


def _finish(args: argparse.Namespace, out: Path, servers: Sequence[Any], code: int) -> int:
    from loadtests.report import write_report
    from loadtests.slo import Report, render_table

    slo_path = out / "slo.json"
    if not slo_path.exists():
        _err(f"locust exited {code} without an SLO report; see {out / 'locust.log'}")
        with contextlib.suppress(OSError):
            sys.stderr.write((out / "locust.log").read_text()[-3000:])
        return 2
    data = json.loads(slo_path.read_text())
    report = Report.from_dict(data)
    servers_info = _servers_info(servers)
    for name, info in servers_info.items():
        # This process sampled every 0.2 s: it sees the spike of a server that died of memory
        # between two of locust's samples.
        report = report.with_peak_rss(name, int(info["peak_rss_mb"] * MB))
    full = {
        **report.to_dict(),
        "servers": servers_info,
        "mode": "no-guard" if args.no_guard else ("host" if args.host else "guard"),
        "files": {
            "slo": str(slo_path),
            "html": str(out / "report.html"),
            "locust_html": str(out / "locust_report.html"),
            "timeline": str(out / "timeline.json"),
            "csv": str(out / "locust_stats.csv"),
            "locust_json": str(out / "locust.json"),
            "log": str(out / "locust.log"),
        },
    }
    guided_path = out / "guided.json"
    if args.scenario == "guided-compile" and guided_path.exists():
        full["guided"] = json.loads(guided_path.read_text())
        full["files"]["guided"] = str(guided_path)
    (out / "report.json").write_text(json.dumps(full, indent=2, sort_keys=True) + "\n")
    try:
        write_report(out, args.compare)
    except (OSError, ValueError) as exc:  # the gate's verdict stands; say what is missing
        _err(f"could not write report.html: {exc}")
    if args.json:
        sys.stdout.write(json.dumps(full, indent=2, sort_keys=True) + "\n")
    else:
        print(render_table(report))
        if "guided" in full:
            from loadtests.guided import render

            print("\n" + render(full["guided"]) + "\n")
        if "fair_share" in report.numbers:
            from loadtests import fairshare

            print("\n" + fairshare.render(report.numbers["fair_share"]) + "\n")
        for name, s in servers_info.items():
            print(f"{name}: {s['url']} pid {s['pid']}, peak RSS {s['peak_rss_mb']} MB, {s['exit']}")
        print(
            f"reports: {out}/ (report.html, slo.json, timeline.json, locust_report.html, "
            "locust_stats.csv, locust.json)"
        )
    sys.stdout.flush()
    if code not in (0, 1):
        _err(f"locust exited {code}; see {out / 'locust.log'}")
        return 2
    return 0 if report.passed else 1


# ------------------------------------------------------------------------------ upstream


def upstream_main(argv: Sequence[str]) -> int:
    """The reference scheduler with a cost model (``schedguard ref`` otherwise)."""
    parser = argparse.ArgumentParser(prog="python -m schedguard._load_cli upstream")
    parser.add_argument("--profile", choices=("vulnerable", "hardened"), default="vulnerable")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--cost", choices=sorted(COSTS), default="gpu")
    args = parser.parse_args(argv)

    import uvicorn

    from schedguard._oom import exit_on_memory_error
    from scheduler_ref.config import CostModel, SchedulerConfig
    from scheduler_ref.profiles import get_profile
    from scheduler_ref.server import create_app

    profile = get_profile(args.profile)
    config = SchedulerConfig.for_profile(profile, cost=CostModel(**COSTS[args.cost]))
    app = create_app(profile, config)
    exit_on_memory_error(app)
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        loop="uvloop",
        http="httptools",
        log_level="warning",
        access_log=False,
    )
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["upstream"]:
        sys.exit(upstream_main(sys.argv[2:]))
    sys.exit("usage: python -m schedguard._load_cli upstream --port P [--profile P] [--cost C]")
