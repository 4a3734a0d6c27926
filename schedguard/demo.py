"""The seed experiment: the seed payload and a benign request against each deployment.

Each deployment is one or more servers started as child processes under ``RLIMIT_AS``; each
request runs under a hard wall clock (the servers are stopped when it expires). Deployments and
payloads are data: the last deployment is the guard (``schedguard serve``) in front of the
vulnerable profile, each a capped child process, requests sent to the guard.

A refused payload is sent again ``DemoConfig.steady_requests`` times on the same kept-alive
connection: the median of those (``steady_latency_ms``) is the refusal's steady-state latency,
the figure the seed write-up's "after patch" latency is comparable with; the first request's
latency includes connecting and a cold server.

Only the standard library talks HTTP here (``http.client``), so that ``schedguard demo`` runs
from a plain install of the wheel.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from schedguard._demo_rows import DemoConfig, MiB, Row, RowOutcome
from schedguard._report import render_comparison, render_rows
from schedguard.servers import (
    RunningServer,
    ServerSpec,
    ServerStartError,
    free_port,
    schedguard_argv,
)

__all__ = [
    "BENIGN",
    "DEPLOYMENTS",
    "PAYLOADS",
    "SEED",
    "SEED_TEMPLATE",
    "DemoConfig",
    "DemoRequest",
    "Deployment",
    "Row",
    "RowOutcome",
    "guard_server",
    "ref_server",
    "run_demo",
    "run_demo_cli",
    "write_json",
]

# The write-up's payload, verbatim: 1024 openers, 512 closers, ~9.7 KB.
SEED_TEMPLATE = "{{" * 1024 + "system_prompt}}" * 512

ProgressCallback = Callable[[str], None]
_DEFAULT_CONFIG = DemoConfig()  # frozen: sharing it is safe


@dataclass(frozen=True)
class DemoRequest:
    """One request the demo sends: a name for the tables, the path and the JSON body."""

    name: str
    path: str
    body: Mapping[str, Any]  # "{model}" in a top-level string value is the served model's id


BENIGN = DemoRequest(
    "benign",
    "/v1/completions",
    {
        "model": "{model}",
        "prompt_template": "You are {{persona}}. Answer in {{lang}}: what is a scheduler?",
        "template_vars": {"persona": "a concise assistant", "lang": "English"},
        "max_tokens": 16,
    },
)
SEED = DemoRequest(
    "seed",
    "/v1/completions",
    {"model": "{model}", "prompt_template": SEED_TEMPLATE, "max_tokens": 16},
)
PAYLOADS: tuple[DemoRequest, ...] = (BENIGN, SEED)  # benign first: the seed may kill the server


@dataclass(frozen=True)
class Deployment:
    """Servers started in order; requests go to ``entry`` (the last server by default). ``name``
    and ``profile`` are the rows' ``target`` and ``profile``."""

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


DEPLOYMENTS: tuple[Deployment, ...] = (
    Deployment("scheduler_ref", "vulnerable", (ref_server("vulnerable"),)),
    Deployment("scheduler_ref", "hardened", (ref_server("hardened"),)),
    Deployment("guard", "vulnerable", (ref_server("vulnerable"), guard_server()), entry="guard"),
)


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _fill(body: Mapping[str, Any], model: str) -> dict[str, Any]:
    return {k: (v.replace("{model}", model) if isinstance(v, str) else v) for k, v in body.items()}


def _classify(status: int) -> RowOutcome:
    if 200 <= status < 300:
        return "ok"
    return "rejected" if status < 500 else "server_error"


def _error_code(status: int, data: bytes) -> str | None:
    if 200 <= status < 300:
        return "ok"
    try:
        err = json.loads(data).get("error")
    except (ValueError, AttributeError):
        return None
    code = err.get("code") if isinstance(err, dict) else None
    return str(code) if code is not None else None


def _post(conn: http.client.HTTPConnection, path: str, body: bytes) -> tuple[int, bytes]:
    """POST ``body`` as JSON on ``conn`` (reconnecting when the server closed it)."""
    conn.request("POST", path, body=body, headers={"content-type": "application/json"})
    response = conn.getresponse()
    return response.status, response.read()


_HTTP_ERRORS = (OSError, http.client.HTTPException)


class _Running:
    """The running servers of one deployment; restarted when a payload took them down."""

    def __init__(
        self, deployment: Deployment, config: DemoConfig, ports: Mapping[str, int]
    ) -> None:
        self.deployment = deployment
        self.config = config
        self.ports = ports
        self.servers: list[RunningServer] = []
        self.model = "ref"

    def ensure_up(self, progress: ProgressCallback) -> None:
        if self.servers and all(s.alive() for s in self.servers):
            return
        self.stop()
        mb = self.config.mem_limit_bytes // MiB
        for spec in self.deployment.servers:
            progress(
                f"[demo] starting {spec.name} ({self.deployment.profile}) on "
                f"{self.config.host}:{self.ports[spec.name]}, memory cap {mb} MiB"
            )
            server = RunningServer(
                spec, self.ports, self.config.host, mem_limit_bytes=self.config.mem_limit_bytes
            )
            self.servers.append(server)
            server.wait_ready(self.config.startup_timeout_s)
        self.model = self._served_model()

    def _served_model(self) -> str:
        conn = http.client.HTTPConnection(self.entry.host, self.entry.port, timeout=5.0)
        try:
            conn.request("GET", "/v1/models")
            data = json.loads(conn.getresponse().read())["data"]
            return str(data[0]["id"])
        except (*_HTTP_ERRORS, ValueError, KeyError, IndexError, TypeError):
            return "ref"
        finally:
            conn.close()

    @property
    def entry(self) -> RunningServer:
        name = self.deployment.entry_name
        return next(s for s in self.servers if s.spec.name == name)

    def stop(self) -> None:
        for server in reversed(self.servers):
            server.stop()
        self.servers = []


def _steady_latency(
    conn: http.client.HTTPConnection, path: str, body: bytes, status: int, config: DemoConfig
) -> tuple[float | None, int]:
    """(median ms, count) of up to ``config.steady_requests`` more requests on ``conn``, each
    answered with ``status`` again, within ``config.steady_budget_s``."""
    latencies: list[float] = []
    deadline = time.monotonic() + config.steady_budget_s
    while len(latencies) < config.steady_requests and time.monotonic() < deadline:
        start = time.perf_counter()
        try:
            again, _ = _post(conn, path, body)
        except _HTTP_ERRORS:
            break
        if again != status:
            break
        latencies.append((time.perf_counter() - start) * 1000)
    if not latencies:
        return None, 0
    return round(statistics.median(latencies), 2), len(latencies)


def _send(run: _Running, payload: DemoRequest, config: DemoConfig) -> Row:
    """One request under a hard wall clock; the row says what happened to it and the servers,
    and, for a refusal, its steady-state latency."""
    baselines = {s.spec.name: s.sampler.reset_peak() for s in run.servers}
    expired = threading.Event()

    def expire() -> None:  # the wall clock: take the servers down, which ends the request
        expired.set()
        run.stop()

    watchdog = threading.Timer(config.timeout_s, expire)
    watchdog.daemon = True
    status: int | None = None
    code: str | None = None
    failure = ""
    # The wall clock is the watchdog's, not the socket's: a server trickling bytes must not
    # stretch it (the socket timeout only bounds each read).
    entry = run.entry
    conn = http.client.HTTPConnection(entry.host, entry.port, timeout=config.timeout_s + 5.0)
    body = json.dumps(_fill(payload.body, run.model)).encode()
    try:
        start = time.perf_counter()
        watchdog.start()
        try:
            status, data = _post(conn, payload.path, body)
            code = _error_code(status, data)
        except _HTTP_ERRORS as exc:
            failure = f"{type(exc).__name__}: {exc}"
        finally:
            watchdog.cancel()
        latency_ms = (time.perf_counter() - start) * 1000

        servers = list(run.servers)
        peaks = {s.spec.name: s.sampler.sample_now() for s in servers}
        if status is None and not expired.is_set():
            for s in servers:  # a dropped connection: give a dying server a moment to be reaped
                with contextlib.suppress(subprocess.TimeoutExpired):  # still alive: an answer too
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
        steady_ms: float | None = None
        steady_n = 0
        if outcome == "rejected" and status is not None and not dead:
            steady_ms, steady_n = _steady_latency(conn, payload.path, body, status, config)
    finally:
        conn.close()
    peak_total = sum(peaks.values())
    base_total = sum(baselines.get(name, 0) for name in peaks)
    return Row(
        target=run.deployment.name,
        profile=run.deployment.profile,
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
        steady_latency_ms=steady_ms,
        steady_requests=steady_n,
    )


def _allocate_ports(deployments: Sequence[Deployment], config: DemoConfig) -> list[dict[str, int]]:
    out: list[dict[str, int]] = []
    next_port = config.port_base
    for deployment in deployments:
        ports: dict[str, int] = {}
        for spec in deployment.servers:
            if config.port_base:
                ports[spec.name] = next_port
                next_port += 1
            else:
                ports[spec.name] = free_port(config.host)
        out.append(ports)
    return out


def run_demo(
    config: DemoConfig = _DEFAULT_CONFIG,
    *,
    deployments: Sequence[Deployment] = DEPLOYMENTS,
    payloads: Sequence[DemoRequest] = PAYLOADS,
    progress: ProgressCallback = _stderr,
) -> list[Row]:
    """Send every payload to every deployment; return one row per (deployment, payload)."""
    rows: list[Row] = []
    for deployment, ports in zip(deployments, _allocate_ports(deployments, config), strict=True):
        run = _Running(deployment, config, ports)
        what = f"{deployment.name} ({deployment.profile})"
        try:
            for payload in payloads:
                try:
                    run.ensure_up(progress)
                except ServerStartError as exc:
                    progress(f"[demo] {what} did not start: {exc}")
                    rows.append(_start_failure_row(deployment, payload, str(exc)))
                    continue
                progress(f"[demo] {what}: sending {payload.name} ...")
                row = _send(run, payload, config)
                rows.append(row)
                progress(f"[demo]   -> {_summary(row)}")
        finally:
            run.stop()
    return rows


def _start_failure_row(deployment: Deployment, payload: DemoRequest, why: str) -> Row:
    first_line = why.splitlines()[0] if why else "did not start"
    return Row(deployment.name, deployment.profile, payload.name, "error", None, None, 0.0, 0.0,
               0.0, f"server did not start: {first_line}")  # fmt: skip


def _summary(row: Row) -> str:
    what = f"{row.status} {row.code}" if row.status is not None else row.outcome
    steady = (
        ""
        if row.steady_latency_ms is None
        else f" (steady {row.steady_latency_ms:.1f} ms, median of {row.steady_requests})"
    )
    return f"{what} in {row.latency_ms:.1f} ms{steady}, server peak RSS {row.peak_rss_mb:.0f} MB"


def write_json(rows: Sequence[Row], path: str | Path, config: DemoConfig) -> None:
    doc = {
        "mem_limit_mb": config.mem_limit_bytes // MiB,
        "timeout_s": config.timeout_s,
        "steady_requests": config.steady_requests,
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
