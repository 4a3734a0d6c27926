"""Campaigns against live servers: ``schedguard fuzz run --target http://HOST:PORT [--guard URL]``.

A black-box campaign mutates OpenAI requests (:mod:`fuzz.live._mutator`), sends them to the
server and judges each from outside (:mod:`fuzz.live._oracle`); a differential one asks a guard's
dry run first and sends what it admits to the upstream directly. Both:

- refuse hosts that are not loopback unless ``allow_remote``;
- bound their own request rate (``max_rps``: fuzzed requests, dry runs, health checks and
  minimisation tests alike);
- check the server's health after every finding, and when it is down wait for it
  (``dead_wait_s``), restart it (``restart_cmd``) or stop cleanly with the crash as a finding,
  never spinning on a dead server;
- run ``jobs`` workers that pause while a finding is confirmed and minimised, so the server
  then sees only the minimiser's requests;
- report through the run context every engine uses (:class:`fuzz.engines.EngineRun`) and the
  same reports and exit status as in-process targets (:mod:`fuzz.report`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import psutil

from fuzz._exceptions import RemoteTargetRefused, TargetUnreachable
from fuzz.campaign import ProgressLine, default_minimise_s, draw_seed
from fuzz.engines import EngineRun, RunOptions
from fuzz.findings import FindingSet, known_causes
from fuzz.live._environment import capture_environment, guard_identity
from fuzz.live._evidence import ServerLog
from fuzz.live._http import (
    HttpClient,
    RequestPacer,
    discover_model,
    require_loopback,
    split_url,
)
from fuzz.live._monitor import Health, RssMonitor
from fuzz.live._mutator import CorpusScheduler, RequestMutator
from fuzz.live._oracle import LATENCY_PER_TOKEN_S, LiveBudgets, LiveOracle, Measured
from fuzz.live._recorder import LiveRecorder
from fuzz.live._request import LiveRequest, load_seeds
from fuzz.live._target import LiveTarget
from fuzz.live._upstreams import find_project_upstream
from fuzz.oracle import Oracle
from fuzz.report import CampaignReport, write_reports
from fuzz.targets import TargetKind

__all__ = ["Gate", "LiveOptions", "find_listener", "is_url", "run_live_campaign"]

_PROGRESS_EVERY_S = 0.5
# The tail of a failed restart command's output the campaign reports.
_RESTART_OUTPUT = 8000


def _is_local(opts: LiveOptions) -> bool:
    """Whether the target is on this machine (its scripts' pid files and log can be read)."""
    try:
        require_loopback(opts.target, allow_remote=False)
    except RemoteTargetRefused:
        return False
    return True


def is_url(target: str) -> bool:
    """Whether ``--target`` names a live server rather than a registered target."""
    return target.startswith(("http://", "https://"))


@dataclass
class LiveOptions:
    """A live campaign. ``target``: the server's base URL (the upstream in a differential
    campaign); ``guard``: the guard's base URL (a differential campaign); ``pids``: processes
    whose resident memory (children included) is the server's, ``"auto"`` for the one
    listening on the target's port; ``ignore_5xx``: regular expressions of 5xx messages that are
    this server's refusals of invalid input; ``restart_cmd``: a shell command that brings the
    server back after it died (lets crashes be minimised and the campaign go on);
    ``expect_findings``: the server is known to be vulnerable (findings do not fail);
    ``server_log``: the server's log file (default: the log of the project's upstream scripts'
    server on the target's port, when it is one: :mod:`fuzz.live._upstreams`), whose lines
    name each finding's cause; ``guard_policy``: the policy file whose hash the record names
    (default: the default policy); ``capture_env``: record the upstream's versions, model and
    flags (:mod:`fuzz.live._environment`)."""

    target: str
    guard: str | None = None
    duration_s: float = 60.0
    jobs: int = 1
    seed: int | None = None
    out_dir: Path | None = None
    save_root: Path | None = None
    save: bool = True
    minimise_s: float | None = None
    max_minimise_tests: int = 200
    max_rps: float = 50.0
    timeout_s: float = 60.0
    latency_budget_s: float = 20.0
    latency_per_token_s: float = LATENCY_PER_TOKEN_S
    rss_budget_bytes: int = 512 << 20
    pids: tuple[int | str, ...] = ()
    metrics_url: str | None = None
    health_path: str | None = None
    allow_remote: bool = False
    model: str | None = None
    headers: tuple[tuple[str, str], ...] = ()
    restart_cmd: str | None = None
    max_restarts: int = 100
    server_log: Path | None = None
    guard_policy: Path | None = None
    capture_env: bool = True
    ignore_5xx: tuple[str, ...] = ()
    expect_findings: bool = False
    name: str | None = None
    corpus: Path | None = None
    max_body_bytes: int = 1 << 20
    output_cap: int = 16
    stop_on_first: bool = False
    dead_wait_s: float = 30.0
    progress: TextIO | None = field(default_factory=lambda: sys.stderr)


class Gate:
    """Workers send under :meth:`shared`; :meth:`exclusive` waits until none is sending and
    holds the others back (a finding being confirmed and minimised)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._active = 0
        self._exclusive = False

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            while self._exclusive:
                self._cond.wait()
            self._active += 1
        try:
            yield
        finally:
            with self._cond:
                self._active -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            while self._exclusive:
                self._cond.wait()
            self._exclusive = True
            while self._active:
                self._cond.wait()
        try:
            yield
        finally:
            with self._cond:
                self._exclusive = False
                self._cond.notify_all()


def find_listener(port: int) -> int | None:
    """The process listening on TCP ``port`` on this machine, if it can be seen."""
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return None
    for c in conns:
        if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid:
            return int(c.pid)
    return None


class _Live:
    """One campaign's state (built and run by :func:`run_live_campaign`)."""

    def __init__(self, opts: LiveOptions) -> None:
        opts = dataclasses.replace(opts, seed=draw_seed(opts.seed))
        for url in (opts.target, opts.guard, opts.metrics_url):
            if url is not None:
                require_loopback(url, allow_remote=opts.allow_remote)
        project = find_project_upstream(split_url(opts.target)[2]) if _is_local(opts) else None
        if project is not None:
            opts = dataclasses.replace(
                opts,
                restart_cmd=opts.restart_cmd or project.restart_cmd,
                server_log=opts.server_log or project.log,
            )
        self.opts = opts
        self.restart_failure: dict[str, Any] | None = None
        self.limiter = RequestPacer(opts.max_rps)
        self.upstream, self.guard = _clients(opts, self.limiter)
        self.health = Health(self.upstream, opts.health_path)
        self.guard_health = Health(self.guard, None) if self.guard is not None else None
        if not self.health.detect():
            raise TargetUnreachable(f"{opts.target} does not answer its health check")
        if self.guard_health is not None and not self.guard_health.detect():
            raise TargetUnreachable(f"{opts.guard} does not answer its health check")
        self.metrics, metrics_path = _metrics_client(opts.metrics_url, self.limiter)
        self.auto_pids = any(isinstance(p, str) for p in opts.pids)
        self.monitor = RssMonitor(
            self._pids(), self.metrics, metrics_path, horizon_s=2 * opts.timeout_s + 60
        )
        self.budgets = LiveBudgets(
            timeout_s=opts.timeout_s,
            latency_s=opts.latency_budget_s,
            latency_per_token_s=opts.latency_per_token_s,
            rss_bytes=opts.rss_budget_bytes,
            ignore_5xx=tuple(re.compile(p) for p in opts.ignore_5xx),
        )
        self.oracle = LiveOracle(
            self.upstream,
            self.budgets,
            monitor=self.monitor,
            health=self.health,
            guard=self.guard,
            guard_health=self.guard_health,
            server_log=ServerLog(opts.server_log) if opts.server_log else None,
        )
        self.model = opts.model or discover_model(self.upstream)
        self.environment: dict[str, Any] = {}
        if opts.capture_env:
            self.environment = capture_environment(self.upstream, self.monitor.pids)
        self.environment["tool"] = guard_identity(opts.guard_policy)
        self.environment["restart_cmd"] = opts.restart_cmd
        self.environment["server_log"] = str(opts.server_log) if opts.server_log else None
        self.mutator, self.scheduler = _fuzzer(
            opts, self.model, differential=self.guard is not None
        )
        kind: TargetKind = "vulnerable" if opts.expect_findings else "hardened"
        self.target = LiveTarget(
            opts.target,
            self.oracle,
            self.mutator,
            self.budgets,
            name=opts.name,
            kind=kind,
            guard=opts.guard,
        )
        self.gate = Gate()
        self.stop = threading.Event()
        self.stopped: str | None = None
        self.restarts = 0
        self.gave_up = False
        self.stats: Counter[str] = Counter()
        self.statuses: Counter[str] = Counter()
        self.guard_codes: Counter[str] = Counter()
        self.worst_latency = 0.0
        self.max_excess: int | None = None
        self.stats_lock = threading.Lock()
        self.progress = ProgressLine(opts.progress, self.target.name)
        self.rss_start = 0
        self.recorder: LiveRecorder | None = None

    # ------------------------------------------------------------------------- processes

    def _pids(self) -> list[int]:
        """The watched processes: ids as given; ``auto`` and ``port:N`` are resolved to the
        process listening on the target's port or on N (again after a restart)."""
        pids: list[int] = []
        for p in self.opts.pids:
            if isinstance(p, int):
                pids.append(p)
                continue
            port = split_url(self.opts.target)[2] if p == "auto" else int(p.split(":", 1)[1])
            found = find_listener(port)
            if found is None:
                raise TargetUnreachable(f"--pid {p}: no process visible listening on port {port}")
            pids.append(found)
        for pid in pids:
            if not psutil.pid_exists(pid):
                raise TargetUnreachable(f"--pid {pid}: no such process")
        return pids

    def recover(self) -> bool:
        """Bring the server back (or see it back) after it went down; False: it stays down."""
        if self.oracle.alive():
            return True
        if self.can_restart():
            return self.restart()
        if self.gave_up or self.restart_failure is not None:
            return False  # waited once already, or the restart command failed: stopping
        if self.opts.restart_cmd:
            self.note(f"the target is down and was restarted {self.restarts} times already")
        self.note(f"the target is down: waiting up to {self.opts.dead_wait_s:g} s for it")
        ok = self.health.wait(self.opts.dead_wait_s) and self.monitor.alive()
        self.gave_up = not ok
        return ok

    def can_restart(self) -> bool:
        """A restart command is set, has not failed, and the restarts are not used up."""
        return (
            bool(self.opts.restart_cmd)
            and self.restart_failure is None
            and self.restarts < self.opts.max_restarts
        )

    def restart(self) -> bool:
        """Run the restart command and wait for the server's health. A command that fails (its
        status, or no healthy server after it) is recorded with its output and never run
        again: the campaign stops rather than loop on a server that does not come back."""
        cmd = self.opts.restart_cmd
        if not cmd or not self.can_restart():
            return False
        self.restarts += 1
        self.note(f"restarting the target ({self.restarts}): {cmd}")
        # A Python server restarted here prints its stack on a fatal signal (the log's evidence).
        env = {**os.environ, "PYTHONFAULTHANDLER": "1"}
        timeout = max(60.0, self.opts.dead_wait_s)
        try:
            done = subprocess.run(
                cmd,
                shell=True,
                timeout=timeout,
                check=False,
                capture_output=True,
                env=env,
            )
            status: int | str = done.returncode
            output = (done.stdout + done.stderr)[-_RESTART_OUTPUT:].decode("utf-8", "replace")
        except subprocess.TimeoutExpired as exc:
            status = f"timed out after {timeout:g} s"
            output = ((exc.stdout or b"") + (exc.stderr or b""))[-_RESTART_OUTPUT:].decode(
                "utf-8", "replace"
            )
        healthy = status == 0 and self.health.wait(self.opts.dead_wait_s)
        if not healthy:
            why = f"exit status {status}" if status != 0 else "the server did not come back"
            self.restart_failure = {"cmd": cmd, "status": status, "why": why, "output": output}
            self.note(f"the restart command failed ({why}); its output:\n{output.rstrip()}")
            return False
        if self.auto_pids:
            with contextlib.suppress(TargetUnreachable):
                self.monitor.rebind(self._pids())
        else:  # a process id given as a number that died is not watched any more
            self.monitor.rebind([p for p in self.monitor.pids if psutil.pid_exists(p)])
        return True

    # ------------------------------------------------------------------------------ loop

    def note(self, text: str) -> None:
        self.progress.note(f"[{self.target.name}] {text}")

    def run(self) -> CampaignReport:
        opts = self.opts
        engine = "differential" if self.guard is not None else "live"
        options = _run_options(opts)
        findings = FindingSet(
            known_causes(self.target.name, options.save_root)
            if options.save_root is not None
            else {}
        )

        def no_oracle() -> Oracle:
            raise RuntimeError("a live campaign sends its requests itself")

        run = EngineRun(
            self.target,
            no_oracle,
            options,
            engine=engine,
            findings=findings,
            on_progress=self.progress,
        )
        self.recorder = LiveRecorder(
            self.oracle,
            findings,
            target=self.target.name,
            engine=engine,
            recover=self.recover,
            save_root=options.save_root,
            seed=opts.seed,
            minimise_s=options.minimise_s,
            max_tests=opts.max_minimise_tests,
            confirm_faults=opts.jobs > 1,
            note=self.note,
            target_url=opts.target,
            server_kind=self.environment.get("kind"),
            can_restart=self.can_restart,
            restart=self.restart,
        )
        if self.model:
            self.note(f"model {self.model}; health {self.health.path}")
        self._run_workers(run)
        run.report()
        self.progress.done()
        result = run.result(stats=self._stats(run))
        report = CampaignReport(
            target=self.target.name,
            kind=self.target.kind,
            description=self.target.description,
            engine=engine,
            duration_s=result.duration_s,
            budgets={**self.budgets.to_dict(), "max_rps": opts.max_rps},
            results=[result],
            findings=list(findings.findings),
            fails_ci=self.target.kind not in ("vulnerable",),
            seed=opts.seed,
            jobs=opts.jobs,
            source=self.target.source,
            environment=self.environment,
            target_url=opts.target,
        )
        for client in (self.upstream, self.guard, self.metrics):
            if client is not None:
                client.close()
        if opts.out_dir is not None:
            write_reports(report, opts.out_dir)
        return report

    def _run_workers(self, run: EngineRun) -> None:
        """The jobs workers, with the RSS monitor, until the run is over or interrupted."""
        opts = self.opts
        self.monitor.start()
        self.rss_start = self.monitor.current()
        seed = opts.seed
        assert seed is not None  # drawn in __init__
        threads = [
            threading.Thread(target=self._worker, args=(run, seed + i), daemon=True)
            for i in range(opts.jobs)
        ]
        try:
            for t in threads:
                t.start()
            for t in threads:
                while t.is_alive():
                    t.join(timeout=0.5)
        except KeyboardInterrupt:
            self.stop.set()
            self.stopped = "interrupted"
            for t in threads:
                t.join(timeout=opts.timeout_s + 5)
        finally:
            self.monitor.stop()

    def _worker(self, run: EngineRun, seed: int) -> None:
        rng = random.Random(seed)
        while not self.stop.is_set() and not run.over():
            try:
                req = self.scheduler.next(rng)
                with self.gate.shared():
                    if self.stop.is_set() or run.over():
                        break
                    measured = self.oracle.run(req)
                run.executed(measured.outcome)
                self._count(measured)
                if measured.outcome.is_finding:
                    with self.gate.exclusive():
                        self._finding(run, req, measured)
                else:
                    self.scheduler.feedback(req, measured.score)
            except Exception as exc:  # a harness error is reported, the campaign goes on
                run.error(exc)
                time.sleep(0.1)
            run.report(every_s=_PROGRESS_EVERY_S)

    def _finding(self, run: EngineRun, req: LiveRequest, measured: Measured) -> None:
        if self.stop.is_set():
            return
        at = run.elapsed()
        assert self.recorder is not None
        found = self.recorder.record(req, measured, at)
        self.scheduler.ban(req)
        if found is not None:
            run.add(found, at=at)
            self.note(f"finding {found.cause} ({found.size_bytes} bytes) -> {found.path or '-'}")
            if self.opts.stop_on_first:
                self.stopped = "first finding"
                self.stop.set()
        # The target's health after every finding: wait for it, restart it, or stop.
        if not self.recover():
            self.stopped = (
                "the restart command failed"
                if self.restart_failure is not None
                else "the target is down"
            )
            self.note(f"{self.stopped}: stopping")
            self.stop.set()
        elif self.guard_health is not None and not self.guard_health.ok():
            self.stopped = "the guard is down"
            self.note("the guard is down: stopping")
            self.stop.set()

    def _count(self, m: Measured) -> None:
        with self.stats_lock:
            self.stats[m.outcome.verdict] += 1
            if m.reply is not None:
                self.statuses[str(m.reply.status or m.reply.error)] += 1
                self.worst_latency = max(self.worst_latency, m.reply.latency_s)
            if m.guard is not None:
                code = "allowed" if m.guard.get("allowed") else str(m.guard.get("code"))
                self.guard_codes[code] += 1
            if m.extra.get("usage") is not None and m.guard is not None and m.guard.get("allowed"):
                self.max_excess = (
                    m.excess if self.max_excess is None else max(self.max_excess, m.excess)
                )

    def _stats(self, run: EngineRun) -> dict[str, Any]:
        elapsed = max(run.elapsed(), 1e-9)
        rec = self.recorder
        assert rec is not None
        return {
            "requests": run.execs,
            "requests_per_s": round(run.execs / elapsed, 2),
            # The rate while fuzzing: the time spent confirming and minimising findings (the
            # other workers paused) left out.
            "fuzzing_requests_per_s": round(run.execs / max(elapsed - rec.busy_s, 1e-9), 2),
            "http_requests": self.limiter.sent,
            "max_rps": self.opts.max_rps,
            "verdicts": dict(self.stats),
            "statuses": dict(self.statuses),
            "guard_verdicts": dict(self.guard_codes),
            "worst_latency_s": round(self.worst_latency, 3),
            "rss_start_bytes": self.rss_start,
            "rss_peak_bytes": self.monitor.peak,
            "max_prompt_token_excess": self.max_excess,
            "duplicates": dict(rec.duplicates),
            "unconfirmed": rec.unconfirmed,
            "minimise_tests": rec.minimise_tests,
            "findings_s": round(rec.busy_s, 1),
            "health_checks": self.health.checks,
            "health_path": self.health.path,
            "restarts": self.restarts,
            "restart_failure": self.restart_failure,
            "stopped": self.stopped,
            "model": self.model,
            "seeds": len(self.mutator.seeds),
            "target_url": self.opts.target,
            "guard_url": self.opts.guard,
        }


def _clients(opts: LiveOptions, limiter: RequestPacer) -> tuple[HttpClient, HttpClient | None]:
    """The clients of the target and of the guard (when there is one), pacing through limiter."""
    headers = dict(opts.headers)
    upstream = HttpClient(opts.target, limiter=limiter, timeout_s=opts.timeout_s, headers=headers)
    guard = (
        HttpClient(opts.guard, limiter=limiter, timeout_s=opts.timeout_s, headers=headers)
        if opts.guard
        else None
    )
    return upstream, guard


def _metrics_client(url: str | None, limiter: RequestPacer) -> tuple[HttpClient | None, str]:
    """The client of the Prometheus endpoint at ``url`` and its path (/metrics if none)."""
    if not url:
        return None, ""
    scheme, host, port, path = split_url(url)
    return HttpClient(f"{scheme}://{host}:{port}", limiter=limiter), path or "/metrics"


def _fuzzer(
    opts: LiveOptions, model: str | None, *, differential: bool
) -> tuple[RequestMutator, CorpusScheduler]:
    """The mutator of the corpus's seeds and the scheduler that picks its parents."""
    seeds = load_seeds(opts.corpus, max_bytes=opts.max_body_bytes)
    mutator = RequestMutator(
        seeds,
        model=model,
        differential=differential,
        output_cap=opts.output_cap,
        max_body_bytes=opts.max_body_bytes,
    )
    scheduler = CorpusScheduler(mutator, mutator.seeds, benign_parents=0.8 if differential else 0.3)
    return mutator, scheduler


def _run_options(opts: LiveOptions) -> RunOptions:
    """The engine run's options: findings saved under --found-root or --out unless --no-save."""
    return RunOptions(
        duration_s=opts.duration_s,
        jobs=opts.jobs,
        out_dir=opts.out_dir,
        seed=opts.seed,
        minimise_s=(
            opts.minimise_s if opts.minimise_s is not None else default_minimise_s(opts.duration_s)
        ),
        save_root=(opts.save_root or opts.out_dir) if opts.save else None,
        stop_on_first=opts.stop_on_first,
    )


def run_live_campaign(opts: LiveOptions) -> CampaignReport:
    """Run one campaign against a live server (see the module docstring). Raises
    :class:`fuzz.RemoteTargetRefused` for a remote host without ``allow_remote`` and
    :class:`fuzz.TargetUnreachable` when a server does not answer at start."""
    return _Live(opts).run()
