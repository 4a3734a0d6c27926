"""loadtests end to end: ``schedguard load`` with its own servers, and locust distributed (a
master with two workers) against a guard in front of the vulnerable reference scheduler.

locust (and gevent's monkey-patching) only ever runs in subprocesses. The vulnerable upstream
runs under RLIMIT_AS (schedguard.servers / guard.isolation). Runs are a few seconds each.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

import loadtests
from loadtests import outcomes
from loadtests import report as load_report
from loadtests import timeline as tl
from schedguard.servers import RunningServer, ServerSpec, free_port, schedguard_argv
from tests import _chromium

LOCUSTFILE = str(Path(loadtests.__file__).with_name("locustfile.py"))
POLICY = str(Path(loadtests.__file__).with_name("policy.yaml"))
MB = 1 << 20

# find_spec, not importorskip: importing locust would monkey-patch this pytest process.
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("locust") is None, reason="the load extra (locust) is not installed"
)


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, RunningServer]]:
    """The vulnerable reference scheduler (GPU cost model) and the guard in front of it."""
    host = "127.0.0.1"
    ports = {"upstream": free_port(host), "guard": free_port(host)}
    upstream = RunningServer(
        ServerSpec(
            "upstream",
            lambda p, h: [
                sys.executable,
                "-m",
                "schedguard._load_cli",
                "upstream",
                "--profile",
                "vulnerable",
                "--host",
                h,
                "--port",
                str(p["upstream"]),
            ],
        ),
        ports,
        host,
        mem_limit_bytes=1024 * MB,
        sample_interval_s=0.2,
    )
    guard = None
    try:
        upstream.wait_ready(60)
        guard = RunningServer(
            ServerSpec(
                "guard",
                lambda p, h: schedguard_argv(
                    "serve",
                    "--upstream",
                    f"http://{h}:{p['upstream']}",
                    "--policy",
                    POLICY,
                    "--host",
                    h,
                    "--port",
                    str(p["guard"]),
                    "--log-level",
                    "warning",
                ),
                health_path="/readyz",
            ),
            ports,
            host,
            mem_limit_bytes=2048 * MB,
            sample_interval_s=0.2,
        )
        guard.wait_ready(60)
        yield {"upstream": upstream, "guard": guard}
    finally:
        if guard is not None:
            guard.stop()
        upstream.stop()


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def test_schedguard_load_runs_gates_and_reports(tmp_path: Path) -> None:
    """The command starts both servers, runs locust headless, writes every report, passes the
    gate (exit 0) and leaves nothing running."""
    out = tmp_path / "run"
    proc = subprocess.run(
        [
            *schedguard_argv("load"),
            "--duration",
            "8",
            "--users",
            "3",
            "--attack-share",
            "0.4",
            "--user-rps",
            "1",
            "--out",
            str(out),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["passed"] is True and report["mode"] == "guard"
    n = report["numbers"]
    assert n["benign_requests"] > 0 and n["benign_failures"] == 0
    attacks = n["attacks"]
    assert n["attack_requests"] > 0
    assert attacks["content_stopped"] + attacks["content_limited"] == attacks["content_sent"]
    assert n["guard_rejections_by_code"]  # scraped from the guard's /metrics
    assert n["guard_peak_rss_mb"] > 0 and n["upstream_peak_rss_mb"] > 0
    assert n["ttft_p99_ms"] is not None  # streams were timed
    for name in (
        "report.html",
        "locust_report.html",
        "timeline.json",
        "locust_stats.csv",
        "locust.json",
        "slo.json",
        "report.json",
    ):
        assert (out / name).stat().st_size > 0, name
    # report.html is ours: every SLO and chart, drawn from this run's timeline.
    html = (out / "report.html").read_text()
    for check in report["checks"]:
        assert f'data-slo="{check["name"]}"' in html
    for chart in load_report.CHARTS:
        assert f'<svg id="{chart}"' in html
    assert "no timeline.json" not in html and "<script" not in html
    timeline = json.loads((out / "timeline.json").read_text())
    kinds = {key for bucket in timeline["buckets"].values() for key in bucket}
    assert {"lat BENIGN", "req ATTACK", tl.ATTACKS} <= kinds
    # The monitor's periods as it measured them, stated on the page.
    periods = timeline["periods_s"]
    assert (
        periods["rss_asked_s"] == 1.0
        and f"RSS every {load_report._period(periods['rss_s'])}" in html
    )
    assert timeline["rss_mb"]["guard"] and timeline["guard_rejections"][-1][1]
    assert {s["exit"] for s in report["servers"].values()} == {"running"}
    deadline = time.monotonic() + 5
    while not all(_gone(s["pid"]) for s in report["servers"].values()):
        assert time.monotonic() < deadline, "servers left running"
        time.sleep(0.1)  # polling for the children's exit, not timing a test


def _poll_json(client: httpx.Client, url: str, ok: Any, deadline: float) -> Any:
    while time.monotonic() < deadline:
        try:
            data = client.get(url).json()
            if ok(data):
                return data
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.2)  # waiting for locust to start and users to report
    raise AssertionError(f"{url} never satisfied the condition")


def test_distributed_master_two_workers_with_dashboard(
    servers: dict[str, RunningServer], tmp_path: Path
) -> None:
    """``--master`` and two ``--worker`` on localhost with the same locustfile: both workers
    run users, the master's web UI has the schedguard tab and status, and the master's gate sees
    the workers' stats and tallies."""
    guard, upstream = servers["guard"], servers["upstream"]
    master_port, web_port = free_port("127.0.0.1"), free_port("127.0.0.1")
    slo_json = tmp_path / "slo.json"
    master = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "locust",
            "-f",
            LOCUSTFILE,
            "--master",
            "--master-bind-host",
            "127.0.0.1",
            "--master-bind-port",
            str(master_port),
            "--expect-workers",
            "2",
            "--autostart",
            "--autoquit",
            "0",
            "-t",
            "7s",
            "-u",
            "6",
            "-r",
            "6",
            "--host",
            guard.url,
            "--web-host",
            "127.0.0.1",
            "--web-port",
            str(web_port),
            "--attack-share",
            "0.34",
            "--user-rps",
            "1",
            "--guard-url",
            guard.url,
            "--upstream-url",
            upstream.url,
            "--guard-pid",
            str(guard.proc.pid),
            "--upstream-pid",
            str(upstream.proc.pid),
            "--slo-json",
            str(slo_json),
            "--timeline-json",
            str(tmp_path / "timeline.json"),
            "--only-summary",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    workers = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "locust",
                "-f",
                LOCUSTFILE,
                "--worker",
                "--master-host",
                "127.0.0.1",
                "--master-port",
                str(master_port),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(2)
    ]
    try:
        base = f"http://127.0.0.1:{web_port}"
        deadline = time.monotonic() + 40
        with httpx.Client(timeout=3) as client:
            stats = _poll_json(
                client,
                base + "/stats/requests",
                lambda d: (
                    len(d.get("workers", [])) == 2
                    and all(w["user_count"] > 0 for w in d["workers"])
                ),
                deadline,
            )
            assert stats["extended_stats"][0]["key"] == "schedguard"
            status = _poll_json(
                client,
                base + "/schedguard/status",
                lambda d: d["guard"]["peak_rss_mb"] and d["rejections"],
                deadline,
            )
            assert status["upstream"]["alive"] is True and "slo" in status
            index = client.get(base + "/").text
            assert '"extended_tabs": [{"key": "schedguard"' in index
            page = client.get(base + "/schedguard").text
            assert '<svg id="memory"' in page and "time since the monitor started" in page
            if _chromium.chromium() is not None:
                # The page's script ran in a browser: it filled the tables and the chart.
                dom, console = _chromium.dump_dom(base + "/schedguard", budget_ms=4000)
                assert not [m for m in console if "Uncaught" in m or "error" in m.lower()]
                assert "<td>guard peak RSS</td>" in dom and '<svg id="memory"' in dom
        output, _ = master.communicate(timeout=60)
    finally:
        for p in (master, *workers):
            if p.poll() is None:
                p.kill()
            p.wait(timeout=10)
    assert master.returncode == 0, output[-3000:]
    assert "SLO gate: PASS" in output
    report = json.loads(slo_json.read_text())
    n = report["numbers"]
    assert n["benign_requests"] > 0 and n["attack_requests"] > 0
    attacks = n["attacks"]
    assert attacks["content_stopped"] + attacks["content_limited"] == attacks["content_sent"]
    assert n["client_codes"]  # the workers' tallies reached the master
    timeline = json.loads((tmp_path / "timeline.json").read_text())  # and their timelines
    benign = sum(sum(b.get("req BENIGN", {}).values()) for b in timeline["buckets"].values())
    assert benign == n["benign_requests"]
    # The gate judged the attacks on the records timeline.json holds: the workers' own.
    records = tl.attack_records(timeline["buckets"])
    assert sum(records.values()) == n["attack_requests"] > 0
    assert outcomes.summarize(records).to_dict()["by_intent"] == attacks["by_intent"]
    assert any(counts.get("benign") for _, counts in timeline["users"])
    assert all(w.returncode == 0 for w in workers)
