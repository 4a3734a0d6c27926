"""The seed experiment: the seed payload and a benign request against each target.

Each target is one or more servers started as child processes under ``RLIMIT_AS``; each request
runs under a hard wall clock (the servers are stopped when it expires). Targets and payloads are
data: the last target is the guard (``schedguard serve``) in front of the vulnerable profile, each
a capped child process, requests sent to the guard.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx

from schedguard._report import render_comparison, render_rows
from schedguard._servers import (
    RunningServer,
    ServerSpec,
    ServerStartError,
    free_port,
    schedguard_argv,
)

# The write-up's payload, verbatim: 1024 openers, 512 closers, ~9.7 KB.
SEED_TEMPLATE = "{{" * 1024 + "system_prompt}}" * 512

RowOutcome = Literal["ok", "rejected", "server_error", "killed", "timeout", "error"]
Progress = Callable[[str], None]
MiB = 1 << 20


@dataclass(frozen=True)
class Payload:
    name: str
    path: str
    body: Mapping[str, Any]  # "{model}" in a top-level string value is the served model's id


BENIGN = Payload(
    "benign",
    "/v1/completions",
    {
        "model": "{model}",
        "prompt_template": "You are {{persona}}. Answer in {{lang}}: what is a scheduler?",
        "template_vars": {"persona": "a concise assistant", "lang": "English"},
        "max_tokens": 16,
    },
)
SEED = Payload(
    "seed",
    "/v1/completions",
    {"model": "{model}", "prompt_template": SEED_TEMPLATE, "max_tokens": 16},
)
PAYLOADS: tuple[Payload, ...] = (BENIGN, SEED)  # benign first: the seed may kill the server


@dataclass(frozen=True)
class Target:
    """Servers started in order; requests go to ``entry`` (the last server by default)."""

    name: str
    profile: str
    servers: tuple[ServerSpec, ...]
    entry: str | None = None

    @property
    def entry_name(self) -> str:
        return self.entry or self.servers[-1].name


def ref_server(profile: str, name: str = "scheduler_ref") -> ServerSpec:
    def argv(ports: Mapping[str, int], host: str) -> list[str]:
        return schedguard_argv(
            "ref", "--profile", profile, "--host", host, "--port", str(ports[name]),
            "--log-level", "warning",
        )  # fmt: skip

    return ServerSpec(name, argv)


def guard_server(upstream: str = "scheduler_ref", name: str = "guard") -> ServerSpec:
    """``schedguard serve`` (default policy) in front of server ``upstream``; ready once the
    upstream answers through it (``/readyz``)."""

    def argv(ports: Mapping[str, int], host: str) -> list[str]:
        return schedguard_argv(
            "serve", "--upstream", f"http://{host}:{ports[upstream]}", "--host", host,
            "--port", str(ports[name]), "--log-level", "warning",
        )  # fmt: skip

    return ServerSpec(name, argv, health_path="/readyz")


TARGETS: tuple[Target, ...] = (
    Target("scheduler_ref", "vulnerable", (ref_server("vulnerable"),)),
    Target("scheduler_ref", "hardened", (ref_server("hardened"),)),
    Target("guard", "vulnerable", (ref_server("vulnerable"), guard_server()), entry="guard"),
)


@dataclass(frozen=True)
class DemoConfig:
    mem_limit_bytes: int = 1 << 30
    timeout_s: float = 20.0  # per request, hard
    port_base: int = 0  # 0: free ports
    host: str = "127.0.0.1"
    startup_timeout_s: float = 60.0


@dataclass(frozen=True)
class Row:
    target: str
    profile: str
    payload: str
    outcome: RowOutcome
    status: int | None  # HTTP status, None without a response
    code: str | None  # the error body's code, "ok" on 2xx
    latency_ms: float
    peak_rss_mb: float  # peak RSS of the target's servers while the request ran
    rss_growth_mb: float  # that peak minus their RSS just before the request
    detail: str = ""
    server_peak_rss_mb: dict[str, float] = field(default_factory=dict)
    server_rss_growth_mb: dict[str, float] = field(default_factory=dict)  # per server

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _fill(body: Mapping[str, Any], model: str) -> dict[str, Any]:
    return {k: (v.replace("{model}", model) if isinstance(v, str) else v) for k, v in body.items()}


def _classify(status: int) -> RowOutcome:
    if 200 <= status < 300:
        return "ok"
    return "rejected" if status < 500 else "server_error"


def _error_code(response: httpx.Response) -> str | None:
    if response.is_success:
        return "ok"
    try:
        err = response.json().get("error")
    except (ValueError, AttributeError):
        return None
    code = err.get("code") if isinstance(err, dict) else None
    return str(code) if code is not None else None


class _Deployment:
    """The running servers of one target; restarted when a payload took them down."""

    def __init__(self, target: Target, config: DemoConfig, ports: Mapping[str, int]) -> None:
        self.target = target
        self.config = config
        self.ports = ports
        self.servers: list[RunningServer] = []
        self.model = "ref"

    def ensure_up(self, progress: Progress) -> None:
        if self.servers and all(s.alive() for s in self.servers):
            return
        self.stop()
        mb = self.config.mem_limit_bytes // MiB
        for spec in self.target.servers:
            progress(
                f"[demo] starting {spec.name} ({self.target.profile}) on "
                f"{self.config.host}:{self.ports[spec.name]}, memory cap {mb} MiB"
            )
            server = RunningServer(
                spec, self.ports, self.config.host, mem_limit_bytes=self.config.mem_limit_bytes
            )
            self.servers.append(server)
            server.wait_ready(self.config.startup_timeout_s)
        self.model = self._served_model()

    def _served_model(self) -> str:
        with httpx.Client(timeout=5.0) as client:
            try:
                data = client.get(self.entry.url + "/v1/models").json()["data"]
                return str(data[0]["id"])
            except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
                return "ref"

    @property
    def entry(self) -> RunningServer:
        name = self.target.entry_name
        return next(s for s in self.servers if s.spec.name == name)

    def stop(self) -> None:
        for server in reversed(self.servers):
            server.stop()
        self.servers = []


def _send(dep: _Deployment, payload: Payload, config: DemoConfig) -> Row:
    """One request under a hard wall clock; the row says what happened to it and the servers."""
    baselines = {s.spec.name: s.sampler.reset_peak() for s in dep.servers}
    expired = threading.Event()

    def expire() -> None:  # the wall clock: take the servers down, which ends the request
        expired.set()
        dep.stop()

    watchdog = threading.Timer(config.timeout_s, expire)
    watchdog.daemon = True
    status: int | None = None
    code: str | None = None
    failure = ""
    # Read the timeout from the event, not the HTTP client: a server trickling bytes must not
    # stretch it.
    client_timeout = httpx.Timeout(config.timeout_s + 5.0, connect=5.0)
    url, body = dep.entry.url + payload.path, _fill(payload.body, dep.model)
    with httpx.Client(timeout=client_timeout) as client:  # built outside the timed part
        start = time.perf_counter()
        watchdog.start()
        try:
            response = client.post(url, json=body)
            status, code = response.status_code, _error_code(response)
        except httpx.HTTPError as exc:
            failure = f"{type(exc).__name__}: {exc}"
        finally:
            watchdog.cancel()
        latency_ms = (time.perf_counter() - start) * 1000

    servers = list(dep.servers)
    peaks = {s.spec.name: s.sampler.sample_now() for s in servers}
    if status is None and not expired.is_set():
        for s in servers:  # a dropped connection: give a dying server a moment to be reaped
            with contextlib.suppress(subprocess.TimeoutExpired):  # still alive is an answer too
                s.proc.wait(timeout=2.0)

    outcome: RowOutcome
    detail = ""
    dead = [s for s in servers if s.proc.poll() is not None]
    if expired.is_set():
        outcome, detail = "timeout", f"no answer within {config.timeout_s:g} s; servers stopped"
    elif status is not None:
        outcome = _classify(status)
    elif dead:
        outcome = "killed" if any(s.died_of_memory() for s in dead) else "error"
        detail = "; ".join(f"{s.spec.name} {s.exit_description()}" for s in dead)
    else:
        outcome, detail = "error", failure
    peak_total = sum(peaks.values())
    base_total = sum(baselines.get(name, 0) for name in peaks)
    return Row(
        target=dep.target.name,
        profile=dep.target.profile,
        payload=payload.name,
        outcome=outcome,
        status=status,
        code=code,
        latency_ms=round(latency_ms, 2),
        peak_rss_mb=round(peak_total / MiB, 1),
        rss_growth_mb=round(max(0, peak_total - base_total) / MiB, 1),
        detail=detail,
        server_peak_rss_mb={k: round(v / MiB, 1) for k, v in peaks.items()},
        server_rss_growth_mb={
            k: round(max(0, v - baselines.get(k, 0)) / MiB, 1) for k, v in peaks.items()
        },
    )


def _allocate_ports(targets: Sequence[Target], config: DemoConfig) -> list[dict[str, int]]:
    out: list[dict[str, int]] = []
    next_port = config.port_base
    for target in targets:
        ports: dict[str, int] = {}
        for spec in target.servers:
            if config.port_base:
                ports[spec.name] = next_port
                next_port += 1
            else:
                ports[spec.name] = free_port(config.host)
        out.append(ports)
    return out


def run_demo(
    config: DemoConfig = DemoConfig(),  # frozen: sharing the default is safe
    *,
    targets: Sequence[Target] = TARGETS,
    payloads: Sequence[Payload] = PAYLOADS,
    progress: Progress = _stderr,
) -> list[Row]:
    """Send every payload to every target; return one row per (target, payload)."""
    rows: list[Row] = []
    for target, ports in zip(targets, _allocate_ports(targets, config), strict=True):
        dep = _Deployment(target, config, ports)
        try:
            for payload in payloads:
                try:
                    dep.ensure_up(progress)
                except ServerStartError as exc:
                    progress(f"[demo] {target.name} ({target.profile}) did not start: {exc}")
                    rows.append(_start_failure_row(target, payload, str(exc)))
                    continue
                progress(f"[demo] {target.name} ({target.profile}): sending {payload.name} ...")
                row = _send(dep, payload, config)
                rows.append(row)
                progress(f"[demo]   -> {_summary(row)}")
        finally:
            dep.stop()
    return rows


def _start_failure_row(target: Target, payload: Payload, why: str) -> Row:
    first_line = why.splitlines()[0] if why else "did not start"
    return Row(target.name, target.profile, payload.name, "error", None, None, 0.0, 0.0, 0.0,
               f"server did not start: {first_line}")  # fmt: skip


def _summary(row: Row) -> str:
    what = f"{row.status} {row.code}" if row.status is not None else row.outcome
    return f"{what} in {row.latency_ms:.1f} ms, server peak RSS {row.peak_rss_mb:.0f} MB"


def write_json(rows: Sequence[Row], path: str | Path, config: DemoConfig) -> None:
    doc = {
        "mem_limit_mb": config.mem_limit_bytes // MiB,
        "timeout_s": config.timeout_s,
        "rows": [r.to_json() for r in rows],
    }
    Path(path).write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")


def run_demo_cli(config: DemoConfig, *, json_path: str | None = None) -> int:
    """``schedguard demo``: run, print the tables, optionally write JSON. 0 unless it failed."""
    import importlib.util

    if importlib.util.find_spec("scheduler_ref.server") is None:
        print("schedguard demo: scheduler_ref.server is not installed", file=sys.stderr)
        return 2
    rows = run_demo(config)
    print(render_rows(rows, config))
    print()
    print(render_comparison(rows, config))
    if json_path:
        write_json(rows, json_path, config)
        print(f"\nrows written to {json_path}")
    return 1 if any(r.outcome == "error" for r in rows) else 0
