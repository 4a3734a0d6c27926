"""fuzz.live._oracle: an exchange with a live server judged from outside, and a guard's verdict
against what the upstream then counts."""

from __future__ import annotations

from fuzz.live import LiveBudgets, Reply, error_signature, extract_usage
from fuzz.live._oracle import Measured, _within_limit, judge
from fuzz.oracle import Outcome
from fuzz.targets import Cost


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


def test_a_token_refusal_over_the_upstream_s_own_count_is_not_a_false_positive() -> None:

    refusal = {"code": "prompt_tokens_exceeded", "message": "more tokens than the limit of 2048"}
    over = Measured(Outcome("ok", Cost()), extra={"usage": {"prompt_tokens": 3013}})
    under = Measured(Outcome("ok", Cost()), extra={"usage": {"prompt_tokens": 1500}})
    assert not _within_limit(refusal, over)
    assert _within_limit(refusal, under)
    assert _within_limit({"code": "n_exceeded", "message": "the limit of 16"}, over)


def test_the_latency_budget_grows_with_the_output_tokens_asked_for() -> None:
    budgets = LiveBudgets(latency_s=1.0, latency_per_token_s=0.01)
    long = Reply(200, b'{"usage":{"prompt_tokens":5,"completion_tokens":400}}')
    alive = lambda: True  # noqa: E731
    assert judge(long, Cost(time_s=4.9), budgets, alive).verdict == "ok"  # 1 + 0.01 x 400
    over = judge(long, Cost(time_s=5.1), budgets, alive)
    assert over.where == "budget:wall_s"
    assert "5.00 s (1 s + 0.01 s x 400 output tokens)" in (over.error_message or "")
    # no usage (or none asked for): the fixed budget alone
    assert judge(Reply(200, b"{}"), Cost(time_s=1.1), budgets, alive).verdict == "budget"
    fixed = LiveBudgets(latency_s=1.0, latency_per_token_s=0.0)
    assert judge(long, Cost(time_s=1.1), fixed, alive).verdict == "budget"


def test_a_stream_without_usage_counts_its_events_as_output_tokens() -> None:
    from fuzz.live._oracle import output_tokens

    events = b"".join(b'data: {"choices":[{"text":"a"}]}\n\n' for _ in range(30))
    assert output_tokens(Reply(200, events + b"data: [DONE]\n\n")) == 30
    sse_with_usage = b'data: {"choices":[],"usage":{"completion_tokens":7}}\n\ndata: [DONE]\n\n'
    assert output_tokens(Reply(200, events + sse_with_usage)) == 7
    assert output_tokens(Reply(200, b'{"choices":[]}')) == 0
