"""loadtests/: the pure parts (prompts, shapes, SLO gate, corpus replay, HTTP client, monitor,
dashboard rows, the ``schedguard load`` command line). Nothing here imports locust or gevent:
monkey-patching must not leak into pytest (locust itself runs in subprocesses, see
test_loadtests_e2e.py)."""

from __future__ import annotations

import contextlib
import json
import os
import random
import socket
import socketserver
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from guard.telemetry import GuardMetrics
from loadtests import dashboard, outcomes, shapes, slo
from loadtests.httpclient import KeepAlive, error_code, send_raw
from loadtests.monitor import Monitor, Watched, parse_guard_metrics
from loadtests.prompts import BenignMix, make_request
from loadtests.replay import CLASSES, RoundRobin, load_attacks, load_lookalikes
from payloads.loader import Transport
from schedguard import _load_cli
from schedguard.cli import build_parser

MB = 1 << 20


def test_importing_loadtests_does_not_monkey_patch() -> None:
    assert "gevent" not in sys.modules
    assert "locust" not in sys.modules


# ------------------------------------------------------------------------------ prompts


def test_benign_requests_are_valid_and_reproducible() -> None:
    mix = BenignMix(stream_share=0.5)
    a = [make_request(random.Random(7), mix) for _ in range(3)]
    b = [make_request(random.Random(7), mix) for _ in range(3)]
    assert [r.body for r in a] == [r.body for r in b]
    rng = random.Random(1)
    reqs = [make_request(rng, mix) for _ in range(400)]
    kinds = {(r.kind, r.stream) for r in reqs}
    assert kinds == {("chat", True), ("chat", False), ("completion", True), ("completion", False)}
    for r in reqs:
        body = json.loads(r.body)
        assert body["max_tokens"] == r.max_tokens
        assert 4 <= r.max_tokens <= 320 and 8 <= r.prompt_tokens_target <= 1500
        if r.kind == "chat":
            assert r.path == "/v1/chat/completions" and body["messages"][-1]["role"] == "user"
        else:
            assert r.path == "/v1/completions" and isinstance(body["prompt"], str)
        assert body.get("stream", False) is r.stream
        assert ("stream_options" in body) is r.stream


def test_prompt_lengths_follow_the_length_model() -> None:
    rng = random.Random(3)
    lengths = sorted(make_request(rng, BenignMix()).prompt_tokens_target for _ in range(2000))
    median = lengths[len(lengths) // 2]
    assert 140 <= median <= 230  # the model's median is 180 tokens
    assert lengths[int(0.99 * len(lengths))] > 800  # a long tail


def test_benign_mix_validates() -> None:
    with pytest.raises(ValueError):
        BenignMix(chat_weight=0, completion_weight=0)
    with pytest.raises(ValueError):
        BenignMix(stream_share=1.5)


# ------------------------------------------------------------------------------ shapes


def test_steady_shape_runs_everyone_then_stops() -> None:
    spec = shapes.ShapeSpec("steady", users=10, attack_users=3, run_time_s=60)
    assert shapes.tick(spec, 0) == shapes.Tick(10, 10.0, ("benign", "attack"))
    assert shapes.tick(spec, 59.9) == shapes.tick(spec, 0)
    assert shapes.tick(spec, 60) is None
    no_attack = shapes.ShapeSpec("steady", users=4)
    assert shapes.tick(no_attack, 5) == shapes.Tick(4, 4.0, ("benign",))


def test_ramp_and_spike_shapes() -> None:
    ramp = shapes.ShapeSpec("ramp", users=20, attack_users=6, run_time_s=100)
    counts = [shapes.tick(ramp, t) for t in (0, 40, 80, 99)]
    assert [c.users for c in counts if c] == [2, 11, 20, 20]
    spike = shapes.ShapeSpec("spike", users=20, run_time_s=100)
    assert [shapes.tick(spike, t).users for t in (10, 45, 70)] == [5, 20, 5]  # type: ignore[union-attr]


def test_burst_shape_adds_attackers_only_in_the_window() -> None:
    spec = shapes.ShapeSpec("burst", users=10, attack_users=3, run_time_s=100)
    assert shapes.tick(spec, 10) == shapes.Tick(7, 10.0, ("benign",))
    assert shapes.tick(spec, 50) == shapes.Tick(10, 10.0, ("attack",))
    assert shapes.tick(spec, 80) == shapes.Tick(7, 10.0, ("attack",))  # attackers leave


def test_shape_validation() -> None:
    with pytest.raises(ValueError, match="unknown shape"):
        shapes.ShapeSpec("wave", users=1)
    with pytest.raises(ValueError, match="run time"):
        shapes.ShapeSpec("ramp", users=5)
    with pytest.raises(ValueError):
        shapes.ShapeSpec("steady", users=2, attack_users=3)


# ------------------------------------------------------------------------------ SLO gate


_REFUSED = outcomes.key("fan_out", outcomes.CONTENT_ATTACK, 400, "n_exceeded")
_SERVED = outcomes.key("fan_out", outcomes.CONTENT_ATTACK, 200, None)
_LIMITED = outcomes.key("fan_out", outcomes.CONTENT_ATTACK, 429, "rate_limited_tokens")


def _passing() -> slo.RunData:
    return slo.RunData(
        duration_s=60,
        benign_latency_ms={100: 90, 500: 9, 2000: 1},
        benign_requests=100,
        attack_records={_REFUSED: 40},
        flood_bursts={outcomes.BURST_STOPPED: 2},
        guard_peak_rss=100 * MB,
        upstream_peak_rss=200 * MB,
        upstream_alive=True,
        upstream_status="alive, health 200",
    )


def test_percentile_nearest_rank() -> None:
    hist = {100: 90, 500: 9, 2000: 1}
    assert slo.percentile(hist, 0.5) == 100
    assert slo.percentile(hist, 0.95) == 500
    assert slo.percentile(hist, 0.99) == 500
    assert slo.percentile(hist, 1.0) == 2000
    assert slo.percentile({}, 0.99) is None


def test_gate_passes_and_renders() -> None:
    report = slo.evaluate(_passing(), slo.Thresholds())
    assert report.passed
    assert {c.status for c in report.checks} == {"pass"}
    table = slo.render_table(report)
    assert "benign p99 latency" in table and "SLO gate: PASS" in table
    again = slo.Report.from_dict(json.loads(json.dumps(report.to_dict())))
    assert again.passed and again.checks == report.checks
    assert again.thresholds == report.thresholds
    # A finer sampler saw the upstream's spike before it died: the check is judged again.
    spiked = again.with_peak_rss("upstream", 700 * MB)
    assert not spiked.passed and spiked.numbers["upstream_peak_rss_mb"] == 700.0
    assert again.with_peak_rss("guard", 50 * MB) is again  # lower: nothing changes


@pytest.mark.parametrize(
    ("change", "failing"),
    [
        ({"benign_failures": 1}, "benign errors"),
        ({"lookalike_failures": 1}, "benign errors"),
        ({"attack_records": {_REFUSED: 39, _SERVED: 1}}, slo.CONTENT_CHECK),
        ({"attack_records": {_LIMITED: 40}}, slo.CONTENT_CHECK),  # none reached the checks
        ({"flood_bursts": {outcomes.BURST_STOPPED: 1, outcomes.BURST_THROUGH: 1}}, slo.FLOOD_CHECK),
        ({"guard_peak_rss": 151 * MB}, "guard peak RSS"),
        ({"upstream_peak_rss": 600 * MB}, "upstream peak RSS"),
        ({"upstream_alive": False}, "upstream healthy at end"),
        ({"benign_latency_ms": {9000: 100}}, "benign p99 latency"),
        ({"benign_latency_ms": {}}, "benign p99 latency"),
    ],
)
def test_gate_fails_on_each_violation(change: dict[str, object], failing: str) -> None:
    data = _passing()
    for key, value in change.items():
        setattr(data, key, value)
    report = slo.evaluate(data, slo.Thresholds())
    assert not report.passed
    assert [c.name for c in report.checks if c.status == "fail"] == [failing]


def test_missing_data_is_skipped_not_passed() -> None:
    data = _passing()
    data.guard_peak_rss = None
    data.upstream_alive = None
    data.attack_records, data.flood_bursts = {}, {}
    report = slo.evaluate(data, slo.Thresholds())
    status = {c.name: c.status for c in report.checks}
    assert status["guard peak RSS"] == "skip"
    assert status["upstream healthy at end"] == "skip"
    assert status[slo.CONTENT_CHECK] == status[slo.FLOOD_CHECK] == "skip"
    assert report.passed


def test_an_attack_a_limit_refused_is_not_counted_as_stopped_by_the_checks() -> None:
    """The content SLO is judged on the requests that reached the checks: the rate-limited
    ones are said apart, neither stopped nor through."""
    data = _passing()
    data.attack_records = {
        _REFUSED: 6,
        _LIMITED: 3,
        outcomes.key("volume", outcomes.FLOOD, 200, None): 4,  # served before the limit
        outcomes.key("volume", outcomes.FLOOD, 429, "concurrency_limited"): 26,
    }
    report = slo.evaluate(data, slo.Thresholds())
    check = next(c for c in report.checks if c.name == slo.CONTENT_CHECK)
    assert check.status == "pass"
    assert check.measured == "100.0% (6/6); 3 refused by a limit first, not judged"
    attacks = report.numbers["attacks"]
    assert attacks["requests"] == 39 and attacks["content_limited"] == 3
    assert attacks["by_intent"]["flood"]["volume"] == {
        outcomes.SERVED_BEFORE_LIMIT: 4,
        outcomes.CONCURRENCY: 26,
    }
    data.attack_records[_SERVED] = 1
    failed = slo.evaluate(data, slo.Thresholds())
    assert [c.name for c in failed.checks if c.status == "fail"] == [slo.CONTENT_CHECK]


def test_what_refused_an_attack() -> None:
    assert outcomes.refused_by(400, "json_depth_exceeded") == outcomes.CONTENT
    assert outcomes.refused_by(429, "rate_limited_tokens") == outcomes.RATE
    assert outcomes.refused_by(400, "request_exceeds_token_budget") == outcomes.BUDGET
    assert outcomes.refused_by(503, "server_busy") == outcomes.CONCURRENCY
    assert outcomes.refused_by(502, "upstream_error") == outcomes.SERVER_ERROR
    assert outcomes.refused_by(200, None) == outcomes.SERVED
    assert outcomes.refused_by(0, None) == outcomes.NO_ANSWER
    # What each corpus attack is meant to meet: floods a limit, the others a content check.
    aims = {(a.flood, outcomes.intent(a.flood, a.expect_code)) for a in load_attacks()}
    assert aims == {(True, outcomes.FLOOD), (False, outcomes.CONTENT_ATTACK)}
    record = outcomes.parse_key(outcomes.key("volume", outcomes.FLOOD, 0, None, "timeout: x"))
    assert record.answer == "no answer: timeout" and outcomes.category(record) == "no answer"
    assert outcomes.burst_stopped([(200, None), (429, "rate_limited_requests")])
    assert not outcomes.burst_stopped([(200, None), (400, "invalid_json")])


def test_baseline_ratio_and_rss_slope(tmp_path: Path) -> None:
    base = tmp_path / "slo.json"
    slo.evaluate(_passing(), slo.Thresholds()).write_json(base)
    assert slo.load_baseline_p99(base) == 500
    data = _passing()
    data.benign_latency_ms = {800: 100}
    report = slo.evaluate(data, slo.Thresholds(baseline_p99_ms=500))
    ratio = next(c for c in report.checks if c.name == "benign p99 / baseline")
    assert ratio.status == "fail" and report.numbers["benign_p99_ratio"] == 1.6
    # 1 MB a minute, after the warm-up is left out.
    series = [(t, 100 * MB + int(t / 60 * MB)) for t in range(0, 600, 10)]
    assert slo.rss_slope_mb_per_min(series) == pytest.approx(1.0, rel=0.01)
    # A one-off step (an arena growing once) is not a leak.
    step = [(t, 100 * MB + (5 * MB if t >= 300 else 0)) for t in range(0, 600, 10)]
    assert abs(slo.rss_slope_mb_per_min(step) or 0.0) < 0.1
    data.rss_series = {"guard": series}
    gated = slo.evaluate(data, slo.Thresholds(max_rss_slope_mb_per_min=0.5))
    assert any(c.name == "guard RSS slope" and c.status == "fail" for c in gated.checks)
    # Under two minutes of samples the slope is not judged (nor shown as a number).
    data.rss_series = {"guard": [(float(t), 100 * MB + t * MB) for t in range(0, 46)]}
    short = slo.evaluate(data, slo.Thresholds(max_rss_slope_mb_per_min=0.5))
    check = next(c for c in short.checks if c.name == "guard RSS slope")
    assert (check.status, check.measured) == ("skip", "too short to judge (45 s < 120 s)")
    assert short.numbers["rss_slope_mb_per_min"] == {"guard": None}
    assert slo.rss_slope_mb_per_min([(0, 1)]) is None


# ------------------------------------------------------------------------------ corpus replay


def test_attacks_cover_every_threats_class() -> None:
    attacks = load_attacks()
    assert {a.class_ for a in attacks} == set(CLASSES)
    floods = [a for a in attacks if a.flood]
    assert floods and all(a.class_ == "volume" and a.expect_status == 429 for a in floods)
    seed = next(a for a in attacks if a.id == "npt-seed")
    assert seed.body() is seed.body()  # built once
    assert ("content-type", "application/json") in seed.headers()
    with pytest.raises(ValueError, match="unknown attack class"):
        load_attacks(["nope"])


def test_round_robin_replays_every_payload_once_per_cycle() -> None:
    attacks = load_attacks(["fan_out", "volume"])
    rr = RoundRobin(attacks, seed=1)
    first = [rr.next().id for _ in range(rr.size)]
    assert sorted(first) == sorted(a.id for a in attacks)
    assert rr.next().id == first[0]


def test_lookalikes_follow_the_upstream_profile() -> None:
    served = {r.id for r in load_lookalikes("vulnerable")}
    everything = {r.id for r in load_lookalikes(None)}
    assert "bn-chat-simple" in served
    assert "bn-embeddings" in everything - served  # the reference scheduler has no embeddings


# ------------------------------------------------------------------------------ HTTP client


class _Handler(socketserver.StreamRequestHandler):
    """A raw HTTP/1.1 server with one behaviour per path (see the tests below)."""

    server: _Server

    def handle(self) -> None:
        self.server.connections += 1
        while self._one():
            pass

    def _one(self) -> bool:
        line = self.rfile.readline()
        if not line:
            return False
        _, path, _ = line.decode().split(" ", 2)
        headers: dict[str, str] = {}
        while (h := self.rfile.readline()) not in (b"\r\n", b""):
            k, v = h.decode("latin-1").split(":", 1)
            headers[k.strip().lower()] = v.strip()
        if path == "/early":
            self.rfile.read(100_000)
            self.server.received = 100_000
            self._send(413, b'{"error":{"code":"body_too_large"}}', close=True)
            self.connection.shutdown(socket.SHUT_WR)
            self.connection.settimeout(2.0)
            total = 100_000
            with contextlib.suppress(OSError):
                while chunk := self.connection.recv(65536):
                    total += len(chunk)
            self.server.received = total
            return False
        if path == "/chunked":
            sizes = []
            while True:
                size = int(self.rfile.readline().strip(), 16)
                if size == 0:
                    self.rfile.readline()
                    break
                sizes.append(len(self.rfile.read(size)))
                self.rfile.readline()
            self._send(200, json.dumps({"chunks": len(sizes), "bytes": sum(sizes)}).encode())
            return True
        if path == "/stall":
            self.connection.settimeout(0.3)
            with contextlib.suppress(OSError):
                self.rfile.read(int(headers["content-length"]))
            self._send(408, b'{"error":{"code":"body_timeout"}}', close=True)
            return False
        body = self.rfile.read(int(headers.get("content-length", "0")))
        if path == "/sse":
            events = [
                {"choices": [{"delta": {"role": "assistant", "content": ""}}]},
                *({"choices": [{"delta": {"content": f" t{i}"}}]} for i in range(3)),
            ]
            payload = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
            payload += b"data: [DONE]\n\n"
            head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
            self.wfile.write(head + b"%x\r\n%s\r\n0\r\n\r\n" % (len(payload), payload))
            return True
        self._send(200, json.dumps({"echo": len(body)}).encode())
        return True

    def _send(self, status: int, body: bytes, close: bool = False) -> None:
        conn = b"connection: close\r\n" if close else b""
        self.wfile.write(
            b"HTTP/1.1 %d X\r\ncontent-type: application/json\r\ncontent-length: %d\r\n%s\r\n%s"
            % (status, len(body), conn, body)
        )
        self.wfile.flush()


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    connections = 0
    received = 0


@pytest.fixture
def server() -> Iterator[tuple[str, _Server]]:
    srv = _Server(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}", srv
    finally:
        srv.shutdown()
        srv.server_close()


def test_keep_alive_reuses_its_connection(server: tuple[str, _Server]) -> None:
    url, srv = server
    conn = KeepAlive(url, timeout_s=5)
    for n in (3, 5):
        resp = conn.request("POST", "/json", b"x" * n, [("content-type", "application/json")])
        assert resp.status == 200 and json.loads(resp.body) == {"echo": n}
    assert srv.connections == 1
    conn.close()


def test_stream_reports_ttft_and_gaps(server: tuple[str, _Server]) -> None:
    url, _ = server
    res = KeepAlive(url, timeout_s=5).stream("POST", "/sse", b"{}", [])
    assert res.status == 200 and res.done and res.error is None
    assert res.ttft_s is not None and res.ttft_s >= 0
    assert len(res.gaps_s) == 2  # three content events; the role-only chunk is no token
    assert res.itl_mean_s is not None


def test_send_raw_stops_sending_when_answered_early(server: tuple[str, _Server]) -> None:
    url, srv = server
    resp = send_raw(url, "POST", "/early", [], b"a" * (8 * MB), timeout_s=10)
    assert (resp.status, resp.code) == (413, "body_too_large")
    assert srv.received < 8 * MB  # the rest was never sent


def test_send_raw_chunked_and_stalled_framing(server: tuple[str, _Server]) -> None:
    url, _ = server
    body = b"0123456789" * 10
    resp = send_raw(
        url, "POST", "/chunked", [], body, Transport(chunk_size=1, content_length="omit")
    )
    assert resp.status == 200 and json.loads(resp.body) == {"chunks": 100, "bytes": 100}
    stalled = send_raw(url, "POST", "/stall", [], b"{", Transport(content_length=1000))
    assert (stalled.status, stalled.code) == (408, "body_timeout")


def test_send_raw_reports_connection_errors() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    resp = send_raw(f"http://127.0.0.1:{port}", "POST", "/", [], b"{}", timeout_s=2)
    assert resp.status == 0 and resp.error == "refused"
    assert error_code(b'{"error": {"code": "x"}}') == "x" and error_code(b"nope") is None


# ------------------------------------------------------------------------------ monitor


def test_guard_metrics_are_parsed() -> None:
    metrics = GuardMetrics()
    metrics.rejected("template_depth_exceeded")
    metrics.rejected("template_depth_exceeded")
    metrics.rejected("n_exceeded")
    metrics.in_flight = 3
    snap = parse_guard_metrics(metrics.render().decode())
    assert snap.rejections == {"template_depth_exceeded": 2.0, "n_exceeded": 1.0}
    assert snap.in_flight == 3.0


def test_watched_process_rss_and_dead_upstream() -> None:
    me = Watched("self", os.getpid())
    me.sample(0.0)
    me.sample(1.0)
    assert me.alive() and me.current > 0 and (me.peak or 0) >= me.current
    assert len(me.series) == 2
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mon = Monitor(upstream_url=f"http://127.0.0.1:{port}")
    healthy, why = mon.upstream_health(timeout_s=1)
    assert healthy is False and "failed" in why
    snap = mon.snapshot()
    assert snap["guard"]["pid"] is None and snap["rejections"] == {}


def test_dashboard_rows() -> None:
    status = {
        "slo": slo.evaluate(_passing(), slo.Thresholds()).to_dict(),
        "guard": {"pid": 1, "rss_mb": 90.0, "peak_rss_mb": 100.0, "alive": True},
        "upstream": {"pid": None},
        "rejections": {"n_exceeded": 4.0},
    }
    rows = dashboard.table_rows(status)
    assert rows[0] == {
        "metric": "SLO gate (so far)",
        "value": "",
        "threshold": "",
        "status": "PASS",
    }
    assert {"metric": "rejected: n_exceeded", "value": "4", "threshold": "", "status": ""} in rows
    assert any(r["metric"] == "guard RSS now / peak" for r in rows)
    assert all(set(r) == {"metric", "value", "threshold", "status"} for r in rows)


# ------------------------------------------------------------------------------ command line


def test_split_users() -> None:
    assert _load_cli.split_users(14, 0.3) == (14, 6)
    assert _load_cli.split_users(10, 0.0) == (10, 0)
    assert _load_cli.split_users(1, 0.1) == (1, 1)


def test_locust_command_line() -> None:
    args = build_parser().parse_args(
        [
            "load",
            "--duration",
            "30",
            "--users",
            "7",
            "--attack-share",
            "0.3",
            "--baseline",
            "b.json",
            "--",
            "--flood-burst",
            "40",
        ]
    )
    target = _load_cli.LoadEndpoints("http://g", "http://g", "http://u", 11, 22)
    cmd = _load_cli.locust_argv(args, target, Path("out"))
    joined = " ".join(cmd)
    assert cmd[1:3] == ["-m", "locust"] and "--headless" in cmd
    assert "-u 10" in joined and "-t 30s" in joined  # 7 benign + 3 attackers
    assert "--guard-pid 11" in joined and "--upstream-pid 22" in joined
    assert "--slo-baseline b.json" in joined and cmd[-2:] == ["--flood-burst", "40"]
    assert cmd[cmd.index("--attack-share") + 1] == repr(0.3)


def test_load_refuses_host_with_no_guard(capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser().parse_args(["load", "--host", "http://x", "--no-guard"])
    assert _load_cli.run(args) == 2
    assert "cannot be combined" in capsys.readouterr().err
