"""fuzz.live._campaign: black-box and differential campaigns against the fake server: finding
kinds, the rate bound, health after every finding, and the reports and exit status."""

from __future__ import annotations

import json
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from fuzz.live import replay_live, run_live_campaign
from fuzz.live._campaign import Gate
from payloads import load_payload
from schedguard.cli import main
from tests._support import free_port
from tests.fuzz.live._fake import HELLO, Fake, live_options, make_corpus


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


def test_cli_refuses_a_remote_target_and_a_dead_one(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fuzz", "run", "--target", "http://10.1.2.3:8000", "--duration", "1"]) == 2
    assert "loopback" in capsys.readouterr().err
    argv = ["fuzz", "run", "--target", f"http://127.0.0.1:{free_port()}", "--duration", "1"]
    assert main(argv) == 2
    assert "health" in capsys.readouterr().err
    guard = ["--guard", "http://192.168.1.1:8080"]
    assert main(["fuzz", "run", "--target", "http://127.0.0.1:1", *guard]) == 2


def test_black_box_crash_is_a_finding_and_the_campaign_stops(fake: Fake, tmp_path: Path) -> None:
    corpus = make_corpus(
        tmp_path / "corpus",
        {"deep-grammar": {**HELLO, "grammar": "root ::= " + "(" * 2000 + '"KILL"' + ")" * 2000}},
        {"hello": HELLO},
    )
    start = time.monotonic()
    report = run_live_campaign(
        live_options(fake, tmp_path, corpus, duration_s=30, pids=(fake.pid,))
    )
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


def test_black_box_hang(fake: Fake, tmp_path: Path) -> None:
    corpus = make_corpus(
        tmp_path / "corpus", {"hang": {**HELLO, "grammar": 'root ::= "HANG"'}}, {"hello": HELLO}
    )
    opts = live_options(fake, tmp_path, corpus, duration_s=4, timeout_s=1.0, minimise_s=2.0)
    report = run_live_campaign(opts)
    assert "time" in [f.cause for f in report.findings]
    hang = next(f for f in report.findings if f.cause == "time")
    assert hang.outcome.verdict == "timeout"


def test_black_box_memory_budget(fake: Fake, tmp_path: Path) -> None:
    corpus = make_corpus(
        tmp_path / "corpus", {"hog": {**HELLO, "max_tokens": 777}}, {"hello": HELLO}
    )
    opts = live_options(fake, tmp_path, corpus, duration_s=5, pids=(fake.pid,),
                    rss_budget_bytes=100 << 20, minimise_s=3.0)  # fmt: skip
    report = run_live_campaign(opts)
    mem = [f for f in report.findings if f.cause == "memory"]
    assert mem and mem[0].cost_after.peak_mem_bytes > 100 << 20


def test_rate_bound_holds_for_a_whole_campaign(fake: Fake, tmp_path: Path) -> None:
    corpus = make_corpus(tmp_path / "corpus", {}, {"hello": HELLO})
    start = time.monotonic()
    report = run_live_campaign(
        live_options(fake, tmp_path, corpus, duration_s=3, max_rps=10, jobs=3)
    )
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
    corpus = make_corpus(
        tmp_path / "corpus", {"refusal": refusal}, {"hello": HELLO, "bn-fp": falsepos}
    )
    opts = live_options(fake, tmp_path, corpus, guard=fake.url, duration_s=8)
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
    corpus = make_corpus(tmp_path / "corpus", {"big-n": {**HELLO, "n": 1000}}, {"hello": HELLO})
    base = ["fuzz", "run", "--target", fake.url, "--duration", "3", "--corpus", str(corpus),
            "--seed", "1", "--minimise-s", "2", "--quiet"]  # fmt: skip
    assert main([*base, "--out", str(tmp_path / "a")]) == 1
    out = capsys.readouterr()
    assert "5xx:500:engine failure" in out.out and "FAIL" in out.err
    assert main([*base, "--out", str(tmp_path / "b"), "--expect-findings"]) == 0
    # The fake also fails bad_words with a 500 (a fault of its own the mutator can reach by
    # adding the field): both are the server's refusals here, so nothing is left to find.
    ignored = ["--ignore-5xx", "engine", "--ignore-5xx", "Internal Server Error"]
    assert main([*base, "--out", str(tmp_path / "c"), *ignored]) == 0
