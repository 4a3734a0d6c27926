"""schedguard demo: the machinery on a fake server, then end to end on the reference scheduler."""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import pytest

from schedguard._report import render_comparison, render_rows
from schedguard.demo import (
    DEPLOYMENTS,
    PAYLOADS,
    SEED_TEMPLATE,
    DemoConfig,
    Deployment,
    Row,
    run_demo,
    write_json,
)
from schedguard.servers import ServerSpec
from tests._support import TESTS_DIR, live_descendants

MiB = 1 << 20
FAKE = str(TESTS_DIR / "_fake_server.py")
HAS_SERVER = importlib.util.find_spec("scheduler_ref.server") is not None
REQUIRED_KEYS = {"target", "profile", "payload", "outcome", "status", "code", "latency_ms",
                 "peak_rss_mb", "steady_latency_ms", "steady_requests"}  # fmt: skip


@pytest.fixture(autouse=True)
def _servers_cleaned_up() -> object:
    yield
    deadline = time.monotonic() + 3.0
    while live_descendants() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert live_descendants() == []


def fake_deployment(mode: str) -> Deployment:
    def argv(ports: Mapping[str, int], host: str) -> list[str]:
        return [sys.executable, FAKE, mode, str(ports["fake"])]

    return Deployment("fake", mode, (ServerSpec("fake", argv),))


def test_seed_payload_is_the_write_ups() -> None:
    assert SEED_TEMPLATE.count("{{") == 1024
    assert SEED_TEMPLATE.count("}}") == 512
    assert len(SEED_TEMPLATE) == 2 * 1024 + len("system_prompt}}") * 512
    assert [p.name for p in PAYLOADS] == ["benign", "seed"]
    assert [(t.name, t.profile) for t in DEPLOYMENTS] == [
        ("scheduler_ref", "vulnerable"),
        ("scheduler_ref", "hardened"),
        ("guard", "vulnerable"),
    ]
    guard = DEPLOYMENTS[-1]
    assert [s.name for s in guard.servers] == ["scheduler_ref", "guard"]
    assert guard.entry_name == "guard" and guard.servers[-1].health_path == "/readyz"
    argv = guard.servers[-1].argv({"scheduler_ref": 9001, "guard": 9002}, "127.0.0.1")
    assert argv[argv.index("serve") :][:3] == ["serve", "--upstream", "http://127.0.0.1:9001"]
    assert "--port" in argv and argv[argv.index("--port") + 1] == "9002"


def test_machinery_on_fake_servers(tmp_path: Path) -> None:
    # The hog must reach its cap within the timeout with the other core busy: 5 s for 256 MiB.
    config = DemoConfig(mem_limit_bytes=256 * MiB, timeout_s=5.0, startup_timeout_s=60.0)
    lines: list[str] = []
    deployments = [fake_deployment(m) for m in ("hog", "hang", "reject", "crash")]
    rows = run_demo(config, deployments=deployments, progress=lines.append)
    got = {(r.profile, r.payload): r for r in rows}
    assert len(rows) == 8
    for mode in ("hog", "hang", "reject", "crash"):
        benign = got[(mode, "benign")]
        assert (benign.outcome, benign.status, benign.code) == ("ok", 200, "ok")
        assert benign.peak_rss_mb > 1
    hog = got[("hog", "seed")]
    assert (hog.outcome, hog.status) == ("killed", None)
    assert 100 < hog.peak_rss_mb <= 256
    assert hog.rss_growth_mb > 50
    hang = got[("hang", "seed")]
    assert hang.outcome == "timeout"
    assert hang.latency_ms >= 5000  # the demo waited its timeout, then gave up
    reject = got[("reject", "seed")]
    assert (reject.outcome, reject.status, reject.code) == (
        "rejected",
        400,
        "template_depth_exceeded",
    )
    # A refusal is sent again on the same connection: its steady-state latency beside the first.
    assert reject.steady_requests == config.steady_requests
    assert reject.steady_latency_ms is not None and reject.steady_latency_ms > 0
    assert all(r.steady_latency_ms is None for r in rows if r.outcome != "rejected")
    crash = got[("crash", "seed")]
    assert crash.outcome == "error" and "exited 3" in crash.detail
    assert any("starting fake" in line for line in lines)
    assert any("sending seed" in line for line in lines)

    table = render_rows(rows, config)
    assert "killed (cap 256 MiB)" in table and "timeout (> 5 s)" in table
    assert "400 template_depth_exceeded" in table
    assert "steady" in table and "kept-alive" in table

    path = tmp_path / "rows.json"
    write_json(rows, path, config)
    doc = json.loads(path.read_text())
    assert len(doc["rows"]) == 8
    assert all(set(r) >= REQUIRED_KEYS for r in doc["rows"])
    (steady,) = [r for r in doc["rows"] if r["steady_latency_ms"] is not None]
    assert steady["profile"] == "reject" and steady["steady_requests"] == config.steady_requests


def test_server_restarts_after_being_killed() -> None:
    # seed first, then benign: the benign request must find a fresh server.
    config = DemoConfig(mem_limit_bytes=256 * MiB, timeout_s=5.0, startup_timeout_s=60.0)
    rows = run_demo(
        config,
        deployments=[fake_deployment("hog")],
        payloads=PAYLOADS[::-1],
        progress=lambda _: None,
    )
    assert [(r.payload, r.outcome) for r in rows] == [("seed", "killed"), ("benign", "ok")]


def test_start_failure_is_a_row_not_a_crash() -> None:
    config = DemoConfig(mem_limit_bytes=256 * MiB, timeout_s=2.0, startup_timeout_s=5.0)
    broken = Deployment(
        "broken", "x", (ServerSpec("b", lambda ports, host: [sys.executable, "-c", "raise SystemExit(4)"]),)
    )  # fmt: skip
    rows = run_demo(config, deployments=[broken], progress=lambda _: None)
    assert [r.outcome for r in rows] == ["error", "error"]
    assert "did not start" in rows[0].detail


def test_comparison_names_the_seed_numbers() -> None:
    config = DemoConfig()
    rows = [
        Row("scheduler_ref", "vulnerable", "seed", "killed", None, None, 900.0, 1020.0, 950.0),
        Row("scheduler_ref", "hardened", "seed", "rejected", 400, "template_depth_exceeded",
            1.3, 80.0, 0.1),
    ]  # fmt: skip
    text = render_comparison(rows, config)
    assert "127 ms" in text and "312 MB" in text and "4.2 GB" in text
    assert "98x faster" in text
    assert "guard in front" not in text
    steady = Row("scheduler_ref", "hardened", "seed", "rejected", 400, "template_depth_exceeded",
                 3.0, 80.0, 0.1, steady_latency_ms=0.5, steady_requests=50)  # fmt: skip
    assert "254x faster (steady state)" in render_comparison([rows[0], steady], config)
    guarded = Row("guard", "vulnerable", "seed", "rejected", 400, "template_depth_exceeded",
                  2.0, 170.0, 0.0)  # fmt: skip
    assert "guard + vulnerable" in render_comparison([*rows, guarded], config)


def test_rows_of_several_servers_show_each_server() -> None:
    config = DemoConfig()
    row = Row("guard", "vulnerable", "seed", "rejected", 400, "template_depth_exceeded", 2.0,
              170.0, 0.2, server_peak_rss_mb={"scheduler_ref": 95.0, "guard": 75.0},
              server_rss_growth_mb={"scheduler_ref": 0.0, "guard": 0.2})  # fmt: skip
    table = render_rows([row], config)
    assert "scheduler_ref 95 MB (+0.0), guard 75 MB (+0.2)" in table


@pytest.mark.skipif(not HAS_SERVER, reason="scheduler_ref.server not written yet")
def test_demo_end_to_end_on_reference_scheduler(tmp_path: Path) -> None:
    # Outer bounds: a refusal takes milliseconds, but the other core may be busy.
    config = DemoConfig(mem_limit_bytes=512 * MiB, timeout_s=30.0, startup_timeout_s=60.0)
    rows = run_demo(config, progress=lambda _: None)
    path = tmp_path / "demo.json"
    write_json(rows, path, config)
    got = {
        (r["target"], r["profile"], r["payload"]): r for r in json.loads(path.read_text())["rows"]
    }

    hardened_seed = got[("scheduler_ref", "hardened", "seed")]
    assert hardened_seed["status"] is not None, hardened_seed
    assert 400 <= hardened_seed["status"] < 500, hardened_seed
    assert hardened_seed["code"] == "template_depth_exceeded"
    assert hardened_seed["outcome"] == "rejected"
    assert hardened_seed["steady_requests"] == config.steady_requests
    assert hardened_seed["steady_latency_ms"] is not None
    assert got[("scheduler_ref", "hardened", "benign")]["status"] == 200
    assert got[("scheduler_ref", "vulnerable", "benign")]["status"] == 200
    vulnerable_seed = got[("scheduler_ref", "vulnerable", "seed")]
    assert vulnerable_seed["outcome"] in ("killed", "timeout"), vulnerable_seed

    # The same vulnerable profile behind the guard: the seed never reaches it.
    guarded_seed = got[("guard", "vulnerable", "seed")]
    assert (guarded_seed["status"], guarded_seed["code"]) == (400, "template_depth_exceeded")
    assert guarded_seed["steady_requests"] == config.steady_requests
    assert got[("guard", "vulnerable", "benign")]["status"] == 200
    assert set(guarded_seed["server_peak_rss_mb"]) == {"scheduler_ref", "guard"}
    assert guarded_seed["server_rss_growth_mb"]["scheduler_ref"] < 5, guarded_seed
    assert guarded_seed["server_peak_rss_mb"]["scheduler_ref"] < 256, guarded_seed
