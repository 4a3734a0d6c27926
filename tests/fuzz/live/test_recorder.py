"""fuzz.live._recorder: findings on a live server confirmed by sending them again, minimised
against the server (brought back after each crash), deduplicated by cause."""

from __future__ import annotations

import json
from pathlib import Path

from fuzz.findings import FindingSet
from fuzz.live import LiveRecorder, LiveRequest, Measured, run_live_campaign
from fuzz.oracle import Outcome
from fuzz.targets import Cost
from tests.fuzz.live._fake import HELLO, Fake, live_options, make_corpus


def test_black_box_restart_lets_a_crash_be_minimised(fake: Fake, tmp_path: Path) -> None:
    grammar = "root ::= " + "(" * 4000 + '"KILL"' + ")" * 4000
    corpus = make_corpus(
        tmp_path / "corpus",
        {"deep-grammar": {**HELLO, "temperature": 0.5, "stop": ["x"], "grammar": grammar}},
        {"hello": HELLO},
    )
    # Two workers: every request in flight when the server dies fails; the finding must be the
    # one that kills it again alone.
    opts = live_options(fake, tmp_path, corpus, jobs=2, duration_s=12, restart_cmd=fake.restart_cmd,
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
    corpus = make_corpus(
        tmp_path / "corpus",
        {
            "big-n": {**HELLO, "n": 1000, "temperature": 0.3, "logprobs": True},
            "quirk": {**HELLO, "n": 99},
        },
        {"hello": HELLO},
    )
    opts = live_options(
        fake, tmp_path, corpus, ignore_5xx=("validation error",), expect_findings=True
    )
    report = run_live_campaign(opts)
    by_cause = {f.cause: f for f in report.findings}
    f = by_cause["5xx:500:engine failure at step #"]
    small = json.loads(f.data)
    assert set(small) == {"model", "n"} and small["n"] > 100
    assert not any("validation" in c for c in by_cause)
    assert report.exit_status == 0 and report.kind == "vulnerable"
    stats = report.results[0].extra["stats"]
    assert stats["health_checks"] >= len(report.findings)


class _AloneOracle:
    """Sends again what the recorder confirms: the same 500, the log naming its own cause."""

    def __init__(self, again: Measured) -> None:
        self.again = again
        self.sent = 0

    def run(self, req: LiveRequest) -> Measured:
        self.sent += 1
        return self.again

    def alive(self) -> bool:
        return True


def _five_hundred(signature: str) -> Measured:
    out = Outcome("server_error", Cost(), where="500:Internal server error")
    return Measured(out, extra={"evidence": {"signature": signature}})


def test_a_5xx_is_named_by_the_log_of_the_request_sent_alone() -> None:
    """With several workers the first 500's log excerpt may hold another request's traceback
    (the vLLM campaign named an allowed_token_ids 500 ``KeyError@...check_tool_usage``, a
    concurrent request's); the confirming run is sent alone, so its log names the cause."""
    oracle = _AloneOracle(_five_hundred("500@vllm/v1/structured_output/backend_xgrammar.py"))
    rec = LiveRecorder(
        oracle,  # type: ignore[arg-type]  # only run() and alive() are used
        FindingSet(),
        target="t",
        engine="live",
        recover=lambda: True,
        minimise=False,
    )
    req = LiveRequest("/v1/chat/completions", {"model": "m", "allowed_token_ids": [1]})
    measured = _five_hundred("KeyError@vllm/entrypoints/openai/protocol.py:check_tool_usage")
    found = rec.record(req, measured, 1.0)
    assert found is not None and oracle.sent == 1
    assert found.evidence["signature"] == "500@vllm/v1/structured_output/backend_xgrammar.py"
    assert found.cause.endswith("@500@vllm/v1/structured_output/backend_xgrammar.py")
