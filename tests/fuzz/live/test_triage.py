"""Triage, restarts and minimisation across crashes, against the scripted server started with its
log (tests/_fake_openai.py: SEGV dies by SIGSEGV in add_grammar, bad_words logs a KeyError
traceback and answers 500, ONCE fails on a fresh process only)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from fuzz.live import LiveOptions, RemoteTargetRefused, run_live_campaign
from fuzz.report import to_json, to_sarif
from fuzz.triage import triage
from schedguard.cli import main
from tests.fuzz.live._fake import HELLO, Fake, live_options, make_corpus


@pytest.fixture
def logged(tmp_path: Path) -> Iterator[Fake]:
    f = Fake(tmp_path, log=tmp_path / "server.log")
    try:
        yield f
    finally:
        f.stop()


def test_a_segfault_is_one_group_named_by_its_stack_and_minimised_across_restarts(
    logged: Fake, tmp_path: Path
) -> None:
    # Two request shapes reach the same crashing function: one group, the stack names it.
    corpus = make_corpus(
        tmp_path / "corpus",
        {
            "grammar": {**HELLO, "temperature": 0.5, "stop": ["x"], "grammar": 'root ::= "SEGV"'},
            "schema": {
                **HELLO,
                "top_p": 0.9,
                "response_format": {"type": "json_object", "schema": {"pattern": "^SEGV$"}},
            },
        },
        {"hello": HELLO},
    )
    opts = live_options(logged, tmp_path, corpus, duration_s=15, restart_cmd=logged.restart_cmd,
                        server_log=logged.log, dead_wait_s=5.0, minimise_s=30.0,
                        expect_findings=True)  # fmt: skip
    report = run_live_campaign(opts)
    groups = triage(report.findings)
    crashes = [g for g in groups if g.representative.outcome.verdict == "crash"]
    assert len(crashes) == 1, [g.signature for g in groups]
    g = crashes[0]
    assert g.signature == "SIGSEGV@_fake_openai.py:add_grammar"
    assert g.count >= 2  # both shapes (and their children) crashed it: duplicates counted
    rep = g.representative
    assert rep.minimised
    small = json.loads(rep.data)
    assert set(small) in ({"model", "grammar"}, {"model", "response_format"})
    assert rep.evidence["signal"] == "SIGSEGV"
    assert rep.evidence["component"] == "_fake_openai.py" and rep.evidence["basis"] == "stack"
    assert "Fatal Python error: Segmentation fault" in rep.evidence["log_excerpt"]
    stats = report.results[0].extra["stats"]
    assert stats["restarts"] >= 3 and stats["stopped"] is None
    # The record and SARIF point at the upstream's component, not at a file of this project.
    record = to_json(report)
    assert record["groups"][0]["signature"] == g.signature
    loc = next(
        r["locations"][0]
        for r in to_sarif(report)["runs"][0]["results"]
        if r["properties"]["cause"] == rep.cause
    )
    assert loc["physicalLocation"]["artifactLocation"] == {
        "uri": "_fake_openai.py",
        "uriBaseId": "UPSTREAM",
    }
    assert loc["logicalLocations"][0]["fullyQualifiedName"] == "_fake_openai.py:add_grammar"
    assert rep.replay_command is not None and f"--target {logged.url}" in rep.replay_command
    # The report to file upstream, from the campaign's record alone.
    assert main(["fuzz", "report", str(tmp_path / "out"), "--format", "issue"]) == 0
    issues = sorted((tmp_path / "out" / "issues").glob("*.md"))
    crash_issue = next(p for p in issues if p.name.split("-", 1)[1].startswith("crash"))
    text = crash_issue.read_text()
    assert f"curl -sS -w '\\nHTTP %{{http_code}}\\n' -X POST {logged.url}/v1/" in text
    assert rep.data.split(b"\n\n")[-1].decode() in text  # the minimised body, whole
    assert "SIGSEGV@_fake_openai.py:add_grammar" in text and "Fatal Python error" in text
    assert "## What schedguard's guard does about it" in text


def test_a_5xx_is_named_by_the_exception_the_server_logged(logged: Fake, tmp_path: Path) -> None:
    corpus = make_corpus(
        tmp_path / "corpus", {"bw": {**HELLO, "bad_words": ["x"], "top_k": 3}}, {"hello": HELLO}
    )
    opts = live_options(logged, tmp_path, corpus, server_log=logged.log, expect_findings=True,
                        pids=(logged.pid,))  # fmt: skip
    report = run_live_campaign(opts)
    (f,) = [f for f in report.findings if f.outcome.verdict == "server_error"]
    assert f.cause == "5xx:500:Internal Server Error@KeyError@_fake_openai.py:sampler_for"
    assert f.evidence["exception"] == "KeyError" and f.evidence["status"] == 500
    assert set(json.loads(f.data)) == {"model", "bad_words"}
    # With --pid, the server's memory and CPU around the request, and its CPU in the record.
    assert f.evidence["server_before"]["rss_bytes"] > 0
    (rec,) = [r for r in to_json(report)["findings"] if r["cause"] == f.cause]
    assert isinstance(rec["cpu_s"], float) and rec["cpu_s"] >= 0
    assert "(server)" in (tmp_path / "out" / "summary.md").read_text()


def test_without_a_log_a_group_is_status_code_and_shape(fake: Fake, tmp_path: Path) -> None:
    corpus = make_corpus(
        tmp_path / "corpus", {"bw": {**HELLO, "bad_words": ["x"], "top_k": 3}}, {"hello": HELLO}
    )
    report = run_live_campaign(live_options(fake, tmp_path, corpus, expect_findings=True))
    (g,) = [g for g in triage(report.findings) if g.representative.outcome.verdict != "ok"]
    assert g.signature.startswith("HTTP 500:-:bad_words")
    assert g.representative.evidence.get("signature") is None


def test_a_restart_command_that_fails_stops_the_campaign_with_its_output(
    fake: Fake, tmp_path: Path
) -> None:
    corpus = make_corpus(
        tmp_path / "corpus",
        {"kill": {**HELLO, "grammar": "root ::= " + "(" * 1200 + '"KILL"' + ")" * 1200}},
        {"hello": HELLO},
    )
    opts = live_options(fake, tmp_path, corpus, duration_s=20,
                        restart_cmd="echo cannot-start-it >&2; exit 3",
                        expect_findings=True)  # fmt: skip
    report = run_live_campaign(opts)
    stats = report.results[0].extra["stats"]
    assert stats["restarts"] == 1  # tried once, never looped
    assert stats["restart_failure"]["status"] == 3
    assert "cannot-start-it" in stats["restart_failure"]["output"]
    assert stats["stopped"] == "the restart command failed"
    assert [f.outcome.verdict for f in report.findings] == ["crash"]


def test_a_fault_only_a_fresh_server_shows_is_marked_and_minimised_restarting(
    fake: Fake, tmp_path: Path
) -> None:
    # The server is warm when the campaign meets ONCE (the benign seed went first): confirming
    # on it fails, a fresh server shows it again.
    stop_then_start = f"kill $(cat {fake.pidfile}); sleep 0.3; {fake.restart_cmd}"
    corpus = make_corpus(
        tmp_path / "corpus",
        {"once": {**HELLO, "temperature": 0.2, "user": "ONCE", "stop": ["y"]}},
        {"hello": HELLO},
    )
    opts = live_options(fake, tmp_path, corpus, duration_s=15, restart_cmd=stop_then_start,
                        dead_wait_s=5.0, minimise_s=30.0, expect_findings=True)  # fmt: skip
    report = run_live_campaign(opts)
    (f,) = [f for f in report.findings if f.cause.startswith("5xx:500:cold cache")]
    assert f.fresh_only
    assert set(json.loads(f.data)) == {"model", "user"}
    assert report.results[0].extra["stats"]["restarts"] >= 3


def test_a_remote_target_is_refused_before_anything_runs(tmp_path: Path) -> None:
    # Restarts and the upstream scripts' defaults do not open a way around --allow-remote.
    marker = tmp_path / "ran"
    opts = LiveOptions(target="http://10.1.2.3:8000", restart_cmd=f"touch {marker}",
                       progress=None)  # fmt: skip
    with pytest.raises(RemoteTargetRefused, match="loopback"):
        run_live_campaign(opts)
    assert not marker.exists()
