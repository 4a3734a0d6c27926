"""Live campaigns (fuzz.live) against a scripted server (tests/_fake_openai.py): finding kinds,
minimisation on the live server, the rate bound, loopback only, health after every finding,
restarts, and the reports and exit status."""

from __future__ import annotations

import json
import random
import re
import socket
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from fuzz.live import (
    OPERATORS,
    HttpClient,
    LiveBudgets,
    LiveOptions,
    LiveRequest,
    RemoteTargetRefused,
    Reply,
    RequestMutator,
    RequestPacer,
    RssMonitor,
    error_signature,
    extract_usage,
    load_seeds,
    nest_grammar,
    parse_prometheus_rss,
    replay_live,
    require_loopback,
    run_live_campaign,
    shape_signature,
)
from fuzz.live._campaign import Gate
from fuzz.live._oracle import judge
from fuzz.live._shapes import Context, duplicate, grow_string
from fuzz.minimize import shrink_json
from fuzz.targets import Cost
from guard.isolation import run_limited
from payloads import load_payload
from schedguard.cli import main
from tests._support import REPO_ROOT, free_port

ROOT = REPO_ROOT
FAKE = ROOT / "tests" / "_fake_openai.py"
CHAT = "/v1/chat/completions"


def _start_fake(port: int, pidfile: Path | None = None) -> subprocess.Popen[bytes]:
    args = [sys.executable, str(FAKE), str(port)] + ([str(pidfile)] if pidfile else [])
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    end = time.monotonic() + 10
    while time.monotonic() < end:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("the fake server did not start")


class Fake:
    def __init__(self, tmp: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.pidfile = tmp / "fake.pid"
        self.procs = [_start_fake(self.port, self.pidfile)]

    @property
    def pid(self) -> int:
        return self.procs[0].pid

    @property
    def restart_cmd(self) -> str:
        # Detached, so the campaign's subprocess.run returns at once.
        return f"{sys.executable} {FAKE} {self.port} {self.pidfile} >/dev/null 2>&1 &"

    def stop(self) -> None:
        for p in self.procs:
            p.kill()
            p.wait()
        if self.pidfile.exists():  # a copy started by a restart command
            pid = int(self.pidfile.read_text() or 0)
            if pid and pid not in {p.pid for p in self.procs}:
                try:
                    import os
                    import signal

                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[Fake]:
    f = Fake(tmp_path)
    try:
        yield f
    finally:
        f.stop()


def _corpus(
    root: Path, attacks: dict[str, dict[str, Any]], benign: dict[str, dict[str, Any]]
) -> Path:
    """A payload corpus with these bodies (chat endpoint)."""
    for pid, body in attacks.items():
        d = root / "attacks" / "volume"
        d.mkdir(parents=True, exist_ok=True)
        doc = {"id": pid, "class": "volume", "description": "test", "target_field": "body",
               "endpoint": CHAT, "body": body, "expect": {"status": 400, "code": "x_y"}}  # fmt: skip
        (d / f"{pid}.yaml").write_text(yaml.safe_dump(doc))
    for pid, body in benign.items():
        d = root / "benign"
        d.mkdir(parents=True, exist_ok=True)
        doc = {"id": pid, "class": "benign", "description": "test", "target_field": "body",
               "endpoint": CHAT, "body": body, "expect": {"status": 200}}  # fmt: skip
        (d / f"{pid}.yaml").write_text(yaml.safe_dump(doc))
    return root


HELLO = {"model": "m", "messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 2}


def _options(fake: Fake, tmp: Path, corpus: Path, **kw: Any) -> LiveOptions:
    base: dict[str, Any] = {
        "target": fake.url,
        "duration_s": 6.0,
        "seed": 1,
        "out_dir": tmp / "out",
        "corpus": corpus,
        "minimise_s": 5.0,
        "dead_wait_s": 1.0,
        "timeout_s": 5.0,
        "progress": None,
    }
    base.update(kw)
    return LiveOptions(**base)


# ------------------------------------------------------------------------------ the pieces


def test_loopback_only() -> None:
    for url in (
        "http://127.0.0.1:8000",
        "http://localhost:1",
        "http://[::1]:80",
        "https://127.5.5.5",
    ):
        require_loopback(url, allow_remote=False)
    for url in ("http://10.0.0.1:8000", "http://example.com", "http://8.8.8.8"):
        with pytest.raises(RemoteTargetRefused, match="loopback"):
            require_loopback(url, allow_remote=False)
        require_loopback(url, allow_remote=True)


def test_cli_refuses_a_remote_target_and_a_dead_one(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fuzz", "run", "--target", "http://10.1.2.3:8000", "--duration", "1"]) == 2
    assert "loopback" in capsys.readouterr().err
    argv = ["fuzz", "run", "--target", f"http://127.0.0.1:{free_port()}", "--duration", "1"]
    assert main(argv) == 2
    assert "health" in capsys.readouterr().err
    guard = ["--guard", "http://192.168.1.1:8080"]
    assert main(["fuzz", "run", "--target", "http://127.0.0.1:1", *guard]) == 2


def test_rate_limiter_spaces_requests_across_threads() -> None:
    limiter = RequestPacer(100.0)
    start = time.monotonic()

    def take() -> None:
        for _ in range(10):
            limiter.acquire()

    threads = [threading.Thread(target=take) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert limiter.sent == 40
    assert time.monotonic() - start >= 0.38  # 40 at 100/s: the first at once, then 10 ms apart


def test_gate_exclusive_waits_for_shared() -> None:
    gate = Gate()
    events: list[str] = []
    inside = threading.Event()

    def worker() -> None:
        with gate.shared():
            inside.set()
            time.sleep(0.2)
            events.append("shared done")

    t = threading.Thread(target=worker)
    t.start()
    inside.wait()
    with gate.exclusive():
        events.append("exclusive")
    t.join()
    assert events == ["shared done", "exclusive"]


def test_parse_prometheus_rss() -> None:
    text = (
        "# HELP process_resident_memory_bytes x\n# TYPE process_resident_memory_bytes gauge\n"
        'process_resident_memory_bytes{pid="1"} 1.0e+08\nprocess_resident_memory_bytes{pid="2"} 5e7\n'
        "process_resident_memory_bytes_total 9\n"
    )
    assert parse_prometheus_rss(text) == 150_000_000
    assert parse_prometheus_rss("up 1\n") is None


def test_error_signature_and_usage() -> None:
    assert error_signature("engine failure at step 12\ntrace") == "engine failure at step #"
    assert error_signature("'x' codec can't decode 0xff in position 3") == (
        "'...' codec can't decode # in position #"
    )
    sse = (
        b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'
        b'data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":1}}\n\ndata: [DONE]\n\n'
    )
    assert extract_usage(Reply(200, sse)) == {"prompt_tokens": 7, "completion_tokens": 1}
    assert extract_usage(Reply(200, b'{"usage":{"prompt_tokens":3}}')) == {"prompt_tokens": 3}


def test_judge_verdicts() -> None:
    budgets = LiveBudgets(timeout_s=5, latency_s=1.0, rss_bytes=100)
    alive, dead = (lambda: True), (lambda: False)
    assert judge(Reply(None, error="timeout"), Cost(), budgets, alive).verdict == "timeout"
    crash = judge(Reply(None, error="dropped"), Cost(), budgets, dead)
    assert (crash.verdict, crash.where) == ("crash", "server:died")
    drop = judge(Reply(None, error="dropped"), Cost(), budgets, alive)
    assert drop.where == "connection:dropped"
    assert judge(Reply(200, b"{}"), Cost(time_s=2.0), budgets, alive).where == "budget:wall_s"
    assert (
        judge(Reply(200, b"{}"), Cost(peak_mem_bytes=101), budgets, alive).where
        == "budget:mem_bytes"
    )
    assert judge(Reply(400, b"{}"), Cost(), budgets, alive).verdict == "rejected"
    err = judge(Reply(503, b'{"error":{"code":"upstream_unavailable"}}'), Cost(), budgets, alive)
    assert (err.verdict, err.where) == ("server_error", "503:upstream_unavailable")
    behind = judge(Reply(502, b'{"error":{"code":"upstream_error"}}'), Cost(), budgets, dead)
    assert (behind.verdict, behind.where) == ("crash", "server:died")
    assert judge(Reply(504, b"{}"), Cost(), budgets, alive).verdict == "timeout"


def test_nest_grammar() -> None:
    assert nest_grammar('root ::= "a"', 3) == 'root ::= ((("a")))'
    assert nest_grammar('root ::= x\nx ::= "b"', 2) == 'root ::= ((x))\nx ::= "b"'


def test_mutator_reaches_a_60000_deep_grammar() -> None:
    """The llama.cpp parser crash needs ( x 20,000 or more: the operators get there from an
    ordinary grammar seed."""
    seeds = [s for s in load_seeds() if s.seed_id == "builtin-chat-grammar"]
    mutator = RequestMutator(seeds, model="m", max_body_bytes=1 << 20)
    rng = random.Random(0)
    deep = re.compile(r"\({60000}")
    found = False
    for _ in range(600):
        child = mutator.mutate(seeds[0], rng)
        if deep.search(child.to_bytes().decode("utf-8", "replace")):
            found = True
            break
    assert found


def test_every_child_is_sendable_json() -> None:
    seeds = load_seeds(max_bytes=64 << 10)
    assert any(s.benign for s in seeds) and any(not s.benign for s in seeds)
    mutator = RequestMutator(seeds, model="m", max_body_bytes=256 << 10)
    rng = random.Random(1)
    for _ in range(300):
        parent = rng.choice(seeds)
        child = mutator.mutate(parent, rng)
        data = child.to_bytes()
        assert len(data) <= 256 << 10
        assert child.lineage
        if child.raw is None:
            body = json.loads(data)
            assert body["model"] == "m"
            assert LiveRequest.from_input(child.to_input()).path == child.path


def _grow_repeatedly(cap: int) -> int:
    """In a limited child: a body near the cap, then the repeating operators again and again
    on it (as stacked operators and a climbing campaign do); the body's final size."""
    body: dict[str, Any] = {"messages": [{"role": "user", "content": "x" * (cap // 2)}]}
    ctx = Context(random.Random(0), max_bytes=cap)
    for _ in range(12):
        grow_string(body, ctx)
        duplicate(body, ctx)
    return len(json.dumps(body))


def test_repeating_operators_are_bounded_by_the_body_cap() -> None:
    """Each operator's copies are bounded by the body cap, so operators stacked on one body
    grow it linearly, not multiplicatively: a 1 MiB string repeated 256 times, twice, took a
    campaign's process to 21 GB before the cap could discard the child."""
    cap = 256 << 10
    result = run_limited(_grow_repeatedly, cap, mem_limit_bytes=512 << 20, timeout_s=120)
    assert result.outcome == "ok", result
    assert result.value is not None and result.value <= 32 * cap, result.value


@pytest.mark.parametrize("name", sorted(OPERATORS))
def test_each_operator_applies_to_a_chat(name: str) -> None:
    op = OPERATORS[name][0]
    rng = random.Random(2)
    applied = 0
    for _ in range(20):
        body: dict[str, Any] = json.loads(json.dumps(HELLO))
        path = "/v1/completions" if name == "struct.prompt_form" else CHAT
        if op(body, Context(rng, ("donor text",), path)):
            applied += 1
            json.dumps(body)
    assert applied


def test_shrink_json_keeps_what_the_predicate_needs() -> None:
    doc = {
        "model": "m",
        "messages": [{"role": "user", "content": "x" * 100}, {"role": "user", "content": "NEEDLE"}],
        "tools": [{"a": 1}, {"b": [1, 2, 3]}],
        "n": 1000,
        "grammar": "root ::= " + "(" * 64 + '"a"' + ")" * 64,
    }

    def still(d: Any) -> bool:
        text = json.dumps(d)
        return "NEEDLE" in text and "((((" in text

    small = shrink_json(doc, still, max_tests=300, keep=frozenset({"model"}))
    assert still(small) and small["model"] == "m"
    assert set(small) == {"model", "messages", "grammar"}
    assert len(small["messages"]) == 1
    grammar = small["grammar"]
    assert grammar.count("(") < 20 and grammar.count("(") == grammar.count(")")


def test_shrink_json_stops_at_its_budget() -> None:
    calls = []

    def still(d: Any) -> bool:
        calls.append(d)
        return isinstance(d, dict) and len(d.get("a", ())) > 3

    shrink_json({"a": list(range(100)), "b": "x" * 1000}, still, max_tests=5)
    assert len(calls) == 5


def test_shape_signature() -> None:
    refusal = {
        "model": "m",
        "messages": [{"role": "user", "content": [{"type": "refusal", "refusal": "x"}]}],
    }
    assert shape_signature(refusal) == "messages[].content[type=refusal].refusal"
    assert shape_signature(HELLO) == "template-overhead"
    args = {
        "messages": [{"role": "assistant", "tool_calls": [{"function": {"arguments": {"a": "b"}}}]}]
    }
    assert shape_signature(args) == "messages[].tool_calls[].function.arguments.a"
    tools = {"tools": [{"type": "function", "function": {"name": "f"}}]}
    assert shape_signature(tools) == "tools[].function.name"  # a tool's type is not a shape
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}]}
    assert shape_signature(parts) == "template-overhead"  # text parts are a plain chat


def test_a_token_refusal_over_the_upstream_s_own_count_is_not_a_false_positive() -> None:
    from fuzz.live._oracle import Measured, _within_limit
    from fuzz.oracle import Outcome

    refusal = {"code": "prompt_tokens_exceeded", "message": "more tokens than the limit of 2048"}
    over = Measured(Outcome("ok", Cost()), extra={"usage": {"prompt_tokens": 3013}})
    under = Measured(Outcome("ok", Cost()), extra={"usage": {"prompt_tokens": 1500}})
    assert not _within_limit(refusal, over)
    assert _within_limit(refusal, under)
    assert _within_limit({"code": "n_exceeded", "message": "the limit of 16"}, over)


def test_rss_monitor_reads_processes_and_metrics(fake: Fake) -> None:
    limiter = RequestPacer(100)
    metrics = HttpClient(fake.url, limiter=limiter)
    monitor = RssMonitor([fake.pid], metrics, "/metrics")
    total = monitor.sample()
    assert total > 150_000_000  # the metric's 1.5e8 plus the process's own RSS
    mark = monitor.mark()
    assert monitor.growth_since(mark) >= 0
    assert monitor.alive()
    metrics.close()


# ------------------------------------------------------------------------------- campaigns


def test_black_box_crash_is_a_finding_and_the_campaign_stops(fake: Fake, tmp_path: Path) -> None:
    corpus = _corpus(
        tmp_path / "corpus",
        {"deep-grammar": {**HELLO, "grammar": "root ::= " + "(" * 2000 + '"KILL"' + ")" * 2000}},
        {"hello": HELLO},
    )
    start = time.monotonic()
    report = run_live_campaign(_options(fake, tmp_path, corpus, duration_s=30, pids=(fake.pid,)))
    assert time.monotonic() - start < 20  # stopped, not spinning for the 30 s
    causes = [f.cause for f in report.findings]
    assert causes == ["crash:ServerDied:server:died"]
    stats = report.results[0].extra["stats"]
    assert stats["stopped"] == "the target is down"
    assert report.exit_status == 1 and report.kind == "hardened"
    finding = report.findings[0]
    assert finding.path is not None
    saved = load_payload(Path(finding.path))
    assert saved.class_ == "guided_decoding" and saved.finding is not None
    assert "((((" in saved.body_bytes().decode()
    for name in ("report.json", "junit.xml", "report.sarif", "summary.md"):
        assert (tmp_path / "out" / name).is_file()


def test_black_box_restart_lets_a_crash_be_minimised(fake: Fake, tmp_path: Path) -> None:
    grammar = "root ::= " + "(" * 4000 + '"KILL"' + ")" * 4000
    corpus = _corpus(
        tmp_path / "corpus",
        {"deep-grammar": {**HELLO, "temperature": 0.5, "stop": ["x"], "grammar": grammar}},
        {"hello": HELLO},
    )
    # Two workers: every request in flight when the server dies fails; the finding must be the
    # one that kills it again alone.
    opts = _options(fake, tmp_path, corpus, jobs=2, duration_s=12, restart_cmd=fake.restart_cmd,
                    dead_wait_s=5.0, minimise_s=8.0)  # fmt: skip
    report = run_live_campaign(opts)
    crash = [f for f in report.findings if f.cause == "crash:ServerDied:server:died"]
    assert crash and crash[0].minimised
    small = json.loads(crash[0].data)
    assert set(small) == {"model", "grammar"}
    assert 1000 <= small["grammar"].count("(") < 4000
    stats = report.results[0].extra["stats"]
    assert stats["restarts"] >= 2 and stats["stopped"] is None
    assert report.results[0].execs > 10  # the campaign went on after the crash


def test_black_box_5xx_minimised_and_ignored_5xx(fake: Fake, tmp_path: Path) -> None:
    corpus = _corpus(
        tmp_path / "corpus",
        {
            "big-n": {**HELLO, "n": 1000, "temperature": 0.3, "logprobs": True},
            "quirk": {**HELLO, "n": 99},
        },
        {"hello": HELLO},
    )
    opts = _options(fake, tmp_path, corpus, ignore_5xx=("validation error",), expect_findings=True)
    report = run_live_campaign(opts)
    by_cause = {f.cause: f for f in report.findings}
    f = by_cause["5xx:500:engine failure at step #"]
    small = json.loads(f.data)
    assert set(small) == {"model", "n"} and small["n"] > 100
    assert not any("validation" in c for c in by_cause)
    assert report.exit_status == 0 and report.kind == "vulnerable"
    stats = report.results[0].extra["stats"]
    assert stats["health_checks"] >= len(report.findings)


def test_black_box_hang(fake: Fake, tmp_path: Path) -> None:
    corpus = _corpus(
        tmp_path / "corpus", {"hang": {**HELLO, "grammar": 'root ::= "HANG"'}}, {"hello": HELLO}
    )
    opts = _options(fake, tmp_path, corpus, duration_s=4, timeout_s=1.0, minimise_s=2.0)
    report = run_live_campaign(opts)
    assert "time" in [f.cause for f in report.findings]
    hang = next(f for f in report.findings if f.cause == "time")
    assert hang.outcome.verdict == "timeout"


def test_black_box_memory_budget(fake: Fake, tmp_path: Path) -> None:
    corpus = _corpus(tmp_path / "corpus", {"hog": {**HELLO, "max_tokens": 777}}, {"hello": HELLO})
    opts = _options(fake, tmp_path, corpus, duration_s=5, pids=(fake.pid,),
                    rss_budget_bytes=100 << 20, minimise_s=3.0)  # fmt: skip
    report = run_live_campaign(opts)
    mem = [f for f in report.findings if f.cause == "memory"]
    assert mem and mem[0].cost_after.peak_mem_bytes > 100 << 20


def test_rate_bound_holds_for_a_whole_campaign(fake: Fake, tmp_path: Path) -> None:
    corpus = _corpus(tmp_path / "corpus", {}, {"hello": HELLO})
    start = time.monotonic()
    report = run_live_campaign(_options(fake, tmp_path, corpus, duration_s=3, max_rps=10, jobs=3))
    elapsed = time.monotonic() - start
    stats = report.results[0].extra["stats"]
    assert stats["http_requests"] <= 10 * elapsed + 1  # start-up checks included
    assert report.results[0].execs >= 15


def test_differential_finds_the_under_count_and_the_false_positive(
    fake: Fake, tmp_path: Path
) -> None:
    refusal = {"model": "m", "max_tokens": 2, "temperature": 0.2, "messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "hi"},
                                     {"type": "refusal", "refusal": "no " * 300}]}]}  # fmt: skip
    falsepos = {"model": "m", "max_tokens": 2,
                "messages": [{"role": "user", "content": "FALSEPOS is a word"}]}  # fmt: skip
    corpus = _corpus(tmp_path / "corpus", {"refusal": refusal}, {"hello": HELLO, "bn-fp": falsepos})
    opts = _options(fake, tmp_path, corpus, guard=fake.url, duration_s=8)
    report = run_live_campaign(opts)
    by_cause = {f.cause: f for f in report.findings}
    # The fake renders every string of a message, so the minimiser may strip the part down to
    # its refusal text: the shape keeps the field the guard did not count.
    under = next(f for c, f in by_cause.items() if c.startswith("undercount:") and "refusal" in c)
    assert under.minimised and under.size_bytes < len(under.original)
    assert set(json.loads(under.data)) == {"model", "messages"}
    extra = under.outcome.extra
    assert int(extra["upstream_prompt_tokens"]) > int(extra["guard_prompt_tokens"])
    fp = by_cause["false_positive:looks_bad:bn-fp"]
    assert fp.path is not None and "/benign/" in fp.path
    saved = load_payload(Path(fp.path))
    assert saved.class_ == "benign" and saved.expect.status == 200
    assert report.engine == "differential" and report.exit_status == 1

    out = tmp_path / "out"
    data = json.loads((out / "report.json").read_text())
    assert data["engines"][0]["stats"]["guard_verdicts"]["allowed"] > 0
    suite = ET.parse(out / "junit.xml").getroot()
    assert int(suite.get("failures", "0")) == len(report.findings)
    sarif = json.loads((out / "report.sarif").read_text())
    rules = {r["id"] for r in sarif["runs"][0]["tool"]["driver"]["rules"]}
    assert {"fuzz/undercount", "fuzz/false_positive"} <= rules
    summary = (out / "summary.md").read_text()
    assert "live campaign" in summary and "undercount" in summary

    # The saved findings replay as what they were (the guard has not changed).
    replays = replay_live([out / "found", out / "benign"], fake.url, guard=fake.url)
    assert replays and all(r.is_finding for r in replays)
    verdicts = {r.to_dict()["verdict"] for r in replays}
    assert verdicts == {"undercount", "false_positive"}
    argv = ["fuzz", "replay", str(out / "found"), "--target", fake.url, "--guard", fake.url]
    assert main(argv) == 1


def test_cli_live_exit_status(
    fake: Fake, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = _corpus(tmp_path / "corpus", {"big-n": {**HELLO, "n": 1000}}, {"hello": HELLO})
    base = ["fuzz", "run", "--target", fake.url, "--duration", "3", "--corpus", str(corpus),
            "--seed", "1", "--minimise-s", "2", "--quiet"]  # fmt: skip
    assert main([*base, "--out", str(tmp_path / "a")]) == 1
    out = capsys.readouterr()
    assert "5xx:500:engine failure" in out.out and "FAIL" in out.err
    assert main([*base, "--out", str(tmp_path / "b"), "--expect-findings"]) == 0
    assert main([*base, "--out", str(tmp_path / "c"), "--ignore-5xx", "engine"]) == 0
