"""The guard's /metrics: what each series counts, and one /metrics for several workers
(issue 15).

Every series counts one thing in one unit: the limiters' counters are split into event counts
(requests, Redis operations), tokens and the state now, so that summing a family never adds
tokens to requests; and the process collector's ``process_*`` series are exported, as
docs/deploy says. With workers (prometheus_client's multiprocess mode) a worker's series go
through its files unchanged, a dead worker's counts stay in the sums and its live gauges leave
them (the workers themselves: test_workers_process.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from guard.app import create_app
from guard.policy import policy_from_yaml
from guard.telemetry import GuardMetrics
from guard.telemetry._metrics import _Exported
from guard.telemetry._multiprocess import FileExport
from tests._guard_harness import fake_upstream, serve

CHAT = {"model": "fake", "messages": [{"role": "user", "content": "hello there"}]}


async def test_limiter_series_count_one_unit_each() -> None:
    async with fake_upstream() as fake:
        app = create_app(
            policy_from_yaml("rate: {anonymous: {tokens_per_minute: 600}}"), upstream_url=fake.url
        )
        async with serve(app) as url, httpx.AsyncClient(base_url=url) as client:
            capped = {**CHAT, "max_tokens": 16}  # a reservation the 600-token bucket holds
            for _ in range(3):
                assert (await client.post("/v1/chat/completions", json=capped)).status_code == 200
            # More tokens than the bucket holds: refused by the limiter, not by a check.
            refused = await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 1000})
            assert refused.json()["error"]["code"] == "request_exceeds_token_budget"
            text = (await client.get("/metrics")).text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert "schedguard_guard_limiter_events" not in families

    def values(name: str, label: str) -> dict[str, float]:
        return {s.labels[label]: s.value for s in families[name].samples}

    events = values("schedguard_guard_rate_limit_events", "event")
    assert events["allowed"] == 3 and events["rejected_oversize"] == 1
    tokens = values("schedguard_guard_rate_limit_tokens", "kind")
    rate = app.state.gateway.limiter.metrics
    assert tokens == {
        "reserved": rate.tokens_reserved,
        "refunded": rate.tokens_refunded,
        "overshoot": rate.tokens_overshoot,
    }
    assert 0 < tokens["refunded"] < tokens["reserved"]  # 3 x (prompt + 256) reserved, 3 used
    slots = values("schedguard_guard_concurrency_events", "event")
    assert slots["admitted"] == 3 and "wait_seconds_total" not in slots
    assert values("schedguard_guard_concurrency_requests", "state") == {
        "in_flight": 0,
        "waiting": 0,
    }
    assert families["schedguard_guard_concurrency_requests"].type == "gauge"
    # No event count is named after tokens or seconds.
    for name in ("schedguard_guard_rate_limit_events", "schedguard_guard_concurrency_events"):
        assert not any(
            k.startswith("tokens") or k.endswith("seconds_total") for k in values(name, "event")
        )
    # The process collector, as docs/deploy says (the dashboard's memory and CPU panels).
    assert families["process_resident_memory_bytes"].samples[0].value > 0
    assert "process_cpu_seconds" in families


# --------------------------------------------------------------- workers (multiprocess mode)


def _traffic(m: GuardMetrics, scale: int = 1) -> None:
    """The same updates the request path makes, on plain numbers."""
    for i in range(3 * scale):
        m.request_done("/v1/chat/completions", 200, 0.02 * (i + 1))
        m.upstream_answered("/v1/chat/completions", 0.01 * (i + 1))
        m.overhead.observe(0.0003 * (i + 1))
        m.queue_wait.observe(0.0)
        m.tokens_used("team-a", 5, 7)
    m.request_done("/v1/completions", 400, 0.001)
    m.rejected("n_exceeded")
    m.aborted("client_gone")
    m.stream_truncated("/v1/chat/completions", "no_done")
    m.checks_ran({"parse": 0.001, "tokens": 0.002})
    m.in_flight = 2
    m.export("rate", lambda: {"allowed": 3.0 * scale, "tokens_reserved": 100.0 * scale})
    m.export("concurrency", lambda: {"admitted": 3.0 * scale, "in_flight": 1.0, "waiting": 0.0})


def _series(text: str) -> dict[tuple[str, str, tuple[tuple[str, str], ...]], float]:
    return {
        (family.name, family.type, (s.name, *sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        if not family.name.startswith("process_")
        for s in family.samples
        if not s.name.endswith("_created")
    }


def test_one_worker_through_the_files_renders_what_it_renders_alone(tmp_path: Path) -> None:
    alone, through_files = GuardMetrics(), GuardMetrics(multiprocess_dir=str(tmp_path))
    for m in (alone, through_files):
        _traffic(m)
    assert _series(through_files.render().decode()) == _series(alone.render().decode())
    text = through_files.render().decode()
    assert "# TYPE schedguard_guard_overhead_seconds histogram" in text
    assert "# TYPE schedguard_guard_in_flight_requests gauge" in text
    assert float(_value(text, "process_resident_memory_bytes")) > 0


def _value(text: str, name: str) -> str:
    return next(line.split()[-1] for line in text.splitlines() if line.startswith(name + " "))


def test_a_dead_workers_counts_stay_and_its_live_gauges_go(tmp_path: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a pid that no longer runs: a worker that was killed
    other = GuardMetrics()
    _traffic(other, scale=2)
    FileExport([_Exported(other)], str(tmp_path), pid=gone.pid).sync()
    assert list(tmp_path.glob(f"gauge_livesum_{gone.pid}.db"))
    this = GuardMetrics(multiprocess_dir=str(tmp_path))
    _traffic(this)
    series = _series(this.render().decode())
    key = ("schedguard_guard_requests", "counter")
    ok = ("schedguard_guard_requests_total", ("route", "/v1/chat/completions"), ("status", "200"))
    assert series[(*key, ok)] == 3 + 6  # this worker's and the dead one's
    assert series[("schedguard_guard_overhead_seconds", "histogram",
                   ("schedguard_guard_overhead_seconds_count",))] == 9  # fmt: skip
    # The dead worker's in-flight gauge left the sum; only this worker's 2 remain.
    assert series[("schedguard_guard_in_flight_requests", "gauge",
                   ("schedguard_guard_in_flight_requests",))] == 2  # fmt: skip
    assert not list(tmp_path.glob(f"gauge_live*_{gone.pid}.db"))
    assert list(tmp_path.glob(f"counter_{gone.pid}.db"))
    this.close()  # stopping: this worker's live gauges leave too, its counters stay
    assert not list(tmp_path.glob(f"gauge_live*_{os.getpid()}.db"))
    assert list(tmp_path.glob(f"counter_{os.getpid()}.db"))
